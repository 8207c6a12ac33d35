"""Where a run's wall-clock went, stage by stage (bench/overhead.py and bench/gpu_check.py read it)."""

from __future__ import annotations

import time

TIMINGS = "timings.json"  # in the study directory: {stage}_s for each stage of the run that wrote it


class Stages:
    """Seconds spent in each stage of a run, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()

    def end(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[f"{stage}_s"] = round(now - self._since, 3)
        self._since = now
