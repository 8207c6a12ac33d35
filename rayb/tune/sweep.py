"""The study's worker pool on the cluster: each worker group of the pool (see packs.py) is one Ray Train run.

The driver runs each group's trainer (train/trainer.py) on a thread of its own, `max_concurrent` at once:
its `.fit()` starts the run's controller on the driver's node, whose workers take the study's trials from
a queue shared by every group of their shape (group.TrialQueue) and train them one after another until it
is empty. On rayb's private instance the pool starts its first groups' Train workers itself, before their
controllers, which adopt them (kept.start_warm_workers), and their synchronization actors
(kept.start_sync_actors); those that end cleanly go on to the pool's next group, or to the driver's next
pool. Results are not taken from Ray: every trial writes its own files (see `rayb.train.trial`), so a
crashed study loses nothing and a rerun trains only unfinished trials.

Why not a Ray Tune trial per group: rayb takes nothing from Tune but a concurrency limit and restarts,
and each Tune trial is one more process per group, started before the group's controller and only waiting
on it: 1.5 s more per group start on 2 cores (8.8 s against 7.3 s for a group that imports DeepSpeed and
trains nothing). The driver's threads do the rest (see _run_group).
"""

from __future__ import annotations

import threading
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import ray
from ray.exceptions import RayActorError
from ray.train import TrainingFailedError

from rayb import runtime, storage
from rayb.report.status import write_cluster
from rayb.train.kept import (
    keep_sync_actors,
    keep_warm_workers,
    start_controller_ahead,
    start_sync_actors,
    start_warm_workers,
    start_workers_ahead,
    sync_arguments,
)
from rayb.train.spec import TrainSpec
from rayb.train.trainer import pack_trainer
from rayb.train.trial import TRIAL_ERROR, TrialPack, TrialSpec
from rayb.tune.group import queue_actor
from rayb.tune.packs import one_node, unfittable

# A worker group whose controller is lost (killed, or out of memory) is started again: it takes the trial
# it held again and resumes it from its last checkpoint on storage.
PACK_RESTARTS = 3


class ClusterWatch:
    """Watches the cluster while trials wait and train (`look`, every WATCH_S where an autoscaler may serve
    it, else as groups end): what the autoscaler is starting goes to the study's `cluster.json` for the
    live view and `rayb status`, and a cluster that can no longer ever fit a trial (a fixed cluster that
    lost its nodes) stops the pool, naming why, where the trials would otherwise wait forever."""

    WATCH_S = 1.0  # a node may boot within a few seconds: each look is a GCS read or two

    def __init__(self, train: TrainSpec, study_dir: str | None):
        self.train, self.study_dir = train, study_dir
        self.why: str | None = None
        self._said: str | None = None

    def look(self) -> bool:
        """Whether the pool must stop (`why` says why)."""
        if self.why is None:
            self.why = unfittable(self.train, runtime.capacity())
            self._say(f"stopped: {self.why}" if self.why else runtime.scaling_activity())
        return self.why is not None

    def _say(self, what: str | None) -> None:
        if self.study_dir is not None and what != self._said:
            write_cluster(self.study_dir, what)
            self._said = what


def _starts_workers_ahead(train: TrainSpec) -> bool:
    """Whether a pool starts its groups' Train workers itself, ahead of their controllers: on rayb's private
    instance (which no autoscaler serves), for CPU groups."""
    return runtime.private_instance() and not train.use_gpu


def start_first_group_ahead(train: TrainSpec, trials_left: Callable[[], bool]) -> None:
    """Start the first run's Train controller now (kept.start_controller_ahead), and where a pool starts its
    groups' workers itself, its first group's workers (kept.start_workers_ahead), for the driver's next
    pool: a study's, once its data is prepared, its models checked and its trials planned. Not where the
    pool starts its workers and `trials_left()` says no: a rerun of a finished study starts neither. It is
    asked only there, on rayb's private instance: on a cluster, listing the trials of a shared output on
    object storage would take longer than the controller it might spare (whose start a rerun pays, on no
    critical path)."""
    if _starts_workers_ahead(train):
        if not trials_left():
            return
        start_workers_ahead(train.num_workers)
    start_controller_ahead()


def queue_name() -> str:
    """A name for a pool's TrialQueue actor, unique on the cluster."""
    return f"rayb-trials-{uuid.uuid4().hex[:12]}"


def run_pool(
    groups: list[TrialPack], max_concurrent: int, study_dir: str | None = None, name: str | None = None
) -> dict[str, str]:
    """Train the groups' trials, `max_concurrent` groups at once; return {trial key: error message} for those
    that failed or were left untrained, whose full traceback each one's directory keeps (TRIAL_ERROR, for
    `rayb status` and the live view). What the cluster is doing while trials wait goes to `study_dir` (see
    ClusterWatch). The pool's queue is the actor `name` (default: a new queue_name())."""
    shapes = {g.queue: g.trials for g in groups}
    trials = [t for queue in shapes.values() for t in queue]
    for trial in trials:  # an earlier run's failure no longer stands
        storage.remove(storage.join(trial.trial_dir, TRIAL_ERROR))
    name = name or queue_name()
    train = groups[0].train
    requests_resources = not runtime.private_instance()  # which no autoscaler serves
    # The first groups' workers and synchronization actors, started now (or kept from this driver's last
    # pool, or started ahead of it: start_first_group_ahead): the workers import while the groups'
    # controllers start.
    at_once = min(max_concurrent, len(groups))
    ahead = _starts_workers_ahead(train)
    warm = start_warm_workers(at_once * train.num_workers) if ahead else []
    syncs = start_sync_actors(at_once) if ahead else []
    arguments = sync_arguments()
    queue = (
        queue_actor(relay=2 * max_concurrent * train.num_workers + 4)
        .options(name=name, num_cpus=0, scheduling_strategy=_this_node())
        .remote(
            {shape: [t.key for t in queue if not t.done] for shape, queue in shapes.items()},
            [(worker._actor_id.hex(), ray.cloudpickle.dumps(worker)) for worker in warm],
            [(sync._actor_id.hex(), ray.cloudpickle.dumps(sync), arguments) for sync in syncs],
        )
    )
    watch, packed = ClusterWatch(train, study_dir), one_node(train, runtime.capacity())
    by_key = {t.key: t for t in trials}
    errors: dict[str, str] = {}
    stopped = threading.Event()  # the groups' threads see it; the queue ends their runs

    def stop() -> None:
        stopped.set()
        ray.get(queue.stop.remote())

    # rayb's private instance is one node that only the driver's own end can lose.
    look_every = ClusterWatch.WATCH_S if requests_resources else None
    left: list = []  # the idle warm workers and synchronization actors the pool leaves, once it has ended
    try:
        with ThreadPoolExecutor(max_concurrent, thread_name_prefix="rayb-group") as threads:
            running = {
                threads.submit(_run_group, g, name, packed, requests_resources, by_key, stopped)
                for g in groups
            }
            try:
                while running:
                    if watch.why is None and watch.look():
                        stop()  # ends the running groups; the waiting ones see it
                    done, running = wait(running, timeout=look_every, return_when=FIRST_COMPLETED)
                    for group in done:
                        errors |= group.result()
            except BaseException:  # Ctrl-C, or a bug: the threads' runs end before the driver does
                stop()
                raise
        if ahead:  # every group has ended: those it kept, and those none adopted, are idle
            idle = {actor for actors in ray.get(queue.leftover.remote()) for actor in actors}
            left = [a for a in warm + syncs if a._actor_id.hex() in idle]
    finally:  # for this driver's next pool
        keep_warm_workers([w for w in warm if w in left])
        keep_sync_actors([s for s in syncs if s in left])
        for actor in [queue, *(a for a in warm + syncs if a not in left)]:
            ray.kill(actor)  # those of groups that failed or were ended, whatever they left
    why = f"the sweep stopped: {watch.why}" if watch.why else "not trained: its worker pool ended without it"
    return errors | _record([t for t in trials if t.key not in errors and not t.done], why)


def _run_group(
    pack: TrialPack, queue_name: str, packed: bool, requests_resources: bool, trials: dict[str, TrialSpec],
    stopped: threading.Event,
) -> dict[str, str]:  # fmt: skip
    """Run one worker group of the pool: its Ray Train run, on a thread of the driver (its controller runs
    on the driver's node, which outlives the nodes a cluster may lose), unless the pool has `stopped`. A
    failure Ray Train has already retried is final: the trials it leaves untrained are recorded, with why.
    A run whose controller died (a process lost otherwise than by training) starts again, up to
    PACK_RESTARTS times, and resumes the trial it held from that trial's last checkpoint. The stop is the
    driver's own flag, not the queue's: asking the queue would wait for its actor's process to start
    (0.5 s of a laptop study's critical path), and only the driver stops it."""
    restarts = 0
    while not stopped.is_set():
        try:
            pack_trainer(pack, one_node=packed, queue=queue_name, requests_resources=requests_resources).fit()
            return {}
        except TrainingFailedError as exc:
            failure: Exception = exc
        except RayActorError as exc:  # its controller was lost, or ended as the pool stopped
            failure, restarts = exc, restarts + 1
            if restarts <= PACK_RESTARTS:
                continue
        return _group_failed(pack, ray.get_actor(queue_name), failure, trials)
    return {}  # the pool stopped: run_pool records why


def _group_failed(pack: TrialPack, queue, failure: Exception, trials: dict[str, TrialSpec]) -> dict[str, str]:
    """Record the trials a failed group leaves untrained, with why: the one it held, with its error, and its
    shape's waiting ones, which it takes down with it (as a user's model that crashes would crash in each
    of its trials)."""
    error, trace = f"{type(failure).__name__}: {failure}", "".join(traceback.format_exception(failure))
    held, waiting = ray.get(queue.fail.remote(pack.queue, pack.run_name))

    def untrained(keys: list[str]) -> list[TrialSpec]:
        return [trials[k] for k in keys if not trials[k].done]

    after = f"not trained: {held or 'a trial'} of its worker group failed first: {error}"
    return _record(untrained([held] if held else []), error, trace) | _record(
        untrained(waiting), after, trace
    )


def _this_node():
    """Pinned to the driver's node, which outlives the nodes a cluster may lose."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def _record(trials: list[TrialSpec], error: str, trace: str | None = None) -> dict[str, str]:
    """Write each trial's failure where `rayb status` and the live view find it; {trial key: message}."""
    errors = {}
    for trial in trials:
        where = storage.join(trial.trial_dir, TRIAL_ERROR)
        storage.write_bytes(where, (trace or error).encode())
        errors[trial.key] = f"{error.splitlines()[0]} (traceback: {where})"
    return errors
