"""A cluster that scales from zero, as Ray's own autoscaler runs one: a 1-CPU head whose autoscaler (Ray's
fake provider: its nodes are processes on this machine) may add one 2-CPU node, and a study whose trials
need 2 CPUs on one node. The study must wait for that node, say so, and train on it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import tiny_study_dict
from local_cluster import LocalCluster

from rayb.results import read_results

pytestmark = pytest.mark.ray
REPO = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def scaling_head(tmp_path_factory):
    cluster = LocalCluster(env={}, root=tmp_path_factory.mktemp("scaling"))
    cluster.start_head(1, node_types={"cpu2": {"CPU": 2}})
    yield cluster
    cluster.stop()


def test_a_study_on_a_cluster_that_scales_from_zero_waits_for_its_node_and_trains(scaling_head, tmp_path):
    study = tiny_study_dict(seeds=[0], eval=["lm"])
    study["models"] = study["models"][:1]
    study["train"] |= {"num_workers": 2}
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    # The fake provider's nodes share the head's temp directory, where a job's working_dir is unpacked: a
    # node unpacking it again deletes the driver's working directory. rayb is installed here, so the job
    # ships no working_dir (on a real cluster every node has its own disk).
    runtime_env = yaml.safe_load((REPO / "jobs" / "runtime_env.yaml").read_text())
    (tmp_path / "runtime_env.yaml").write_text(yaml.safe_dump({"env_vars": runtime_env["env_vars"]}))
    done = subprocess.run(
        [str(REPO / "jobs" / "submit_study.sh"), str(study_file), str(out)],
        env=os.environ | {"RAY_ADDRESS": scaling_head.address, "RAYB_RUNTIME_ENV": str(tmp_path / "runtime_env.yaml")},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    (tmp_path / "job.log").write_text(done.stdout + done.stderr)
    logs = done.stdout + done.stderr
    assert done.returncode == 0, logs[-4000:]
    # Before: "a trial needs 2 CPU ... it has no autoscaler that could add more", with nothing trained.
    assert "waiting for nodes: the autoscaler is starting 1 cpu2" in logs, logs[-4000:]
    (study_dir,) = (out / "studies").iterdir()
    table = read_results(study_dir / "results.parquet")
    assert list(table.status) == ["ok"]
    # The node came: the cluster now has the head's CPU and the new node's two.
    provenance = json.loads((study_dir / "provenance.json").read_text())
    assert len(scaling_head.alive_nodes()) == 2
    assert provenance["hardware"]["ray_cluster"]["CPU"] == 1  # planned on the head alone, and not refused
