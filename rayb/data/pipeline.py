"""The data step on Ray Data: read parquet, tokenize in parallel, pack, mix by weight, split, cache.

This is the only data module that knows about Ray. Each source's parquet row groups are its units of
work; Ray Data tasks tokenize the units and save each one's stretch of the packed stream, then
place the stretches into the memory-mapped cache (see `cache.py`) by their offsets in the stream. The
driver sees token counts only, so its memory does not grow with the corpus. The mix is exact by
construction: source i contributes round(w_i * rows) packed rows, and one seeded permutation scatters
them through the training set. Each source stops being read once it has delivered its rows, so a
hub-sized source costs only the tokens the budget asks for.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from rayb.data import held_out
from rayb.data.cache import MANIFEST, TokenCache, unigram_entropy
from rayb.data.held_out import HELD_OUT_DIR
from rayb.data.packing import row_blocks, split_rows
from rayb.data.sources import ResolvedSource, resolve
from rayb.data.spec import DataSpec
from rayb.data.tokenizer import ensure_pretrained, load_tokenizer, train_bpe
from rayb.files import atomic_directory, digest

CACHE_FORMAT_VERSION = 1
BPE_SAMPLE_CHARS = 6_000_000  # enough text for a stable small-vocabulary BPE, seconds to train
STREAM_DIR = "streams"  # the units' stretches of the packed stream, while the cache is built


class SourceTooSmall(ValueError):
    pass


class BadShard(ValueError):
    pass


def prepare_data(spec: DataSpec, cache_root: Path) -> TokenCache:
    """Build (or reuse) the packed-token cache for a data spec; return it."""
    cache_root = Path(cache_root).resolve()
    resolved = {s.name: resolve(s.location, cache_root) for s in spec.sources}
    key = data_key(spec, resolved)
    out = cache_root / "data" / key
    if (out / MANIFEST).exists():
        if not (out / HELD_OUT_DIR).exists():  # a cache from before rayb kept the held-out text
            with atomic_directory(out / HELD_OUT_DIR) as scratch:
                held_out.write(_held_out(spec, resolved, TokenCache(out)), scratch.path)
        return TokenCache(out)

    started = time.perf_counter()
    units = [list_units(i, resolved[s.name], s.text_column) for i, s in enumerate(spec.sources)]
    tokenizer_dir = _tokenizer(spec, resolved, cache_root)
    with atomic_directory(out) as scratch:
        shutil.copytree(tokenizer_dir, scratch.path / "tokenizer")
        manifest = _write_rows(spec, resolved, units, scratch.path)
        manifest.update(
            key=key, tokenizer_source=spec.tokenizer, build_s=round(time.perf_counter() - started, 2)
        )
        (scratch.path / MANIFEST).write_text(json.dumps(manifest, indent=2))
        held_out.write(_held_out(spec, resolved, TokenCache(scratch.path)), scratch.path / HELD_OUT_DIR)
    return TokenCache(out)


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
    sources = {s.name: resolved[s.name].fingerprint for s in spec.sources}
    out = cache_root / "tokenizers" / digest({"tokenizer": spec.tokenizer, "sources": sources})
    if spec.trained_vocab is None:
        return ensure_pretrained(spec.tokenizer_location, out)
    texts = (
        text
        for s in spec.sources
        for text in _sample_texts(resolved[s.name], s.text_column, int(BPE_SAMPLE_CHARS * s.weight))
    )
    return train_bpe(texts, spec.trained_vocab, out)


def _sample_texts(source: ResolvedSource, column: str, max_chars: int):
    """The first non-empty documents of a source, in order, up to max_chars."""
    seen = 0
    for text in _documents(source, column):
        if text:
            yield text
            seen += len(text)
            if seen >= max_chars:
                return


def _documents(source: ResolvedSource, column: str):
    """Every document of a source, in the order packing reads them (plain pyarrow: no Ray needed)."""
    dataset = pads.dataset(source.paths, format="parquet", filesystem=source.filesystem)
    for batch in dataset.to_batches(columns={"text": pc.field(*column.split("."))}, batch_size=512):
        yield from batch.column(0).to_pylist()


def _held_out(spec: DataSpec, resolved: dict[str, ResolvedSource], cache: TokenCache) -> held_out.HeldOut:
    """The text behind the cache's validation rows (held_out.py), rebuilt from the sources."""
    return held_out.build(
        (_documents(resolved[s.name], s.text_column) for s in spec.sources),
        [cache.manifest["sources"][s.name]["val_rows"] for s in spec.sources],
        cache.seq_len, cache.tokenizer_dir / "tokenizer.json", cache.manifest["eos_id"], cache.val,
    )  # fmt: skip


