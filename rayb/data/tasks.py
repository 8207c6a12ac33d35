"""What runs inside the cache build's Ray Data tasks: tokenize a unit, cut and write rows.

A Ray worker imports this module to run a task, so it imports only what the tasks use (numpy, pyarrow,
tokenizers): pipeline.py reaches torch through the lock and the study, which cost every worker process
about 6 s of CPU on 2 cores before its first task could start.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from rayb import storage
from rayb.data.buildlog import Clock
from rayb.data.cache import shard_name
from rayb.data.held_out import documents_table
from rayb.data.packing import pieces_by_shard
from rayb.data.split import HeldOutRule
from rayb.data.units import text_values


@functools.lru_cache(maxsize=4)
def fast_tokenizer(tokenizer_json: str) -> Tokenizer:
    # The bare Rust tokenizer: loads in milliseconds and avoids importing transformers in Ray workers.
    return Tokenizer.from_str(tokenizer_json)


def tokenize_unit(unit: dict, filesystems: tuple, columns: tuple, tokenizer_json: str, eos_id: int,
                  dtype: str, rule: HeldOutRule) -> dict:  # fmt: skip
    """Read a unit's documents, tokenize them, end each with EOS, and save the unit's stretch of the
    source's training stream (`<stem>-train.bin`) and of its validation stream (`<stem>-val.bin`, the
    held-out documents), and the held-out documents' text, ids and token spans (`<stem>-held.parquet`, for
    the held-out record); return the stretches' lengths and the node it ran on."""
    import ray

    clock = Clock()
    column = columns[unit["source"]]
    shard = pq.ParquetFile(unit["path"], filesystem=filesystems[unit["source"]])
    table = shard.read_row_group(unit["row_group"], columns=[column.split(".")[0]])
    texts = [t or "" for t in text_values(table, column)]
    clock.lap("read")
    held = np.array([rule.held(text) for text in texts], dtype=bool)
    clock.lap("held_out")
    docs = fast_tokenizer(tokenizer_json).encode_batch(texts, add_special_tokens=False)
    ids = [doc.ids for doc in docs]
    clock.lap("tokenize")
    streams_of = {"train": _stream([d for d, h in zip(ids, held, strict=True) if not h], eos_id, dtype),
                  "val": _stream([d for d, h in zip(ids, held, strict=True) if h], eos_id, dtype)}  # fmt: skip
    clock.lap("pack")
    stem = unit["stem"]
    for split, tokens in streams_of.items():
        storage.write_bytes(f"{stem}-{split}.bin", tokens.tobytes())
    kept = np.flatnonzero(held).tolist()
    held_docs = documents_table(
        [texts[i] for i in kept], [ids[i] for i in kept], [docs[i].offsets for i in kept]
    )
    sink = pa.BufferOutputStream()
    pq.write_table(held_docs, sink)
    storage.write_bytes(f"{stem}-held.parquet", sink.getvalue().to_pybytes())
    clock.lap("write")
    lengths = {split: len(tokens) for split, tokens in streams_of.items()}
    return {"unit": unit["unit"], "node": ray.get_runtime_context().get_node_id(), "docs": len(texts),
            **lengths, **clock.laps}  # fmt: skip


def _stream(docs: list[list[int]], eos_id: int, dtype: str) -> np.ndarray:
    """Documents' tokens, each followed by EOS, as one array. Built by numpy from the flat ids: a
    Python loop over every token cost about as much CPU as the tokenizer itself."""
    lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
    flat = np.fromiter(itertools.chain.from_iterable(docs), dtype=dtype, count=int(lengths.sum()))
    return np.insert(flat, np.cumsum(lengths), np.asarray(eos_id, dtype=dtype))


def pieces(job: dict, slots: np.ndarray, shapes: dict, dtype: str, shard_rows: dict[str, int]) -> list[dict]:
    """A stretch of a stream, cut into the pieces each shard of its split stores. A source's validation
    rows go to val.bin in stream order from row `at`; its training rows `at`, `at` + 1, ... to their
    shuffled slots in train.bin."""
    split = job["split"]
    tokens = np.frombuffer(storage.read_bytes(job["file"]), dtype=dtype)[: job["length"]]
    slots = slots if split == "train" else None
    return [
        {"split": split, "shard": shard, "column": column,
         "rows": rows.astype(np.int64).tobytes(), "tokens": np.ascontiguousarray(block).tobytes()}
        for shard, column, rows, block in pieces_by_shard(
            tokens, job["offset"], shapes[split][1], job["at"], slots, shard_rows[split]
        )
    ]  # fmt: skip


def write_shard(pieces: pa.Table, rows_at: str, shapes: dict, dtype: str, vocab: int,
                shard_rows: dict[str, int]) -> pa.Table:  # fmt: skip
    """On object storage: assemble one shard of a split from its pieces and write it as its own object
    (`shard_name`). Returns the token counts of the training rows it wrote."""
    split, shard = pieces["split"][0].as_py(), pieces["shard"][0].as_py()
    total, seq_len = shapes[split]
    first = shard * shard_rows[split]
    out = np.zeros((min(shard_rows[split], total - first), seq_len), dtype=dtype)
    for column, rows, tokens in zip(
        *(pieces[c].to_pylist() for c in ("column", "rows", "tokens")), strict=True
    ):
        at = np.frombuffer(rows, dtype=np.int64)
        block = np.frombuffer(tokens, dtype=dtype).reshape(len(at), -1)
        out[at, column : column + block.shape[1]] = block
    shards = math.ceil(total / shard_rows[split])
    storage.write_bytes(storage.join(rows_at, shard_name(split, shard, shards)), out.tobytes())
    counts = np.bincount(out.ravel(), minlength=vocab) if split == "train" else np.zeros(vocab, np.int64)
    return pa.table({"counts": [counts.astype(np.int64).tobytes()]})
