"""Shared fixtures: one local Ray instance and one tiny token cache for the whole session."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from unittest import mock

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs two pytest workers side by side, each with a Ray instance that sees every core, so their
# torch processes share cores, as a study's worker groups never do, and OpenMP's threads spin-wait on
# cores the other process needs. Side by side on 2 cores, the tiny study's gpt2 stepped 1.9-2.5x slower
# under the default than with PASSIVE (`python bench/shared_cores.py`); alone, PASSIVE is the slower, but
# the suite's two processes mostly train at once: 1600 s against 1805 s on one machine. Ray's processes
# inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# No test reaches a hub. huggingface_hub and datasets read these once, at import: a test that set them
# after another test in its process had imported them still went to the network, and the test of
# `rayb data prepare` offline took 56 s, not 10 s, retrying a hub this machine cannot resolve.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def tiny_study_dict(**overrides) -> dict:
    """A study small enough to train in seconds on one CPU core."""
    study = {
        "name": "tiny",
        "data": {
            "sources": [
                {"name": "edu", "uri": "embedded://edu?docs=300", "weight": 0.6},
                {"name": "web", "uri": "embedded://web?docs=300", "weight": 0.4},
            ],
            "tokenizer": "bpe:512",
            "seq_len": 32,
            "token_budget": 32 * 8 * 24,
            "val_share": 0.1,
            "seed": 0,
        },
        "models": [
            {"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}},
            {"arch": "mamba", "config": {"d_model": 32, "n_layer": 2, "d_state": 4}},
        ],
        "train": {"lr": 3e-3, "warmup_steps": 2, "micro_batch": 4, "global_batch": 8, "eval_every": 8},
        "seeds": 2,
    }
    for key, value in overrides.items():
        study[key] = value
    return study


def registered_checkpoint_step(run_dir: Path) -> int:
    """The step of the latest checkpoint Ray Train has registered for a run (0 if none yet).
    A reported checkpoint counts for resumption only once the controller has recorded it here."""
    latest = _latest_checkpoint(run_dir) or {}
    return latest.get("metrics", {}).get("step", 0)


def _latest_checkpoint(run_dir: Path) -> dict | None:
    """The controller's record of a run's latest checkpoint; None while there is none, or while the
    controller is rewriting the file (a poll can read it empty)."""
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    try:
        return json.loads(snapshot.read_text()).get("latest_checkpoint_result")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def registered_checkpoint_trial(run_dir: Path) -> str | None:
    """The trial key of the latest checkpoint Ray Train has registered for a run (in a pack's run, the
    trials take turns): its DeepSpeed tag, `<trial key>-step<N>`, in the checkpoint's `latest` file."""
    latest = _latest_checkpoint(run_dir)
    if not latest:
        return None
    from rayb.train.trial import tag_trial

    return tag_trial((run_dir / latest["checkpoint_dir_name"] / "latest").read_text().strip())


def ray_processes(actor_class: str) -> list:
    """The live processes of a Ray actor class in the connected session (psutil.Process): the GCS's actors
    of that class whose process carries the title Ray gives it, `ray::<class>`, or `ray::<class>.<method>`
    while it runs that method (pass "<class>.<method>"). Only this session's: another Ray on the machine
    (a parallel test run's) keeps its own."""
    import psutil

    title = f"ray::{actor_class}"
    alive = [a["Pid"] for a in session_actors(actor_class.partition(".")[0]) if a["State"] == "ALIVE"]
    processes = []
    for pid in alive:
        try:
            process = psutil.Process(pid)
            if " ".join(process.cmdline()).startswith(title):
                processes.append(process)
        except psutil.NoSuchProcess:  # gone since the GCS listed it
            continue
    return processes


def train_worker_processes() -> list:
    """The processes of Ray Train's workers in the connected session (psutil.Process), for a test to kill:
    all but the idle ones this driver keeps between its pools (train/kept.keep_warm_workers)."""
    return _unkept_processes("RayTrainWorker", kept_worker_ids())


def controller_processes() -> list:
    """The processes of Ray Train's controllers in the connected session (psutil.Process), for a test to kill:
    all but the idle ones this driver keeps between its runs (train/kept.keep_controller)."""
    from rayb.train.kept import kept_controller_ids

    return _unkept_processes("EnvController", kept_controller_ids())


def _unkept_processes(actor_class: str, kept_ids: set[str]) -> list:
    idle = {a["Pid"] for a in session_actors(actor_class) if a["ActorID"] in kept_ids}
    return [p for p in ray_processes(actor_class) if p.pid not in idle]


def kept_worker_ids() -> set[str]:
    """The actor ids of the idle Train workers this driver keeps between its pools."""
    from rayb.train.kept import kept_worker_ids

    return kept_worker_ids()


def session_actors(class_name: str | None = None) -> list[dict]:
    """The actors of the connected Ray session (of `class_name`, if given), dead ones included, as the GCS
    has them: ActorID, ActorClassName, State, Pid... (no dashboard needed)."""
    from ray._private.state import actors

    return [a for a in actors().values() if class_name in (None, a["ActorClassName"])]


def job_actors(class_name: str) -> list:
    """This driver's job's actors of `class_name`, dead ones included, as the GCS has them (its
    ActorTableData: actor_id, owner_address, serialized_runtime_env, state...). Only this job's: another
    driver on the session's Ray has actors of its own."""
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    job = ray.get_runtime_context().get_job_id()
    table = state._connect_and_get_accessor().get_actor_table(None, None)
    actors = [gcs_pb2.ActorTableData.FromString(raw) for raw in table]
    return [a for a in actors if a.class_name == class_name and a.job_id.hex() == job]


