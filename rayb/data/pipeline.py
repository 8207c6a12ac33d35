"""The data step on Ray Data: read parquet, tokenize in parallel, hold out, pack, mix by weight, cache.

This is the only data module that knows about Ray. Each source's parquet row groups are its units of
work; Ray Data tasks tokenize the units, send each document to the source's training or validation
stream (a seeded random sample of documents is held out, split.py), and save the unit's stretch of both
streams. Other tasks then cut each stretch into the rows it fills, labelled by the shard of the cache that
stores them; Ray Data groups the pieces by shard, and one task per shard writes it whole (see `cache.py`).
The driver sees token counts only, so its memory does not grow with the corpus. Where the output and
every source are on object storage, all of this runs on any node and writes straight to the store;
otherwise on the driver's node, into the local cache directory.
The mix is exact by construction: source i contributes round(w_i * rows) packed rows to each split, so
validation has the training mix; one seeded permutation scatters the training rows through the training
set, and validation rows keep their stream order (source after source), so the held-out stream reads as
whole documents. Each source stops being read once both its streams
have their rows, so a hub-sized source costs only the tokens the budget asks for.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from rayb import storage
from rayb.data import held_out
from rayb.data.cache import MANIFEST, TokenCache, shard_name, unigram_entropy
from rayb.data.held_out import HELD_OUT_DIR
from rayb.data.packing import pieces_by_shard, split_rows
from rayb.data.sources import ResolvedSource, resolve
from rayb.data.spec import DataSpec
from rayb.data.split import HeldOutRule
from rayb.data.tokenizer import ensure_pretrained, load_tokenizer, train_bpe
from rayb.files import atomic_directory, digest
from rayb.lock import waiting_lock

CACHE_FORMAT_VERSION = 2  # 2: held-out documents are a seeded random sample (1: a source's first rows)
BPE_SAMPLE_CHARS = 6_000_000  # enough text for a stable small-vocabulary BPE, seconds to train
STREAM_DIR = "streams"  # the units' stretches of the packed streams, while the cache is built
SPLITS = ("train", "val")
MIN_BYTES_PER_TOKEN = 2.0  # fewer than almost any tokenizer on almost any text: see _first_bytes
SHARD_BYTES = 64 * 2**20  # a shard of the training rows: one task assembles it, one object holds it


class SourceTooSmall(ValueError):
    pass


class BadShard(ValueError):
    pass


def prepare_data(
    spec: DataSpec, cache_root: Path | str, progress: Callable[[str], None] | None = None
) -> TokenCache:
    """Build (or reuse) the packed-token cache for a data spec under `cache_root` (a local directory, or
    a URI on object storage); return it. `progress` is told, in a line, each stage a build finishes.
    On object storage the driver's node builds the cache in private scratch space and uploads it, its
    manifest last: a cache without a manifest is never trusted, so a driver killed mid-build leaves
    nothing a rerun would use. One run builds a cache at a time: another run (of another study with the
    same data) waits for it, saying so, and reads what it built."""
    cache_root = storage.resolve(cache_root)
    # Embedded corpora and tokenizers are made locally (on object storage, in this node's mirror: they are
    # a function of their key alone, so a copy there is as good as a cache).
    work_root = storage.local(cache_root).resolve()
    resolved = {s.name: resolve(s.location, work_root) for s in spec.sources}
    key = data_key(spec, resolved)
    out = storage.join(cache_root, "data", key)
    if cache := _built(out):
        return cache
    units = [Units(i, resolved[s.name], s.text_column) for i, s in enumerate(spec.sources)]
    for source in units:  # the first shard of each is checked before anything is built or locked
        bool(source)
    lock = storage.join(cache_root, "locks", f"data-{key}.json")
    with waiting_lock(lock, "another run's data cache", progress or print):
        return _built(out) or _build(spec, resolved, units, key, out, work_root, progress)


def _built(out: str) -> TokenCache | None:
    if not storage.exists(storage.join(out, MANIFEST)):
        return None
    return TokenCache(storage.local(out) if not storage.is_remote(out) else out)


def _build(
    spec: DataSpec,
    resolved: dict,
    units: list[Units],
    key: str,
    out: str,
    work_root: Path,
    progress: Callable[[str], None] | None,
) -> TokenCache:
    log = BuildLog(progress or (lambda line: None))
    tokenizer_dir = _tokenizer(spec, resolved, work_root)
    log.done("tokenizer", detail=spec.tokenizer)
    build = storage.writable(out)
    with atomic_directory(build) as scratch:
        shutil.copytree(tokenizer_dir, scratch.path / "tokenizer")
        # Rows (and the streams they are cut from) go straight to where the cache will be read: the store,
        # or the local scratch directory that becomes the cache.
        rows_at = out if storage.is_remote(out) else str(scratch.path)
        manifest, held_texts = _write_rows(spec, resolved, units, scratch.path / "tokenizer", rows_at, log)
        val = _written_rows(rows_at, "val", manifest)
        held = _held_out(spec, held_texts, manifest, scratch.path / "tokenizer", val)
        held_out.write(held, scratch.path / HELD_OUT_DIR)
        log.done("held-out record", rows=spec.val_rows, tokens=spec.val_rows * spec.seq_len)
        storage.remove(storage.join(rows_at, STREAM_DIR))
        manifest.update(
            key=key, tokenizer_source=spec.tokenizer, build_s=log.total_s(), build_stages=log.stages
        )
        (scratch.path / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if storage.is_remote(out):
        storage.push(out, last=(MANIFEST,))
        return TokenCache(out)
    return TokenCache(build)


class BuildLog:
    """What each stage of a build did and how long it took: the manifest's `build_stages`, and a line per
    stage for whoever watches the build (`rayb data prepare` prints them)."""

    def __init__(self, progress: Callable[[str], None]):
        self.progress, self.stages = progress, {}
        self._began = self._last = time.perf_counter()

    def done(self, stage: str, detail: str = "", **counts) -> None:
        """A stage has ended now. counts: rows, tokens, docs, and seconds its tasks spent per part (`*_s`)."""
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        self.stages[stage] = {"s": round(seconds, 2), **{k: round(v, 2) for k, v in counts.items()}}
        self.progress(stage_line(stage, seconds, detail, counts))

    def total_s(self) -> float:
        return round(time.perf_counter() - self._began, 2)


def stage_line(stage: str, seconds: float, detail: str, counts: dict) -> str:
    """'tokenize: 5,000 documents, 1,234,567 tokens in 2.1 s (0.59M tokens/s)'."""
    what = [f"{counts[k]:,} {k}" for k in ("docs", "rows") if k in counts]
    if "tokens" in counts:
        what.append(f"{counts['tokens']:,} tokens")
    rate = f" ({counts['tokens'] / max(seconds, 1e-9) / 1e6:.2f}M tokens/s)" if counts.get("tokens") else ""
    return f"{stage}: {', '.join([detail] * bool(detail) + what)} in {seconds:.1f} s{rate}".replace(
        "docs", "documents"
    )


def data_key(spec: DataSpec, resolved: dict[str, ResolvedSource]) -> str:
    content = {name: r.fingerprint for name, r in resolved.items()}
    return digest({"spec": spec.hashed(), "content": content, "format": CACHE_FORMAT_VERSION})


def _columns(fields: pa.Schema | pa.StructType, prefix: str = "") -> list[str]:
    """Every column a text_column can name: top-level ones, and struct fields as dotted paths."""
    names = []
    for field in fields:
        names.append(prefix + field.name)
        if pa.types.is_struct(field.type):
            names += _columns(field.type, f"{prefix}{field.name}.")
    return names


def text_values(table: pa.Table, column: str) -> list:
    """The values of a (possibly dotted, struct-field) text column."""
    top, *path = column.split(".")
    values = table.column(top)
    return (pc.struct_field(values, path) if path else values).to_pylist()


# ----- tokenizer ----------------------------------------------------------------------------------
def _tokenizer(spec: DataSpec, resolved: dict[str, ResolvedSource], cache_root: Path) -> Path:
    key = {
        "tokenizer": spec.tokenizer,
        "sources": {s.name: resolved[s.name].fingerprint for s in spec.sources},
    }
    if spec.trained_vocab is None:
        return ensure_pretrained(spec.tokenizer_location, cache_root / "tokenizers" / digest(key))
    # A trained vocabulary sees training documents only, so the held-out sample is part of its key.
    key["held_out"] = [CACHE_FORMAT_VERSION, spec.seed, spec.val_share]
    texts = (
        text
        for s in spec.sources
        for text in _sample_texts(
            resolved[s.name], s.text_column, int(BPE_SAMPLE_CHARS * s.weight), spec.held_out
        )
    )
    return train_bpe(texts, spec.trained_vocab, cache_root / "tokenizers" / digest(key))


def _sample_texts(source: ResolvedSource, column: str, max_chars: int, rule: HeldOutRule):
    """The first non-empty training documents of a source (never a held-out one), in order, up to max_chars."""
    seen = 0
    for text in _documents(source, column):
        if text and not rule.held(text):
            yield text
            seen += len(text)
            if seen >= max_chars:
                return


def _documents(source: ResolvedSource, column: str):
    """Every document of a source, in order, shard by shard as they are read (plain pyarrow: no Ray)."""
    for path in source.paths:
        shard = open_shard(path, source.filesystem, column)
        for batch in shard.iter_batches(batch_size=512, columns=[column.split(".")[0]]):
            yield from text_values(pa.Table.from_batches([batch]), column)


def open_shard(path: str, filesystem, column: str) -> pq.ParquetFile:
    """A parquet shard, checked: a corrupt file or a missing text column fails here, by name, instead of
    as a remote task error halfway through tokenizing."""
    try:
        shard = pq.ParquetFile(path, filesystem=filesystem)
    except (OSError, pa.ArrowException) as exc:
        raise BadShard(f"cannot read parquet shard {path}: {exc}") from None
    if column not in _columns(shard.schema_arrow):
        raise BadShard(
            f"parquet shard {path} has no text column '{column}'; its columns: {_columns(shard.schema_arrow)}"
        )
    return shard


def _held_out(
    spec: DataSpec, held_texts: list[list[str]], manifest: dict, tokenizer_dir: Path, val: np.ndarray
) -> held_out.HeldOut:
    """The text behind the cache's validation rows (held_out.py), from the held-out documents the
    tokenize tasks set aside (per source, one file per unit read, in stream order)."""
    return held_out.build(
        (_texts(files) for files in held_texts),
        [manifest["sources"][s.name]["val_rows"] for s in spec.sources],
        manifest["seq_len"], tokenizer_dir / "tokenizer.json", manifest["eos_id"], val,
    )  # fmt: skip


def _texts(files: list[str]):
    for file in files:
        yield from pq.read_table(pa.BufferReader(storage.read_bytes(file))).column("text").to_pylist()


def _written_rows(rows_at: str, split: str, manifest: dict) -> np.ndarray:
    """A split's rows as written, from the cache being built (one object or file: only training rows are
    ever sharded)."""
    rows = manifest[f"{split}_rows"]
    location = storage.join(rows_at, f"{split}.bin")
    if storage.is_remote(location):
        data = storage.read_bytes(location)
        return np.frombuffer(data, dtype=manifest["dtype"]).reshape(rows, manifest["seq_len"])
    return np.memmap(location, dtype=manifest["dtype"], mode="r", shape=(rows, manifest["seq_len"]))


# ----- tokenize, pack, place ----------------------------------------------------------------------
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


def _write_rows(spec: DataSpec, resolved: dict[str, ResolvedSource], units: list[Units], tokenizer_dir: Path,
                rows_at: str, log: BuildLog) -> tuple[dict, list[list[str]]]:  # fmt: skip
    """Tokenize, hold out, pack and place every source's rows in tasks, writing them at `rows_at` (a local
    directory or a URI); the driver sees token counts only. Returns the manifest and, per source, the files
    of held-out documents the tasks set aside."""
    tokenizer = load_tokenizer(tokenizer_dir)
    vocab = len(tokenizer)
    dtype = np.dtype(np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.uint32).name
    weights = [s.weight for s in spec.sources]
    rows = {"train": split_rows(spec.train_rows, weights), "val": split_rows(spec.val_rows, weights)}
    # Tasks run on any node where every file they touch is on object storage; else on the driver's.
    on_store = storage.is_remote(rows_at)
    sources_on_store = all(r.filesystem is not None for r in resolved.values())
    tokenizer_json = (tokenizer_dir / "tokenizer.json").read_text()
    read, nodes, work = _tokenized(
        spec,
        resolved,
        units,
        rows_at,
        tokenizer_json,
        tokenizer.eos_token_id,
        dtype,
        rows,
        on_store and sources_on_store,
    )
    log.done("tokenize", **work)
    shapes = {"train": (spec.train_rows, spec.seq_len), "val": (spec.val_rows, spec.seq_len)}
    shard_rows = {
        "train": max(1, SHARD_BYTES // (spec.seq_len * np.dtype(dtype).itemsize)),
        "val": spec.val_rows,
    }
    if not on_store:  # one file per split, each shard's task writing its own rows
        for split, shape in shapes.items():
            np.memmap(Path(rows_at) / f"{split}.bin", dtype=dtype, mode="w+", shape=shape).flush()
    jobs = []
    for split in SPLITS:
        at = 0  # the split's first row for this source
        for n_rows, source_units in zip(rows[split], read, strict=True):
            offset, end = 0, n_rows * spec.seq_len
            for unit in source_units:
                if offset >= end:
                    break
                if unit[split]:
                    jobs.append({"split": split, "file": f"{unit['stem']}-{split}.bin", "offset": offset,
                                 "length": min(unit[split], end - offset), "at": at})  # fmt: skip
                offset += unit[split]
            at += n_rows
    # One seeded permutation places every source's training rows through the training set.
    slots = np.random.default_rng(spec.seed).permutation(spec.train_rows)
    counts = _place(jobs, slots, rows_at, shapes, dtype, vocab, shard_rows, anywhere=on_store)
    log.done(
        "place", rows=spec.train_rows + spec.val_rows, tokens=(spec.train_rows + spec.val_rows) * spec.seq_len
    )
    manifest = {
        "format": CACHE_FORMAT_VERSION,
        "seq_len": spec.seq_len,
        "vocab_size": vocab,
        "eos_id": tokenizer.eos_token_id,
        "dtype": dtype,
        "train_rows": spec.train_rows,
        "val_rows": spec.val_rows,
        "train_tokens": spec.train_rows * spec.seq_len,
        "held_out_probability": spec.held_out.probability,
        "sources": {
            s.name: {
                "train_rows": t,
                "val_rows": v,
                "weight": s.weight,
                "shards_read": u.shards_read,
                "shards_present": len(u.source.paths),
            }
            for s, t, v, u in zip(spec.sources, rows["train"], rows["val"], units, strict=True)
        },  # fmt: skip
        "unigram_entropy_nats": unigram_entropy(counts),
        "build_nodes": nodes,
    }
    if on_store and spec.train_rows > shard_rows["train"]:
        manifest["train_shard_rows"] = shard_rows["train"]
    return manifest, [[f"{u['stem']}-held.parquet" for u in source_units] for source_units in read]


def _tokenized(spec: DataSpec, resolved: dict[str, ResolvedSource], units: list[Units], rows_at: str,
               tokenizer_json: str, eos_id: int, dtype: str, rows: dict[str, list[int]],
               anywhere: bool) -> tuple[list[list[dict]], int, Counter]:  # fmt: skip
    """Tokenize each source's units, in rounds, until its training and validation streams hold the rows
    its weight asks for; per source, the units read, in document order: {stem of their files, train and
    val tokens}; the number of nodes that tokenized them; and what the tasks did (documents, tokens, and
    seconds per part of a task: read, held_out, tokenize, pack, write). A source stops being read once it
    has enough, so a hub-sized source costs only the tokens the budget asks for.

    A round reads a margin more units than its estimate, but stops as soon as every source in it has
    enough: the margin costs only the tasks already running then, and no round is cut short of the rows
    it needed. A round's units that came back after a gap in their source's document order go back to be
    read again, so a stream is always a prefix of its source."""
    streams = storage.join(rows_at, STREAM_DIR)
    need = [{split: rows[split][i] * spec.seq_len for split in SPLITS} for i in range(len(spec.sources))]
    done: list[list[dict]] = [[] for _ in spec.sources]
    nodes, work, numbered = set(), Counter(), 0
    parallel = _parallel(anywhere)
    while short := [i for i in range(len(need)) if _missing(done[i], need[i]) and units[i]]:
        batch = []
        for i in short:
            if done[i]:
                batch += units[i].take(_units_to_read(done[i], need[i], spec.held_out))
            else:
                batch += units[i].take_bytes(
                    _first_bytes(need[i], spec.held_out), max(1, parallel // len(short))
                )
        # Numbers are never reused: a task still running when its round stopped may yet write its files.
        items = [{"unit": numbered + n, **asdict(u), "stem": storage.join(streams, str(numbered + n))}
                 for n, u in enumerate(batch)]  # fmt: skip
        numbered += len(items)
        results = {}
        for r in _in_tasks(
            _tokenize_unit, items, anywhere, tuple(resolved[s.name].filesystem for s in spec.sources),
            tuple(s.text_column for s in spec.sources), tokenizer_json, eos_id, dtype, streams, spec.held_out,
        ):  # fmt: skip
            results[int(r["unit"])] = r
            nodes.add(r["node"])
            work.update({k: r[k] for k in r if k.endswith("_s") or k == "docs"}, tokens=r["train"] + r["val"])
            if all(
                not _missing(done[i] + kept, need[i]) for i, kept in _in_order(items, results, short).items()
            ):
                break
        kept = _in_order(items, results, short)
        for i in short:
            done[i] += kept[i]
            units[i].put_back(
                [u for item, u in zip(items, batch, strict=True) if u.source == i][len(kept[i]) :]
            )
    for source, needed, read in zip(spec.sources, need, done, strict=True):
        if _missing(read, needed):
            held = {split: _tokens(read, split) for split in SPLITS}
            raise SourceTooSmall(
                f"data source '{source.name}' ({source.uri}) holds {held['train']:,} training tokens and "
                f"{held['val']:,} held-out ones (a random {spec.held_out.probability:.1%} of its documents "
                f"is held out), but its weight asks for {needed['train']:,} and {needed['val']:,}; lower "
                "data.token_budget, change its weight, or add documents"
            )
    return done, len(nodes), work


def _in_order(items: list[dict], results: dict[int, dict], sources: list[int]) -> dict[int, list[dict]]:
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


def _tokens(read: list[dict], split: str) -> int:
    return sum(unit[split] for unit in read)


def _missing(read: list[dict], need: dict[str, int]) -> dict[str, int]:
    """The tokens each of a source's streams still lacks (only the streams that lack some)."""
    return {
        split: need[split] - _tokens(read, split) for split in SPLITS if _tokens(read, split) < need[split]
    }


