"""One trial: a (model, learning rate, seed) cell of a study, and where its outputs live; and a pack, the
trials one Ray Train worker group trains one after another, or takes from the queue it shares with other
groups of the study's worker pool (see `rayb.tune.packs`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rayb import storage
from rayb.files import digest
from rayb.train.spec import TrainSpec

TRAIN_DONE = "train_result.json"  # written last by the training loop: its presence means "trained"
TRIAL_ERROR = "error.txt"  # the traceback of a trial whose training failed (cleared when it trains again)
LATEST_CHECKPOINT = "checkpoint.json"  # in a trial's directory: its latest checkpoint, in whichever run


def checkpoint_tag(key: str, step: int) -> str:
    """DeepSpeed's tag for a trial's checkpoint after `step` steps: it names the trial, so a pack's run
    knows whose its latest checkpoint is."""
    return f"{key}-step{step}"


def checkpoint_record(run: str, checkpoint: str, tag: str) -> dict[str, str]:
    """A trial's checkpoint as its record names it: its Ray Train run and its directory there (relative to
    the storage path: the same from every node), and DeepSpeed's tag."""
    return {"run": run, "checkpoint": storage.name(checkpoint), "tag": tag}


def tag_trial(tag: str) -> str:
    return tag.rpartition("-step")[0]


def tag_step(tag: str) -> int:
    return int(tag.rpartition("-step")[2])


@dataclass(frozen=True)
class TrialSpec:
    key: str
    model: str  # label
    arch: str
    model_config: dict[str, Any]
    lr: float
    seed: int
    train: TrainSpec
    steps: int
    cache_dir: str  # locations: local paths, or URIs on object storage (rayb/storage.py)
    trial_dir: str
    storage_path: str  # Ray Train storage for DeepSpeed checkpoints
    train_flops_per_token: float = 0.0  # the model's analytic (or measured) training FLOPs per token
    init_from: dict[str, Any] | None = None  # a Checkpoint (models/pretrained.py) to start from

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, as a trial crosses into Ray (a Train run's config)."""
        return asdict(self) | {"train": self.train.model_dump(mode="json")}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrialSpec:
        return cls(**values | {"train": TrainSpec.model_validate(values["train"])})

    @property
    def run_name(self) -> str:
        # Stable across relaunches, so Ray Train finds this trial's latest checkpoint and resumes it.
        return f"{self.model}-{self.key}"

    @property
    def done(self) -> bool:
        return storage.exists(storage.join(self.trial_dir, TRAIN_DONE))


@dataclass(frozen=True)
class TrialPack:
    """Trials that fit one worker group, trained by it one after another: the group's start-up (its
    processes, imports, process group) is paid once, and each trial still has its own files. In the
    study's worker pool (`group` set), the trials are a queue shared by every group of that shape, and
    each group trains those it takes (tune/group.py's TrialQueue)."""

    trials: tuple[TrialSpec, ...]
    threads: int = 1  # torch threads per worker
    group: int | None = None  # in the worker pool: this group's number among those sharing the queue

    @property
    def train(self) -> TrainSpec:
        return self.trials[0].train

    @property
    def pending(self) -> list[TrialSpec]:
        return [t for t in self.trials if not t.done]

    @property
    def storage_path(self) -> str:
        return self.trials[0].storage_path

    @property
    def queue(self) -> str:
        """The name of the trials' queue, the same for every group that shares it."""
        return digest([t.key for t in self.trials], length=12)

    @property
    def run_name(self) -> str:
        """The Ray Train run's name: stable across relaunches of the same group, so the run finds its latest
        checkpoint. A relaunch that groups the trials differently (other trials pending, a cluster of
        another size) resumes each trial through its own record of its checkpoint (train/loop.py)."""
        if self.group is not None:
            return f"pool-{self.queue}-{self.group}"
        if len(self.trials) == 1:
            return self.trials[0].run_name
        return f"pack-{self.queue}"

    def to_dict(self) -> dict[str, Any]:
        return {"trials": [t.to_dict() for t in self.trials], "threads": self.threads, "group": self.group}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrialPack:
        trials = tuple(TrialSpec.from_dict(t) for t in values["trials"])
        return cls(trials, values["threads"], values["group"])


def read_metrics(location: Path | str) -> list[dict[str, Any]]:
    """Read a trial's metrics log; a step logged twice (before and after a resume) keeps its last line."""
    data = storage.read_bytes(location)
    if data is None:
        return []
    latest: dict[tuple[str, int], dict] = {}
    for line in data.decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
        latest[(rec["kind"], rec["step"])] = rec
    return sorted(latest.values(), key=lambda r: (r["step"], r["kind"]))
