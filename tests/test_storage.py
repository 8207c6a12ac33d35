"""Object storage (rayb/storage.py) against a real S3 server on the loopback, and the same calls on local
paths: what a study writes lands on the store, what a node reads comes through its mirror."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time

import numpy as np
import pytest
import yaml
from conftest import tiny_study_dict

from rayb import storage
from rayb.data import cache as token_cache
from rayb.data.cache import MANIFEST, RangedRows, TokenCache, shard_name
from rayb.models import build_model
from rayb.models.registry import get_arch


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path, mirror):
    if request.param == "local":
        return str(tmp_path / "out")
    return f"s3://{request.getfixturevalue('s3_bucket')}/out"


def test_locations_join_and_map_to_the_mirror(mirror):
    assert storage.join("s3://b/out/", "trials", "x") == "s3://b/out/trials/x"
    assert storage.join("/data/out", "trials") == "/data/out/trials"
    assert storage.local("s3://b/out/x.json") == mirror / "s3" / "b" / "out" / "x.json"
    assert storage.local("/data/out") == storage.local("/data/out/")  # a local path is itself
    assert storage.is_remote("gs://b/x") and not storage.is_remote("/x") and not storage.is_remote("C:/x")
    assert storage.name("s3://b/out/studies/tiny-abc/") == "tiny-abc"


def test_small_files_are_written_whole_and_read_back(root):
    target = storage.join(root, "trials", "t1", "train_result.json")
    assert storage.read_bytes(target) is None and not storage.exists(target)
    storage.write_bytes(target, b'{"status": "ok"}')
    assert storage.read_bytes(target) == b'{"status": "ok"}' and storage.exists(target)
    assert storage.listdir(storage.join(root, "trials")) == ["t1"]
    storage.remove(storage.join(root, "trials"))
    assert not storage.exists(target) and storage.listdir(storage.join(root, "trials")) == []


def test_a_pushed_tree_is_fetched_once_and_again_only_when_it_changed(root):
    location = storage.join(root, "model")
    written = storage.writable(location)
    written.mkdir(parents=True, exist_ok=True)
    (written / "weights.bin").write_bytes(b"w" * 1000)
    (written / "config.json").write_text("{}")
    storage.push(location, last=("config.json",))
    if storage.is_remote(root):
        assert not written.exists()  # the private copy is dropped once the store has it
    local = storage.fetch_tree(location)
    assert (local / "weights.bin").read_bytes() == b"w" * 1000 and (local / "config.json").read_text() == "{}"
    stamp = (local / "weights.bin").stat().st_mtime_ns
    assert storage.fetch_tree(location) == local and (local / "weights.bin").stat().st_mtime_ns == stamp
    storage.write_bytes(storage.join(location, "weights.bin"), b"v" * 999)  # the store's copy changes
    assert storage.fetch(storage.join(location, "weights.bin")).read_bytes() == b"v" * 999


def test_a_kept_tree_pushed_again_uploads_only_what_changed(s3_bucket):
    location = f"s3://{s3_bucket}/study"
    written = storage.writable(location)
    written.mkdir(parents=True, exist_ok=True)
    (written / "log.txt").write_text("one")
    (written / "events").write_bytes(b"e" * 100)
    storage.push(location, keep=True)
    storage.remove(storage.join(location, "events"))  # so a second upload of it would show
    (written / "log.txt").write_text("one two")
    storage.push(location, keep=True)
    assert storage.read_bytes(storage.join(location, "log.txt")) == b"one two"
    assert not storage.exists(storage.join(location, "events"))  # unchanged: not uploaded again


@contextlib.contextmanager
def recorded_requests(s3_server):
    """The requests the loopback S3 server takes meanwhile, as (method, path?query) (moto's recorder)."""
    import urllib.request
    from urllib.parse import urlparse

    api = f"{s3_server['AWS_ENDPOINT_URL']}/moto-api/recorder"

    def post(action: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{api}/{action}", method="POST")).close()

    post("reset-recording")
    post("start-recording")
    requests: list[tuple[str, str]] = []
    try:
        yield requests
    finally:
        post("stop-recording")
    with urllib.request.urlopen(f"{api}/download-recording") as recording:
        for request in map(json.loads, recording.read().decode().splitlines()):
            url = urlparse(request["url"])
            requests.append((request["method"], url.path + (f"?{url.query}" if url.query else "")))


def test_a_small_file_goes_to_the_store_in_one_request_and_a_large_one_in_parts(
    s3_bucket, s3_server, tmp_path
):
    """rayb's writes and Ray Train's checkpoint uploads (through the filesystem rayb hands its runs) put a
    file smaller than a multipart part in one request, not three (start an upload, its part, complete)."""
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.storage import StorageContext

    from rayb.train.trainer import run_storage

    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "rng_rank0.pt").write_bytes(b"r" * 20_000)
    run = StorageContext(**run_storage(f"s3://{s3_bucket}/ray/train"), experiment_dir_name="run")
    with recorded_requests(s3_server) as requests:
        storage.write_bytes(f"s3://{s3_bucket}/trial/checkpoint.json", b"{}")
        run.persist_current_checkpoint(Checkpoint.from_directory(tmp_path / "checkpoint"), "checkpoint_0")
    # What writes (less its directory markers): no multipart upload's three requests.
    writes = [(method, path) for method, path in requests if method in ("PUT", "POST") and path[-1] != "/"]
    assert writes == [
        ("PUT", f"/{s3_bucket}/trial/checkpoint.json"),
        ("PUT", f"/{s3_bucket}/ray/train/run/checkpoint_0/rng_rank0.pt"),
    ], requests
    assert storage.read_bytes(f"s3://{s3_bucket}/ray/train/run/checkpoint_0/rng_rank0.pt") == b"r" * 20_000
    assert run_storage(str(tmp_path)) == {"storage_path": str(tmp_path)}  # a local path as it is
    # A file of several parts (a token shard, a large model's states) still goes up as a multipart upload.
    shard = np.random.default_rng(0).bytes(12 << 20)
    with recorded_requests(s3_server) as requests:
        storage.write_bytes(f"s3://{s3_bucket}/cache/train.bin", shard)
    assert ("POST", f"/{s3_bucket}/cache/train.bin?uploads") in requests
    assert storage.read_bytes(f"s3://{s3_bucket}/cache/train.bin") == shard


def test_a_file_rewritten_while_it_is_read_is_read_whole(s3_bucket, mirror):
    """A growing file on the store (a metrics log, Ray Train's checkpoint snapshot) is rewritten as a
    whole while others read it. A reader that takes the object's size, then that many bytes, got a newer
    version cut short: 22 of 200 reads here before the fix, and once in CI a JSON snapshot cut mid-value.
    Each version is JSON whose padding its count checks, so any cut or mix of two versions shows."""
    location = f"s3://{s3_bucket}/growing.json"
    storage.write_bytes(location, json.dumps({"n": 0, "pad": ""}).encode())
    stop = threading.Event()

    def rewrite():
        n = 0
        while not stop.is_set():
            n += 1
            began = time.perf_counter()
            storage.write_bytes(location, json.dumps({"n": n, "pad": "x" * n}).encode())
            # A writer far busier than any of rayb's (seconds apart), yet one that pauses: a version goes up
            # in one request, and without a pause as long as a read no read could find the object unchanged.
            # A read takes three requests, so the pause is four writes' time, never under 20 ms: with 20 ms
            # alone, a suite's load once made every read of ten overlap a write. At 20 ms, a reader without
            # the check above read 17 of 150 versions cut short.
            stop.wait(max(0.02, 4 * (time.perf_counter() - began)))

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        versions = [json.loads(storage.read_bytes(location)) for _ in range(150)]
        versions += [json.loads(storage.fetch(location).read_bytes()) for _ in range(50)]
    finally:
        stop.set()
        writer.join()
    assert all(len(v["pad"]) == v["n"] for v in versions)
    assert versions[-1]["n"] > versions[0]["n"]  # the writer really ran beside the reads


class _BreaksOff:
    """A store's filesystem whose first `reads` reads the store breaks off partway, with the error pyarrow
    raised when moto's S3 server did so to a reader of an object being replaced."""

    def __init__(self, fs, reads: int):
        self.fs, self.left, self.broken = fs, reads, 0

    def get_file_info(self, path):
        return self.fs.get_file_info(path)

    @contextlib.contextmanager
    def open_input_file(self, path):
        with self.fs.open_input_file(path) as source:
            if self.left:
                self.left, self.broken = self.left - 1, self.broken + 1
                source.read(1)
                raise OSError(
                    "AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream"
                )
            yield source


def test_a_read_the_store_breaks_off_is_read_again(s3_bucket, monkeypatch):
    location = f"s3://{s3_bucket}/broken-off.json"
    storage.write_bytes(location, b'{"n": 1}')
    fs, path = storage.filesystem(location)
    store, sink = _BreaksOff(fs, reads=2), io.BytesIO()
    storage._read_whole(store, path, sink)
    assert sink.getvalue() == b'{"n": 1}' and store.broken == 2
    # A store that breaks off every read: its own error, not a file cut short or an empty one.
    monkeypatch.setattr(storage, "_READ_ATTEMPTS", 3)
    with pytest.raises(OSError, match="INTERNAL_FAILURE"):
        storage._read_whole(_BreaksOff(fs, reads=3), path, io.BytesIO())


def test_a_cache_on_s3_is_the_local_cache_byte_for_byte(
    ray_session, tiny_cache, s3_bucket, mirror, monkeypatch
):
    from rayb.data import pipeline
    from rayb.study import parse_study

    spec = parse_study(tiny_study_dict()).data
    # Shards of 7 rows: training rows in many objects, each written whole by its own task.
    monkeypatch.setattr(pipeline, "SHARD_BYTES", 7 * spec.seq_len * 2)
    remote = pipeline.prepare_data(spec, f"s3://{s3_bucket}/out/cache")
    # Same data key: where the output lives changes no hash.
    assert remote.manifest["key"] == tiny_cache.manifest["key"] and storage.is_remote(remote.path)
    assert remote.manifest["train_shard_rows"] == 7 and "train_shard_rows" not in tiny_cache.manifest
    files = storage.listdir(remote.path)
    assert "train-00000.bin" in files and "train.bin" not in files and "val.bin" in files
    assert pipeline.STREAM_DIR not in files  # the tokenized streams are gone once the rows are placed
    # A worker reads its own rows by byte range, for any worker count, past the first epoch: the very rows
    # of the local cache, across shard boundaries, without downloading any shard.
    epochs = 3 * tiny_cache.batches_per_epoch(8)
    for world, micro_batch in ((1, 4), (2, 2), (4, 1)):
        for step in range(epochs):
            for rank in range(world):
                for micro in range(8 // (micro_batch * world)):
                    args = (step, micro, rank, world, 8, micro_batch)
                    assert np.array_equal(remote.micro_batch(*args), tiny_cache.micro_batch(*args))
    assert not list(mirror.rglob("train*.bin"))
    assert np.array_equal(remote.train, tiny_cache.train) and np.array_equal(remote.val, tiny_cache.val)
    assert remote.held_out.documents == tiny_cache.held_out.documents
    assert (remote.tokenizer_dir / "tokenizer.json").read_bytes() == (
        tiny_cache.tokenizer_dir / "tokenizer.json"
    ).read_bytes()
    # The build happened in private scratch space, dropped once uploaded: only the mirror holds files.
    assert not list(mirror.glob("writes-*/**/train.bin"))


def _uploaded(cache: TokenCache, location: str, shard_rows: int | None) -> TokenCache:
    """A copy of a local cache's manifest and training rows on the store: train.bin whole, or in shards of
    `shard_rows` rows as a cache built there in shards holds them."""
    manifest, rows = dict(cache.manifest), np.asarray(cache.train)
    per = shard_rows or len(rows)
    shards = -(-len(rows) // per)
    for k in range(shards):
        storage.write_bytes(
            storage.join(location, shard_name("train", k, shards)), rows[k * per : (k + 1) * per].tobytes()
        )
    if shard_rows:
        manifest["train_shard_rows"] = shard_rows
    storage.write_bytes(storage.join(location, MANIFEST), json.dumps(manifest).encode())
    return TokenCache(location)


@pytest.mark.parametrize("shard_rows", [None, 7])
def test_a_worker_reads_a_cache_on_s3_a_block_at_a_time(
    tiny_cache, s3_bucket, mirror, monkeypatch, shard_rows
):
    """A micro-batch is a few rows. A lone worker reads blocks of many (here 5 rows, so blocks end inside
    micro-batches, and in shards of 7 rows span two), each block once in the first epoch; one of several
    workers reads a block per micro-batch of its own, never the others' rows; every epoch's rows are the
    local cache's."""
    monkeypatch.setattr(token_cache, "BLOCK_BYTES", 5 * tiny_cache.seq_len * 2)
    fetched = []
    fetch = RangedRows._fetch
    monkeypatch.setattr(
        RangedRows,
        "_fetch",
        lambda self, block: fetched.append((self.block_rows, block)) or fetch(self, block),
    )
    per_epoch = tiny_cache.batches_per_epoch(8)
    for world, micro_batch in ((1, 4), (2, 2)):
        remote = _uploaded(tiny_cache, f"s3://{s3_bucket}/cache-{world}", shard_rows)
        fetched.clear()
        for step in range(3 * per_epoch):
            for micro in range(8 // (micro_batch * world)):
                args = (step, micro, world - 1, world, 8, micro_batch)
                assert np.array_equal(remote.micro_batch(*args), tiny_cache.micro_batch(*args))
            if step == per_epoch - 1:  # the first epoch: the blocks of its rows, each read once
                if world == 1:
                    blocks = {(5, row // 5) for row in range(per_epoch * 8)}
                else:  # the second worker's rows of each step, 2-3 and 6-7 of 8: a block each
                    blocks = {
                        (2, (8 * s + 2 * (2 * micro + 1)) // 2)
                        for s in range(per_epoch)
                        for micro in range(2)
                    }
                assert sorted(fetched[: len(blocks)]) == sorted(blocks)
    assert not list(mirror.rglob("train*.bin"))


@pytest.mark.parametrize("shard_rows", [None, 7])
def test_the_overfit_suite_reads_only_its_rows_of_a_cache_on_s3(tiny_cache, s3_bucket, mirror, shard_rows):
    """The overfit suite memorises the first rows of the training split. On object storage it reads just
    the block holding those rows, by byte range: no node downloads the split (gigabytes at scale) for a
    thousand rows of it."""
    from rayb.eval.overfit import OverfitOptions, run_overfit
    from rayb.eval.registry import EvalContext

    remote = _uploaded(tiny_cache, f"s3://{s3_bucket}/cache", shard_rows)
    end = tiny_cache.manifest["train_rows"]
    assert np.array_equal(remote.train_rows(0, 12), tiny_cache.train[:12])  # across shards, if in shards
    assert np.array_equal(remote.train_rows(end - 3, 12), tiny_cache.train[end - 3 :])  # cut at the end
    config = get_arch("gpt2").shape(32, 2)
    fresh = lambda: build_model("gpt2", config, tiny_cache.manifest["vocab_size"], tiny_cache.seq_len)  # noqa: E731
    scores = [
        run_overfit(EvalContext(fresh(), None, cache, fresh_model=fresh), None, OverfitOptions(12, steps=3))
        for cache in (remote, tiny_cache)
    ]
    assert scores[0]["examples"] == 12 and scores[0] == scores[1]  # the same rows, the same training
    assert not list(mirror.rglob("train*.bin"))


def test_a_cache_upload_cut_short_is_never_trusted(ray_session, tiny_cache, s3_bucket, mirror, monkeypatch):
    """The driver dies while it uploads a cache: everything but the manifest is on the store. A rerun must
    rebuild it rather than read a cache that may be missing its last files."""
    from rayb.data.pipeline import prepare_data
    from rayb.study import parse_study

    spec = parse_study(tiny_study_dict()).data
    root = f"s3://{s3_bucket}/out/cache"
    real_push = storage.push

    def dies_before_the_manifest(location, *, last=(), keep=False):
        for file in sorted(storage.writable(location).rglob("*")):
            if file.is_file() and file.name not in last:
                rel = file.relative_to(storage.writable(location)).as_posix()
                storage.write_bytes(storage.join(location, rel), file.read_bytes())
        raise KeyboardInterrupt  # killed here: the manifest never went up

    monkeypatch.setattr(storage, "push", dies_before_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(spec, root)
    cache_dir = storage.join(root, "data", tiny_cache.manifest["key"])
    assert storage.exists(storage.join(cache_dir, "train.bin"))
    assert not storage.exists(storage.join(cache_dir, MANIFEST))
    monkeypatch.setattr(storage, "push", real_push)
    rebuilt = prepare_data(spec, root)
    assert np.array_equal(TokenCache(rebuilt.path).train, tiny_cache.train)


def test_a_finetuning_arm_starts_from_another_studys_weights_on_s3(ray_session, s3_bucket, tmp_path, mirror):
    """`init_from: study:FILE#MODEL` on an output on object storage: the named study runs first, on the same
    store, and the arm's workers load its weights and tokenizer from there."""
    from rayb.runner import run_study
    from rayb.study import load_study
    from rayb.train.loop import METRICS
    from rayb.train.trial import read_metrics

    gpt2 = {"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}}
    base = tiny_study_dict(seeds=[0], models=[gpt2])
    base["data"]["token_budget"] = 32 * 8 * 8
    (tmp_path / "pre.yaml").write_text(yaml.safe_dump(base | {"name": "pre"}))
    arm = base | {"name": "arm", "models": [gpt2 | {"name": "arm", "init_from": "study:pre.yaml#gpt2"}]}
    (tmp_path / "arm.yaml").write_text(yaml.safe_dump(arm))

    outcome = run_study(load_study(tmp_path / "arm.yaml"), f"s3://{s3_bucket}/out", log=lambda _: None)
    (trial,) = outcome.trials
    assert outcome.table.status.tolist() == ["ok"]
    assert trial.init_from["model"].startswith(f"s3://{s3_bucket}/out/")

    def first_loss(trial_dir: str) -> float:
        return next(r["loss"] for r in read_metrics(storage.join(trial_dir, METRICS)) if r["kind"] == "train")

    pre = trial.init_from["model"].removesuffix("/model")  # the named study's trial
    assert storage.exists(storage.join(pre, "train_result.json"))
    # The arm's first step starts from the trained weights: its loss is already well below a fresh start's.
    assert first_loss(trial.trial_dir) < first_loss(pre) - 0.25
