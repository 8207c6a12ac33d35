"""What `rayb run` shows while a study runs, read from the same files as `rayb status` (status.py).

On a terminal: a live table, one row per trial (step, loss, tokens/s, ETA, state) and one for the
evaluations, redrawn every second under rayb's own lines. Elsewhere (CI, `ray job logs`): a line when a
trial changes state, and a heartbeat with the counts when nothing else was said for HEARTBEAT_S. Watching
never stops a study: a file read mid-write is read again at the next tick.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.live import Live

from rayb import storage
from rayb.report.status import StudyStatus, status_table, study_status
from rayb.threads import beside

TICK_S = 1.0
REMOTE_TICK_S = 5.0  # a study on object storage: each tick is a few requests per trial
HEARTBEAT_S = 30.0


@contextmanager
def watching(study_dir: Path | str, console: Console) -> Iterator[None]:
    """Show the study's progress while the block runs (the study directory may not exist yet)."""
    show = _live if console.is_terminal else _lines
    with beside(lambda stop: show(study_dir, console, stop), "rayb-progress"):
        yield


def _read(study_dir: Path | str) -> StudyStatus | None:
    try:
        return study_status(study_dir)
    except (OSError, ValueError):  # not planned yet, or a file caught mid-write: the next tick reads it
        return None


def _new_cluster_states(status: StudyStatus, printed: int) -> list[str | None]:
    """The cluster states written after the first `printed` of them: each one, however briefly it lasted
    between two ticks."""
    news = min(status.cluster_changes - printed, len(status.cluster_history))
    return list(status.cluster_history[len(status.cluster_history) - news :]) if news > 0 else []


def _tick(study_dir: Path | str) -> float:
    return REMOTE_TICK_S if storage.is_remote(study_dir) else TICK_S


def _live(study_dir: Path | str, console: Console, stop: threading.Event) -> None:
    with Live(console=console, auto_refresh=False) as live:  # the last table stays, above the verdict
        while not stop.wait(_tick(study_dir)):
            if status := _read(study_dir):
                live.update(status_table(status), refresh=True)


def _lines(study_dir: Path | str, console: Console, stop: threading.Event) -> None:
    states: dict[tuple[str, float, int], str] = {}
    printed = status.cluster_changes if (status := _read(study_dir)) else 0  # an earlier run's are not news
    said = time.monotonic()
    while not stop.wait(_tick(study_dir)):
        status = _read(study_dir)
        if status is None:
            continue
        new, printed = _new_cluster_states(status, printed), status.cluster_changes
        for cluster in new:
            console.print(f"rayb cluster: {cluster or 'nodes ready'}", highlight=False)
            said = time.monotonic()
        for t in status.trials:
            if states.get((t.model, t.lr, t.seed), "queued") != t.state:
                states[(t.model, t.lr, t.seed)] = t.state
                where = f" (traceback: {t.error})" if t.error else ""
                console.print(
                    f"rayb trial {t.model} seed {t.seed} lr {t.lr:.3g}: {t.state}{where}", highlight=False
                )
                said = time.monotonic()
        if time.monotonic() - said >= HEARTBEAT_S:
            counts = [t.state for t in status.trials]
            summary = ", ".join(f"{counts.count(s)} {s}" for s in dict.fromkeys(counts))
            console.print(
                f"rayb status: {summary}; evaluations {status.evaluations_done}/{status.evaluations_total}",
                highlight=False,
            )
            said = time.monotonic()
