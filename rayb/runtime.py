"""Connecting to Ray: a running cluster when RAY_ADDRESS is set, else a local instance rayb starts."""

from __future__ import annotations

import atexit
import functools
import json
import math
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rayb.tune.packs import Capacity, NodeType

# Ray Train's settings for rayb's runs, which each run's trainer hands its controller and workers
# (train/trainer.PackTrainer) where the environment has no setting of the user's. On rayb's private
# instance they are also set before Ray starts, so that every process inherits them.
TRAIN_SETTINGS = (
    # How long a worker group waits for its resources before Ray Train gives up on that attempt and starts
    # another. Ray's default, 60 s, is less than a GPU node takes to boot; each attempt drops the resource
    # request the autoscaler is serving and asks again. Waiting never fails a trial: Ray Train retries a
    # group that has not started for as long as it takes (its default), and the sweep's ClusterWatch
    # (tune/sweep.py) ends a wait that the cluster can no longer ever satisfy.
    ("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "900"),
    # Ray Train's own setting for its runs (its DataParallelTrainer sets it in its controller's): no warning
    # for a blocking ray.get in an async actor.
    ("RAY_WARN_BLOCKING_GET_INSIDE_ASYNC", "0"),
)

# Where Ray's cluster launcher (`ray up`) leaves the head's autoscaler its configuration.
BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")


def init_ray(ray_logs: Path | None = None, dashboard: bool = False) -> str | None:
    """Connect to (or start) Ray. With `ray_logs`, Ray's own output goes to files instead of the terminal:
    the driver's log records to that file, the workers' output stays in the Ray session's log directory,
    and Ray Data's progress bars are off (rayb prints its own progress). A local instance runs
    Ray's dashboard only with `dashboard` (a cluster keeps its own); returns its address where it started."""
    import ray

    if ray_logs is not None:
        _quiet_driver(ray_logs)
    if ray.is_initialized():
        return None
    quiet = {"log_to_driver": ray_logs is None}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], **quiet)
        return None
    # A private, local instance. Its processes inherit this environment, which carries its settings:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # - the driver's import path (see driver_import_path). Not as a job runtime env: with one, no task or
    #   actor runs on the workers Ray prestarts (each starts a process of its own, 0.5-1 s on 2 cores).
    os.environ["PYTHONPATH"] = driver_import_path()
    # - no preemption watcher in Ray Train: nothing drains a local node, and the watcher is one more
    #   actor process per worker group.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # - Ray Train's settings for rayb's runs: every worker process inherits them, so a run's Train workers
    #   need no runtime env to be handed them (trainer.InheritingWorkerGroup) and start on the idle workers
    #   Ray keeps, or as plain new processes: 1.2-1.4 s each on 2 cores, against 1.9-2.3 s with one.
    for name, value in TRAIN_SETTINGS:
        os.environ.setdefault(name, value)
    # - Ray's forced gc.collect() in every worker process at most every 5 minutes, not every 10 s. From
    #   about 70 s into a run the raylet asked all 14 processes of a 2-pack study for one every 10 s
    #   ("Sending Python GC request" in raylet.out), on heaps holding torch and transformers: that took
    #   CPU from training, whose steps took 10-14% longer over ten seeds on 2 cores. Python's own
    #   generational collector still runs in every process.
    os.environ.setdefault("RAY_local_gc_min_interval_s", "300")
    # - idle workers kept while trials hold the CPUs. Ray keeps as many idle workers as its soft limit
    #   (by default the CPU count) leaves beside the CPUs in use, and ends others a second after their
    #   last task: with every CPU held by worker groups, each study of a driver (a notebook, the test
    #   suite) started its data preparation's tokenize workers anew, and the tiny study's data took
    #   2.4-3.2 s, against 0.7-1.1 s, its study 7 new processes and 13-16 CPU-seconds, against 5 and
    #   10-13 (2 cores). Twice the CPUs keeps up to one idle worker per core, as many as rayb's tasks use
    #   at once; they end with the driver.
    os.environ.setdefault("RAY_num_workers_soft_limit", str(2 * (os.cpu_count() or 1)))
    with _without_unused_processes(log_to_driver=quiet["log_to_driver"], dashboard=dashboard):
        context = ray.init(
            # A new instance, not Ray's default: that joins the cluster a `ray start` on this machine last
            # started, where one has left its address, and fails there on the settings below.
            address="local",
            # The machine's real cores: a trial holds only its workers' CPUs (its Train controller holds
            # none), so nothing needs more slots than there are cores.
            num_cpus=os.cpu_count() or 1,
            # The dashboard (on 127.0.0.1 only) only when asked: it is a head process and nine module
            # processes, which on 2 cores took 1.2-1.5 s of Ray's start and about 4.5 CPU-seconds of a study's
            # first minute. rayb itself needs nothing from it: the worker pool's runs read the GCS
            # (tune/group.TrialQueue), not the State API the dashboard serves.
            include_dashboard=dashboard,
            **quiet,
        )
    if not quiet["log_to_driver"]:
        # At exit Ray sleeps 0.5 s so that its workers' last lines reach the terminal; where they go to log
        # files instead (`rayb run` without -v), rayb shuts Ray down itself first, without that sleep.
        # Registered after Ray's own exit handler (registered as ray imports), so it runs first.
        atexit.register(ray.shutdown)
    return context.dashboard_url or None


