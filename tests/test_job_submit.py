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


@pytest.fixture
def head_node(request, tmp_path):
    """A one-node cluster: `ray start --head` declaring `request.param` CPUs (the machine's real count
    unless a test asks for more, as a user starting a head would)."""
    cluster = LocalCluster(env={}, root=tmp_path / "cluster")
    cluster.start_head(getattr(request, "param", os.cpu_count()))
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


# A new user's cluster: a head declaring the machine's real 2 cores, or 4. Every trial holds exactly its
# worker's CPU (its Tune actor and Train controller none), so two models × two seeds all train, with
# the evaluations queued behind them, instead of each trial's Tune actor starving the workers.
@pytest.mark.parametrize(
    ("head_node", "cpus"), [(2, 2), (4, 4)], indirect=["head_node"], ids=["2cpus", "4cpus"]
)
def test_submitted_study_succeeds_and_writes_its_report(head_node, cpus, tmp_path):
    bucket = tmp_path / "bucket"
    done, out = _submit(tiny_study_dict(seeds=[0, 1]), tmp_path, head_node, bucket.as_uri())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout.lower()
    (study_dir,) = (out / "studies").iterdir()
    table = read_results(study_dir / "results.parquet")
    assert sorted(table.model) == ["gpt2", "gpt2", "mamba", "mamba"] and (table.status == "ok").all()
    assert "gpt2" in (study_dir / "report.md").read_text()
    # Provenance records the cluster as Ray sees it: the CPUs the head declared.
    provenance = json.loads((study_dir / "provenance.json").read_text())
    assert provenance["hardware"]["ray_cluster"]["CPU"] == cpus
    # The archive outlives the cluster's file system: results, report and the trials' models.
    assert (bucket / "studies" / study_dir.name / "report.html").is_file()
    assert len(list(bucket.glob("trials/*/model/*.safetensors"))) == 4


@pytest.mark.parametrize("head_node", [2], indirect=True)
def test_a_trial_the_cluster_can_never_fit_fails_before_any_work(head_node, tmp_path):
    study = tiny_study_dict(seeds=[0])
    study["train"] |= {"num_workers": 4, "micro_batch": 2}
    done, out = _submit(study, tmp_path, head_node)
    assert done.returncode != 0
    assert "a trial needs 4 CPU on one node" in done.stdout and "have 2 CPU" in done.stdout
    assert not (out / "cache").exists()  # it stopped before preparing data
