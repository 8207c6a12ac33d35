"""Pure data logic: packing, mixing counts, batch indexing, the learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rayb.data.cache import micro_batch_rows, row_digest, unigram_entropy
from rayb.data.packing import pieces_by_shard, row_blocks, split_rows
from rayb.train.schedule import lr_multiplier


def _docs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 100, size=rng.integers(1, 40)) for _ in range(n)]


def _stream(docs: list[np.ndarray], eos: int = 0) -> np.ndarray:
    return np.concatenate([np.append(d, eos) for d in docs])


def _place(stretches: list[np.ndarray], seq_len: int, rows: int) -> np.ndarray:
    """Rows built the way the cache tasks build them: each stretch placed by its offset alone."""
    out = np.full((rows, seq_len), -1)
    offset = 0
    for stretch in stretches:
        for first, column, block in row_blocks(stretch[: max(0, rows * seq_len - offset)], offset, seq_len):
            out[first : first + len(block), column : column + block.shape[1]] = block
        offset += len(stretch)
    return out


@pytest.mark.parametrize("chunk", [1, 3, 7, 50])
def test_placed_stretches_are_the_stream_cut_into_rows_however_documents_are_split(chunk):
    docs = _docs(50)
    stream = _stream(docs)
    rows = len(stream) // 16
    stretches = [_stream(docs[i : i + chunk]) for i in range(0, len(docs), chunk)]
    np.testing.assert_array_equal(_place(stretches, 16, rows), stream[: rows * 16].reshape(rows, 16))


def test_row_blocks_give_whole_rows_as_one_block_and_shared_rows_in_parts():
    blocks = list(row_blocks(np.arange(40), offset=10, seq_len=16))
    assert [(first, column, block.shape) for first, column, block in blocks] == [
        (0, 10, (1, 6)), (1, 0, (2, 16)), (3, 0, (1, 2)),
    ]  # fmt: skip
    assert list(row_blocks(np.arange(0), offset=5, seq_len=16)) == []


@pytest.mark.parametrize("shard_rows", [1, 5, 7, 1000])
def test_shards_assembled_from_their_pieces_are_the_shuffled_rows(shard_rows):
    """Each shard built only from the pieces labelled with it, as one task per shard builds it, holds the
    stream's rows at their shuffled slots, for any shard size and however the stream was cut."""
    docs, seq_len = _docs(60, seed=1), 16
    stream = _stream(docs)
    rows = len(stream) // seq_len
    slots = np.random.default_rng(3).permutation(rows)
    shards = [np.full((min(shard_rows, rows - k), seq_len), -1) for k in range(0, rows, shard_rows)]
    offset = 0
    for stretch in (_stream(docs[i : i + 4]) for i in range(0, len(docs), 4)):
        stretch = stretch[: max(0, rows * seq_len - offset)]
        for shard, column, at, block in pieces_by_shard(stretch, offset, seq_len, 0, slots, shard_rows):
            assert 0 <= at.min() and at.max() < len(shards[shard])
            shards[shard][at, column : column + block.shape[1]] = block
        offset += len(stretch)
    expected = np.empty((rows, seq_len), dtype=stream.dtype)
    expected[slots] = stream[: rows * seq_len].reshape(rows, seq_len)
    np.testing.assert_array_equal(np.concatenate(shards), expected)


def test_pieces_of_rows_kept_in_order_start_at_the_sources_first_row():
    """Validation rows are not shuffled: a source's stream fills the split from its first row on."""
    pieces = list(pieces_by_shard(np.arange(40), offset=0, seq_len=16, first_row=3, slots=None, shard_rows=4))
    assert [(shard, column, list(at), block.shape) for shard, column, at, block in pieces] == [
        (0, 0, [3], (1, 16)), (1, 0, [0], (1, 16)), (1, 0, [1], (1, 8)),
    ]  # fmt: skip


def test_split_rows_is_exact():
    assert split_rows(10, [0.6, 0.4]) == [6, 4]
    assert split_rows(7, [0.5, 0.5]) in ([4, 3], [3, 4])
    for total in range(1, 200):
        counts = split_rows(total, [0.2, 0.3, 0.5])
        assert sum(counts) == total
        assert all(abs(c - w * total) < 1 for c, w in zip(counts, [0.2, 0.3, 0.5], strict=True))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_micro_batches_cover_each_global_batch_exactly(world):
    global_batch, micro = 16, 2
    accum = global_batch // (micro * world)
    for step in range(3):
        rows = np.concatenate(
            [
                micro_batch_rows(step, m, r, world, global_batch, micro)
                for m in range(accum)
                for r in range(world)
            ]
        )
        np.testing.assert_array_equal(
            np.sort(rows), np.arange(step * global_batch, (step + 1) * global_batch)
        )


def test_row_digest_is_order_free_and_content_sensitive():
    rows = np.arange(40).reshape(5, 8)
    assert row_digest(rows) == row_digest(rows[::-1])
    assert row_digest(rows[:2]) + row_digest(rows[2:]) == row_digest(rows)
    changed = rows.copy()
    changed[0, 0] += 1
    assert row_digest(changed) != row_digest(rows)


def test_unigram_entropy():
    assert unigram_entropy(np.array([5, 5, 0])) == pytest.approx(math.log(2))
    assert unigram_entropy(np.array([7])) == 0


def test_lr_schedule():
    kw = dict(total_steps=100, warmup_steps=10, schedule="cosine", min_ratio=0.1)
    assert lr_multiplier(0, **kw) == pytest.approx(0.1)
    assert lr_multiplier(9, **kw) == pytest.approx(1.0)
    assert lr_multiplier(10, **kw) == pytest.approx(1.0)
    assert lr_multiplier(55, **kw) == pytest.approx(0.55)
    assert lr_multiplier(100, **kw) == pytest.approx(0.1)
    values = [lr_multiplier(s, **kw) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert lr_multiplier(50, 100, 10, "constant", 0.1) == 1.0
