"""The actors a driver starts ahead of its pools' worker groups on rayb's private instance, and keeps between
its pools (a study's rounds of seeds; the studies of a notebook, a sweep script or the test suite): warm
Train workers (trainer.RayTrainWorker), which the groups adopt instead of starting their own
(trainer.InheritingWorkerGroup), and the groups' synchronization actors, one each. It also keeps the
Train controllers of the pools' runs that finished cleanly, on any cluster, for its next runs
(trainer.PackTrainer), and one it starts ahead of a study's first run. Driver-side only: Ray Train's
controller, which unpickles train/trainer.py, never imports this module."""

from __future__ import annotations

import os
import threading

from ray._private.ray_constants import env_float
from ray.train.v2._internal.constants import (
    COLLECTIVE_TIMEOUT_S_ENV_VAR,
    COLLECTIVE_WARN_INTERVAL_S_ENV_VAR,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_COLLECTIVE_WARN_INTERVAL_S,
)
from ray.train.v2._internal.execution.checkpoint.sync_actor import SynchronizationActor

from rayb.train.trainer import RayTrainWorker, new_controller

# The idle actors this driver keeps between its pools (a study's rounds of seeds, the studies of a
# notebook or a sweep script): warm Train workers, each of which has imported torch and DeepSpeed and kept a
# process group of one; and worker groups' synchronization actors.
_kept_workers: list = []
_kept_sync_actors: list = []
# And Train controllers (trainer.EnvController), which the pool's groups, each on a thread of its own, take
# and give back as their runs start and end.
_kept_controllers: list = []
_controllers_lock = threading.Lock()


def _take_kept(kept: list, count: int) -> list:
    """Up to `count` of the `kept` actors, alive or still starting (a pool that ended early leaves workers
    still importing); one the GCS has dead, or does not know (a handle from an earlier Ray session), is
    dropped."""
    from ray._private.state import actors

    live = [a for a in kept if actors(a._actor_id.hex()).get("State") not in (None, "DEAD")]
    taken, kept[:] = live[:count], live[count:]
    return taken


def _keep(kept: list, actors: list) -> None:
    """Keep the idle `actors` a pool leaves for this driver's next pool, up to one per core of their kind (an
    idle actor holds a process's memory, no CPU, and takes about 1% of a core: Ray's task loop wakes every
    10 ms to check for signals); kill the rest."""
    import ray

    room = max(0, (os.cpu_count() or 1) - len(kept))
    kept.extend(actors[:room])
    for actor in actors[room:]:
        ray.kill(actor)


def start_warm_workers(count: int) -> list:
    """`count` CPU Train workers for the pool's worker groups to adopt as they start (InheritingWorkerGroup):
    those this driver kept from its last pool that are still alive (keep_warm_workers), and as many new ones
    as that leaves (_new_workers). On rayb's private instance, a single node, where a group's workers have no
    runtime env."""
    workers = _take_kept(_kept_workers, count)
    return workers + _new_workers(count - len(workers))


def start_workers_ahead(count: int) -> None:
    """Have `count` warm workers kept for this driver's next pool, alive or starting: those it keeps, and as
    many new ones as that leaves, which start now. For a driver about to prepare a study's data, check its
    models and plan its trials before its pool starts: a worker's start (its process, and importing torch,
    DeepSpeed and transformers: 5-6 CPU-seconds) then overlaps that work instead of following it."""
    live = _take_kept(_kept_workers, len(_kept_workers))
    _kept_workers[:] = live + _new_workers(count - len(live))


def _new_workers(count: int) -> list:
    """`count` new warm workers. Each holds no resources (the adopting group's placement group holds them),
    so none waits for CPUs."""
    import ray

    actor = ray.remote(num_cpus=0)(RayTrainWorker)
    return [actor.remote() for _ in range(count)]


def start_sync_actors(count: int) -> list:
    """`count` synchronization actors for the pool's worker groups to adopt as they start, one each
    (InheritingWorkerGroup), with the arguments Ray Train's groups start theirs with (`sync_arguments`):
    those this driver kept from its last pool, and as many new ones as that leaves. Each is Ray Train's own,
    on this node (as Ray Train places its groups'), and one a group ends cleanly with goes on to the next."""
    import ray

    kept = _take_kept(_kept_sync_actors, count)
    on_this_node = {ray._raylet.RAY_NODE_ID_KEY: ray.get_runtime_context().get_node_id()}
    new = SynchronizationActor.options(label_selector=on_this_node)
    return kept + [new.remote(**sync_arguments()) for _ in range(count - len(kept))]


def sync_arguments() -> dict[str, float | None]:
    """What Ray Train's worker groups start their synchronization actor with (from the environment, as Ray
    Train's WorkerGroup reads it)."""
    return {
        "timeout_s": env_float(COLLECTIVE_TIMEOUT_S_ENV_VAR, DEFAULT_COLLECTIVE_TIMEOUT_S),
        "warn_interval_s": env_float(COLLECTIVE_WARN_INTERVAL_S_ENV_VAR, DEFAULT_COLLECTIVE_WARN_INTERVAL_S),
    }


def start_controller_ahead() -> None:
    """Have a Train controller kept for this driver's next run, alive or starting: one it keeps, or else a
    new one, which starts now and waits for that run (trainer.EnvController.reset). For a driver about to
    prepare a study's data, check its models and plan its trials: the controller's start (its process, and
    importing Ray Train: 2-3 s on 2 cores, which its run would otherwise wait for first) overlaps that
    work instead of following it. Its process holds no resources, on any cluster."""
    with _controllers_lock:
        _kept_controllers[:] = _take_kept(_kept_controllers, len(_kept_controllers)) or [new_controller()]


def take_controller():
    """An idle Train controller this driver kept from a run that finished cleanly (keep_controller), or None."""
    with _controllers_lock:
        taken = _take_kept(_kept_controllers, 1)
    return taken[0] if taken else None


def keep_controller(controller) -> None:
    """Keep the controller of a run of the pool that finished cleanly, for this driver's next run (see
    _keep)."""
    with _controllers_lock:
        _keep(_kept_controllers, [controller])


def release_kept_workers() -> None:
    """Kill the idle actors this driver keeps between pools (the memory of their processes)."""
    import ray

    with _controllers_lock:
        for actor in _kept_workers + _kept_sync_actors + _kept_controllers:
            ray.kill(actor)
        _kept_workers.clear()
        _kept_sync_actors.clear()
        _kept_controllers.clear()


def keep_warm_workers(workers: list) -> None:
    """Keep the idle warm workers a pool leaves for this driver's next pool (see _keep)."""
    _keep(_kept_workers, workers)


def keep_sync_actors(sync_actors: list) -> None:
    """Keep the idle synchronization actors a pool leaves for this driver's next pool (see _keep)."""
    _keep(_kept_sync_actors, sync_actors)


def kept_worker_ids() -> set[str]:
    """The actor ids of the idle warm workers this driver keeps between pools."""
    return {w._actor_id.hex() for w in _kept_workers}


def kept_controller_ids() -> set[str]:
    """The actor ids of the idle Train controllers this driver keeps between runs."""
    with _controllers_lock:
        return {c._actor_id.hex() for c in _kept_controllers}
