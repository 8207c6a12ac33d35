"""Connecting to Ray: a running cluster when RAY_ADDRESS is set, else a local instance rayb starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rayb.tune.packs import Capacity


def init_ray(ray_logs: Path | None = None) -> None:
    """Connect to (or start) Ray. With `ray_logs`, Ray's own output goes to files instead of the terminal:
    the driver's log records to that file, the workers' output stays in the Ray session's log directory,
    and Tune's and Ray Data's progress blocks are off (rayb prints its own progress)."""
    import ray

    if ray_logs is not None:
        _quiet_driver(ray_logs)
    if ray.is_initialized():
        return
    quiet = {"log_to_driver": ray_logs is None}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **quiet)
        return
    # A private, local instance. Its processes inherit this environment, which carries its settings:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # - the driver's import path (see driver_import_path). Not as a job runtime env: with one, no task or
    #   actor runs on the workers Ray prestarts (each starts a process of its own, 0.5-1 s on 2 cores).
    os.environ["PYTHONPATH"] = driver_import_path()
    # - no preemption watcher in Ray Train: nothing drains a local node, and the watcher is one more
    #   actor process per worker group.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # - Ray's forced gc.collect() in every worker process at most every 5 minutes, not every 10 s. From
    #   about 70 s into a run the raylet asked all 14 processes of a 2-pack study for one every 10 s
    #   ("Sending Python GC request" in raylet.out), on heaps holding torch and transformers: that took
    #   CPU from training, whose steps took 10-14% longer over ten seeds on 2 cores. Python's own
    #   generational collector still runs in every process.
    os.environ.setdefault("RAY_local_gc_min_interval_s", "300")
    ray.init(
        # The machine's real cores: a trial holds only its workers' CPUs (its Tune actor and Train
        # controller hold none), so nothing needs more slots than there are cores.
        num_cpus=os.cpu_count() or 1,
        # The dashboard (on 127.0.0.1 only) also serves the State API that Ray Train's placement-group
        # cleaner polls; without it that cleaner logs a warning every few seconds of every trial.
        include_dashboard=True,
        **quiet,
    )


def _quiet_driver(log_file: Path) -> None:
    """Ray's driver-side log records into `log_file` rather than the terminal, and Ray Data's progress
    bars off. Ray's loggers keep their own files (Ray Data's ray-data.log in the session logs)."""
    import logging

    from ray.data import DataContext  # importing Ray Data sets up its loggers: reroute them after

    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ray_loggers = [logging.getLogger("ray")] + [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("ray.")
    ]
    for logger in ray_loggers:
        for handler in list(logger.handlers):
            if not isinstance(handler, logging.FileHandler):
                logger.removeHandler(handler)
    ray_loggers[0].addHandler(to_file)
    ray_loggers[0].propagate = False
    DataContext.get_current().enable_progress_bars = False


def session_logs() -> str:
    """Where this Ray session keeps its processes' logs (on each node of a cluster)."""
    import ray

    try:  # not public API: fall back to Ray's default location
        return str(Path(ray._private.worker._global_node.get_session_dir_path()) / "logs")
    except AttributeError:
        return "/tmp/ray/session_latest/logs"


def driver_import_path() -> str:
    """The driver's import path, for local workers: a user's model named by import path
    (`arch: my_model:build`, found in the current directory) must import in Train workers and eval
    actors as it did when the study was validated. (On a cluster, `ray job submit --working-dir`
    ships that code instead.)"""
    return os.pathsep.join(dict.fromkeys(p for p in [os.getcwd(), *sys.path] if p))


def compute_cores(use_gpu: bool) -> int:
    """Devices to share among trials and evaluations: the cluster's GPUs, or its CPU cores."""
    import ray

    resources = ray.cluster_resources()
    return int(resources.get("GPU", 0)) if use_gpu else max(1, int(resources.get("CPU", 1)))


def capacity() -> Capacity:
    """Each live node's CPUs and GPUs, and what the cluster's autoscaler may add."""
    import ray

    nodes = tuple(
        {name: amount for name, amount in node["Resources"].items() if name in ("CPU", "GPU")}
        for node in ray.nodes()
        if node.get("Alive")
    )  # fmt: skip
    return Capacity(nodes, autoscaler_limits())


def autoscaler_limits() -> dict[str, float] | None:
    """The cluster's resources with every node type at its max_workers, from the autoscaler's published
    config; None on a cluster that cannot scale (a local instance, `ray start` nodes)."""
    try:
        from ray._private.state import state

        return state.get_max_resources_from_cluster_config() or None
    except Exception:  # noqa: BLE001  (a private API: without it, the cluster is taken as fixed)
        return None


def cluster_summary() -> dict[str, float | int]:
    """The Ray cluster's nodes and resource totals (CPU, GPU, memory), for the provenance record."""
    import ray

    resources = ray.cluster_resources()
    summary = {"nodes": sum(1 for node in ray.nodes() if node.get("Alive"))}
    summary |= {key: resources[key] for key in ("CPU", "GPU") if key in resources}
    if "memory" in resources:
        summary["memory_gib"] = round(resources["memory"] / 2**30, 1)
    return summary
