"""Which trials share a worker group: the study's worker pool.

Starting a trial on Ray costs a controller, a placement group, worker processes, their imports and a
process group: seconds each, more than a small model's whole training. The pool pays that once per
worker group: each group takes trials, one after another, from a queue of the trials that fit it (the
same workers and GPUs: a model's seeds and learning rates, and the other models of rayb's own
architectures, since each trial builds its own model and engine). A user's model (named by import path)
has groups of its own, so a bug in it stops no baseline. A shape gets as many groups as fill the trial
slots, in proportion to its trials; a group that finishes early takes the next trial, so none idles
while another has a queue.

Pure logic (no Ray): the groups follow from the trials and the slot count alone (tune/sweep.py runs
them); a relaunch resumes each unfinished trial from its own record of its checkpoint (train/loop.py),
whichever group takes it.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, replace

from rayb.registry import is_import_path
from rayb.train.spec import TrainSpec
from rayb.train.trial import TrialPack, TrialSpec


def group_of(model: str, arch: str, train: TrainSpec) -> str:
    """What the trials of a pack share: the worker group (its workers, their GPUs); and for a user's model,
    the model itself."""
    own = model if is_import_path(arch) else None
    return json.dumps([train.num_workers, train.use_gpu, train.gpus_per_trial, own])


# An autoscaler with no upper bound reports sys.maxsize; worker groups beyond this many at once are not useful.
MAX_AUTOSCALED_GROUPS = 4096


@dataclass(frozen=True)
class NodeType:
    """A kind of node an autoscaler may launch: its resources, and how many of it at most."""

    name: str
    resources: dict[str, float]
    max_workers: int


@dataclass(frozen=True)
class Capacity:
    """What trials may use: each live node's resources, and what an autoscaler may bring up."""

    nodes: tuple[dict[str, float], ...]
    node_types: tuple[NodeType, ...] = ()  # what the autoscaler may launch, where rayb can read it
    # An autoscaler runs. With no node_types, rayb cannot see what it may add: nothing is refused for
    # want of nodes (Ray Train does the same with an unknown limit).
    scales: bool = False

    @classmethod
    def of_gpus(cls, gpus: float) -> Capacity:
        """A cluster described only by its GPUs (`rayb plan`): CPUs are not what limits it."""
        return cls(({"GPU": gpus, "CPU": math.inf},))

    @property
    def unknown(self) -> bool:
        """An autoscaler whose node types rayb cannot read: any trial may fit once it scales."""
        return self.scales and not self.node_types

    def largest(self) -> list[tuple[dict[str, float], int]]:
        """The cluster at its largest, as (node, how many): the live nodes, and every node type the
        autoscaler may launch at its max_workers."""
        launchable = [(t.resources, t.max_workers) for t in self.node_types if t.max_workers > 0]
        return [(node, 1) for node in self.nodes] + launchable


def worker_resources(train: TrainSpec) -> dict[str, float]:
    """What one Train worker holds: a CPU, and its GPU share. Ray Train's controller holds nothing, so a
    trial takes exactly its workers'."""
    return {"CPU": 1.0} | ({"GPU": train.gpus_per_worker} if train.use_gpu else {})


def _workers_on(node: dict[str, float], train: TrainSpec) -> int:
    return int(min(node.get(name, 0.0) / amount + 1e-9 for name, amount in worker_resources(train).items()))


def one_node(train: TrainSpec, capacity: Capacity) -> bool:
    """Whether a worker group is placed on a single node (STRICT_PACK: NCCL over NVLink, not the network):
    where some live node, or a node type the autoscaler may launch, holds all its workers. Otherwise its
    workers spread over nodes (PACK: as few as Ray can). With node types rayb cannot read and no live node
    that holds the group, it spreads: a group held to one node that no node type has would wait forever."""
    return any(_workers_on(node, train) >= train.num_workers for node, _ in capacity.largest())


