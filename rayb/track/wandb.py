"""Weights & Biases: each trial a run through W&B's client, grouped by the study's name. WANDB_MODE=offline
(W&B's own setting) keeps the runs on disk for `wandb sync`; they go under the study directory unless
WANDB_DIR says where."""

from __future__ import annotations

import os
from pathlib import Path

from rayb.track import TRACKERS, Tracker, TrialRun
from rayb.track.spec import WandbSpec


class WandbTracker(Tracker):
    def __init__(self, setting: WandbSpec, study_dir: Path):
        import wandb

        self.wandb, self.setting = wandb, setting
        # Read here, not left to W&B: its settings are fixed by the first run in a process.
        self.dir = os.environ.get("WANDB_DIR") or str(study_dir)
        mode = os.environ.get("WANDB_MODE", "online")
        self.destination = f"wandb project {setting.project}" + (f" ({mode})" if mode != "online" else "")
        self.runs: dict[str, object] = {}

    def start_trial(self, run: TrialRun) -> None:
        self.runs[run.key] = self.wandb.init(
            project=self.setting.project, entity=self.setting.entity, name=run.name, group=run.group,
            job_type="trial", config=run.params, dir=self.dir,
            reinit="create_new",  # trials of a pack overlap with others' evaluation: one run each, at once
            settings=self.wandb.Settings(silent=True),  # rayb's own output says what runs; W&B's would repeat it
        )  # fmt: skip

    def log(self, key: str, rows: list[tuple[int, dict[str, float]]]) -> None:
        run = self.runs[key]
        for step, metrics in rows:
            run.log(metrics, step=step)

    def finish_trial(self, key: str, results: dict[str, float], ok: bool) -> None:
        run = self.runs.pop(key)
        run.summary.update(results)
        run.finish(exit_code=0 if ok else 1)

    def close(self) -> None:
        for run in self.runs.values():
            run.finish(exit_code=1)
        self.runs.clear()


@TRACKERS.decorator("wandb")
def make(setting: WandbSpec, study, study_dir: Path) -> WandbTracker:
    return WandbTracker(setting, study_dir)