def _first_bytes(need: dict[str, int], rule: HeldOutRule) -> int:
    """The text a source's first round reads: enough for its slower stream at MIN_BYTES_PER_TOKEN. Most
    text has more bytes per token, so one round usually does, and it stops once it has enough
    (`_tokenized`): reading the text in one Ray Data execution rather than two costs one start-up, and
    keeps every core busy from the first task to the last."""
    share = {"train": 1 - rule.probability, "val": rule.probability}
    return math.ceil(MIN_BYTES_PER_TOKEN * max(need[split] / share[split] for split in SPLITS))


def _units_to_read(read: list[dict], need: dict[str, int], rule: HeldOutRule) -> int:
    """A later round reads as many units as a source's slower stream's token rate says are still missing
    (and a quarter more: the round stops once it has enough, see `_tokenized`). A stream that has no
    tokens yet is expected at its share of the tokens read."""
    total = sum(_tokens(read, split) for split in SPLITS)
    share = {"train": 1 - rule.probability, "val": rule.probability}
    per_unit = {split: max(_tokens(read, split) or share[split] * total, 1) / len(read) for split in SPLITS}
    return math.ceil(1.25 * max(missing / per_unit[split] for split, missing in _missing(read, need).items()))


@functools.lru_cache(maxsize=4)
def _fast_tokenizer(tokenizer_json: str) -> Tokenizer:
    # The bare Rust tokenizer: loads in milliseconds and avoids importing transformers in Ray workers.
    return Tokenizer.from_str(tokenizer_json)