def actor_runtime_envs(class_name: str) -> list[dict]:
    """The runtime_env that each actor of `class_name` in this driver's job was started with ({} for none)."""
    return [json.loads(a.serialized_runtime_env or "{}") for a in job_actors(class_name)]


def loop_with_steps_held(after: int, seconds: float):
    """rayb's training loop with each step after `after` held back `seconds`, so that a test's kill after
    that step's checkpoint lands before training ends on any machine (holding a step changes none of its
    numbers)."""

    def held_loop(config):
        import time

        from rayb.train import loop

        real_step = loop._train_step

        def train_step(run, step):
            if step > after:
                time.sleep(seconds)
            return real_step(run, step)

        loop._train_step = train_step
        loop.train_loop_per_worker(config)

    return held_loop


def restart_points(metrics_log: Path) -> list[int]:
    """Steps at which a run's raw (undeduplicated) log starts over: where it resumed after a failure."""
    steps = [json.loads(line)["step"] for line in metrics_log.read_text().splitlines() if '"train"' in line]
    return [b for a, b in zip(steps, steps[1:], strict=False) if b <= a]


# Every file that takes more than a few seconds, longest first (its tests' seconds in one worker of
# `-n 2 --dist loadfile --no-loadscope-reorder` on 2 cores, 2026-12-06). Collected first, so that a parallel
# run starts them first and ends on short files: ending on a long one left a core idle for a minute.
LONGEST_FIRST = (
    "test_training.py",  # 290
    "test_multinode.py",  # 267
    "test_team_studies.py",  # 228
    "test_study_e2e.py",  # 102
    "test_eval_pool.py",  # 94
    "test_faults.py",  # 90
    "test_job_submit.py",  # 88
    "test_lock.py",  # 86
    "test_cluster_waits.py",  # 71
    "test_autoscaling.py",  # 69
    "test_storage.py",  # 68
    "test_sequential.py",  # 66
    "test_report.py",  # 53
    "test_runtime.py",  # 40
    "test_selfcheck.py",  # 26
    "test_sizing.py",  # 22
    "test_gpu_check.py",  # 21
    "test_lm_eval_parity.py",  # 18
    "test_eval.py",  # 13
    "test_data_pipeline.py",  # 12
    "test_study_features.py",  # 11
    "test_frozen_heap.py",  # 10
    "test_bad_input.py",  # 8
    "test_tracking.py",  # 7
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (a stable sort: each file's own order stays). GPU tests (marked `gpu`, all
    of tests/gpu/) skip cleanly where there is no CUDA device."""
    import torch

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (on a GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """What collecting imported (torch, transformers, Ray, DeepSpeed: most of this process's objects) is
    left out of garbage collection from here on, as rayb leaves out its workers' imports
    (rayb.imports_frozen): Python's full collections during the tests, and the five pytest makes as the
    session ends, walk only what the tests made."""
    import gc

    gc.collect()
    gc.freeze()


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports. Their sockets stay bound until all are chosen: a port freed at once can be
    handed out again by the next bind, and a Ray node given one port for two components refuses to start."""
    import contextlib
    import socket

    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "rayb-test",
    "AWS_SECRET_ACCESS_KEY": "rayb-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """An S3 server on the loopback (moto's), as a process environment that reaches it: the endpoint and
    throwaway keys, which pyarrow, and so rayb and Ray, read from the environment like real credentials.

    The server is a process of its own, as a real store is. As a thread of this process it served every
    node's requests only between the test's own Python work: with one busy thread beside it, a two-node
    study on it did not finish in 15 minutes, against 90-110 s."""
    import subprocess
    import sys
    import time
    import urllib.request

    (port,) = free_ports(1)
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,  # a line per request otherwise
        # Where its request recorder (tests/test_storage.py) keeps what it records: not the working directory.
        env=os.environ | {"MOTO_RECORDER_FILEPATH": str(tmp_path_factory.mktemp("s3") / "recording")},
    )  # fmt: skip
    deadline = time.time() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            break
        except OSError:
            assert server.poll() is None and time.time() < deadline, "the S3 server did not start"
            time.sleep(0.1)
    yield S3_ENV | {"AWS_ENDPOINT_URL": endpoint}
    server.terminate()
    server.wait(timeout=30)


@pytest.fixture
def s3_bucket(s3_server, monkeypatch, request):
    """A fresh bucket on the loopback S3 server, with this process's environment pointing at it."""
    import boto3

    for key, value in s3_server.items():
        monkeypatch.setenv(key, value)
    name = "rayb-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
    boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return name


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """This node's mirror of object storage, private to the test (rayb/storage.py)."""
    from rayb import storage

    monkeypatch.setenv(storage.MIRROR_ENV, str(tmp_path / "mirror"))
    storage.mirror_root.cache_clear()
    yield tmp_path / "mirror"
    storage.mirror_root.cache_clear()


@pytest.fixture(scope="session")
def ray_session(s3_server, tmp_path_factory):
    """The suite's one local Ray. Its processes reach the loopback S3 server as a cluster's nodes reach
    their store: through credentials in their environment (this process's own stays untouched).

    Started as `rayb run` starts it (without -v): the workers' output stays in the session's log files,
    with no log monitor streaming it here. That process rescans every worker's log file as it polls, and
    the suite starts hundreds of workers: the two test workers' monitors took 51 CPU-seconds of a 20-minute
    run on 2 cores."""
    import ray

    from rayb import runtime

    with mock.patch.dict(os.environ, s3_server):
        runtime.init_ray(ray_logs=tmp_path_factory.mktemp("ray") / "driver.log")
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_cache(ray_session, tmp_path_factory):
    from rayb.data.pipeline import prepare_data
    from rayb.study import parse_study

    study = parse_study(tiny_study_dict())
    return prepare_data(study.data, tmp_path_factory.mktemp("cache"))
