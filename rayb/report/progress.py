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

from rayb.report.status import TRIALS_NAME, StudyStatus, status_table, study_status

TICK_S = 1.0
HEARTBEAT_S = 30.0


@contextmanager
def watching(study_dir: Path, console: Console) -> Iterator[None]:
    """Show the study's progress while the block runs (the study directory may not exist yet)."""
    stop = threading.Event()
    show = _live if console.is_terminal else _lines
    thread = threading.Thread(target=show, args=(study_dir, console, stop), name="rayb-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _read(study_dir: Path) -> StudyStatus | None:
    if not (study_dir / TRIALS_NAME).is_file():
        return None
    try:
        return study_status(study_dir)
    except (OSError, ValueError):  # a file caught mid-write: the next tick reads it whole
        return None


def _live(study_dir: Path, console: Console, stop: threading.Event) -> None:
    with Live(console=console, auto_refresh=False) as live:  # the last table stays, above the verdict
        while not stop.wait(TICK_S):
            if status := _read(study_dir):
                live.update(status_table(status), refresh=True)


def _lines(study_dir: Path, console: Console, stop: threading.Event) -> None:
    states: dict[tuple[str, float, int], str] = {}
    said = time.monotonic()
    while not stop.wait(TICK_S):
        status = _read(study_dir)
        if status is None:
            continue
        for t in status.trials:
            if states.get((t.model, t.lr, t.seed), "queued") != t.state:
                states[(t.model, t.lr, t.seed)] = t.state
                console.print(f"rayb trial {t.model} seed {t.seed} lr {t.lr:.3g}: {t.state}", highlight=False)
                said = time.monotonic()
        if time.monotonic() - said >= HEARTBEAT_S:
            counts = [t.state for t in status.trials]
            summary = ", ".join(f"{counts.count(s)} {s}" for s in dict.fromkeys(counts))
            console.print(
                f"rayb status: {summary}; evaluations {status.evaluations_done}/{status.evaluations_total}",
                highlight=False,
            )
            said = time.monotonic()
