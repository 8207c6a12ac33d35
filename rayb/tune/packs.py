"""Which trials share a worker group: every trial that fits the same group, packed, split only to fill slots.

Starting a trial on Ray costs a controller, a placement group, worker processes, their imports and a
process group: seconds each, more than a small model's whole training. A pack (`TrialPack`) pays that
once for trials that ask for the same worker group (workers, GPUs): a model's seeds and learning rates,
and the other models of rayb's own architectures, since each trial builds its own model and engine.
A user's model (named by import path) packs only with its own trials, so a bug in it stops no
baseline. Packs are split only where whole packs would leave trial slots idle: their trials are cut
into near-equal, in-order packs that run side by side.

Pure logic (no Ray): packs follow from the study's full trial list and the slot count alone, so a rerun
on the same cluster rebuilds the same packs under the same Ray Train run names, and a pack killed
mid-trial resumes that trial from its checkpoint.
"""

from __future__ import annotations

import json
from typing import TypeVar

from rayb.models.registry import is_import_path
from rayb.train.spec import TrainSpec
from rayb.train.trial import TrialPack, TrialSpec

T = TypeVar("T")


def group_of(model: str, arch: str, train: TrainSpec) -> str:
    """What the trials of a pack share: the worker group (its workers, their GPUs); and for a user's model,
    the model itself."""
    own = model if is_import_path(arch) else None
    return json.dumps([train.num_workers, train.use_gpu, train.gpus_per_trial, own])


def trial_slots(train: TrainSpec, devices: float) -> int:
    """Worker groups that can train at once on `devices` GPUs (or CPU cores): the study's
    max_concurrent_trials, else as many as the devices hold (four 0.25-GPU trials to a GPU)."""
    if train.max_concurrent_trials:
        return train.max_concurrent_trials
    per_group = train.num_workers * (train.gpus_per_worker if train.use_gpu else 1)
    return max(1, int(devices // per_group + 1e-9))


def split_groups(groups: list[list[T]], slots: int) -> list[list[T]]:
    """Cut groups into near-equal, in-order chunks until there are `slots` of them (or every chunk is one
    item): each further cut goes to the group whose chunks are largest (the first of equals)."""
    groups = [list(g) for g in groups if g]
    cuts = [1] * len(groups)
    while sum(cuts) < slots:
        splittable = [i for i, g in enumerate(groups) if cuts[i] < len(g)]
        if not splittable:
            break
        cuts[max(splittable, key=lambda i: -(-len(groups[i]) // cuts[i]))] += 1
    return [chunk for group, k in zip(groups, cuts, strict=True) for chunk in _chunks(group, k)]


def _chunks(items: list[T], k: int) -> list[list[T]]:
    size, extra = divmod(len(items), k)
    bounds = [i * size + min(i, extra) for i in range(k + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def pack_trials(trials: list[TrialSpec], slots: int, cores: int) -> list[TrialPack]:
    """Group `trials` by the worker group they need, in their order, and split the groups to fill `slots`.
    The packs that run at once share `cores` among their workers as torch threads."""
    groups: dict[str, list[TrialSpec]] = {}
    for trial in trials:
        groups.setdefault(group_of(trial.model, trial.arch, trial.train), []).append(trial)
    packs = split_groups(list(groups.values()), slots)
    if not packs:
        return []
    threads = max(1, cores // (min(slots, len(packs)) * packs[0][0].train.num_workers))
    return [TrialPack(tuple(p), threads) for p in packs]