def _tokenize_unit(unit: dict, filesystems: tuple, columns: tuple, tokenizer_json: str, eos_id: int,
                   dtype: str, streams: str, rule: HeldOutRule) -> dict:  # fmt: skip
    """Ray Data task: read a unit's documents, tokenize them, end each with EOS, and save the unit's
    stretch of the source's training stream (`streams/<unit>-train.bin`) and of its validation stream
    (`<unit>-val.bin`, the held-out documents), and the held-out documents' text (`<unit>-held.parquet`,
    for the held-out record); return the stretches' lengths and the node it ran on."""
    import ray

    clock = _Clock()
    column = columns[unit["source"]]
    shard = pq.ParquetFile(unit["path"], filesystem=filesystems[unit["source"]])
    table = shard.read_row_group(unit["row_group"], columns=[column.split(".")[0]])
    texts = [t or "" for t in text_values(table, column)]
    clock.lap("read")
    held = np.array([rule.held(text) for text in texts], dtype=bool)
    clock.lap("held_out")
    docs = _fast_tokenizer(tokenizer_json).encode_batch(texts, add_special_tokens=False)
    ids = [doc.ids for doc in docs]
    clock.lap("tokenize")
    streams_of = {"train": _stream([d for d, h in zip(ids, held, strict=True) if not h], eos_id, dtype),
                  "val": _stream([d for d, h in zip(ids, held, strict=True) if h], eos_id, dtype)}  # fmt: skip
    clock.lap("pack")
    stem = unit["stem"]
    for split, tokens in streams_of.items():
        storage.write_bytes(f"{stem}-{split}.bin", tokens.tobytes())
    held_texts = pa.table({"text": pa.array([t for t, h in zip(texts, held, strict=True) if h], pa.string())})
    sink = pa.BufferOutputStream()
    pq.write_table(held_texts, sink)
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


