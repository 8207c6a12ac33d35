"""One run of a study at a time, on a local output and on S3: a second run refuses and names the
holder; the run after a killed one starts (at once locally, once the lease is stale on S3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb import lock, storage
from rayb.cli import app
from rayb.lock import StudyLocked, study_lock

HOLD = "import sys, time; from rayb.lock import study_lock\nwith study_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)"


@pytest.fixture(params=["local", "s3"])
def output(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    return f"s3://{request.getfixturevalue('s3_bucket')}/out"


def _holder(study_dir: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, study_dir], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_run_of_a_study_refuses_and_names_the_first(output, tmp_path, monkeypatch):
    from rayb.runner import study_directory
    from rayb.study import parse_study

    raw = tiny_study_dict()
    study_dir = study_directory(parse_study(raw), output)
    holder = _holder(study_dir)
    try:
        with pytest.raises(StudyLocked, match=f"process {holder.pid} on "):
            with study_lock(study_dir):
                pass
        # `rayb run` refuses before it starts Ray or touches the study's files.
        study_file = tmp_path / "study.yaml"
        study_file.write_text(yaml.safe_dump(raw))
        refused = CliRunner().invoke(
            app, ["run", str(study_file), "--output", output], env={"COLUMNS": "200"}
        )
        assert refused.exit_code == 2 and f"process {holder.pid}" in refused.output, refused.output
        assert storage.listdir(study_dir) == [lock.LOCK_NAME]
    finally:
        holder.kill()
        holder.wait()
    # The holder was killed: locally the OS let go of its lock; on S3 its lease goes stale.
    monkeypatch.setattr(lock, "STALE_S", 3.0)
    monkeypatch.setattr(lock, "SETTLE_S", 0.2)
    if storage.is_remote(output):
        with pytest.raises(StudyLocked):
            with study_lock(study_dir):
                pass
        time.sleep(3.5)
    with study_lock(study_dir):
        pass
    if storage.is_remote(output):
        assert not storage.exists(storage.join(study_dir, lock.LOCK_NAME))  # a lease is given back


def test_two_runs_that_take_a_lease_at_once_leave_exactly_one_holding_it(s3_bucket):
    study_dir = f"s3://{s3_bucket}/out/studies/x"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD, study_dir],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ,
        )  # fmt: skip
        for _ in range(2)
    ]
    try:
        # Both read no lease, both write, each reads back after SETTLE_S: one refuses. (Waited for rather
        # than timed: on a loaded machine the imports alone can take seconds.)
        deadline = time.time() + 120
        while all(r.poll() is None for r in racers) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(lock.SETTLE_S + 1)  # the other has read its lease back by now, and holds it
        held = [r for r in racers if r.poll() is None]
        refused = [r for r in racers if r.poll() is not None]
        assert len(held) == 1 and len(refused) == 1
        assert "already running" in refused[0].stderr.read()
    finally:
        for r in racers:
            r.send_signal(signal.SIGKILL)
            r.wait()


CLAIM = (
    "import sys, time; from rayb.lock import trial_claims\n"
    "with trial_claims(sys.argv[1], [sys.argv[2]], 'other'):\n    print('held', flush=True); time.sleep(600)"
)


@pytest.mark.ray
def test_a_study_leaves_a_trial_another_study_is_training_to_it_and_takes_it_over_if_let_go(
    output, ray_session, monkeypatch
):
    """Two different studies share a trial (same model, data and training): while another run holds it,
    this run trains its other trials and waits, saying so; when that run ends without finishing it (killed
    here), this run trains it itself."""
    import threading

    from rayb.data.pipeline import prepare_data
    from rayb.runner import plan_trials, run_study
    from rayb.study import parse_study

    monkeypatch.setattr(lock, "SETTLE_S", 0.2)
    monkeypatch.setattr(lock, "WAIT_S", 0.5)
    monkeypatch.setattr(lock, "STALE_S", 15.0)  # the killed holder's lease on S3: renewed every 10 s
    study = parse_study(tiny_study_dict(seeds=[0], eval=["lm"]))
    trials = plan_trials(study, prepare_data(study.data, storage.join(output, "cache")), output, {})
    holder = subprocess.Popen([sys.executable, "-c", CLAIM, output, trials[0].key], stdout=subprocess.PIPE,
                              text=True, env=os.environ)  # fmt: skip
    said: list[str] = []
    try:
        assert holder.stdout.readline().strip() == "held"
        run = threading.Thread(target=run_study, args=(study, output), kwargs={"log": said.append})
        run.start()
        deadline = time.time() + 600
        while not (trials[1].done and any("waiting for 1 trial(s)" in line for line in said)):
            assert run.is_alive() and time.time() < deadline, said
            time.sleep(1)
        assert not trials[0].done  # left to the run that holds it
        assert any("study other" in line for line in said)
    finally:
        holder.kill()
        holder.wait()
    run.join(timeout=600)
    assert not run.is_alive() and trials[0].done and trials[1].done
    # Claims that do not overlap never collide; a run's claims are given back when it ends.
    with (
        lock.trial_claims(output, [trials[1].key], "this") as a,
        lock.trial_claims(output, ["x"], "that") as b,
    ):
        assert a == b == {}


@pytest.mark.ray
def test_two_studies_sharing_a_trial_run_at_once_and_it_is_trained_once(ray_session, tmp_path):
    """Two `rayb run`s of different studies on one output, started together on one cluster: they share
    their data cache and one trial (gpt2, seed 0). Both finish; the data is tokenized once, the shared
    trial trained once, and each study's results hold it."""
    import ray

    from rayb.results import read_results

    out = tmp_path / "out"
    base = tiny_study_dict(eval=["lm"])
    base["models"] = base["models"][:1]
    files = []
    for name, seeds in (("one", [0]), ("two", [0, 1])):
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(yaml.safe_dump(base | {"name": name, "seeds": seeds}))
    env = os.environ | {"RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    runs = [subprocess.Popen(["rayb", "run", str(f), "--output", str(out)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for f in files]  # fmt: skip
    logs = [run.communicate(timeout=900)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    (cache,) = [d for d in (out / "cache" / "data").iterdir() if d.is_dir()]
    assert (cache / "manifest.json").is_file()
    trained = sorted(out.glob("trials/*/train_result.json"))
    assert len(trained) == 2  # gpt2 seeds 0 and 1: the shared one once
    for result in trained:
        log = result.parent / "metrics.jsonl"
        steps = [json.loads(line)["step"] for line in log.read_text().splitlines() if '"train"' in line]
        assert steps == sorted(set(steps)), f"{log} was trained more than once"
    tables = [
        read_results(next((out / "studies").glob(f"{name}-*")) / "results.parquet") for name in ("one", "two")
    ]
    assert [sorted(t.seed) for t in tables] == [[0], [0, 1]]
    assert all((t.status == "ok").all() for t in tables)
    shared = [t[t.seed == 0].iloc[0] for t in tables]
    assert shared[0].val_loss == shared[1].val_loss  # one trial, read by both
