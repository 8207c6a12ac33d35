"""TensorBoard: one event-file directory per trial, <study dir>/tensorboard/<model>-lr<lr>-seed<seed>, so
`tensorboard --logdir <study dir>/tensorboard` overlays a study's trials."""

from __future__ import annotations

import json
from pathlib import Path

from rayb.track import TRACKERS, Tracker, TrialRun


class TensorBoardTracker(Tracker):
    def __init__(self, root: Path):
        from torch.utils.tensorboard import SummaryWriter  # writes through tensorboard's own event writer

        self._writer_type = SummaryWriter
        self.root, self.destination = root, f"tensorboard at {root}"
        self.writers: dict[str, SummaryWriter] = {}
        self.last_step: dict[str, int] = {}

    def start_trial(self, run: TrialRun) -> None:
        writer = self._writer_type(log_dir=str(self.root / run.name), flush_secs=10)
        writer.add_text("params", f"```\n{json.dumps(run.params, indent=1, sort_keys=True)}\n```")
        self.writers[run.key], self.last_step[run.key] = writer, 0

    def log(self, key: str, rows: list[tuple[int, dict[str, float]]]) -> None:
        writer = self.writers[key]
        for step, metrics in rows:
            for name, value in metrics.items():
                writer.add_scalar(name, value, global_step=step)
        self.last_step[key] = rows[-1][0]
        writer.flush()

    def finish_trial(self, key: str, results: dict[str, float], ok: bool) -> None:
        writer, step = self.writers.pop(key), self.last_step.pop(key)
        for name, value in results.items():  # at the last step trained, beside the curves they end
            writer.add_scalar(name, value, global_step=step)
        writer.close()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()


@TRACKERS.decorator("tensorboard")
def make(setting: bool, study, study_dir: Path) -> TensorBoardTracker:
    return TensorBoardTracker(study_dir / "tensorboard")
