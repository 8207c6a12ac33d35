"""The text behind the validation rows, kept so that every model is scored on the same bytes.

A trained model reads the validation rows in study tokens and scores positions 1..T−1 of each row (its
first token is context only). A pretrained reference with its own tokenizer cannot read study tokens, so
it needs the text itself: not the tokens decoded back (a tokenizer's decode need not give back the text,
and separators would be invented), but the documents as the sources hold them, with each row's place in
them. For every validation row this records:

- its items, in order: a span of characters of one held-out document, or the end-of-text token that
  packing put between two documents;
- `context_end`: where its first token's text ends (scoring starts there; -1 when that token is an
  end-of-text);
- `scored_bytes`: the UTF-8 bytes from `context_end` to the row's end, the denominator of bits per byte
  for every model, trained or pretrained.

The validation rows are a source's held-out documents (a seeded random sample, split.py) packed in their
order. The tokenize tasks keep each held-out document's text, token ids and token spans (the spans come
with the ids from one tokenizer call); the record follows packing over them and must reproduce val.bin
token for token. Character spans are exact for ASCII and whole characters; where a row boundary falls
inside a multi-byte character (byte-level BPE can split one), that character belongs to the row where it
starts.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HELD_OUT_DIR = "held_out"
EOS_ITEM = -1  # the document index of an end-of-text item
ITEM = pa.struct([("doc", pa.int64()), ("start", pa.int64()), ("end", pa.int64())])


@dataclass(frozen=True)
class HeldOut:
    documents: list[str]
    rows: list[list[tuple[int, int, int]]]  # per row: (doc, start, end) items; doc EOS_ITEM: end of text
    context_end: np.ndarray  # per row
    scored_bytes: np.ndarray  # per row

    def text(self) -> str:
        """The held-out text, each document's part in the rows, documents separated by blank lines."""
        spans: dict[int, tuple[int, int]] = {}
        for items in self.rows:
            for doc, start, end in items:
                if doc != EOS_ITEM:
                    low, high = spans.get(doc, (start, end))
                    spans[doc] = (min(low, start), max(high, end))
        return "\n\n".join(self.documents[d][s:e] for d, (s, e) in sorted(spans.items()) if e > s)


