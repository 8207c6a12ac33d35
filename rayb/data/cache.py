"""The packed-token cache: what Ray Data writes once and every trial of a study reads.

Layout (nanoGPT-style flat files, memory-mapped, so a worker touches only the rows it trains on):
    manifest.json   seq_len, rows, dtype, tokenizer, per-source counts, unigram entropy
    train.bin       (train_rows, seq_len) tokens in their final, shuffled, mixed order
    val.bin         (val_rows, seq_len) held-out tokens: each source's held-out documents (a seeded random
                    sample, split.py) packed in order, source after source, in the training mix
    held_out/       the text behind the validation rows, and the UTF-8 bytes each row scores (held_out.py)

On object storage (rayb/storage.py) the training rows larger than one shard (SHARD_BYTES, pipeline.py) are
shards, each written whole by its own task: train-00000.bin, train-00001.bin, ... of `train_shard_rows`
rows each (in the manifest). A Train worker reads the blocks holding its rows of each batch by byte range,
those of the next READ_AHEAD micro-batches already on their way (`RangedRows`), so no node downloads the
split; an evaluation that needs a few training rows (the overfit suite) reads them the same way. The other
files a process opens (manifest, tokenizer, val.bin, the held-out record) are fetched into its node's
mirror the first time.

Global batch `s` is rows [s·G, (s+1)·G) of train.bin, whatever the number of workers: each worker
takes an interleaved share of it. That is what makes every model's batch sequence identical.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from rayb import storage
from rayb.data.held_out import HELD_OUT_DIR, HeldOut
from rayb.data.held_out import read as read_held_out

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class TokenCache:
    path: Path | str  # a local directory, or a URI on object storage

    @cached_property
    def manifest(self) -> dict:
        location = storage.join(self.path, MANIFEST)
        data = storage.read_bytes(location)
        if data is None:  # as reading a missing local file always raised: no manifest, no finished cache
            raise FileNotFoundError(f"{location} does not exist: this token cache was never finished")
        return json.loads(data)

    @property
    def seq_len(self) -> int:
        return self.manifest["seq_len"]

    @property
    def tokenizer_dir(self) -> Path:
        return storage.fetch_tree(storage.join(self.path, "tokenizer"))

    @cached_property
    def train(self) -> np.ndarray:
        return self._open("train")

    @cached_property
    def val(self) -> np.ndarray:
        return self._open("val")

    @cached_property
    def held_out(self) -> HeldOut:
        storage.fetch_tree(storage.join(self.path, HELD_OUT_DIR))
        return read_held_out(storage.local(self.path))

    def _open(self, split: str) -> np.ndarray:
        rows = self.manifest[f"{split}_rows"]
        return np.memmap(
            self._fetch(split), dtype=self.manifest["dtype"], mode="r", shape=(rows, self.seq_len)
        )

    def _fetch(self, split: str) -> Path:
        """The local file of a split's rows: the file itself, or the node's mirror of it, its shards (if
        the store holds it in shards) joined once."""
        shards = self._train_shards()[0] if split == "train" else [storage.join(self.path, f"{split}.bin")]
        if len(shards) == 1:
            return storage.fetch(shards[0])
        joined = storage.local(storage.join(self.path, "train.bin"))
        if not joined.exists():  # written beside, then renamed: a reader never sees part of it
            joined.parent.mkdir(parents=True, exist_ok=True)
            partial = joined.with_name(f".train.bin.{os.getpid()}.tmp")
            with open(partial, "wb") as out:
                for shard in shards:
                    out.write(storage.read_bytes(shard))
            os.replace(partial, joined)
        return joined

    def _train_shards(self) -> tuple[list[str], int]:
        """The training split's files and the rows each holds: train.bin alone, unless the cache was built
        on object storage in shards."""
        rows = self.manifest["train_rows"]
        per = self.manifest.get("train_shard_rows", rows)
        shards = math.ceil(rows / per)
        return [storage.join(self.path, shard_name("train", k, shards)) for k in range(shards)], per

    def micro_batch(self, step: int, micro: int, rank: int, world: int, global_batch: int, micro_batch: int):
        """Rows of optimizer step `step` that worker `rank` trains on in its `micro`-th micro-step."""

        def first_row(step: int, micro: int) -> int:
            batch = epoch_batch(step, self.batches_per_epoch(global_batch), self.data_seed)
            return int(micro_batch_rows(batch, micro, rank, world, global_batch, micro_batch)[0])

        first = first_row(step, micro)
        if not storage.is_remote(self.path):
            return self.train_rows(first, micro_batch)
        micros = global_batch // (micro_batch * world)  # micro-steps per optimizer step
        later = (divmod(step * micros + micro + k, micros) for k in range(1, READ_AHEAD + 1))
        # A lone worker trains on the rows in order: a block holds hundreds of its micro-batches. One of
        # several trains on every world-th micro-batch: a block larger than one would read the others' rows.
        block = None if world == 1 else micro_batch
        return self.train_rows(first, micro_batch, ahead=[first_row(s, m) for s, m in later], block=block)

    def train_rows(
        self, first: int, rows: int, ahead: list[int] = (), block: int | None = None
    ) -> np.ndarray:
        """Training rows [first, first + rows), fewer past the split's end: locally a view of the
        memory-mapped file; on object storage read in blocks of `block` rows (BLOCK_BYTES by default) by
        byte range (and the blocks of as many rows at each of `ahead` started in the background), so a
        reader of a few rows never downloads the split."""
        rows = max(0, min(rows, self.manifest["train_rows"] - first))
        if not storage.is_remote(self.path):
            return self.train[first : first + rows]
        dtype = self.manifest["dtype"]
        block = block or max(1, BLOCK_BYTES // (self.seq_len * np.dtype(dtype).itemsize))
        if block not in self._readers:
            shards, per = self._train_shards()
            self._readers[block] = RangedRows(
                shards, per, self.manifest["train_rows"], dtype, self.seq_len, block
            )
        return self._readers[block].read(first, rows, ahead)

    @cached_property
    def _readers(self) -> dict[int, RangedRows]:
        """Per block size, the reader of the training rows on object storage."""
        return {}

    def batches_per_epoch(self, global_batch: int) -> int:
        return batches_per_epoch(self.manifest["train_rows"], global_batch)

    @property
    def data_seed(self) -> int:
        """Seeds later epochs' batch order: a function of the data alone, so every model shares it."""
        return int(self.manifest["key"][:8], 16)


