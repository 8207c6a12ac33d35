"""The local Ray instance rayb starts: what its processes get from the driver."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
REPO = Path(__file__).parent.parent


def test_local_workers_get_the_drivers_import_path_without_a_job_runtime_env(ray_session):
    import ray

    @ray.remote(num_cpus=0)
    def seen() -> tuple[str, ...]:
        names = ("PYTHONPATH", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "RAY_local_gc_min_interval_s")
        return tuple(os.environ.get(name, "") for name in names)

    import_path, preemption_watcher, gc_interval = ray.get(seen.remote())
    # A user's model named by import path from the current directory loads in every worker...
    assert os.getcwd() in import_path.split(os.pathsep)
    # ...through the environment the instance's processes inherit: a job runtime env would keep every
    # task and actor off the workers Ray prestarts.
    assert not ray.get_runtime_context().runtime_env
    assert preemption_watcher == "0"  # nothing drains a local node: no watcher actor per worker group
    # The raylet these workers came from runs Ray's forced gc.collect() in them every 5 minutes at most.
    assert gc_interval == "300"


def test_a_task_worker_stays_for_the_next_task_while_trials_hold_every_cpu(ray_session):
    """Ray keeps only as many idle workers as its soft limit (by default the CPU count) leaves beside the
    CPUs in use: while worker groups hold every CPU, a task's worker would end a second after its task,
    and each study of a driver would start its tokenize workers anew. rayb's instance keeps it."""
    import psutil
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    @ray.remote(num_cpus=1)
    def pid() -> int:
        return os.getpid()

    worker = psutil.Process(ray.get(pid.remote()))
    free = int(ray.available_resources().get("CPU", 0))  # those a test before this one holds stay held
    held = placement_group([{"CPU": 1}] * free)  # as worker groups hold them
    try:
        ray.get(held.ready(), timeout=120)
        assert ray.available_resources().get("CPU", 0) == 0
        time.sleep(3)  # Ray's idle threshold is 1 s, and it looks for idle workers to end every 0.2 s
        assert worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
    finally:
        remove_placement_group(held)


@pytest.mark.parametrize("cluster_file", ["aws.yaml", "gcp.yaml"])
def test_a_gpu_study_on_the_shipped_clusters_waits_for_the_gpu_nodes_their_autoscaler_adds(cluster_file):
    """Both cluster files start with a CPU head and no GPU node: a GPU study must wait for the 8xA100 nodes
    the autoscaler launches, not be refused for the GPUs the head lacks."""
    import yaml

    from rayb.runtime import node_types
    from rayb.study import load_study
    from rayb.tune.packs import Capacity, one_node, trial_slots, unfittable

    config = yaml.safe_load((REPO / "cluster" / cluster_file).read_text())
    types = {t.name: t for t in node_types(config)}
    gpu_type = next(t for t in types.values() if t.resources.get("GPU"))
    assert gpu_type.resources == {"CPU": 96.0, "GPU": 8.0} and gpu_type.max_workers == 2
    head = config["available_node_types"][config["head_node_type"]]["resources"]
    assert config["head_node_type"] not in types  # the head is up already; the autoscaler adds none
    train = load_study(REPO / "configs" / "groundthink-gate.yaml").train  # a quarter of a GPU per trial
    fixed, scaling = (
        Capacity(({"CPU": 8.0, "GPU": head["GPU"]},)),
        Capacity(({"CPU": 8.0, "GPU": head["GPU"]},), tuple(types.values()), scales=True),
    )
    assert unfittable(train, fixed) is not None  # the same head with no autoscaler: refused
    assert unfittable(train, scaling) is None
    assert one_node(train, scaling) and trial_slots(train, scaling) == 64  # 2 nodes x 8 GPUs x 4 trials each


def test_a_local_instance_runs_a_dashboard_only_when_asked(ray_session):
    """`rayb run` starts no dashboard (about 1.5 s of a laptop's start, and its CPU through the study), not
    even the head process Ray starts without one (0.8 s of Ray's start on 2 cores); `rayb run --dashboard`
    starts one that answers on the address rayb prints."""
    import ray
    from ray._private.ray_constants import PROCESS_TYPE_DASHBOARD

    # The suite's instance, started as `rayb run` does.
    assert not ray._private.worker.get_dashboard_url()
    assert PROCESS_TYPE_DASHBOARD not in ray._private.worker._global_node.all_processes
    asked = (
        "import json, urllib.request; from rayb.runtime import init_ray; url = init_ray(dashboard=True); "
        "print(json.loads(urllib.request.urlopen(f'http://{url}/api/version', timeout=60).read())['ray_version'])"
    )
    done = own_local_ray(asked)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == ray.__version__