def groups_fitting(train: TrainSpec, nodes: list[tuple[dict[str, float], int]], on_one_node: bool) -> int:
    """Worker groups that fit at once on `nodes` ((node, how many) pairs): each on a single node when
    `on_one_node`, else across any nodes."""
    workers = [(_workers_on(node, train), count) for node, count in nodes]
    if on_one_node:
        return sum((w // train.num_workers) * count for w, count in workers)
    return sum(w * count for w, count in workers) // train.num_workers


def trial_slots(train: TrainSpec, capacity: Capacity) -> int:
    """Worker groups that can train at once: the study's max_concurrent_trials, else as many as the
    nodes hold, or as the cluster holds once its autoscaler has launched every node type it may (a
    cluster that scales up from zero GPUs still runs its trials side by side)."""
    if train.max_concurrent_trials:
        return train.max_concurrent_trials
    packed = one_node(train, capacity)
    now = groups_fitting(train, [(node, 1) for node in capacity.nodes], packed)
    later = groups_fitting(train, capacity.largest(), packed)
    return max(1, now, min(later, MAX_AUTOSCALED_GROUPS))


def unfittable(train: TrainSpec, capacity: Capacity) -> str | None:
    """Why no trial can ever start on this cluster (None when one can, now or once it has scaled up, or
    when an autoscaler runs whose node types rayb cannot read)."""
    if capacity.unknown or groups_fitting(train, capacity.largest(), one_node(train, capacity)):
        return None
    per_worker = worker_resources(train)
    need = ", ".join(f"{amount * train.num_workers:g} {name}" for name, amount in per_worker.items())

    def shape(node: dict[str, float]) -> str:
        return ", ".join(f"{node.get(name, 0):g} {name}" for name in per_worker)

    have = "; ".join(shape(node) for node in capacity.nodes)
    types = "; ".join(f"{t.name}: {shape(t.resources)}, at most {t.max_workers}" for t in capacity.node_types)
    return (
        f"a trial needs {need} (train.num_workers: {train.num_workers}, each worker 1 CPU"
        + (f" and {per_worker['GPU']:g} GPU" if "GPU" in per_worker else "")
        + f"), but the cluster's nodes have {have or 'nothing'}"
        + (f" and its autoscaler's node types ({types}) add no more" if types else
           " and it has no autoscaler that could add more")
        + ". Lower train.num_workers, or give Ray more resources (ray start --num-cpus/--num-gpus, a bigger "
        "node, or a node type in the autoscaler's configuration that fits)"
    )  # fmt: skip


def groups_per_queue(sizes: list[int], slots: int) -> list[int]:
    """How many worker groups serve queues of these sizes, so that there are `slots` groups (or one per
    trial): each further group goes to the queue with the most trials per group (the first of equals)."""
    cuts = [1] * len(sizes)
    while sum(cuts) < slots:
        splittable = [i for i, size in enumerate(sizes) if cuts[i] < size]
        if not splittable:
            break
        cuts[max(splittable, key=lambda i: -(-sizes[i] // cuts[i]))] += 1
    return cuts


def _cost(trial: TrialSpec) -> float:
    return trial.train_flops_per_token * trial.steps


def _queues(trials: list[TrialSpec]) -> list[list[TrialSpec]]:
    """A queue of trials per group shape, costliest first (the longest trials start first, so none starts
    last and runs on alone)."""
    queues: dict[str, list[TrialSpec]] = {}
    for trial in trials:
        queues.setdefault(group_of(trial.model, trial.arch, trial.train), []).append(trial)
    return [sorted(queue, key=lambda t: -_cost(t)) for queue in queues.values()]


def _threads(cores: int, at_once: int, train: TrainSpec) -> int:
    """Torch threads per worker, where `at_once` groups share `cores`."""
    return max(1, cores // (at_once * train.num_workers))


def worker_pool(trials: list[TrialSpec], slots: int, cores: int) -> list[TrialPack]:
    """The worker groups that train `trials`: per group shape, a queue of its trials (`_queues`), served by
    as many groups as `groups_per_queue` gives it (`TrialPack.group`). The groups that run at once share
    `cores` among their workers as torch threads."""
    queues = _queues(trials)
    groups = [
        TrialPack(tuple(queue), group=i)
        for queue, count in zip(queues, groups_per_queue([len(q) for q in queues], slots), strict=True)
        for i in range(count)
    ]
    if not groups:
        return []
    threads = _threads(cores, min(slots, len(groups)), trials[0].train)
    return [replace(g, threads=threads) for g in groups]


# The share of a small model's CPU training step that more torch threads do not speed up (Amdahl's law),
# from bench/overhead.py's smoke-study gpt2 on 2 cores: its trial trained 1.5-1.8x faster alone on 2
# threads than on 1 thread beside a second group (28 s against 43 s; 22 s against 37-39 s on another day),
# a share of 0.12-0.30.
SERIAL_SHARE = 0.25
# A CPU training step: a fixed cost (Python, DeepSpeed's engine, the loop's log), then its FLOPs at a core's
# rate. The tiny test study's 43K-parameter gpt2 took 16 ms a step on 2 cores, its FLOPs a tenth of a
# millisecond; the smoke study's 1M-parameter gpt2 0.18 s on 2 threads for 1.3e10 FLOPs: 5e10 a second on
# one thread (2 cores, 2026-12).
STEP_S = 0.015
CORE_FLOPS = 5e10
# What one more worker group takes from the cores as it starts: its Train worker's imports (torch,
# DeepSpeed, transformers), its controller and synchronization actor. The tiny study's four trials took
# 2.5-10 CPU-seconds more, and 0.6-3.9 s more wall, on two groups at once than on one (five pairs of
# `rayb run`, 2 cores, 2026-12-08).
GROUP_START_CPU_S = 5.0


def thread_speedup(threads: int) -> float:
    return 1.0 / (SERIAL_SHARE + (1.0 - SERIAL_SHARE) / threads)


def trial_seconds(trial: TrialSpec, seq_len: int, threads: int) -> float:
    """A CPU trial's training time on `threads` torch threads, by the step model above."""
    flops_per_step = trial.train_flops_per_token * trial.train.global_batch * seq_len
    return trial.steps * (STEP_S + flops_per_step / (CORE_FLOPS * thread_speedup(threads)))


def groups_at_once(trials: list[TrialSpec], slots: int, capacity: Capacity, seq_len: int) -> int:
    """How many of the `slots` worker groups that fit should train at once: on one CPU node, the count that
    ends soonest, its groups sharing the node's cores as torch threads (`thread_speedup`), each group after
    the first taking the cores' time its start costs (GROUP_START_CPU_S). Three seeds on two cores end
    sooner one after another on both cores than two at once and then the third alone on one; ten end sooner
    two at a time; seeds of a second each sooner on one group than on two that both start. A GPU study, one
    spread over nodes (whose threads are each node's), and one that sets max_concurrent_trials run every
    slot."""
    if not trials or len(capacity.nodes) != 1 or capacity.scales:
        return slots
    train = trials[0].train
    if train.use_gpu or train.max_concurrent_trials:
        return slots
    cores = int(capacity.nodes[0].get("CPU", 1))
    queues = _queues(trials)

    def wall(at_once: int) -> float:
        threads = _threads(cores, at_once, train)
        durations = [[trial_seconds(t, seq_len, threads) for t in queue] for queue in queues]
        groups = groups_per_queue([len(q) for q in queues], at_once)
        return makespan(durations, groups, at_once) + (at_once - 1) * GROUP_START_CPU_S / cores

    return min(range(1, min(slots, len(trials)) + 1), key=wall)  # the fewest groups of equals


def makespan(queues: list[list[float]], groups: list[int], slots: int) -> float:
    """How long the pool takes: queues of trial durations, each served in order by its number of `groups`,
    at most `slots` groups at once (the rest start as groups end); each group takes its queue's next trial
    as soon as it is free, and ends when the queue is empty."""
    waiting = [list(queue) for queue in queues]
    to_start = [i for i, count in enumerate(groups) for _ in range(count)]
    running: list[tuple[float, int]] = []  # (when its trial ends, its queue)
    now = 0.0
    while to_start or running:
        while to_start and len(running) < slots:
            queue = to_start.pop(0)
            if waiting[queue]:
                heapq.heappush(running, (now + waiting[queue].pop(0), queue))
        if not running:
            break
        now, queue = heapq.heappop(running)
        if waiting[queue]:
            heapq.heappush(running, (now + waiting[queue].pop(0), queue))
    return now
