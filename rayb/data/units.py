"""A source's units of work (its parquet row groups), and how many of them a tokenize round reads.

The driver takes units in document order, reading shards' footers only as units are taken, so a hub-sized
source costs only the footers and the text its budget needs. A first round goes by the footers' text bytes;
a later one by the token rate of the units already read. Each round stops once every source in it has
enough (pipeline.py), so a round that reads more than it needs costs only the tasks running then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayb.data.split import HeldOutRule

if TYPE_CHECKING:
    from rayb.data.sources import ResolvedSource

SPLITS = ("train", "val")
MAX_BYTES_PER_TOKEN = 6.0  # more than almost any tokenizer on almost any text: see first_bytes


class BadShard(ValueError):
    pass


def columns(fields: pa.Schema | pa.StructType, prefix: str = "") -> list[str]:
    """Every column a text_column can name: top-level ones, and struct fields as dotted paths."""
    names = []
    for field in fields:
        names.append(prefix + field.name)
        if pa.types.is_struct(field.type):
            names += columns(field.type, f"{prefix}{field.name}.")
    return names


def text_values(table: pa.Table, column: str) -> list:
    """The values of a (possibly dotted, struct-field) text column."""
    top, *path = column.split(".")
    values = table.column(top)
    return (pc.struct_field(values, path) if path else values).to_pylist()


def open_shard(path: str, filesystem, column: str) -> pq.ParquetFile:
    """A parquet shard, checked: a corrupt file or a missing text column fails here, by name, instead of
    as a remote task error halfway through tokenizing."""
    try:
        shard = pq.ParquetFile(path, filesystem=filesystem)
    except (OSError, pa.ArrowException) as exc:
        raise BadShard(f"cannot read parquet shard {path}: {exc}") from None
    if column not in columns(shard.schema_arrow):
        raise BadShard(
            f"parquet shard {path} has no text column '{column}'; its columns: {columns(shard.schema_arrow)}"
        )
    return shard


@dataclass(frozen=True)
class Unit:
    """A tokenize task's share of a source: one parquet row group (read once, whole: pyarrow cannot read
    part of one without decoding it)."""

    source: int  # index into the study's sources
    path: str
    row_group: int
    text_bytes: int  # its text column, uncompressed (from the footer): what a first round goes by


class Units:
    """A source's units in document order, its shards' footers read (and checked) only as units are
    taken: a source of 10,000 shards whose token budget needs three opens three."""

    def __init__(self, index: int, source: ResolvedSource, column: str):
        self.index, self.source, self.column = index, source, column
        self.shards_read = 0
        self._paths = iter(source.paths)
        self._ready: list[Unit] = []

    def put_back(self, units: list[Unit]) -> None:
        """Units taken but not read: they come next again."""
        self._ready = units + self._ready

    def take(self, n: int) -> list[Unit]:
        while len(self._ready) < n and self._open_next():
            pass
        taken, self._ready = self._ready[:n], self._ready[n:]
        return taken

    def take_bytes(self, text_bytes: int, at_least: int) -> list[Unit]:
        """The next units that hold `text_bytes` of text (or all there are), and at least `at_least`."""
        taken = self.take(at_least)
        while sum(u.text_bytes for u in taken) < text_bytes and (more := self.take(1)):
            taken += more
        return taken

    def __bool__(self) -> bool:  # units left
        return bool(self._ready) or self._open_next()

    def _open_next(self) -> bool:
        path = next(self._paths, None)
        if path is None:
            return False
        shard = open_shard(path, self.source.filesystem, self.column)
        self.shards_read += 1
        meta = shard.metadata
        self._ready += [Unit(self.index, path, group, _text_bytes(meta.row_group(group), self.column))
                        for group in range(shard.num_row_groups)]  # fmt: skip
        return True


def _text_bytes(row_group: pq.RowGroupMetaData, column: str) -> int:
    """The uncompressed bytes of a row group's text column (every leaf under a struct column)."""
    chunks = (row_group.column(i) for i in range(row_group.num_columns))
    return sum(c.total_uncompressed_size for c in chunks if f"{c.path_in_schema}.".startswith(f"{column}."))


def in_order(items: list[dict], results: dict[int, dict], sources: list[int]) -> dict[int, list[dict]]:
    """Per source, the round's units that count, in document order: those done, up to its first one not
    done. Each: {stem of its files, train and val tokens}."""
    kept, gap = {i: [] for i in sources}, set()
    for item in items:
        source = item["source"]
        if item["unit"] not in results:
            gap.add(source)
        elif source not in gap:
            kept[source].append({"stem": item["stem"], **{s: int(results[item["unit"]][s]) for s in SPLITS}})
    return kept


def tokens(read: list[dict], split: str) -> int:
    return sum(unit[split] for unit in read)


def missing(read: list[dict], need: dict[str, int]) -> dict[str, int]:
    """The tokens each of a source's streams still lacks (only the streams that lack some)."""
    return {split: need[split] - tokens(read, split) for split in SPLITS if tokens(read, split) < need[split]}


def first_bytes(need: dict[str, int], rule: HeldOutRule) -> int:
    """The text a source's first round reads: enough for its slower stream at MAX_BYTES_PER_TOKEN. Text
    has fewer bytes per token (English about 4 to 5 under a 16k-50k BPE), so one round almost always holds
    enough, and it stops once it has (pipeline.py), so the text beyond costs only the tasks running then:
    one Ray Data execution instead of two costs one start-up, and keeps every core busy from the first
    task to the last instead of idling through a round's tail."""
    share = {"train": 1 - rule.probability, "val": rule.probability}
    return math.ceil(MAX_BYTES_PER_TOKEN * max(need[split] / share[split] for split in SPLITS))


def units_to_read(read: list[dict], need: dict[str, int], rule: HeldOutRule) -> int:
    """A later round reads as many units as a source's slower stream's token rate says are still missing
    (and a quarter more: the round stops once it has enough). A stream that has no tokens yet is expected
    at its share of the tokens read."""
    total = sum(tokens(read, split) for split in SPLITS)
    share = {"train": 1 - rule.probability, "val": rule.probability}
    per_unit = {split: max(tokens(read, split) or share[split] * total, 1) / len(read) for split in SPLITS}
    return math.ceil(1.25 * max(gap / per_unit[split] for split, gap in missing(read, need).items()))
