"""Failures mid-study: a killed driver, a diverged trial and a failed one lose nothing and count nothing twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml
from conftest import kept_worker_ids, registered_checkpoint_trial, session_actors, tiny_study_dict
from typer.testing import CliRunner

from rayb.cli import app
from rayb.report.status import study_status
from rayb.results import read_results
from rayb.train.loop import METRICS
from rayb.train.trial import TRAIN_DONE, read_metrics

pytestmark = pytest.mark.ray


def test_killed_driver_resumes_without_redoing_finished_trials(ray_session, tmp_path):
    import ray

    raw = tiny_study_dict(
        models=[{"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}}], seeds=3
    )
    raw["train"]["max_concurrent_trials"] = 1  # one trial at a time: the kill lands between known states
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    # A second driver on the same cluster, killed like a lost head-node shell or an OOM-killed job.
    env = os.environ | {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    driver = subprocess.Popen(
        [sys.executable, "-m", "rayb.cli", "run", str(study_file), "--output", str(out)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 400
    while True:
        assert driver.poll() is None and time.time() < deadline, "study ended before the kill"
        trials = sorted((out / "trials").glob("*")) if (out / "trials").exists() else []
        done = [t for t in trials if (t / TRAIN_DONE).exists()]
        # The three seeds share one worker group (one Ray Train run), whose checkpoints take turns.
        runs = list((out / "ray" / "train").glob("*")) if (out / "ray" / "train").exists() else []
        checkpointed = {registered_checkpoint_trial(run) for run in runs}
        running = [t for t in trials if t not in done and t.name.split("-")[-1] in checkpointed]
        if done and running:
            break
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    finished = {p: p.stat().st_mtime_ns for p in (out / "trials").rglob("model.safetensors")}
    interrupted = running[0]
    # `rayb status` reads where the dead driver's study stands from its files alone.
    (study_dir,) = (out / "studies").iterdir()
    states = {t.seed: t.state for t in study_status(study_dir).trials}
    assert sorted(states.values()).count("done") == len(finished) and "running" in states.values()
    time.sleep(5)  # Ray reaps the dead driver's trial actors and workers

    result = CliRunner().invoke(app, ["run", str(study_file), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert f"{len(finished)} already trained" in result.output
    for path, mtime in finished.items():
        assert path.stat().st_mtime_ns == mtime, f"{path} was retrained"
    # The interrupted trial resumed from a checkpoint (steps 8, 16), not from step 1.
    assert [r["step"] for r in read_metrics(interrupted / METRICS) if r["kind"] == "resume"] in ([8], [16])
    table = read_results(study_dir / "results.parquet")
    assert sorted(table.seed) == [0, 1, 2] and (table.status == "ok").all()


def test_a_drained_worker_lost_mid_evaluation_costs_its_job_one_attempt(ray_session, tmp_path):
    """The Train worker running an evaluation after its trial (its group drained) is killed mid-job, as a
    lost node or the OOM killer would end it: the job runs again, and the study ends with every result."""
    import ray

    raw = tiny_study_dict(
        models=[{"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}}], seeds=[0],
        eval=["lm", "overfit"], eval_options={"overfit": {"steps": 600}},  # seconds: long enough to kill in
    )  # fmt: skip
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(raw))
    out, outcome = tmp_path / "out", {}
    study = threading.Thread(
        target=lambda: outcome.update(
            result=CliRunner().invoke(app, ["run", str(study_file), "--output", str(out)])
        )
    )
    study.start()
    deadline, killed = time.time() + 300, []
    while not killed:
        alive = study.is_alive()  # where it ended first, its own lines say where its jobs ran instead
        assert alive and time.time() < deadline, (
            f"no drained worker ran the job; {outcome['result'].output if not alive else 'it is still running'}"
        )
        queues = [a for a in session_actors("TrialQueue") if a["State"] == "ALIVE"]
        scored = list(out.glob("trials/*/eval/lm-*.json"))  # then overfit is the job handed over next
        if queues and scored and ray.get(ray.get_actor(queues[0]["Name"]).relay_state.remote())["busy"]:
            time.sleep(1.0)  # the worker is running it by now, and it runs for seconds
            (worker,) = [a for a in session_actors("RayTrainWorker")
                         if a["State"] == "ALIVE" and a["ActorID"] not in kept_worker_ids()]  # fmt: skip
            os.kill(worker["Pid"], signal.SIGKILL)
            killed.append(worker["Pid"])
        time.sleep(0.05)
    study.join(timeout=300)
    result = outcome["result"]
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "attempt 1 of 3 failed (the drained Train worker was lost" in output, result.output
    ((trial, result_file),) = [
        (t, f) for t in (out / "trials").iterdir() for f in t.glob("eval/overfit-*.json")
    ]
    assert json.loads(result_file.read_text())["status"] == "ok"
    assert [r["kind"] for r in read_metrics(trial / METRICS)].count("resume") == 0  # trained once, not again


def test_a_diverged_and_a_failed_trial_are_recorded_and_the_study_goes_on(ray_session, tmp_path):
    """gpt2 beside two faulty copies of it (tests/faulty_models.py): one diverges, one raises."""
    raw = tiny_study_dict(seeds=[0])
    shape = {"d_model": 32, "n_layer": 2, "n_head": 2}
    gpt2, *_ = raw["models"]
    unstable = {"arch": "faulty_models:nan_after", "name": "unstable", "config": shape | {"nan_at": 5}}
    broken = {"arch": "faulty_models:raises_at", "name": "broken", "config": shape | {"raise_at": 3}}
    raw["models"] = [gpt2, unstable, broken]
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(
        app, ["run", str(study_file), "--output", str(tmp_path / "out")], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 1, result.output  # a trial failed; the rest of the study stands
    (study_dir,) = (tmp_path / "out" / "studies").iterdir()
    table = read_results(study_dir / "results.parquet").set_index("model")
    assert table.loc["gpt2", "status"] == "ok"
    # nan_at counts forward passes: 2 micro-batches per step, so the 5th is step 3.
    assert table.loc["unstable", "status"] == "diverged" and table.loc["unstable", "steps"] == 3
    verdict = json.loads((study_dir / "results.json").read_text())
    assert {"model": "unstable", "seed": 0, "lr": 0.003, "status": "diverged", "step": 3} in verdict[
        "excluded"
    ]
    assert [r["model"] for r in verdict["rows"]] == ["gpt2"]
    # Ray Train retried the broken model's worker group and gave up; the pool did not start it again.
    assert table.loc["broken", "status"] == "error"
    broken = next(t for t in study_status(study_dir).trials if t.model == "broken")
    assert broken.state == "failed" and broken.error.endswith("error.txt")
    assert "injected failure at forward pass 3" in open(broken.error).read()
    assert f"traceback: {broken.error}" in " ".join(result.output.split())

    # The same trials judged against the diverged model: no verdict can be drawn. That is a study error
    # with its message, not a traceback, and everything computed so far is kept (nothing is retrained).
    raw |= {"models": [gpt2, unstable], "verdict": {"reference": "unstable"}}
    study_file.write_text(yaml.safe_dump(raw))
    failed = CliRunner().invoke(app, ["run", str(study_file), "--output", str(tmp_path / "out")])
    assert failed.exit_code == 1 and "Traceback" not in failed.output, failed.output
    assert (
        "study failed" in failed.output
        and "reference model 'unstable' has no finished trial" in failed.output
    )
    assert "2 already trained; training 0" in failed.output  # nothing was retrained
    (judged,) = [d for d in (tmp_path / "out" / "studies").iterdir() if d != study_dir]
    assert (
        len(read_results(judged / "results.parquet")) == 2
        and "ValueError" in (judged / "error.txt").read_text()
    )
