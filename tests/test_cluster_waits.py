"""A worker group waits for resources as long as the cluster may yet give them, and not when it never can:
on the suite's real local Ray, with its real CPU count."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    controller_processes,
    ray_processes,
    session_actors,
    tiny_study_dict,
    train_worker_processes,
)

from rayb.runner import plan_trials
from rayb.study import parse_study
from rayb.train.kept import kept_controller_ids, release_kept_workers
from rayb.train.trial import TrialPack
from rayb.tune.sweep import run_pool

pytestmark = pytest.mark.ray
CPUS = os.cpu_count() or 1


def _pack(tiny_cache, out, num_workers: int, seeds: tuple[int, ...] = (0,)) -> TrialPack:
    raw = tiny_study_dict(seeds=list(seeds))
    raw["models"] = raw["models"][:1]
    raw["train"] |= {"num_workers": num_workers, "micro_batch": 1, "global_batch": 8 * num_workers}
    return TrialPack(tuple(plan_trials(parse_study(raw), tiny_cache, out)))


def test_a_worker_group_waits_for_resources_longer_than_ray_trains_start_timeout(
    tiny_cache, tmp_path, monkeypatch
):
    """Every CPU is held (by evaluations, or while a node boots) for several of Ray Train's group start
    timeouts, here shortened to 2 s: the trial waits and then trains. Before, a group gave up after four
    timeouts and its trials failed."""
    import ray

    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "2")
    pack = _pack(tiny_cache, tmp_path, 1)

    @ray.remote(num_cpus=CPUS)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()
    ray.get(holder.ready.remote())
    release = threading.Timer(8 * 2, ray.kill, args=(holder,))
    release.start()
    began = time.monotonic()
    errors = run_pool([pack], 1)
    release.join()
    assert errors == {}
    assert pack.trials[0].done and time.monotonic() - began > 16


def test_a_cluster_that_can_never_fit_a_trial_stops_the_sweep_naming_why(tiny_cache, tmp_path):
    """A trial that needs more CPUs than the fixed cluster has (as after losing a node) would wait forever:
    the sweep's watch stops it, and every unfinished trial records why."""
    pack = _pack(tiny_cache, tmp_path, CPUS + 1)
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    errors = run_pool([pack], 1, str(study_dir))
    (error,) = errors.values()
    assert f"the sweep stopped: a trial needs {CPUS + 1} CPU" in error and "no autoscaler" in error
    assert not pack.trials[0].done
    from rayb.report.status import study_status, write_trials

    write_trials(study_dir, list(pack.trials))
    status = study_status(study_dir)
    assert status.cluster.startswith("stopped: a trial needs") and status.trials[0].state == "failed"


def test_a_worker_group_whose_controller_dies_is_started_again(tiny_cache, tmp_path):
    """The pool runs each group's Ray Train run from a thread of the driver: a run whose controller dies
    (killed here, as Ray's memory monitor may) is started again, and trains its trial to the end. The dead
    controller's placement group, the job's and not the controller's, goes: killed as its group started,
    before its group had started, it had held a CPU until the driver exited."""
    from ray.util import placement_group_table

    def held() -> set[str]:
        return {pg for pg, group in placement_group_table().items() if group["state"] != "REMOVED"}

    pack, earlier = _pack(tiny_cache, tmp_path, 1), held()
    killed: list[int] = []
    release_kept_workers()  # the group's controller is then a new one, not one this driver kept
    ended = {p.pid for p in ray_processes("EnvController")}  # earlier runs', on their way out

    def kill_the_first_controller() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            for process in [p for p in ray_processes("EnvController") if p.pid not in ended][:1]:
                process.kill()
                killed.append(process.pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_first_controller)
    killer.start()
    errors = run_pool([pack], 1)
    killer.join()
    assert killed, "no controller was seen to kill"
    assert errors == {} and pack.trials[0].done
    assert held() <= earlier


def test_ctrl_c_ends_the_pools_runs_and_frees_their_cpus(tiny_cache, tmp_path):
    """Ctrl-C while a group trains: the pool ends its group's run before the interrupt goes on, so no
    controller or worker is left training, and its placement group no longer holds the CPUs."""
    from ray.util import placement_group_table

    def held() -> set[str]:
        return {pg for pg, group in placement_group_table().items() if group["state"] != "REMOVED"}

    def left() -> list:
        return controller_processes() + train_worker_processes()

    def leftovers() -> str:
        """Which actors outlived the Ctrl-C, and whether each was a controller kept before the run."""
        pids = {p.pid for p in left()}
        actors = session_actors("EnvController") + session_actors("RayTrainWorker")
        return "; ".join(
            f"{a['ActorClassName']} {a['ActorID']} pid {a['Pid']} {a['State']}"
            + (" (kept before the run)" if a["ActorID"] in kept_before else "")
            for a in actors if a["Pid"] in pids
        )  # fmt: skip

    pack = _pack(tiny_cache, tmp_path, 1, seeds=(0, 1))  # two trials: the second cannot end before Ctrl-C
    first, earlier, kept_before = pack.trials[0].trial_dir, held(), kept_controller_ids()

    def interrupt_once_it_trains() -> None:
        deadline = time.monotonic() + 120
        while not (Path(first) / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # as Ctrl-C reaches the driver

    # Python's own Ctrl-C handler, as in `rayb run`: a test that called a trainer's fit() on this main
    # thread left Ray Train's handler in place, which exits the process.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_once_it_trains, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_pool([pack], 1)
    finally:
        signal.signal(signal.SIGINT, before)
    assert not all(t.done for t in pack.trials)  # interrupted while the group trained
    assert not held() - earlier
    deadline = time.monotonic() + 10
    while left():
        assert time.monotonic() < deadline, leftovers()
        time.sleep(0.2)
