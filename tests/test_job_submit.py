"""A real `ray job submit`: a fresh head node, a tiny study submitted as a job, its report checked."""

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


CPUS = os.cpu_count() or 1


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    """A one-node cluster: `ray start --head` declaring the machine's real CPU count, as a user starting a
    head would (a head declaring more than the machine has would hide what a user hits)."""
    cluster = LocalCluster(env={}, root=tmp_path_factory.mktemp("cluster"))
    cluster.start_head(CPUS)
    yield cluster.address
    cluster.stop()


def _submit(
    study: dict, tmp_path: Path, address: str, *archive: str
) -> tuple[subprocess.CompletedProcess, Path]:
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    done = subprocess.run(
        [str(REPO / "jobs" / "submit_study.sh"), str(study_file), str(out), *archive],
        env=os.environ | {"RAY_ADDRESS": address}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return done, out


# Every trial holds exactly its worker's CPU (its Train controller none), so two models train side by
# side, with the evaluations queued behind them.
def test_submitted_study_succeeds_and_writes_its_report(head_node, tmp_path):
    bucket = tmp_path / "bucket"
    done, out = _submit(tiny_study_dict(seeds=[0]), tmp_path, head_node, bucket.as_uri())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout.lower()
    (study_dir,) = (out / "studies").iterdir()
    table = read_results(study_dir / "results.parquet")
    assert sorted(table.model) == ["gpt2", "mamba"] and (table.status == "ok").all()
    assert "gpt2" in (study_dir / "report.md").read_text()
    # Provenance records the cluster as Ray sees it: the CPUs the head declared.
    provenance = json.loads((study_dir / "provenance.json").read_text())
    assert provenance["hardware"]["ray_cluster"]["CPU"] == CPUS
    # The archive outlives the cluster's file system: results, report and the trials' models.
    assert (bucket / "studies" / study_dir.name / "report.html").is_file()
    assert len(list(bucket.glob("trials/*/model/*.safetensors"))) == 2


def test_a_trial_the_cluster_can_never_fit_fails_before_any_work(head_node, tmp_path):
    workers = CPUS + 2  # micro-batches of 1 make any worker count divide the global batch
    study = tiny_study_dict(seeds=[0])
    study["train"] |= {"num_workers": workers, "micro_batch": 1, "global_batch": workers}
    before = _train_actors(head_node)
    done, out = _submit(study, tmp_path, head_node)
    assert done.returncode != 0
    assert f"a trial needs {workers} CPU" in done.stdout and f"have {CPUS} CPU" in done.stdout
    assert not (out / "cache").exists()  # it stopped before preparing data
    assert _train_actors(head_node) == before  # nor started a Train controller or worker ahead of its runs


def _train_actors(address: str) -> set[str]:
    """The Ray Train controllers and workers the cluster has started, alive or gone."""
    from ray.util.state import list_actors

    return {
        a.actor_id
        for kind in ("EnvController", "RayTrainWorker")
        for a in list_actors(address=address, filters=[("class_name", "=", kind)], limit=10_000)
    }
