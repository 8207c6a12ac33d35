"""A real `ray job submit`: a fresh head node, a tiny study submitted as a job, its report checked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import tiny_study_dict

from rayb.results import read_results

pytestmark = pytest.mark.ray
REPO = Path(__file__).parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head_node(request):
    """`ray start --head --block` in its own temp dir, declaring `request.param` CPUs (the machine's real
    count unless a test asks for more, as a user starting a head would); terminating it stops only this
    cluster."""
    num_cpus = getattr(request, "param", os.cpu_count())
    temp_dir = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # short: Ray's socket paths have a length limit
    # Every port the head opens is a free one: the suite's own Ray (dashboard and agent on their default
    # ports) is running beside it.
    ports = {
        flag: _free_port()
        for flag in ("port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                     "metrics-export-port", "runtime-env-agent-port", "ray-client-server-port")
    }  # fmt: skip
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--dashboard-host=127.0.0.1", f"--num-cpus={num_cpus}", f"--temp-dir={temp_dir}",
         "--include-dashboard=true", *(f"--{flag}={port}" for flag, port in ports.items())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    dashboard = ports["dashboard-port"]
    address = f"http://127.0.0.1:{dashboard}"
    # Ready means a job runs: the job API answers before the head's job agent is up.
    probe = ["ray", "job", "submit", "--address", address, "--", "python", "-c", "pass"]
    deadline = time.time() + 180
    while subprocess.run(probe, capture_output=True).returncode:
        assert head.poll() is None and time.time() < deadline, "head node did not come up"
        time.sleep(2)
    yield address
    head.terminate()
    head.wait(timeout=60)


def _submit(study: dict, tmp_path: Path, address: str, *archive: str) -> tuple[subprocess.CompletedProcess, Path]:
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
@pytest.mark.parametrize(("head_node", "cpus"), [(2, 2), (4, 4)], indirect=["head_node"], ids=["2cpus", "4cpus"])
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
