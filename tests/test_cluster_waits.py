"""A worker group waits for resources as long as the cluster may yet give them, and not when it never can:
on the suite's real local Ray, with its real CPU count."""

from __future__ import annotations

import os
import threading
import time

import pytest
from conftest import tiny_study_dict

from rayb.runner import plan_trials
from rayb.study import parse_study
from rayb.train.trial import TrialPack
from rayb.tune.sweep import run_pool

pytestmark = pytest.mark.ray
CPUS = os.cpu_count() or 1


def _pack(tiny_cache, out, num_workers: int) -> TrialPack:
    raw = tiny_study_dict(seeds=[0])
    raw["models"] = raw["models"][:1]
    raw["train"] |= {"num_workers": num_workers, "micro_batch": 1, "global_batch": 8 * num_workers}
    (trial,) = plan_trials(parse_study(raw), tiny_cache, out)
    return TrialPack((trial,))


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
    (killed here, as Ray's memory monitor may) is started again, and trains its trial to the end."""
    import psutil

    pack = _pack(tiny_cache, tmp_path, 1)
    killed: list[int] = []

    def kill_the_first_controller() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            for process in psutil.process_iter(["cmdline"]):
                if "ray::TrainController" in " ".join(process.info["cmdline"] or []):
                    process.kill()
                    killed.append(process.pid)
                    break
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_first_controller)
    killer.start()
    errors = run_pool([pack], 1)
    killer.join()
    assert killed, "no controller was seen to kill"
    assert errors == {} and pack.trials[0].done