@contextmanager
def _without_unused_processes(log_to_driver: bool, dashboard: bool) -> Iterator[None]:
    """Within, Ray starts a local instance without the processes a private one has no use for:
    - the autoscaler's monitor (no autoscaler serves one fixed node: `capacity` reads it as fixed without a
      monitor too);
    - where the workers' output goes to files rather than this terminal, the log monitor that streams it
      to the driver;
    - without `dashboard`, the dashboard's head process. Ray starts it even with include_dashboard=False,
      then loading only its usage-stats module (no job or State API), and ray.init waits until it has
      written its address.
    The monitors are Python processes that took about a CPU-second of Ray's start each on 2 cores (Ray's
    start: 6.1 s and 8.6 CPU-seconds with them, 5.1 s and 6.3 without, medians of five interleaved pairs),
    polling on through the study; at exit Ray's shutdown gave the monitor its whole second to stop. The
    dashboard's head took 0.9-1.0 CPU-seconds. `ray start` has flags for the monitors (--no-monitor,
    --include-log-monitor); ray.init has none, and nothing skips the dashboard's head, so rayb sets the
    flags on the RayParams ray.init builds and skips Node.start_api_server (not public API: Ray 2.60's)."""
    from ray._private import node, parameter

    original_params, original_api_server = parameter.RayParams.__init__, node.Node.start_api_server

    def without_monitors(params, *args, **kwargs) -> None:
        original_params(params, *args, **kwargs)
        params.no_monitor, params.include_log_monitor = True, log_to_driver

    parameter.RayParams.__init__ = without_monitors
    if not dashboard:
        node.Node.start_api_server = lambda self, **kwargs: None
    try:
        yield
    finally:
        parameter.RayParams.__init__, node.Node.start_api_server = original_params, original_api_server


DRIVER_LOG_HANDLER = "rayb-driver-log"  # the name of the handler `_quiet_driver` gives Ray's loggers


def _quiet_driver(log_file: Path) -> None:
    """Ray's driver-side log records (Ray Data's included) from INFO up into `log_file` rather than the
    terminal, and Ray Data's progress bars off. Ray's loggers keep their own files (Ray Data's ray-data.log
    in the session logs, at DEBUG). A process that runs several studies (a notebook, the test suite) logs
    each one's records to that study's file only: this replaces the handler an earlier study got."""
    import logging

    from ray.data import DataContext  # importing Ray Data sets up its loggers: reroute them after

    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file)
    to_file.set_name(DRIVER_LOG_HANDLER)
    to_file.setLevel(logging.INFO)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    ray_loggers = [logging.getLogger("ray")] + [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("ray.")
    ]
    for logger in ray_loggers:
        for handler in list(logger.handlers):
            if handler.get_name() == DRIVER_LOG_HANDLER:  # an earlier study's file
                logger.removeHandler(handler)
                handler.close()
            # Handlers that write to a terminal go; Ray's own files (Ray Data's session file) stay.
            elif isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                logger.removeHandler(handler)
    ray_loggers[0].propagate = False
    # "ray", and the loggers that do not pass their records up to it (Ray Data's "ray.data").
    for logger in ray_loggers:
        if logger is ray_loggers[0] or (not logger.propagate and logger.handlers):
            logger.addHandler(to_file)
    DataContext.get_current().enable_progress_bars = False


def private_instance() -> bool:
    """Whether the Ray this driver uses is the private local instance it started (`init_ray` without
    RAY_ADDRESS): one fixed node, which no autoscaler serves. A driver that connects to a cluster
    (RAY_ADDRESS, `ray job submit`) starts no node of its own."""
    import ray

    node = ray._private.worker._global_node  # not public API: the node this driver started, or joined
    return bool(node is not None and node.head)


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
    node_types, scales = autoscaler(ray.get_runtime_context().gcs_address)
    return Capacity(nodes, node_types, scales)