READ_AHEAD = 8  # micro-batches read ahead of the one training, from a cache on object storage
# What one request for training rows on object storage reads: for a small model, hundreds of micro-batches.
BLOCK_BYTES = 2**20


def shard_name(split: str, shard: int, shards: int) -> str:
    """The file of a split's `shard`-th shard, of `shards`: the split's own file when it is whole."""
    return f"{split}.bin" if shards == 1 else f"{split}-{shard:05d}.bin"


class RangedRows:
    """The training rows on object storage (in shards of `shard_rows` rows), read by byte range in blocks
    of `block_rows` rows: a micro-batch is a few kilobytes, and where a reader's rows run on, one request
    per micro-batch would make a store's per-request cost (its latency, its price, a loopback server's
    CPU) the data's. A reader never downloads a whole file, and the blocks it will want next are read in
    the background while it trains, so a step waits on storage only when storage falls behind. Only the
    blocks of the latest read and its read-ahead are kept in memory."""

    def __init__(self, shards: list[str], shard_rows: int, total_rows: int, dtype: str, seq_len: int,
                 block_rows: int):  # fmt: skip
        from concurrent.futures import ThreadPoolExecutor

        self.shards, self.shard_rows, self.total_rows = shards, shard_rows, total_rows
        self.dtype, self.seq_len, self.block_rows = np.dtype(dtype), seq_len, block_rows
        # shard -> its open file (read_at never moves a position, so threads share it)
        self.files: dict[int, object] = {}
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rayb-rows")
        self.blocks: dict[int, object] = {}  # block -> Future of its rows

    def read(self, first: int, rows: int, ahead: list[int] = ()) -> np.ndarray:
        """Rows [first, first + rows); then start reading the blocks of as many rows at each of `ahead`."""
        wanted = self._blocks(first, rows)
        kept = {block: self.blocks[block] for start in ahead for block in self._blocks(start, rows)}
        kept |= {block: self.blocks[block] for block in wanted}
        self.blocks = kept  # only the caller's thread changes the dict; pool threads only fetch
        if not wanted:
            return np.empty((0, self.seq_len), self.dtype)
        parts = [kept[block].result() for block in wanted]
        offset = first - wanted[0] * self.block_rows
        return (parts[0] if len(parts) == 1 else np.concatenate(parts))[offset : offset + rows]

    def _blocks(self, first: int, rows: int) -> list[int]:
        """The blocks holding rows [first, first + rows), each fetch started if it is not already."""
        blocks = list(range(first // self.block_rows, -(-(first + rows) // self.block_rows))) if rows else []
        for block in blocks:
            if block not in self.blocks:
                self.blocks[block] = self.pool.submit(self._fetch, block)
        return blocks

    def _fetch(self, block: int) -> np.ndarray:
        """A block's rows, from the shards that hold them (the split's last block may be short)."""
        first = block * self.block_rows
        rows = min(self.block_rows, self.total_rows - first)
        row_bytes = self.seq_len * self.dtype.itemsize
        parts = []
        while rows:
            shard, within = divmod(first, self.shard_rows)
            n = min(rows, self.shard_rows - within)
            parts.append(self._file(shard).read_at(n * row_bytes, within * row_bytes))
            first, rows = first + n, rows - n
        return np.frombuffer(b"".join(parts), dtype=self.dtype).reshape(-1, self.seq_len)

    def _file(self, shard: int):
        if shard not in self.files:  # threads may both open it: the second copy is merely dropped
            fs, path = storage.filesystem(self.shards[shard])
            self.files[shard] = fs.open_input_file(path)
        return self.files[shard]


def batches_per_epoch(train_rows: int, global_batch: int) -> int:
    """Whole global batches in one pass over the training rows (an incomplete last batch is not trained on)."""
    return train_rows // global_batch


def micro_batch_rows(step: int, micro: int, rank: int, world: int, global_batch: int, micro_batch: int):
    """Row indices; the union over (micro, rank) is exactly [step·G, (step+1)·G) for any `world`."""
    start = step * global_batch + (micro * world + rank) * micro_batch
    return np.arange(start, start + micro_batch)


def epoch_batch(step: int, batches_per_epoch: int, seed: int) -> int:
    """The global batch of train.bin that optimizer step `step` trains on. Epoch 0 reads them in stored
    order; each later epoch in a permutation seeded by (seed, epoch), so a model never sees the same
    batch sequence twice, and every model of a study sees the same sequence (the seed is the data's)."""
    epoch, within = divmod(step, batches_per_epoch)
    return within if epoch == 0 else int(_epoch_order(batches_per_epoch, seed, epoch)[within])


@functools.lru_cache(maxsize=2)
def _epoch_order(batches_per_epoch: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(batches_per_epoch)


def row_digest(rows: np.ndarray) -> int:
    """A 40-bit hash per row, summed over a batch: order-free, so shards can be combined by all-reduce."""
    total = 0
    for row in np.ascontiguousarray(rows, dtype=np.int64):
        total += int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=5).digest(), "little")
    return total


def unigram_entropy(counts: np.ndarray) -> float:
    """Entropy (nats/token) of the empirical unigram distribution: the loss of a context-free model."""
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
