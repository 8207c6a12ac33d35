"""One run of a study at a time, on a local output and on S3: a second run refuses and names the
holder; the run after a killed one starts (at once locally, once the lease is stale on S3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb import lock, storage
from rayb.cli import app
from rayb.lock import StudyLocked, study_lock

HOLD = "import sys, time; from rayb.lock import study_lock\nwith study_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)"


@pytest.fixture(params=["local", "s3"])
def output(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    return f"s3://{request.getfixturevalue('s3_bucket')}/out"


def _holder(study_dir: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, study_dir], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_run_of_a_study_refuses_and_names_the_first(output, tmp_path, monkeypatch):
    from rayb.runner import study_directory
    from rayb.study import parse_study

    raw = tiny_study_dict()
    study_dir = study_directory(parse_study(raw), output)
    holder = _holder(study_dir)
    try:
        with pytest.raises(StudyLocked, match=f"process {holder.pid} on "):
            with study_lock(study_dir):
                pass
        # `rayb run` refuses before it starts Ray or touches the study's files.
        study_file = tmp_path / "study.yaml"
        study_file.write_text(yaml.safe_dump(raw))
        refused = CliRunner().invoke(
            app, ["run", str(study_file), "--output", output], env={"COLUMNS": "200"}
        )
        assert refused.exit_code == 2 and f"process {holder.pid}" in refused.output, refused.output
        assert storage.listdir(study_dir) == [lock.LOCK_NAME]
    finally:
        holder.kill()
        holder.wait()
    # The holder was killed: locally the OS let go of its lock; on S3 its lease goes stale.
    monkeypatch.setattr(lock, "STALE_S", 3.0)
    monkeypatch.setattr(lock, "SETTLE_S", 0.2)
    if storage.is_remote(output):
        with pytest.raises(StudyLocked):
            with study_lock(study_dir):
                pass
        time.sleep(3.5)
    with study_lock(study_dir):
        pass
    if storage.is_remote(output):
        assert not storage.exists(storage.join(study_dir, lock.LOCK_NAME))  # a lease is given back


def test_two_runs_that_take_a_lease_at_once_leave_exactly_one_holding_it(s3_bucket):
    study_dir = f"s3://{s3_bucket}/out/studies/x"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD, study_dir],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ,
        )  # fmt: skip
        for _ in range(2)
    ]
    try:
        time.sleep(8)  # both read no lease, both write, each reads back after SETTLE_S
        held = [r for r in racers if r.poll() is None]
        refused = [r for r in racers if r.poll() is not None]
        assert len(held) == 1 and len(refused) == 1
        assert "already running" in refused[0].stderr.read()
    finally:
        for r in racers:
            r.send_signal(signal.SIGKILL)
            r.wait()


CLAIM = (
    "import sys, time; from rayb.lock import trial_claims\n"
    "with trial_claims(sys.argv[1], [sys.argv[2]], 'other'):\n    print('held', flush=True); time.sleep(600)"
)


@pytest.mark.ray
def test_a_study_that_needs_a_trial_another_study_is_training_refuses(output, ray_session, monkeypatch):
    """Two different studies share a trial (same model, data and training): while one trains it, the other
    refuses before training anything, naming the study and process that hold it."""
    from rayb.data.pipeline import prepare_data
    from rayb.runner import plan_trials, run_study
    from rayb.study import parse_study

    monkeypatch.setattr(lock, "SETTLE_S", 0.2)
    study = parse_study(tiny_study_dict(seeds=[0]))
    trials = plan_trials(study, prepare_data(study.data, storage.join(output, "cache")), output, {})
    holder = subprocess.Popen(
        [sys.executable, "-c", CLAIM, output, trials[0].key],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StudyLocked, match=f"trained by study 'other': process {holder.pid} on "):
            run_study(study, output, log=lambda _: None)
        assert not storage.exists(storage.join(output, "ray", "tune"))  # nothing was trained
    finally:
        holder.kill()
        holder.wait()
    # Claims that do not overlap never collide; a run's claims are given back when it ends.
    with lock.trial_claims(output, [trials[1].key], "this"), lock.trial_claims(output, ["other"], "that"):
        pass
    if storage.is_remote(output):  # only the killed holder's lease is left, until it goes stale
        assert storage.listdir(storage.join(output, lock.CLAIMS_DIR)) == [f"{trials[0].key}.json"]
