"""The data step on Ray Data: read parquet, tokenize in parallel, hold out, pack, mix by weight, cache.

This is the only data module that knows about Ray; what runs inside its tasks is in tasks.py. Each
source's parquet row groups are its units of work (units.py); Ray Data tasks tokenize the units, send each
document to the source's training or validation stream (a seeded random sample of documents is held out,
split.py), and save the unit's stretch of both streams, with the held-out documents' text and token spans
(for the held-out record, held_out.py). Each stretch's rows are then placed in the cache: locally, the
driver writes them straight into the split files, a stretch at a time; on object storage, tasks cut each
stretch into the rows it fills, labelled by the shard of the cache that stores them, Ray Data groups the
pieces by shard, and one task per shard writes it whole (see `cache.py`). Tokens never gather in the
driver, so its memory does not grow with the corpus. Where the output and every source are on object
storage, all of this runs on any node and writes straight to the store; otherwise on the driver's node,
into the local cache directory.
The mix is exact by construction: source i contributes round(w_i * rows) packed rows to each split, so
validation has the training mix; one seeded permutation scatters the training rows through the training
set, and validation rows keep their stream order (source after source), so the held-out stream reads as
whole documents. Each source stops being read once both its streams have their rows, so a hub-sized
source costs only the tokens the budget asks for.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rayb import storage
from rayb.data import held_out, tasks
from rayb.data.buildlog import BuildLog
from rayb.data.cache import MANIFEST, TokenCache, unigram_entropy
from rayb.data.held_out import HELD_OUT_DIR
from rayb.data.packing import pieces_by_shard, split_rows
from rayb.data.sources import ResolvedSource, resolve
from rayb.data.spec import DataSpec
from rayb.data.split import HeldOutRule
from rayb.data.tokenizer import ensure_pretrained, load_tokenizer, train_bpe
from rayb.data.units import (
    SPLITS,
    Units,
    first_bytes,
    in_order,
    missing,
    open_shard,
    text_values,
    tokens,
    units_to_read,
)
from rayb.files import atomic_directory, digest
from rayb.lock import waiting_lock

CACHE_FORMAT_VERSION = 2  # 2: held-out documents are a seeded random sample (1: a source's first rows)
BPE_SAMPLE_CHARS = 6_000_000  # enough text for a stable small-vocabulary BPE, seconds to train
STREAM_DIR = "streams"  # the units' stretches of the packed streams, while the cache is built
SHARD_BYTES = 64 * 2**20  # a shard of the training rows: one task assembles it, one object holds it


class SourceTooSmall(ValueError):
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
    # No Ray Data usage collection in this driver (RAY_DATA_USAGE_DISABLED=0 keeps Ray's default): from the
    # first Dataset on, it polls Prometheus every 10 s from a thread, which Ray Data logs at DEBUG with a
    # traceback per failed query wherever none answers (a laptop, most clusters), and it starts an actor
    # process. Formatting those tracebacks parses source with `ast` in that thread, and Python 3.11's AST
    # constructor is not safe in two threads at once: a study's driver raised "SystemError: AST
    # constructor recursion depth mismatch" while it prepared data.
    os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")
    log = BuildLog(progress or (lambda line: None))
    tokenizer_dir = _tokenizer(spec, resolved, work_root)
    log.done("tokenizer", detail=spec.tokenizer)
    build = storage.writable(out)
    with atomic_directory(build) as scratch:
        shutil.copytree(tokenizer_dir, scratch.path / "tokenizer")
        # Rows (and the streams they are cut from) go straight to where the cache will be read: the store,
        # or the local scratch directory that becomes the cache.
        rows_at = out if storage.is_remote(out) else str(scratch.path)
        manifest, held_files = _write_rows(spec, resolved, units, scratch.path / "tokenizer", rows_at, log)
        val = _written_rows(rows_at, "val", manifest)
        held = _held_out(spec, held_files, manifest, val)
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


def data_key(spec: DataSpec, resolved: dict[str, ResolvedSource]) -> str:
    content = {name: r.fingerprint for name, r in resolved.items()}
    return digest({"spec": spec.hashed(), "content": content, "format": CACHE_FORMAT_VERSION})


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


def _held_out(
    spec: DataSpec, held_files: list[list[str]], manifest: dict, val: np.ndarray
) -> held_out.HeldOut:
    """The text behind the cache's validation rows (held_out.py), from the held-out documents the
    tokenize tasks set aside (per source, one file per unit read, in stream order)."""
    return held_out.build(
        (_held_documents(files) for files in held_files),
        [manifest["sources"][s.name]["val_rows"] for s in spec.sources],
        manifest["seq_len"], manifest["eos_id"], val,
    )  # fmt: skip


def _held_documents(files: list[str]):
    for file in files:
        yield from held_out.documents(pq.read_table(pa.BufferReader(storage.read_bytes(file))))


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
def _write_rows(spec: DataSpec, resolved: dict[str, ResolvedSource], units: list[Units], tokenizer_dir: Path,
                rows_at: str, log: BuildLog) -> tuple[dict, list[list[str]]]:  # fmt: skip
    """Tokenize, hold out and pack every source's rows in tasks, and place them at `rows_at` (a local
    directory or a URI; `_place`). Returns the manifest and, per source, the files of held-out documents
    the tasks set aside."""
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
    counts = _place(jobs, slots, rows_at, shapes, dtype, vocab, shard_rows)
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
    while short := [i for i in range(len(need)) if missing(done[i], need[i]) and units[i]]:
        batch = []
        for i in short:
            if done[i]:
                batch += units[i].take(units_to_read(done[i], need[i], spec.held_out))
            else:
                batch += units[i].take_bytes(
                    first_bytes(need[i], spec.held_out), max(1, parallel // len(short))
                )
        # Numbers are never reused: a task still running when its round stopped may yet write its files.
        items = [{"unit": numbered + n, **asdict(u), "stem": storage.join(streams, str(numbered + n))}
                 for n, u in enumerate(batch)]  # fmt: skip
        numbered += len(items)
        results = {}
        for r in _in_tasks(
            tasks.tokenize_unit, items, anywhere, tuple(resolved[s.name].filesystem for s in spec.sources),
            tuple(s.text_column for s in spec.sources), tokenizer_json, eos_id, dtype, spec.held_out,
        ):  # fmt: skip
            results[int(r["unit"])] = r
            nodes.add(r["node"])
            work.update({k: r[k] for k in r if k.endswith("_s") or k == "docs"}, tokens=r["train"] + r["val"])
            if all(
                not missing(done[i] + kept, need[i]) for i, kept in in_order(items, results, short).items()
            ):
                break
        kept = in_order(items, results, short)
        for i in short:
            done[i] += kept[i]
            units[i].put_back(
                [u for item, u in zip(items, batch, strict=True) if u.source == i][len(kept[i]) :]
            )
    for source, needed, read in zip(spec.sources, need, done, strict=True):
        if missing(read, needed):
            held = {split: tokens(read, split) for split in SPLITS}
            raise SourceTooSmall(
                f"data source '{source.name}' ({source.uri}) holds {held['train']:,} training tokens and "
                f"{held['val']:,} held-out ones (a random {spec.held_out.probability:.1%} of its documents "
                f"is held out), but its weight asks for {needed['train']:,} and {needed['val']:,}; lower "
                "data.token_budget, change its weight, or add documents"
            )
    return done, len(nodes), work


def _place(jobs: list[dict], slots: np.ndarray, rows_at: str, shapes: dict, dtype: str, vocab: int,
           shard_rows: dict[str, int]) -> np.ndarray:  # fmt: skip
    """Place every stretch's rows into the cache's splits; return the token counts of the training rows
    (for the unigram entropy). Locally, this process writes them into the splits' files (`_place_here`).
    On object storage, where a shard is an object written whole, tasks cut each stretch into pieces
    labelled by the shard that stores them (`pieces_by_shard`), Ray Data groups the pieces by shard, and
    one task per shard assembles it and writes it."""
    if storage.is_remote(rows_at):
        return _shuffled_into_shards(jobs, slots, rows_at, shapes, dtype, vocab, shard_rows)
    return _place_here(jobs, slots, Path(rows_at), shapes, dtype, vocab)


def _place_here(jobs: list[dict], slots: np.ndarray, rows_at: Path, shapes: dict, dtype: str,
                vocab: int) -> np.ndarray:  # fmt: skip
    """Write each stretch's row parts at their places in the local split files, one stretch at a time.
    It moves bytes only, at disk speed: in Ray tasks the same work cost seconds more in start-up and a
    shuffle. The rows go out by pwrite, so this process holds one stretch at most."""
    counts, item = np.zeros(vocab, dtype=np.int64), np.dtype(dtype).itemsize
    files = {
        split: os.open(rows_at / f"{split}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC) for split in SPLITS
    }
    try:
        for split, file in files.items():
            rows, seq_len = shapes[split]
            os.ftruncate(file, rows * seq_len * item)  # the whole split, zeros until its rows land
        for job in jobs:
            split, (rows, seq_len) = job["split"], shapes[job["split"]]
            tokens = np.frombuffer(storage.read_bytes(job["file"]), dtype=dtype)[: job["length"]]
            if split == "train":
                counts += np.bincount(tokens, minlength=vocab)
            pieces = pieces_by_shard(tokens, job["offset"], seq_len, job["at"],
                                     slots if split == "train" else None, rows)  # fmt: skip
            for _, column, at, block in pieces:
                for row, part in zip(at.tolist(), block, strict=True):
                    os.pwrite(files[split], part.tobytes(), (row * seq_len + column) * item)
        for file in files.values():
            os.fsync(file)
    finally:
        for file in files.values():
            os.close(file)
    return counts


def _shuffled_into_shards(jobs: list[dict], slots: np.ndarray, rows_at: str, shapes: dict, dtype: str,
                          vocab: int, shard_rows: dict[str, int]) -> np.ndarray:  # fmt: skip
    import ray.data
    from ray.data.context import ShuffleStrategy

    shards = sum(math.ceil(shapes[split][0] / shard_rows[split]) for split in SPLITS)
    # Ray Data's default hash shuffle starts aggregator actors (seconds, on a small machine); the sort
    # shuffle runs as plain tasks. A dataset keeps the context it was created in.
    context = ray.data.DataContext.get_current()
    default, context.shuffle_strategy = context.shuffle_strategy, ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    try:
        pieces = ray.data.from_items(jobs, override_num_blocks=len(jobs)).flat_map(
            tasks.pieces,
            fn_args=(slots, shapes, dtype, shard_rows),
            **_where(len(jobs), anywhere=True, free=True),
        )
        written = pieces.groupby(["split", "shard"], num_partitions=shards).map_groups(
            tasks.write_shard, fn_args=(rows_at, shapes, dtype, vocab, shard_rows), batch_format="pyarrow",
            **_where(shards, anywhere=True),
        )  # fmt: skip
        return sum(np.frombuffer(row["counts"], dtype=np.int64) for row in written.iter_rows())
    finally:
        context.shuffle_strategy = default


def _driver_node_cpus() -> int:
    """The CPUs the driver's node declares to Ray (0 for a head kept free of work)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    return int(next(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["NodeID"] == node))


def _where(n_tasks: int, anywhere: bool, free: bool = False) -> dict:
    """Where a stage's Ray Data tasks run, and how many at once. `anywhere`: on any node, one per CPU of
    the cluster. Otherwise on the driver's node, `_cores()` at once: they read and write the build's
    scratch files on its disk (a task on another node would write where the driver cannot read, or, over
    NFS, undo another node's bytes of the same file). `free` tasks ask no CPU (they only move bytes); so
    do all of them on a driver's node that declares none."""
    import ray
    import ray.data

    if anywhere:
        return {
            "compute": ray.data.TaskPoolStrategy(size=min(n_tasks, _parallel(anywhere))),
            "num_cpus": 0 if free else 1,
        }
    return {
        "compute": ray.data.TaskPoolStrategy(size=max(1, min(n_tasks, _cores()))),
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
