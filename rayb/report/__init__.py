"""A study's report: the verdict and its evidence as markdown, self-contained HTML, JSON and plots
(study_report.py), built from the results table and the provenance record alone."""

from __future__ import annotations

import threading

from rayb import threads


def import_in_background() -> threading.Thread:
    """Start importing what the report is built with (scipy.stats for the verdict, matplotlib for the
    figures, rayb's analysis: 2-2.5 s of a laptop study's end on 2 cores) in a thread: the driver does it
    while its first worker group starts, on CPU the group's processes leave idle. A one-seed study's report
    then took 1.1 s against 2.0-2.8 s, its group's start and set-up no longer (two interleaved pairs on 2
    cores). Join the thread before the report."""
    return threads.import_in_background(
        "rayb.report.study_report", "matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.ticker",
        name="rayb-report-imports", idle_cpu_only=True,
    )  # fmt: skip
