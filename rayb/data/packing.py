"""Packing: concatenate documents (each ended by EOS) and cut the stream into fixed-length rows.

Packing runs on the ordered token stream with a carry-over buffer, so the rows depend only on the
document order, never on how documents happened to be batched upstream.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class Packer:
    def __init__(self, seq_len: int, eos_id: int):
        self.seq_len = seq_len
        self.eos = np.array([eos_id], dtype=np.int64)
        self._carry = np.zeros(0, dtype=np.int64)

    def add(self, docs: Iterable[np.ndarray]) -> np.ndarray:
        """Append documents; return every row completed so far, shape (k, seq_len)."""
        parts = [self._carry]
        for doc in docs:
            parts.append(np.asarray(doc, dtype=np.int64))
            parts.append(self.eos)
        stream = np.concatenate(parts)
        n = len(stream) // self.seq_len
        self._carry = stream[n * self.seq_len :]
        return stream[: n * self.seq_len].reshape(n, self.seq_len)

    @property
    def pending(self) -> int:
        """Tokens waiting for the next row (dropped if the stream ends here)."""
        return len(self._carry)


def split_rows(total: int, weights: list[float]) -> list[int]:
    """Split `total` rows by weight into whole numbers that sum exactly to `total` (largest remainder)."""
    raw = [w * total for w in weights]
    counts = [int(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: raw[i] - counts[i], reverse=True)
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts
