"""`rayb status`: where a study stands, read from its files alone, for a study running in another process,
on a cluster (beside `ray job logs`), or finished.

The runner writes the study's trials to `trials.json` in the study directory when it plans them (and again
at each round of adaptive seeds); every trial writes its own `metrics.jsonl` as it trains,
`train_result.json` when it ends, and one result file per evaluation. A trial's state follows from those:
queued (no step logged), running, resumed (its log starts over after a restart), done, diverged or failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from rayb.eval.actors import read_result
from rayb.files import read_json
from rayb.train.loop import METRICS
from rayb.train.trial import TRAIN_DONE, TrialSpec, read_metrics

TRIALS_NAME = "trials.json"
RECENT_STEPS = 10  # the steps whose mean time gives a running trial's ETA


@dataclass(frozen=True)
class TrialStatus:
    model: str
    seed: int
    lr: float
    step: int
    steps: int
    loss: float | None  # the last training loss logged
    tokens_per_s: float | None
    eta_s: float | None  # at the recent steps' pace; None unless running
    state: str  # queued, running, resumed, done, diverged or failed


@dataclass(frozen=True)
class StudyStatus:
    name: str
    trials: list[TrialStatus]
    evaluations_done: int
    evaluations_total: int
    finished: bool  # the study's results table is written


def write_trials(study_dir: Path, trials: list[TrialSpec]) -> None:
    """The trials a study runs, for `rayb status` (rewritten when adaptive seeds add a round)."""
    from rayb.files import write_json_atomic

    write_json_atomic(study_dir / TRIALS_NAME, [t.to_dict() for t in trials])


def study_status(study_dir: Path) -> StudyStatus:
    """Every trial's state and the evaluations done, from the study directory and the trials' files.
    Raises FileNotFoundError for a directory that is not a study rayb has planned."""
    from rayb.results import RESULTS_NAME

    study_dir = Path(study_dir)
    listed = study_dir / TRIALS_NAME
    if not listed.is_file():
        raise FileNotFoundError(
            f"{listed} does not exist: give a study directory (OUTPUT/studies/<name>-<hash>) of a study that "
            "has started training, or the output directory holding it"
        )
    trials = [TrialSpec.from_dict(t) for t in json.loads(listed.read_text())]
    study = read_json(study_dir / "provenance.json").get("study", {})
    suites = study.get("eval", ["lm"])
    options = study.get("eval_options", {})
    trained = [t for t in trials if read_json(Path(t.trial_dir) / TRAIN_DONE).get("status") == "ok"]
    done = sum(
        bool(read_result(Path(t.trial_dir), suite, options.get(suite.split(":")[0], {})).get("status"))
        for t in trained
        for suite in suites
    )
    return StudyStatus(
        name=study.get("name", study_dir.name), trials=[_trial_status(t) for t in trials],
        evaluations_done=done, evaluations_total=len(trained) * len(suites),
        finished=(study_dir / RESULTS_NAME).is_file(),
    )  # fmt: skip


def _trial_status(trial: TrialSpec) -> TrialStatus:
    trial_dir = Path(trial.trial_dir)
    result = read_json(trial_dir / TRAIN_DONE)
    train = [r for r in read_metrics(trial_dir / METRICS) if r["kind"] == "train"]
    last: dict[str, Any] = train[-1] if train else {}
    step = int(result.get("steps", last.get("step", 0)))
    if result:
        state = {"ok": "done", "diverged": "diverged"}.get(result.get("status"), "failed")
    else:
        state = "queued" if not train else ("resumed" if _restarted(trial_dir / METRICS) else "running")
    eta = None
    if state in ("running", "resumed"):
        recent = [r["step_s"] for r in train[-RECENT_STEPS:]]
        eta = (trial.steps - step) * sum(recent) / len(recent)
    return TrialStatus(
        trial.model,
        trial.seed,
        trial.lr,
        step,
        trial.steps,
        last.get("loss"),
        last.get("tokens_per_s"),
        eta,
        state,
    )


def _restarted(log: Path) -> bool:
    """Whether a trial's raw log starts over somewhere: it resumed from a checkpoint."""
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines() if '"kind": "train"' in line]
    return any(b <= a for a, b in zip(steps, steps[1:], strict=False))


def status_table(status: StudyStatus) -> Table:
    """One row per trial, then the evaluations."""
    states = [t.state for t in status.trials]
    summary = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
    table = Table(title=f"{status.name}: {len(states)} trials ({summary})")
    for column in ("model", "seed", "lr", "step", "loss", "tokens/s", "ETA", "state"):
        table.add_column(column, justify="left" if column in ("model", "state") else "right")
    for t in status.trials:
        table.add_row(
            t.model, str(t.seed), f"{t.lr:.3g}", f"{t.step}/{t.steps}", _fmt(t.loss, ".4f"),
            _fmt(t.tokens_per_s, ",.0f"), _eta(t.eta_s), t.state,
        )  # fmt: skip
    table.add_row(
        "evaluation", "", "", f"{status.evaluations_done}/{status.evaluations_total}", "", "", "",
        "done" if status.finished else "jobs done / total",
    )  # fmt: skip
    return table


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
