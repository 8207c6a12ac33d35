"""A real `ray job submit`: a fresh head node, a tiny study submitted as a job, its report checked."""

from __future__ import annotations

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
def head_node():
    """`ray start --head --block` in its own temp dir; terminating it stops only this cluster."""
    temp_dir = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # short: Ray's socket paths have a length limit
    # Every port the head opens is a free one: the suite's own Ray (dashboard and agent on their default
    # ports) is running beside it.
    ports = {
        flag: _free_port()
        for flag in ("port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                     "metrics-export-port", "runtime-env-agent-port", "ray-client-server-port")
    }  # fmt: skip
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", "--dashboard-host=127.0.0.1", "--num-cpus=8", f"--temp-dir={temp_dir}",
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


def test_submitted_study_succeeds_and_writes_its_report(head_node, tmp_path):
    raw = tiny_study_dict(seeds=[0])
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(raw))
    out, bucket = tmp_path / "out", tmp_path / "bucket"
    env = os.environ | {"RAY_ADDRESS": head_node}
    done = subprocess.run(
        [str(REPO / "jobs" / "submit_study.sh"), str(study_file), str(out), bucket.as_uri()],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout.lower()
    (study_dir,) = (out / "studies").iterdir()
    table = read_results(study_dir / "results.parquet")
    assert sorted(table.model) == ["gpt2", "mamba"] and (table.status == "ok").all()
    assert "gpt2" in (study_dir / "report.md").read_text()
    # The archive outlives the cluster's file system: results, report and the trials' models.
    assert (bucket / "studies" / study_dir.name / "report.html").is_file()
    assert len(list(bucket.glob("trials/*/model/*.safetensors"))) == 2
