"""The packed-token cache: what Ray Data writes once and every trial of a study reads.

Layout (nanoGPT-style flat files, memory-mapped, so a worker touches only the rows it trains on):
    manifest.json   seq_len, rows, dtype, tokenizer, per-source counts, unigram entropy
    train.bin       (train_rows, seq_len) tokens in their final, shuffled, mixed order
    val.bin         (val_rows, seq_len) held-out tokens: each source's held-out documents (a seeded random
                    sample, split.py) packed in order, source after source, in the training mix
    held_out/       the text behind the validation rows, and the UTF-8 bytes each row scores (held_out.py)

On object storage (rayb/storage.py), each process fetches the files it opens into its node's mirror the
first time (a worker: the manifest, tokenizer and train.bin; the driver: the manifest and tokenizer only).

Global batch `s` is rows [s·G, (s+1)·G) of train.bin, whatever the number of workers: each worker
takes an interleaved share of it. That is what makes every model's batch sequence identical.
"""

from __future__ import annotations

import functools
import hashlib
import json
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
        return json.loads(storage.read_bytes(storage.join(self.path, MANIFEST)) or b"null")

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
            storage.fetch(storage.join(self.path, f"{split}.bin")),
            dtype=self.manifest["dtype"],
            mode="r",
            shape=(rows, self.seq_len),
        )

    def micro_batch(self, step: int, micro: int, rank: int, world: int, global_batch: int, micro_batch: int):
        """Rows of optimizer step `step` that worker `rank` trains on in its `micro`-th micro-step."""
        batch = epoch_batch(step, self.batches_per_epoch(global_batch), self.data_seed)
        return self.train[micro_batch_rows(batch, micro, rank, world, global_batch, micro_batch)]

    def batches_per_epoch(self, global_batch: int) -> int:
        return batches_per_epoch(self.manifest["train_rows"], global_batch)

    @property
    def data_seed(self) -> int:
        """Seeds later epochs' batch order: a function of the data alone, so every model shares it."""
        return int(self.manifest["key"][:8], 16)


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
