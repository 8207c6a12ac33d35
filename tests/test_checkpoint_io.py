"""What a training worker moves to and from object storage (a real S3 server on the loopback): a resuming
rank reads only its own share of a checkpoint, and the metrics log's uploads never hold up a step."""

from __future__ import annotations

import threading
import time

from rayb import storage
from rayb.train import loop
from rayb.train.metrics_log import MetricsLog

# A two-rank ZeRO checkpoint as DeepSpeed 0.19.8 and rayb write it (fp32 and bf16 shard names alike).
TAG = "k-step8"
SHARED = ["latest", f"{TAG}/mp_rank_00_model_states.pt"]
OWN = {
    rank: [f"{TAG}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", f"rng_rank{rank}.pt"] for rank in (0, 1)
}
OWN_BF16 = {rank: [f"{TAG}/bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"] for rank in (0, 1)}


def test_a_resuming_rank_fetches_only_the_files_it_reads(s3_bucket, mirror):
    location = f"s3://{s3_bucket}/ray/run/checkpoint_0"
    for name in SHARED + [f for files in (*OWN.values(), *OWN_BF16.values()) for f in files]:
        storage.write_bytes(storage.join(location, name), name.encode())
    with loop._fetched(location, rank=1) as ckpt_dir:
        fetched = sorted(p.relative_to(ckpt_dir).as_posix() for p in ckpt_dir.rglob("*") if p.is_file())
        assert fetched == sorted(SHARED + OWN[1] + OWN_BF16[1])
        assert (ckpt_dir / OWN[1][1]).read_bytes() == OWN[1][1].encode()
    assert not ckpt_dir.exists()  # a checkpoint is read once: nothing of it stays on the node
    assert not list(mirror.rglob("*.pt"))


def test_a_local_checkpoint_is_read_where_it_is(tmp_path):
    with loop._fetched(str(tmp_path), rank=3) as ckpt_dir:
        assert ckpt_dir == tmp_path


def test_the_metrics_log_uploads_off_the_training_thread(s3_bucket, mirror, monkeypatch):
    """A store that takes a second per upload: writing a record never waits for it; a checkpoint's push
    waits, and after it the store has every record."""
    uploading = threading.Event()
    real_push = storage.push

    def slow_push(*args, **kwargs):
        uploading.set()
        time.sleep(1.0)
        real_push(*args, **kwargs)

    monkeypatch.setattr(storage, "push", slow_push)
    monkeypatch.setattr(MetricsLog, "PUSH_EVERY_S", 0.0)  # an upload due at every record
    location = f"s3://{s3_bucket}/trial/{loop.METRICS}"
    log = MetricsLog(location, enabled=True)
    began = time.perf_counter()
    for step in range(1, 21):
        log.write(kind="train", step=step, loss=1.0)
    assert time.perf_counter() - began < 0.5
    assert uploading.wait(timeout=5)  # and the uploads do run, on their own thread
    log.push()
    assert [r["step"] for r in loop.read_metrics(location)] == list(range(1, 21))
    log.write(kind="train", step=21, loss=1.0)
    log.push(final=True)
    assert [r["step"] for r in loop.read_metrics(location)][-1] == 21
    assert not log.path.exists()  # the final upload drops the local copy