def own_local_ray(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` run by a fresh driver, which starts a local Ray of its own (not the suite's); `env` is added
    to its environment."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_a_driver_without_ray_address_starts_its_own_ray_where_ray_start_left_one(ray_session):
    """`ray start` leaves its cluster's address for drivers in Ray's temporary directory
    (ray/ray_current_cluster), and Ray's default joins that cluster. rayb, as its README says, uses the
    cluster at RAY_ADDRESS only: without it, a local Ray of its own, not a failure to join with its own
    CPU count. The left address here is the suite's live instance."""
    import ray

    suite = ray.get_runtime_context().gcs_address
    temp = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))  # short: Ray's socket paths have a length limit
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text(suite)
        started = "import ray; from rayb.runtime import init_ray; init_ray(); "
        done = own_local_ray(started + "print(ray.get_runtime_context().gcs_address)", RAY_TMPDIR=str(temp))
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] != suite


@pytest.mark.parametrize("workers_print_here", [False, True], ids=["quiet", "verbose"])
def test_a_local_instance_shuts_down_cleanly_when_its_driver_exits(ray_session, tmp_path, workers_print_here):
    """rayb's local instance runs no autoscaler monitor, and a log monitor only where the workers' output
    comes to this terminal. rayb shuts it down at exit itself (without Ray's wait for worker output where
    that goes to log files): the driver exits cleanly, with no error from an exit handler, and every
    process of the instance, its actors' workers too, is gone."""
    ray_logs = None if workers_print_here else f"pathlib.Path({str(tmp_path / 'ray.log')!r})"
    driver = (
        "import os, pathlib, ray; from rayb.runtime import init_ray\n"
        f"init_ray(ray_logs={ray_logs})\n"
        "node = ray._private.worker._global_node\n"
        "pids = [info.process.pid for infos in node.all_processes.values() for info in infos]\n"
        "actor = ray.remote(num_cpus=0)(type('Pid', (), {'pid': lambda self: os.getpid()})).remote()\n"
        "print(*sorted(node.all_processes))\n"
        "print(*pids, ray.get(actor.pid.remote()))\n"
    )
    done = own_local_ray(driver)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]  # an exit handler's error is only printed
    kinds, pids = done.stdout.splitlines()[-2:]
    assert "monitor" not in kinds.split() and ("log_monitor" in kinds.split()) == workers_print_here, kinds
    pids = [int(pid) for pid in pids.split()]
    assert len(pids) >= 3  # the GCS, the raylet, ..., and the actor's worker
    # The raylet's workers and agents end as it does; a moment for the last of them to be reaped.
    deadline = time.monotonic() + 30
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; its parent (init, once the driver is gone) reaps it


def test_no_driver_collects_ray_data_usage(tiny_cache):
    """Ray Data collects no usage in rayb's drivers (the suite's has run Ray Data for the token cache): no
    thread polling Prometheus every 10 s, with a traceback logged per failed query, and no actor process."""
    import threading

    import ray

    assert "data-usage-metrics-poller" not in [thread.name for thread in threading.enumerate()]
    with pytest.raises(ValueError):
        ray.get_actor("DataUsageCollectionActor", namespace="DataUsageCollectionActor")


def test_each_study_of_a_process_gets_rays_records_in_its_own_log_only(ray_session, tmp_path):
    """A process that runs several studies (a notebook, this suite) sends Ray's driver-side records from
    INFO up to the log of the study that runs, not to every earlier study's log too."""
    import logging

    from rayb.runtime import DRIVER_LOG_HANDLER, _quiet_driver

    first, second = tmp_path / "first.log", tmp_path / "second.log"
    _quiet_driver(first)
    logging.getLogger("ray.data").info("the first study's record")
    _quiet_driver(second)
    logging.getLogger("ray.data").info("the second study's record")
    logging.getLogger("ray.data").debug("Ray Data's own chatter")  # its session file keeps it
    logging.getLogger("ray.train").warning("a warning from Ray Train")
    assert "the first study's record" in first.read_text()
    assert "second" not in first.read_text() and "Ray Train" not in first.read_text()
    text = second.read_text()
    assert "the second study's record" in text and "a warning from Ray Train" in text
    assert "chatter" not in text and "first" not in text
    for name in ("ray", "ray.data"):
        assert [h.get_name() for h in logging.getLogger(name).handlers].count(DRIVER_LOG_HANDLER) == 1


def test_a_local_instance_is_a_fixed_cluster(ray_session):
    """rayb's own local Ray runs no autoscaler monitor: fixed."""
    from rayb import runtime

    capacity = runtime.capacity()
    assert not capacity.scales and not capacity.node_types
    assert capacity.nodes == ({"CPU": float(os.cpu_count())},)
    assert runtime.scaling_activity() is None


def test_an_autoscaler_running_elsewhere_is_told_by_the_node_types_it_reports():
    """KubeRay runs autoscaler v1 in a container of its own, where rayb cannot read its configuration; its
    report names the worker groups, where a monitor over the nodes that are up names each node_<id>."""
    from rayb.runtime import configured_types

    head, gpu = "a" * 56, "b" * 56
    readonly = {"node_type_mapping": {"10.0.0.1": f"node_{head}", "10.0.0.2": f"node_{gpu}"}}
    kuberay = {"node_type_mapping": {"10.0.0.1": "headgroup", "10.0.0.2": "gpu-a100x8"}}
    assert not configured_types(readonly, {head, gpu})
    assert configured_types(kuberay, {head, gpu})
    assert not configured_types({}, {head})  # no report yet: nothing says the cluster scales