# ----- tokenize, pack, place ----------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    """A tokenize task's share of a source: one parquet row group (read once, whole: pyarrow cannot read
    part of one without decoding it)."""

    source: int  # index into the study's sources
    path: str
    row_group: int


def list_units(index: int, source: ResolvedSource, column: str) -> list[Unit]:
    """Every shard's row groups, in document order. Reading the
    footers also checks each shard: a corrupt file or a missing column fails here, by name, instead of
    as a remote task error halfway through tokenizing."""
    units = []
    for path in source.paths:
        try:
            shard = pq.ParquetFile(path, filesystem=source.filesystem)
        except (OSError, pa.ArrowException) as exc:
            raise BadShard(f"cannot read parquet shard {path}: {exc}") from None
        if column not in _columns(shard.schema_arrow):
            raise BadShard(
                f"parquet shard {path} has no text column '{column}'; its columns: {_columns(shard.schema_arrow)}"
            )
        units += [Unit(index, path, group) for group in range(shard.num_row_groups)]
    return units


def _write_rows(
    spec: DataSpec, resolved: dict[str, ResolvedSource], units: list[list[Unit]], tmp: Path
) -> dict:
    """Tokenize, pack and place every source's rows in tasks; the driver sees token counts only."""
    tokenizer = load_tokenizer(tmp / "tokenizer")
    vocab = len(tokenizer)
    dtype = np.dtype(np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.uint32).name
    weights = [s.weight for s in spec.sources]
    rows = list(zip(split_rows(spec.train_rows, weights), split_rows(spec.val_rows, weights), strict=True))
    need = [t + v for t, v in rows]
    stretches = _tokenized(spec, resolved, units, tmp, tokenizer.eos_token_id, dtype, need)
    shapes = {"train": (spec.train_rows, spec.seq_len), "val": (spec.val_rows, spec.seq_len)}
    for split, shape in shapes.items():
        np.memmap(tmp / f"{split}.bin", dtype=dtype, mode="w+", shape=shape).flush()
    jobs, train_at, val_at = [], 0, 0
    for (n_train, n_val), source_stretches in zip(rows, stretches, strict=True):
        offset, end = 0, (n_train + n_val) * spec.seq_len
        for file, length in source_stretches:
            if offset >= end:
                break
            jobs.append({"file": file, "offset": offset, "length": min(length, end - offset),
                         "val_rows": n_val, "val_at": val_at, "train_at": train_at})  # fmt: skip
            offset += length
        train_at, val_at = train_at + n_train, val_at + n_val
    # One seeded permutation places every source's training rows through the training set.
    slots = np.random.default_rng(spec.seed).permutation(spec.train_rows)
    written = _in_tasks(_write_stretch, jobs, slots, str(tmp), shapes, dtype, vocab, here=True)
    shutil.rmtree(tmp / STREAM_DIR)
    return {
        "format": CACHE_FORMAT_VERSION,
        "seq_len": spec.seq_len,
        "vocab_size": vocab,
        "eos_id": tokenizer.eos_token_id,
        "dtype": dtype,
        "train_rows": spec.train_rows,
        "val_rows": spec.val_rows,
        "train_tokens": spec.train_rows * spec.seq_len,
        "sources": {
            s.name: {"train_rows": t, "val_rows": v, "weight": s.weight}
            for s, (t, v) in zip(spec.sources, rows, strict=True)
        },  # fmt: skip
        "unigram_entropy_nats": unigram_entropy(sum(r["counts"] for r in written)),
    }


def _tokenized(spec: DataSpec, resolved: dict[str, ResolvedSource], units: list[list[Unit]], tmp: Path,
               eos_id: int, dtype: str, need_rows: list[int]) -> list[list[tuple[str, int]]]:  # fmt: skip
    """Tokenize each source's units, in rounds, until it holds the packed rows its weight asks for; per
    source, its (stream file, tokens) in document order. A source stops being read once it has enough,
    so a hub-sized source costs only the tokens the budget asks for: the first round reads one unit of
    each, the next as many as its token rate says are still missing (and a quarter more)."""
    (tmp / STREAM_DIR).mkdir()
    pending = list(units)
    need = [rows * spec.seq_len for rows in need_rows]
    done: list[list[tuple[str, int]]] = [[] for _ in spec.sources]
    while short := [i for i in range(len(need)) if _tokens(done[i]) < need[i] and pending[i]]:
        batch = []
        for i in short:
            missing = need[i] - _tokens(done[i])
            take = 1 if not done[i] else math.ceil(1.25 * missing * len(done[i]) / _tokens(done[i]))
            batch += pending[i][:take]
            pending[i] = pending[i][take:]
        first = sum(map(len, done))  # units are numbered across rounds
        items = [{"unit": first + n, **asdict(u)} for n, u in enumerate(batch)]
        results = {int(r["unit"]): int(r["tokens"]) for r in _in_tasks(
            _tokenize_unit, items, tuple(resolved[s.name].filesystem for s in spec.sources),
            tuple(s.text_column for s in spec.sources), str(tmp / "tokenizer"), eos_id, dtype, str(tmp / STREAM_DIR),
        )}  # fmt: skip
        for item, unit in zip(items, batch, strict=True):
            done[unit.source].append((str(tmp / STREAM_DIR / f"{item['unit']}.npy"), results[item["unit"]]))
    for source, tokens, stretches in zip(spec.sources, need, done, strict=True):
        if _tokens(stretches) < tokens:
            packed = _tokens(stretches) // spec.seq_len * spec.seq_len
            raise SourceTooSmall(
                f"data source '{source.name}' ({source.uri}) holds {packed:,} tokens after packing, but its "
                f"weight asks for {tokens:,} (train + validation); lower data.token_budget, change "
                "its weight, or add documents"
            )
    return done


def _tokens(stretches: list[tuple[str, int]]) -> int:
    return sum(length for _, length in stretches)


def _cores() -> int:
    from rayb.runtime import compute_cores

    return compute_cores(False)


@functools.lru_cache(maxsize=4)
def _fast_tokenizer(tokenizer_dir: str) -> Tokenizer:
    # The bare Rust tokenizer: loads in milliseconds and avoids importing transformers in Ray workers.
    return Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))


def _tokenize_unit(unit: dict, filesystems: tuple, columns: tuple, tokenizer_dir: str, eos_id: int,
                   dtype: str, out: str) -> dict:  # fmt: skip
    """Ray Data task: read a unit's documents, tokenize them, end each with EOS, and save the unit's
    stretch of the packed stream to `out/<unit>.npy`; return its length."""
    column = columns[unit["source"]]
    shard = pq.ParquetFile(unit["path"], filesystem=filesystems[unit["source"]])
    table = shard.read_row_group(unit["row_group"], columns=[column.split(".")[0]])
    texts = [t or "" for t in text_values(table, column)]
    docs = _fast_tokenizer(tokenizer_dir).encode_batch(texts, add_special_tokens=False)
    stream = np.array([t for doc in docs for t in (*doc.ids, eos_id)], dtype=dtype)
    np.save(Path(out) / f"{unit['unit']}.npy", stream)
    return {"unit": unit["unit"], "tokens": len(stream)}


def _write_stretch(
    job: dict, slots: np.ndarray, cache_dir: str, shapes: dict, dtype: str, vocab: int
) -> dict:
    """Ray Data task: place a unit's stretch of a source's stream into its rows of the cache. The
    source's first `val_rows` rows go to val.bin from row `val_at`; the rest to their shuffled training
    slots. Returns the token counts of the training rows it wrote (for the unigram entropy)."""
    cache = {split: np.memmap(Path(cache_dir) / f"{split}.bin", dtype=dtype, mode="r+", shape=shape)
             for split, shape in shapes.items()}  # fmt: skip
    n_val, val_at, train_at = job["val_rows"], job["val_at"], job["train_at"]
    counts = np.zeros(vocab, dtype=np.int64)
    tokens = np.load(job["file"])[: job["length"]]
    for first, column, block in row_blocks(tokens, job["offset"], shapes["train"][1]):
        rows, columns = np.arange(first, first + len(block)), slice(column, column + block.shape[1])
        held = rows < n_val
        cache["val"][val_at + rows[held], columns] = block[held]
        cache["train"][slots[train_at + rows[~held] - n_val], columns] = block[~held]
        counts += np.bincount(block[~held].ravel(), minlength=vocab)
    for array in cache.values():
        array.flush()
    return {"counts": counts}


def _in_tasks(fn, items: list[dict], *args, here: bool = False) -> list[dict]:
    """Run `fn` over the items in Ray Data tasks, one item per task, up to a task per core; return the
    results, in no particular order. `here` keeps the tasks on the driver's node and asks no CPU of it
    (a head may have none): they write into one file, which only one node may do safely (two NFS
    clients writing the same page would undo each other's bytes)."""
    import ray
    import ray.data

    placement = {"label_selector": {"ray.io/node-id": ray.get_runtime_context().get_node_id()}, "num_cpus": 0}
    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map(
        fn,
        fn_args=args,
        compute=ray.data.TaskPoolStrategy(size=max(1, min(len(items), _cores()))),
        **(placement if here else {}),
    )
    return list(dataset.iter_rows())
