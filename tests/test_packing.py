"""Pure data logic: packing, mixing counts, batch indexing, the learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rayb.data.cache import micro_batch_rows, row_digest, unigram_entropy
from rayb.data.packing import Packer, split_rows
from rayb.train.schedule import lr_multiplier


def _docs(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 100, size=rng.integers(1, 40)) for _ in range(n)]


def test_packer_keeps_every_token_in_order():
    docs = _docs(50)
    rows = Packer(seq_len=16, eos_id=0).add(docs)
    stream = np.concatenate([np.append(d, 0) for d in docs])
    assert rows.shape[1] == 16
    np.testing.assert_array_equal(rows.ravel(), stream[: rows.size])


@pytest.mark.parametrize("chunk", [1, 3, 7, 50])
def test_packing_does_not_depend_on_batching(chunk):
    docs = _docs(50)
    whole = Packer(16, 0).add(docs)
    packer = Packer(16, 0)
    pieces = [packer.add(docs[i : i + chunk]) for i in range(0, len(docs), chunk)]
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    assert packer.pending < 16


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
