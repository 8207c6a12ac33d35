"""A cache build's time split: a line per stage for whoever watches, the manifest's `build_stages`, and the
seconds each part of a task takes (summed over tasks by the driver)."""

from __future__ import annotations

import time
from collections.abc import Callable


class BuildLog:
    """What each stage of a build did and how long it took: the manifest's `build_stages`, and a line per
    stage for whoever watches the build (`rayb data prepare` prints them)."""

    def __init__(self, progress: Callable[[str], None]):
        self.progress, self.stages = progress, {}
        self._began = self._last = time.perf_counter()

    def done(self, stage: str, detail: str = "", **counts) -> None:
        """A stage has ended now. counts: rows, tokens, docs, and seconds its tasks spent per part (`*_s`)."""
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        self.stages[stage] = {"s": round(seconds, 2), **{k: round(v, 2) for k, v in counts.items()}}
        self.progress(stage_line(stage, seconds, detail, counts))

    def total_s(self) -> float:
        return round(time.perf_counter() - self._began, 2)


def stage_line(stage: str, seconds: float, detail: str, counts: dict) -> str:
    """'tokenize: 5,000 documents, 1,234,567 tokens in 2.1 s (0.59M tokens/s)'."""
    what = [f"{counts[k]:,} {k}" for k in ("docs", "rows") if k in counts]
    if "tokens" in counts:
        what.append(f"{counts['tokens']:,} tokens")
    rate = f" ({counts['tokens'] / max(seconds, 1e-9) / 1e6:.2f}M tokens/s)" if counts.get("tokens") else ""
    return f"{stage}: {', '.join([detail] * bool(detail) + what)} in {seconds:.1f} s{rate}".replace(
        "docs", "documents"
    )


class Clock:
    """Seconds spent in each part of a task, for the build's time split (manifest `build_stages`)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        self.laps[f"{part}_s"] = self.laps.get(f"{part}_s", 0.0) + now - self._last
        self._last = now
