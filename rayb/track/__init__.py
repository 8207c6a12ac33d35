"""Experiment trackers: TensorBoard, MLflow and Weights & Biases mirror a study's trials.

The driver feeds them (rayb/track/driver.py), never the training workers: a thread tails each trial's
metrics.jsonl and result files, so a tracker can neither slow a training step nor fail one, and it works
the same on a cluster (the trial files are on storage every node shares). Each tracker is one module that
registers a factory here by name; each uses its library's own client.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayb.registry import Registry


@dataclass(frozen=True)
class TrialRun:
    """One trial as a tracker's run: its key, a readable name and its parameters (flat, JSON values)."""

    key: str
    name: str  # <model>-lr<lr>-seed<seed>: unique in a study
    group: str  # the study's name
    params: dict[str, Any]


class Tracker:
    """What the driver calls, always from one thread. `destination` names it in messages."""

    destination: str

    def start_trial(self, run: TrialRun) -> None:
        raise NotImplementedError

    def log(self, key: str, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Metrics of trial `key`, as (step, {name: value}) in step order."""
        raise NotImplementedError

    def finish_trial(self, key: str, results: dict[str, float], ok: bool) -> None:
        raise NotImplementedError

    def finish_study(self, files: list[Path], ok: bool) -> None:
        """The study's report and results files once written (none if the report failed): trackers with a
        study-level run attach them and end it."""

    def close(self) -> None:
        """Release what is still open (runs of trials that never finished)."""


# name -> factory(setting, study, study_dir) -> Tracker; the setting is the study's `tracking.<name>`.
TRACKERS: Registry[Any] = Registry(
    "tracker",
    builtins={
        "tensorboard": "rayb.track.tensorboard",
        "mlflow": "rayb.track.mlflow",
        "wandb": "rayb.track.wandb",
    },
)