class _Clock:
    """Seconds spent in each part of a task, for the build's time split (manifest `build_stages`)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        self.laps[f"{part}_s"] = self.laps.get(f"{part}_s", 0.0) + now - self._last
        self._last = now


def _place(jobs: list[dict], slots: np.ndarray, rows_at: str, shapes: dict, dtype: str, vocab: int,
           shard_rows: dict[str, int], anywhere: bool) -> np.ndarray:  # fmt: skip
    """Place every stretch's rows into the cache's splits: tasks cut each stretch into pieces labelled by
    the shard that stores them (`pieces_by_shard`), Ray Data groups the pieces by shard, and one task per
    shard assembles it and writes it whole (an object on the store; its rows of the split's file
    locally). Returns the token counts of the training rows (for the unigram entropy)."""
    import ray.data
    from ray.data.context import ShuffleStrategy

    shards = sum(math.ceil(shapes[split][0] / shard_rows[split]) for split in SPLITS)
    # Ray Data's default hash shuffle starts aggregator actors (seconds, on a small machine); the sort
    # shuffle runs as plain tasks. A dataset keeps the context it was created in.
    context = ray.data.DataContext.get_current()
    default, context.shuffle_strategy = context.shuffle_strategy, ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    try:
        pieces = ray.data.from_items(jobs, override_num_blocks=len(jobs)).flat_map(
            _pieces, fn_args=(slots, shapes, dtype, shard_rows), **_where(len(jobs), anywhere, free=True)
        )
        written = pieces.groupby(["split", "shard"], num_partitions=shards).map_groups(
            _write_shard, fn_args=(rows_at, shapes, dtype, vocab, shard_rows), batch_format="pyarrow",
            **_where(shards, anywhere, free=not anywhere),
        )  # fmt: skip
        return sum(np.frombuffer(row["counts"], dtype=np.int64) for row in written.iter_rows())
    finally:
        context.shuffle_strategy = default


def _pieces(job: dict, slots: np.ndarray, shapes: dict, dtype: str, shard_rows: dict[str, int]) -> list[dict]:
    """Ray Data task: a stretch of a stream, cut into the pieces each shard of its split stores. A
    source's validation rows go to val.bin in stream order from row `at`; its training rows `at`, `at` + 1,
    ... to their shuffled slots in train.bin."""
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


def _write_shard(pieces: pa.Table, rows_at: str, shapes: dict, dtype: str, vocab: int,
                 shard_rows: dict[str, int]) -> pa.Table:  # fmt: skip
    """Ray Data task: assemble one shard of a split from its pieces and write it: as its own object on
    object storage (`shard_name`), as its rows of the split's file locally. Returns the token counts of
    the training rows it wrote."""
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
    if storage.is_remote(rows_at):
        shards = math.ceil(total / shard_rows[split])
        storage.write_bytes(storage.join(rows_at, shard_name(split, shard, shards)), out.tobytes())
    else:
        split_file = np.memmap(Path(rows_at) / f"{split}.bin", dtype=dtype, mode="r+", shape=shapes[split])
        split_file[first : first + len(out)] = out
        split_file.flush()
    counts = np.bincount(out.ravel(), minlength=vocab) if split == "train" else np.zeros(vocab, np.int64)
    return pa.table({"counts": [counts.astype(np.int64).tobytes()]})


def _driver_node_cpus() -> int:
    """The CPUs the driver's node declares to Ray (0 for a head kept free of work)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return int(next(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node))


