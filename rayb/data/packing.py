"""Packing: concatenate documents (each ended by EOS) and cut the stream into fixed-length rows.

A source's packed stream is its documents' tokens, each followed by EOS, in document order; row r is
stream[r·L, (r+1)·L). Tasks tokenize stretches of documents on their own, so each stretch is placed by
its offset in the stream (the token counts of the stretches before it): the rows depend only on the
document order, never on how documents were split among tasks.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def row_blocks(tokens: np.ndarray, offset: int, seq_len: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """Cut a stretch of the stream that starts at stream position `offset` into the parts of rows it
    fills: (first row, first column, block of shape (rows, width)). Whole rows come as one block; a
    row the stretch shares with its neighbours comes as a partial one."""
    position, end = offset, offset + len(tokens)
    while position < end:
        row, column = divmod(position, seq_len)
        if column or end - position < seq_len:
            width = min(seq_len - column, end - position)
            rows = 1
        else:
            width, rows = seq_len, (end - position) // seq_len
        start = position - offset
        yield row, column, tokens[start : start + rows * width].reshape(rows, width)
        position += rows * width


def pieces_by_shard(
    tokens: np.ndarray, offset: int, seq_len: int, first_row: int, slots: np.ndarray | None, shard_rows: int
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """The row parts a stretch fills (`row_blocks`), grouped by the shard of the split that stores them:
    (shard, first column, rows within the shard, block). The stream's row r is the split's row
    `first_row` + r, stored at `slots[first_row + r]` (at `first_row` + r where `slots` is None); shard k
    holds stored rows [k·shard_rows, (k+1)·shard_rows). So each shard can be written whole, by one task,
    from the pieces every stretch sends it."""
    for first, column, block in row_blocks(tokens, offset, seq_len):
        rows = first_row + np.arange(first, first + len(block))
        if slots is not None:
            rows = slots[rows]
        shards = rows // shard_rows
        for shard in np.unique(shards):
            mine = shards == shard
            yield int(shard), column, rows[mine] - shard * shard_rows, block[mine]


def split_rows(total: int, weights: list[float]) -> list[int]:
    """Split `total` rows by weight into whole numbers that sum exactly to `total` (largest remainder)."""
    raw = [w * total for w in weights]
    counts = [int(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts
