"""A tiny study through the real path: Ray Data → Ray Train + DeepSpeed → eval actors → verdict."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.cli import app
from rayb.results import read_results
from rayb.study import parse_study

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def study_run(ray_session, tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    study_file = out / "tiny.yaml"
    study_file.write_text(yaml.safe_dump(tiny_study_dict()))
    result = CliRunner().invoke(app, ["run", str(study_file), "--output", str(out)])
    return out, study_file, result


def test_study_writes_results_table_and_report(study_run):
    out, study_file, result = study_run
    assert result.exit_code == 0, result.output
    study = parse_study(yaml.safe_load(study_file.read_text()))
    (study_dir,) = (out / "studies").iterdir()
    table = read_results(study_dir / "results.parquet")

    assert len(table) == 4  # 2 models × 1 lr × 2 seeds, each exactly once
    assert sorted(zip(table.model, table.seed, strict=True)) == [
        ("gpt2", 0),
        ("gpt2", 1),
        ("mamba", 0),
        ("mamba", 1),
    ]
    assert (table.status == "ok").all(), table[["model", "seed", "error"]]
    assert table.trial_key.is_unique
    assert (table.steps == study.steps).all()
    manifest = json.loads(next((out / "cache" / "data").glob("*/manifest.json")).read_text())
    for row in table.itertuples():
        assert row.val_loss < math.log(manifest["vocab_size"])  # learned something
        assert row.val_ppl == pytest.approx(math.exp(row.val_loss))
        assert 0 < row.val_bpb < row.val_loss / math.log(2)  # more than one byte per token
        assert len(row.curve_train_loss) == study.steps and list(row.curve_val_step) == [8, 16, 24]
    # Seeds differ in initialisation, so their results differ too.
    assert table.groupby("model").val_loss.nunique().eq(2).all()

    verdict = json.loads((study_dir / "results.json").read_text())
    assert verdict["reference"] == "gpt2"
    assert {c["candidate"] for c in verdict["comparisons"]} == {"mamba"}
    assert (study_dir / "loss_curves.png").stat().st_size > 10_000
    assert "mamba" in (study_dir / "report.md").read_text()
    assert "Gate, mamba vs gpt2: " in result.output
    provenance = json.loads((study_dir / "provenance.json").read_text())
    assert provenance["fingerprint"] == study.fingerprint() and provenance["study"]["name"] == "tiny"
    assert provenance["hardware"]["ray_cluster"]["CPU"] >= 1 and provenance["versions"]["ray"]
    assert "gpt2 (ref)" in result.output  # the comparison table is printed
    status = CliRunner().invoke(app, ["status", str(out)], env={"COLUMNS": "200"})
    assert status.exit_code == 0 and "tiny: 4 trials (4 done)" in status.output
    assert "Gate, mamba vs gpt2: " in status.output  # a finished study's verdict, from its files


def test_rerun_trains_nothing(study_run, tmp_path):
    out, study_file, _ = study_run
    (study_dir,) = (out / "studies").iterdir()
    before = {p: p.stat().st_mtime_ns for p in (out / "trials").rglob("model.safetensors")}
    bucket = tmp_path / "bucket"
    result = CliRunner().invoke(
        app, ["run", str(study_file), "--output", str(out), "--archive", bucket.as_uri()]
    )
    assert result.exit_code == 0, result.output
    assert "trained 0 trials, ran 0 evaluations" in result.output
    assert {p: p.stat().st_mtime_ns for p in (out / "trials").rglob("model.safetensors")} == before
    assert len(read_results(study_dir / "results.parquet")) == 4
    # The archive has the output's layout: the study's results and every trial's model and evaluations.
    assert "archived to " in result.output
    archived_study = bucket / "studies" / study_dir.name
    assert (archived_study / "results.parquet").read_bytes() == (study_dir / "results.parquet").read_bytes()
    assert len(list(bucket.glob("trials/*/model/*.safetensors"))) == 4
    assert CliRunner().invoke(app, ["report", str(archived_study)]).exit_code == 0  # usable as it is


def test_a_drained_train_worker_scores_as_an_eval_actor_does(study_run):
    """Once no trial waits for a worker group, the groups' own workers run the evaluations (in a CPU study),
    as the log says; deleted and scored again by `--eval-only`, which trains nothing and so runs every job
    on eval actors, each of those results comes out the same."""
    out, study_file, result = study_run
    output = " ".join(result.output.split())
    relayed = re.findall(r"eval \d+/\d+: (\w+) × lm in [\d.]+s on a drained Train worker: ok", output)
    assert relayed, result.output
    files = {key: next((out / "trials").glob(f"*-{key}/eval/lm-*.json")) for key in relayed}
    before = {key: json.loads(path.read_text()) for key, path in files.items()}
    for path in files.values():
        path.unlink()
    rerun = CliRunner().invoke(app, ["run", str(study_file), "--output", str(out), "--eval-only"])
    assert rerun.exit_code == 0, rerun.output
    assert f"ran {len(relayed)} evaluations" in rerun.output and "drained" not in rerun.output
    for key, path in files.items():
        assert json.loads(path.read_text())["metrics"] == before[key]["metrics"], key


def test_every_benchmark_family_fans_out_over_the_trained_checkpoints(study_run, tmp_path):
    """The same study with every eval suite: the trials are reused (their keys do not depend on the
    evaluation), each (checkpoint × suite) runs on the eval actors, a broken suite is recorded with
    its message without stopping the others, and a rerun retries only that one."""
    out, study_file, _ = study_run
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Question: Who is the mayor of Velmora?\nAnswer: Dunak Orel.\n" * 20)
    study = yaml.safe_load(study_file.read_text()) | {
        "name": "tiny-evals",
        "eval": ["lm", f"lm:{corpus}", "lm_eval:rayb_text", "lm_eval:no_such_task", "statefulness",
                 "recall", "long_context", "speed"],
        "eval_options": {
            "lm_eval": {"limit": 4, "rayb_task_docs": 4},
            "statefulness": {"distances": [2], "examples": 2, "other_kinds_distance": 1},
            "recall": {"kv_counts": [2], "mqar_lengths": [32], "mqar_examples": 4, "passkey_lengths": [64],
                       "passkey_examples": 2},
            "long_context": {"multiples": [1, 2], "max_windows": 2},
            "speed": {"prefill_tokens": 32, "gen_tokens": 4, "lengths": [16, 32], "warmup": 0, "repeats": 1},
        },
    }  # fmt: skip
    evals_file = tmp_path / "evals.yaml"
    evals_file.write_text(yaml.safe_dump(study))
    # --eval-only: the job that evaluates existing checkpoints, and can never start training.
    result = CliRunner().invoke(app, ["run", str(evals_file), "--output", str(out), "--eval-only"])
    assert result.exit_code == 0, result.output
    # 4 checkpoints × 8 suites, less the 4 `lm` results the first study already has
    assert "trained 0 trials, ran 28 evaluations" in result.output
    assert "evaluation" in result.output and "no_such_task" in result.output  # reported, not fatal
    study_dir = next((out / "studies").glob("tiny-evals-*"))
    table = read_results(study_dir / "results.parquet")
    report = (study_dir / "report.md").read_text()
    assert "## Benchmarks" in report and "### recall (v1)" in report and "| mqar_acc" in report
    assert "### Failed evaluations" in report and "lm_eval:no_such_task" in report
    assert (table.status == "ok").all() and table.val_loss.notna().all()
    for column in (f"lm:{corpus}.bpb", "lm_eval:rayb_text.bits_per_byte", "statefulness.recall_acc.d2",
                   "recall.mqar_acc", "long_context.ppl@1x", "speed.gen_tokens_per_s", "speed.version"):  # fmt: skip
        assert table[column].notna().all(), column
    assert all(list(e) == ["lm_eval:no_such_task"] for e in table.eval_errors)
    assert (table.model == "mamba").any() and table[table.model == "mamba"]["recall.mqar_acc"].notna().all()

    # The gate reads the measured suites: all four default metrics graded, none "not measured".
    gate = json.loads((study_dir / "results.json").read_text())["gate"]
    assert [g["candidate"] for g in gate] == ["mamba"]
    assert [m["grade"] != "not measured" for m in gate[0]["grades"]] == [True] * 4
    assert "### Context scaling\n\n![long-context degradation](context_scaling.png)" in report
    assert (study_dir / "speed.png").is_file() and (study_dir / "report.html").is_file()

    rerun = CliRunner().invoke(app, ["run", str(evals_file), "--output", str(out)])
    assert rerun.exit_code == 0 and "trained 0 trials, ran 4 evaluations" in rerun.output
    report = (study_dir / "report.md").read_text()
    rebuilt = CliRunner().invoke(app, ["report", str(study_dir)])  # from the results table alone
    assert rebuilt.exit_code == 0 and (study_dir / "report.md").read_text() == report


def test_eval_only_refuses_to_train(study_run, tmp_path):
    out, study_file, _ = study_run
    trials = sorted(p.name for p in (out / "trials").iterdir())
    one_more_seed = tmp_path / "three_seeds.yaml"
    one_more_seed.write_text(yaml.safe_dump(yaml.safe_load(study_file.read_text()) | {"seeds": 3}))
    result = CliRunner().invoke(app, ["run", str(one_more_seed), "--output", str(out), "--eval-only"])
    assert result.exit_code == 2, result.output
    assert "--eval-only: 2 of 6 trials have no finished training" in " ".join(result.output.split())
    assert sorted(p.name for p in (out / "trials").iterdir()) == trials  # nothing started


def test_adaptive_seeds_add_rounds_until_each_comparison_is_decided(study_run, tmp_path):
    """`seeds: {min: 2, max: 5}` over the same output: round one is the two seeds already trained (mamba's
    7.8% gap is not yet beyond O'Brien–Fleming's first boundary), so the run trains only the rounds the
    sequential design asks for next, and the report replays them."""
    from rayb.analysis.sequential import SeedRounds, replay

    out, study_file, _ = study_run
    adaptive = tmp_path / "adaptive.yaml"
    raw = yaml.safe_load(study_file.read_text()) | {"name": "tiny-adaptive", "seeds": {"min": 2, "max": 5}}
    adaptive.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(adaptive), "--output", str(out)])
    assert result.exit_code == 0, result.output
    study_dir = next((out / "studies").glob("tiny-adaptive-*"))
    table = read_results(study_dir / "results.parquet")
    values = {m: list(rows.sort_values("seed").val_loss) for m, rows in table.groupby("model", sort=False)}
    rounds = replay(values, "gpt2", SeedRounds(2, 5))
    ran = dict(rounds[-1].seeds) | {m: r.seeds[m] for r in rounds for m in r.stopped}
    assert table.groupby("model").seed.count().to_dict() == ran  # what the design asked for, no more
    assert len(rounds) >= 2 and not rounds[0].stopped and set(rounds[-1].stopped) == {"gpt2", "mamba"}
    assert f"trained {sum(ran.values()) - 4} trials" in result.output
    report = (study_dir / "report.md").read_text()
    assert "## Seeds" in report and "Seeds were added in rounds: group-sequential Welch t-test" in report
    assert "significance: group-sequential Welch t-test, O'Brien–Fleming α-spending" in report
    rerun = CliRunner().invoke(app, ["run", str(adaptive), "--output", str(out)])
    assert rerun.exit_code == 0 and "trained 0 trials" in rerun.output


def test_the_live_view_on_a_real_terminal(ray_session, tmp_path):
    """`rayb run` in a pseudo-terminal, a driver of its own (as `ray job submit` runs it) on the shared
    cluster: the live trial table is drawn, and the screen ends with the comparison table and the gate.
    Ray's driver-side records, Ray Train's, Ray Data's progress and the workers' output stay off the
    terminal; rayb says once where they are."""
    import os
    import pty
    import re
    import subprocess
    import sys

    import ray

    (tmp_path / "live.yaml").write_text(yaml.safe_dump(tiny_study_dict(name="live", seeds=1)))
    env = os.environ | {"RAY_ADDRESS": ray.get_runtime_context().gcs_address, "COLUMNS": "200", "LINES": "50",
                        "TERM": "xterm-256color"}  # fmt: skip
    main, terminal = pty.openpty()
    driver = subprocess.Popen(
        [sys.executable, "-m", "rayb.cli", "run", "live.yaml", "--output", "out"],
        cwd=tmp_path, env=env, stdin=terminal, stdout=terminal, stderr=terminal, close_fds=True,
    )  # fmt: skip
    os.close(terminal)
    screen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed: the driver has exited
            break
        if not chunk:
            break
        screen += chunk
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode("utf-8", "replace"))
    assert driver.wait(timeout=600) == 0, text[-3000:]
    assert "live: 2 trials (" in text and "2/2" in text  # the live table, redrawn as the trials ran
    assert re.search(r"gpt2\s+│\s+0\s+│\s+0\.003\s+│\s+\d+/24", text)  # a trial's row with its step
    tail = text[text.rindex("live: 2 trials") :]
    assert "gpt2 (ref)" in tail and "Gate, mamba vs gpt2: " in tail  # then the verdict, last
    for noise in ("RayTrainWorker", "TrainController", "EnvController",
                  "Attempting to start training worker group", "streaming_executor"):  # fmt: skip
        assert noise not in text, noise
    (logs,) = re.findall(r"Ray's own logs: (\S+) \(driver\)", text)
    assert os.path.isabs(logs) and os.path.isfile(logs)
