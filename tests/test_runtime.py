"""The local Ray instance rayb starts: what its processes get from the driver."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.ray


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