class _Builder:
    """Follows packing over one source's held-out documents: each document's tokens and an end-of-text
    token, cut into rows of seq_len; records the first `rows` rows (the source's validation rows)."""

    def __init__(self, seq_len: int, rows: int, eos_id: int, first_doc: int):
        self.seq_len, self.n_rows, self.eos_id = seq_len, rows, eos_id
        self.doc = first_doc
        self.position = 0  # tokens of the source's validation stream seen so far
        self.items: list[list[tuple[int, int, int]]] = [[] for _ in range(rows)]
        self.context_end = np.full(rows, EOS_ITEM, dtype=np.int64)
        self.ids = np.zeros((rows, seq_len), dtype=np.int64)

    @property
    def done(self) -> bool:
        return self.position >= self.n_rows * self.seq_len

    def add(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        """One document: its token ids and their character spans ([tokens, 2])."""
        stream = np.append(ids, self.eos_id)
        begin = self.position  # where the document's first token falls in the source's stream
        end = min(begin + len(stream), self.n_rows * self.seq_len)
        for row in range(begin // self.seq_len, -(-end // self.seq_len)):
            row_start = row * self.seq_len
            low = max(begin, row_start) - begin  # the document's tokens in this row: stream[low:high]
            high = min(end, row_start + self.seq_len) - begin
            self.ids[row, begin + low - row_start : begin + high - row_start] = stream[low:high]
            if low < min(high, len(ids)):
                self.items[row].append((self.doc, offsets[low][0], offsets[min(high, len(ids)) - 1][1]))
            if high > len(ids):  # the end-of-text token after the document
                self.items[row].append((EOS_ITEM, 0, 0))
            if begin + low == row_start and low < len(ids):  # the row's first token is this document's
                self.context_end[row] = offsets[low][1]
        self.position += len(stream)
        self.doc += 1


def documents_table(texts: list[str], ids: list[list[int]], offsets: list[list[tuple[int, int]]]) -> pa.Table:
    """Held-out documents as the tokenize tasks save them: each one's text, token ids and the character
    span of each token, so that the record is built without tokenizing them again."""
    bounds = pa.array(np.cumsum([0, *map(len, ids)]), pa.int32())
    flat_ids = np.fromiter(itertools.chain.from_iterable(ids), np.int64)
    spans = np.array([span for doc in offsets for span in doc], np.int64).reshape(-1, 2)
    return pa.table({
        "text": pa.array(texts, pa.string()),
        "ids": pa.ListArray.from_arrays(bounds, flat_ids),
        "start": pa.ListArray.from_arrays(bounds, spans[:, 0]),
        "end": pa.ListArray.from_arrays(bounds, spans[:, 1]),
    })  # fmt: skip


def documents(table: pa.Table) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(text, ids, spans [tokens, 2]) of each document in a `documents_table`."""
    lists = [table.column(name).combine_chunks() for name in ("ids", "start", "end")]
    bounds = lists[0].offsets.to_numpy()  # the three share them
    ids, start, end = (column.values.to_numpy() for column in lists)
    for i, text in enumerate(table.column("text").to_pylist()):
        low, high = bounds[i], bounds[i + 1]
        yield text, ids[low:high], np.stack([start[low:high], end[low:high]], axis=1)


def build(
    sources: Iterable[Iterator[tuple[str, np.ndarray, np.ndarray]]],
    rows: list[int],
    seq_len: int,
    eos_id: int,
    expected: np.ndarray,
) -> HeldOut:
    """The held-out record of the validation rows: `rows[i]` rows from the start of source i's held-out
    documents (text, token ids and token spans, in order, as packing read them), which must reproduce
    `expected` (val.bin) exactly."""
    documents_kept: list[str] = []
    items, context_end, ids = [], [], []
    for docs, n_rows in zip(sources, rows, strict=True):
        builder = _Builder(seq_len, n_rows, eos_id, len(documents_kept))
        for text, doc_ids, spans in docs:
            if builder.done:
                break
            documents_kept.append(text)
            builder.add(doc_ids, spans)
        items += builder.items
        context_end.append(builder.context_end)
        ids.append(builder.ids)
    if not np.array_equal(np.concatenate(ids), np.asarray(expected, dtype=np.int64)):
        raise ValueError(
            "the held-out rows rebuilt from their documents differ from the rows packed into val.bin: "
            "packing and the held-out record disagree"
        )
    context = np.concatenate(context_end)
    return HeldOut(documents_kept, items, context, _scored_bytes(documents_kept, items, context))


def _scored_bytes(
    documents: list[str], rows: list[list[tuple[int, int, int]]], context_end: np.ndarray
) -> np.ndarray:
    out = np.zeros(len(rows), dtype=np.int64)
    for r, items in enumerate(rows):
        for k, (doc, start, end) in enumerate(items):
            if doc != EOS_ITEM:
                begin = context_end[r] if k == 0 and context_end[r] >= 0 else start
                out[r] += len(documents[doc][begin:end].encode("utf-8"))
    return out


def write(held_out: HeldOut, out_dir: Path) -> None:
    """documents.parquet (text) and rows.parquet (items, context_end, scored_bytes) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"text": pa.array(held_out.documents, pa.string())}), out_dir / "documents.parquet"
    )
    rows = pa.table(
        {
            "items": pa.array([[dict(zip(("doc", "start", "end"), i, strict=True)) for i in r] for r in held_out.rows],
                              pa.list_(ITEM)),
            "context_end": held_out.context_end,
            "scored_bytes": held_out.scored_bytes,
        }
    )  # fmt: skip
    pq.write_table(rows, out_dir / "rows.parquet")


def read(cache_dir: Path) -> HeldOut:
    rows = pq.read_table(Path(cache_dir) / HELD_OUT_DIR / "rows.parquet")
    items = [[(i["doc"], i["start"], i["end"]) for i in r] for r in rows.column("items").to_pylist()]
    return HeldOut(
        pq.read_table(Path(cache_dir) / HELD_OUT_DIR / "documents.parquet").column("text").to_pylist(),
        items,
        rows.column("context_end").to_numpy(),
        rows.column("scored_bytes").to_numpy(),
    )