def _where(tasks: int, anywhere: bool, free: bool = False) -> dict:
    """Where a stage's Ray Data tasks run, and how many at once. `anywhere`: on any node, one per CPU of
    the cluster. Otherwise on the driver's node, `_cores()` at once: they read and write the build's
    scratch files on its disk (a task on another node would write where the driver cannot read, or, over
    NFS, undo another node's bytes of the same file). `free` tasks ask no CPU (they only move bytes); so
    do all of them on a driver's node that declares none."""
    import ray
    import ray.data

    if anywhere:
        return {
            "compute": ray.data.TaskPoolStrategy(size=min(tasks, _parallel(anywhere))),
            "num_cpus": 0 if free else 1,
        }
    return {
        "compute": ray.data.TaskPoolStrategy(size=max(1, min(tasks, _cores()))),
        "label_selector": {"ray.io/node-id": ray.get_runtime_context().get_node_id()},
        "num_cpus": 0 if free or not _driver_node_cpus() else 1,
    }


def _cores() -> int:
    """Tasks the driver's node runs at once: one per CPU it declares (its real cores, where it declares
    none)."""
    return _driver_node_cpus() or os.cpu_count() or 1


def _parallel(anywhere: bool) -> int:
    """Tasks that run at once (see `_where`)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 0))) if anywhere else _cores()


def _in_tasks(fn, items: list[dict], anywhere: bool, *args) -> Iterator[dict]:
    """Run `fn` over the items in Ray Data tasks, one item per task (placed by `_where`), started in the
    items' order; yield the results as they come, in no particular order. Leaving the loop early stops the
    tasks not yet started."""
    import ray.data

    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    yield from dataset.map(fn, fn_args=args, **_where(len(items), anywhere)).iter_rows()