@functools.lru_cache
def autoscaler(gcs_address: str) -> tuple[tuple[NodeType, ...], bool]:
    """The node types the cluster's autoscaler may launch, and whether an autoscaler runs at all. Ray 2.60
    publishes no autoscaler configuration to the cluster (the GCS key that Ray's own
    `get_max_resources_from_cluster_config` reads stays empty), so rayb looks where the head keeps it:
    1. a configuration reported to the GCS, should a Ray release or KubeRay start reporting one;
    2. the file the autoscaler of this cluster runs from: `monitor.py --autoscaling-config=F` on this
       machine (a driver of `ray job submit` runs on the head), else the cluster launcher's
       ~/ray_bootstrap_config.yaml. A monitor with no such flag runs over a read-only view of the nodes
       that are up: the cluster is fixed;
    3. where no monitor runs here (KubeRay's autoscaler is a container of its own), autoscaler v2's flag
       in the GCS, or v1's status naming node types of a real configuration (a monitor over the nodes
       that are up names each `node_<id>`): an autoscaler whose node types rayb cannot read, so it may add
       any.
    Otherwise the cluster is taken as fixed."""
    if types := _reported_node_types():
        return types, True
    config = _monitor_config(gcs_address)
    if config is None and BOOTSTRAP_CONFIG.expanduser().is_file():
        config = _read_yaml(BOOTSTRAP_CONFIG.expanduser())
    if config is not None:
        types = node_types(config)
        return types, bool(types)
    return (), _autoscaler_v2() or configured_types(_v1_status(), _live_node_ids())


def node_types(config: dict[str, Any]) -> tuple[NodeType, ...]:
    """The node types an autoscaler's cluster configuration (a `ray up` YAML) may launch: those with
    max_workers above zero, the cluster's own max_workers capping each."""
    cap = config.get("max_workers", math.inf)
    types = []
    for name, spec in (config.get("available_node_types") or {}).items():
        if (count := min(spec.get("max_workers", 0), cap)) > 0:
            types.append(
                NodeType(name, {k: float(v) for k, v in spec.get("resources", {}).items()}, int(count))
            )
    return tuple(types)


def _reported_node_types() -> tuple[NodeType, ...]:
    try:  # a private API: without it, rayb reads the head's own files
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001
        return ()
    groups = config.node_group_configs if config is not None else []
    return tuple(NodeType(g.name, dict(g.resources), g.max_count) for g in groups if g.max_count > 0)


def _monitor_config(gcs_address: str) -> dict[str, Any] | None:
    """The configuration this cluster's autoscaler runs from when its monitor runs on this machine: {}
    for a monitor started without one (`ray start --head` alone), None where no monitor of this cluster
    runs here."""
    import psutil

    port = gcs_address.rpartition(":")[2]
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if not any(a.endswith("autoscaler/_private/monitor.py") for a in args):
            continue
        flags = dict(a[2:].partition("=")[::2] for a in args if a.startswith("--"))
        if flags.get("gcs-address", "").rpartition(":")[2] != port:
            continue
        config = flags.get("autoscaling-config")
        return _read_yaml(Path(config).expanduser()) if config else {}
    return None


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):  # unreadable: the autoscaler is there, what it adds is not known
        return {"available_node_types": {}}


def _autoscaler_v2() -> bool:
    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        return is_autoscaler_v2(fetch_from_server=True)
    except Exception:  # noqa: BLE001  (a private API)
        return False


def _v1_status() -> dict[str, Any]:
    """Autoscaler v1's last report, as `ray status` reads it (ray_constants.DEBUG_AUTOSCALING_STATUS)."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get("__autoscaling_status")
    return json.loads(raw).get("autoscaler_report") or {} if raw else {}


def _live_node_ids() -> set[str]:
    import ray

    return {node["NodeID"] for node in ray.nodes() if node.get("Alive")}


def configured_types(report: dict[str, Any], live_ids: set[str]) -> bool:
    """Whether a v1 autoscaler's report names node types of a real configuration: a monitor with none runs
    over a read-only view of the nodes that are up, and names each node's type `node_<id>`."""
    from ray.autoscaler._private.util import format_readonly_node_type

    named = set((report.get("node_type_mapping") or {}).values())
    return bool(named - {format_readonly_node_type(node_id) for node_id in live_ids})


def scaling_activity() -> str | None:
    """What the autoscaler is doing for the cluster, in words ("starting 1 cpu2"), or None when it starts
    nothing: read from autoscaler v1's status in the GCS, or v2's cluster status."""
    import ray

    starting: Counter[str] = Counter()
    if _autoscaler_v2():
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(ray.get_runtime_context().gcs_address)
        for launch in status.pending_launches:
            starting[launch.ray_node_type_name] += launch.count
        for node in status.pending_nodes:
            starting[node.ray_node_type_name] += 1
    else:
        report = _v1_status()
        starting.update(report.get("pending_launches") or {})
        for _ip, node_type, *_ in report.get("pending_nodes") or []:
            starting[node_type] += 1
    if not starting:
        return None
    nodes = ", ".join(f"{n} {name}" for name, n in sorted(starting.items()))
    return f"waiting for nodes: the autoscaler is starting {nodes}"


def cluster_summary() -> dict[str, float | int]:
    """The Ray cluster's nodes and resource totals (CPU, GPU, memory), for the provenance record."""
    import ray

    resources = ray.cluster_resources()
    summary = {"nodes": sum(1 for node in ray.nodes() if node.get("Alive"))}
    summary |= {key: resources[key] for key in ("CPU", "GPU") if key in resources}
    if "memory" in resources:
        summary["memory_gib"] = round(resources["memory"] / 2**30, 1)
    return summary
