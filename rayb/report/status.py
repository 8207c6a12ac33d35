"""`rayb status`: where a study stands, read from its files alone, for a study running in another process,
on a cluster (beside `ray job logs`), or finished.

The runner writes the study's trials to `trials.json` in the study directory when it plans them (and again
at each round of adaptive seeds); every trial writes its own `metrics.jsonl` as it trains,
`train_result.json` when it ends, and one result file per evaluation. A trial's state follows from those:
queued (no step logged), running, resumed (from a checkpoint, after a lost worker or node), done, diverged
or failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from rayb import storage
from rayb.eval.actors import read_result
from rayb.files import read_json
from rayb.train.loop import METRICS
from rayb.train.trial import TRAIN_DONE, TRIAL_ERROR, TrialSpec, read_metrics

TRIALS_NAME = "trials.json"
CLUSTER_HISTORY = 20  # the cluster states cluster.json keeps (write_cluster)
CLUSTER_NAME = "cluster.json"  # what the cluster does for the study's trials (sweep.py's ClusterWatch)
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
    error: str | None = None  # where a failed trial's traceback is


@dataclass(frozen=True)
class StudyStatus:
    name: str
    trials: list[TrialStatus]
    evaluations_done: int
    evaluations_total: int
    finished: bool  # the study's results table is written
    cluster: str | None = None  # what the cluster does while trials wait ("waiting for nodes: ...")
    cluster_changes: int = 0  # how many cluster states were ever written (write_cluster) ...
    cluster_history: tuple[str | None, ...] = ()  # ... and the last of them, oldest first


def write_trials(study_dir: Path | str, trials: list[TrialSpec]) -> None:
    """The trials a study runs, for `rayb status` (rewritten when adaptive seeds add a round)."""
    from rayb.files import write_json_atomic

    write_json_atomic(storage.join(study_dir, TRIALS_NAME), [t.to_dict() for t in trials])


def write_cluster(study_dir: Path | str, what: str | None) -> None:
    """What the cluster is doing for the study's trials, in words; None once it is doing nothing for them.
    The record keeps the last CLUSTER_HISTORY of them and counts them all, so a watcher that looks less
    often than the cluster changes (a node that boots between two looks) still says each one."""
    from rayb.files import write_json_atomic

    where = storage.join(study_dir, CLUSTER_NAME)
    before = read_json(where)
    history = (before.get("history") or [])[1 - CLUSTER_HISTORY :] + [what]
    changes = before.get("changes", 0) + 1
    write_json_atomic(where, {"cluster": what, "at": time.time(), "history": history, "changes": changes})


def study_status(study_dir: Path | str) -> StudyStatus:
    """Every trial's state and the evaluations done, from the study directory and the trials' files (on
    local disk or object storage). Raises FileNotFoundError for a directory that is not a study rayb has
    planned."""
    from rayb.results import RESULTS_NAME

    listed = read_json(storage.join(study_dir, TRIALS_NAME))
    if not listed:
        raise FileNotFoundError(
            f"{storage.join(study_dir, TRIALS_NAME)} does not exist: give a study directory "
            "(OUTPUT/studies/<name>-<hash>) of a study that has started training, or the output directory holding it"
        )
    trials = [TrialSpec.from_dict(t) for t in listed]
    study = read_json(storage.join(study_dir, "provenance.json")).get("study", {})
    suites = study.get("eval", ["lm"])
    options = study.get("eval_options", {})
    trained = [t for t in trials if read_json(storage.join(t.trial_dir, TRAIN_DONE)).get("status") == "ok"]
    cluster = read_json(storage.join(study_dir, CLUSTER_NAME))
    done = sum(
        bool(read_result(t.trial_dir, suite, options.get(suite.split(":")[0], {})).get("status"))
        for t in trained
        for suite in suites
    )
    return StudyStatus(
        name=study.get("name", storage.name(study_dir)), trials=[_trial_status(t) for t in trials],
        evaluations_done=done, evaluations_total=len(trained) * len(suites),
        finished=storage.exists(storage.join(study_dir, RESULTS_NAME)),
        cluster=cluster.get("cluster"), cluster_changes=cluster.get("changes", 0),
        cluster_history=tuple(cluster.get("history") or ()),
    )  # fmt: skip


def _trial_status(trial: TrialSpec) -> TrialStatus:
    result = read_json(storage.join(trial.trial_dir, TRAIN_DONE))
    log = read_metrics(storage.join(trial.trial_dir, METRICS))
    train = [r for r in log if r["kind"] == "train"]
    last: dict[str, Any] = train[-1] if train else {}
    step = int(result.get("steps", last.get("step", 0)))
    error = storage.join(trial.trial_dir, TRIAL_ERROR)
    error = error if not result and storage.exists(error) else None
    if result:
        state = {"ok": "done", "diverged": "diverged"}.get(result.get("status"), "failed")
    elif error:
        state = "failed"
    else:
        resumed = any(r["kind"] == "resume" for r in log)
        state = "queued" if not train else ("resumed" if resumed else "running")
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
        error,
    )


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
    failed = [f"{t.model} seed {t.seed}: traceback in {t.error}" for t in status.trials if t.error]
    cluster = [f"cluster: {status.cluster}"] if status.cluster else []
    table.caption = "\n".join(cluster + failed) or None
    return table


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
