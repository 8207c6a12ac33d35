"""`rayb status` from a study's files alone: every trial state, the ETA, the evaluations, and the CLI on
an output directory. (A study running in another process: tests/test_faults.py; a finished one:
tests/test_study_e2e.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayb.cli import app
from rayb.files import write_json_atomic
from rayb.report.status import status_table, study_status, write_trials
from rayb.train.loop import METRICS
from rayb.train.spec import TrainSpec
from rayb.train.trial import TRAIN_DONE, TRIAL_ERROR, TrialSpec

STEPS = 10


def _trial(tmp_path, model: str, seed: int) -> TrialSpec:
    return TrialSpec(
        key=f"{model}{seed}", model=model, arch="gpt2", model_config={}, lr=1e-3, seed=seed, train=TrainSpec(),
        steps=STEPS, cache_dir="", trial_dir=str(tmp_path / "trials" / f"{model}-{seed}"), storage_path="",
    )  # fmt: skip


def _log(trial: TrialSpec, steps: list[int], resumed_at: int | None = None) -> None:
    path = Path(trial.trial_dir) / METRICS
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        {"kind": "train", "step": s, "loss": 5.0 - 0.1 * s, "tokens_per_s": 1000.0, "step_s": 2.0}
        for s in steps
    ]
    if resumed_at is not None:  # as the training loop writes it: a resume record, then the steps again
        at = steps.index(resumed_at + 1, steps.index(resumed_at) + 1)
        lines.insert(at, {"kind": "resume", "step": resumed_at})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.fixture
def study_dir(tmp_path):
    trials = {name: _trial(tmp_path, "gpt2", seed) for seed, name in enumerate(
        ["queued", "running", "resumed", "done", "diverged", "failed"])}  # fmt: skip
    _log(trials["running"], [1, 2, 3, 4])
    _log(trials["resumed"], [1, 2, 3, 4, 3, 4, 5, 6], resumed_at=2)  # restarted from its step-2 checkpoint
    for name, status in (("done", "ok"), ("diverged", "diverged"), ("failed", "error")):
        _log(trials[name], list(range(1, STEPS + 1)))
        write_json_atomic(Path(trials[name].trial_dir) / TRAIN_DONE, {"status": status, "steps": STEPS})
    directory = tmp_path / "studies" / "toy-123"
    directory.mkdir(parents=True)
    write_json_atomic(directory / "provenance.json", {"study": {"name": "toy", "eval": ["lm", "speed"]}})
    write_trials(directory, list(trials.values()))
    return directory


def test_each_trial_state_step_and_eta_come_from_its_files(study_dir):
    status = study_status(study_dir)
    assert [t.state for t in status.trials] == ["queued", "running", "resumed", "done", "diverged", "failed"]
    queued, running, resumed, done = status.trials[:4]
    assert (queued.step, queued.loss, queued.eta_s) == (0, None, None)
    assert (running.step, running.loss, running.tokens_per_s) == (4, pytest.approx(4.6), 1000.0)
    assert running.eta_s == pytest.approx((STEPS - 4) * 2.0) and resumed.step == 6
    assert done.step == STEPS and done.eta_s is None
    # Evaluations: 2 suites for the one trial that trained "ok", none run yet; no results table yet.
    assert (status.evaluations_done, status.evaluations_total, status.finished) == (0, 2, False)
    table = status_table(status)
    assert table.title == "toy: 6 trials (1 queued, 1 running, 1 resumed, 1 done, 1 diverged, 1 failed)"


def test_the_cli_reads_an_output_directory_or_names_what_is_missing(study_dir, tmp_path):
    result = CliRunner().invoke(app, ["status", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "toy: 6 trials" in result.output and "4/10" in result.output and "12s" in result.output
    assert "evaluation" in result.output and "0/2" in result.output
    missing = CliRunner().invoke(app, ["status", str(tmp_path / "nowhere")], env={"COLUMNS": "200"})
    assert missing.exit_code == 2 and "trials.json does not exist" in missing.output


def test_a_trial_whose_training_raised_is_failed_with_its_traceback_named(study_dir, tmp_path):
    running = Path(tmp_path / "trials" / "gpt2-1")
    (running / TRIAL_ERROR).write_text("Traceback ...\nRuntimeError: boom\n")
    status = study_status(study_dir)
    assert status.trials[1].state == "failed" and status.trials[1].error == str(running / TRIAL_ERROR)
    assert f"gpt2 seed 1: traceback in {running / TRIAL_ERROR}" in status_table(status).caption


def test_the_line_view_says_each_cluster_state_however_briefly_it_lasted(study_dir):
    """A node that boots between two ticks of the line view (CI, `ray job logs`): the view still says that
    the study waited for it, then that the nodes are ready; an earlier run's states are not repeated."""
    import io

    from rich.console import Console

    from rayb.report import progress
    from rayb.report.status import write_cluster

    class Ticks:
        """The view's stop event: before its first look the node is asked for and boots; it stops after
        its second look."""

        looks = 0

        def wait(self, _timeout: float) -> bool:
            self.looks += 1
            if self.looks == 1:
                write_cluster(study_dir, "waiting for nodes: the autoscaler is starting 1 cpu2")
                write_cluster(study_dir, None)
            return self.looks > 2

    write_cluster(study_dir, "stopped: an earlier run's")
    out = io.StringIO()
    progress._lines(study_dir, Console(file=out, width=200), Ticks())
    said = [line for line in out.getvalue().splitlines() if line.startswith("rayb cluster")]
    assert said == [
        "rayb cluster: waiting for nodes: the autoscaler is starting 1 cpu2",
        "rayb cluster: nodes ready",
    ]
