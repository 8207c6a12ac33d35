"""The data step on Ray Data: read parquet, tokenize in parallel, pack, mix by weight, split, cache.

This is the only data module that knows about Ray. Ray Data reads and tokenizes each source in
parallel, in document order (`preserve_order`); the driver packs the ordered stream into rows and
places them in a memory-mapped cache (see `cache.py`). The mix is exact by construction: source i
contributes round(w_i · rows) packed rows, and one seeded permutation scatters them through the
training set. Each source stops being read once it has delivered its rows, so a hub-sized source
costs only the tokens the budget asks for.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
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
from rayb.data.packing import Packer, split_rows
from rayb.data.sources import ResolvedSource, resolve
from rayb.data.spec import DataSpec
from rayb.data.tokenizer import ensure_pretrained, load_tokenizer, train_bpe
from rayb.files import atomic_directory, digest

CACHE_FORMAT_VERSION = 1
BPE_SAMPLE_CHARS = 6_000_000  # enough text for a stable small-vocabulary BPE, seconds to train
TOKENIZE_BATCH_DOCS = 256


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
    for source in spec.sources:
        check_shards(resolved[source.name], source.text_column)
    tokenizer_dir = _tokenizer(spec, resolved, cache_root)
    with atomic_directory(out) as scratch:
        shutil.copytree(tokenizer_dir, scratch.path / "tokenizer")
        manifest = _write_rows(spec, resolved, scratch.path)
        manifest.update(
            key=key, tokenizer_source=spec.tokenizer, build_s=round(time.perf_counter() - started, 2)
        )
        (scratch.path / MANIFEST).write_text(json.dumps(manifest, indent=2))
        held_out.write(_held_out(spec, resolved, TokenCache(scratch.path)), scratch.path / HELD_OUT_DIR)
    return TokenCache(out)


def data_key(spec: DataSpec, resolved: dict[str, ResolvedSource]) -> str:
    content = {name: r.fingerprint for name, r in resolved.items()}
    return digest({"spec": spec.hashed(), "content": content, "format": CACHE_FORMAT_VERSION})


def check_shards(source: ResolvedSource, column: str) -> None:
    """Read every shard's footer up front: a corrupt file or a missing column fails here, by name,
    instead of as a remote task error halfway through tokenizing."""
    for path in source.paths:
        try:
            schema = pq.ParquetFile(path, filesystem=source.filesystem).schema_arrow
        except (OSError, pa.ArrowException) as exc:
            raise BadShard(f"cannot read parquet shard {path}: {exc}") from None
        if column not in _columns(schema):
            raise BadShard(
                f"parquet shard {path} has no text column '{column}'; its columns: {_columns(schema)}"
            )


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
@functools.lru_cache(maxsize=4)
def _fast_tokenizer(tokenizer_dir: str) -> Tokenizer:
    # The bare Rust tokenizer: loads in milliseconds and avoids importing transformers in Ray workers.
    return Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))


def _tokenize(batch: pa.Table, tokenizer_dir: str, column: str) -> pa.Table:
    """Ray Data task: a batch of documents in, their token lists out (same order)."""
    texts = [t or "" for t in text_values(batch, column)]
    encodings = _fast_tokenizer(tokenizer_dir).encode_batch(texts, add_special_tokens=False)
    return pa.table({"ids": pa.array([e.ids for e in encodings], type=pa.list_(pa.int32()))})


def _token_stream(source: ResolvedSource, column: str, tokenizer_dir: Path):
    """Yield lists of per-document token arrays, in document order."""
    import ray
    import ray.data

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds = ray.data.read_parquet(source.paths, filesystem=source.filesystem).select_columns(
        [column.split(".")[0]]
    )
    ds = ds.map_batches(
        _tokenize,
        fn_args=(str(tokenizer_dir), column),
        batch_format="pyarrow",
        batch_size=TOKENIZE_BATCH_DOCS,
    )
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        ids = batch.column("ids").combine_chunks()
        offsets = ids.offsets.to_numpy()
        values = ids.values.to_numpy(zero_copy_only=False)
        yield [values[offsets[i] : offsets[i + 1]] for i in range(len(ids))]


def _write_rows(spec: DataSpec, resolved: dict[str, ResolvedSource], tmp: Path) -> dict:
    tokenizer = load_tokenizer(tmp / "tokenizer")
    vocab = len(tokenizer)
    dtype = np.uint16 if vocab <= np.iinfo(np.uint16).max + 1 else np.uint32
    weights = [s.weight for s in spec.sources]
    train_counts = split_rows(spec.train_rows, weights)
    val_counts = split_rows(spec.val_rows, weights)
    # One seeded permutation places every source's rows through the training set.
    slots = np.random.default_rng(spec.seed).permutation(spec.train_rows)
    train = np.memmap(tmp / "train.bin", dtype=dtype, mode="w+", shape=(spec.train_rows, spec.seq_len))
    val = np.memmap(tmp / "val.bin", dtype=dtype, mode="w+", shape=(spec.val_rows, spec.seq_len))
    counts = np.zeros(vocab, dtype=np.int64)
    per_source, train_at, val_at = {}, 0, 0
    for source, n_train, n_val in zip(spec.sources, train_counts, val_counts, strict=True):
        done = 0
        chunks = _packed_rows(
            resolved[source.name], source, tokenizer, tmp / "tokenizer", spec.seq_len, n_train + n_val
        )
        for rows in chunks:
            # The first n_val rows of each source are held out; the rest go to their training slots.
            n_held = max(0, min(done + len(rows), n_val) - done)
            val[val_at + done : val_at + done + n_held] = rows[:n_held]
            kept = rows[n_held:]
            first = train_at + max(done, n_val) - n_val
            train[slots[first : first + len(kept)]] = kept
            counts += np.bincount(kept.ravel(), minlength=vocab)
            done += len(rows)
        per_source[source.name] = {"train_rows": n_train, "val_rows": n_val, "weight": source.weight}
        train_at, val_at = train_at + n_train, val_at + n_val
    train.flush()
    val.flush()
    return {
        "format": CACHE_FORMAT_VERSION,
        "seq_len": spec.seq_len,
        "vocab_size": vocab,
        "eos_id": tokenizer.eos_token_id,
        "dtype": np.dtype(dtype).name,
        "train_rows": spec.train_rows,
        "val_rows": spec.val_rows,
        "train_tokens": spec.train_rows * spec.seq_len,
        "sources": per_source,
        "unigram_entropy_nats": unigram_entropy(counts),
    }


def _packed_rows(resolved: ResolvedSource, source, tokenizer, tokenizer_dir: Path, seq_len: int, need: int):
    """Yield packed rows of one source, in order, exactly `need` rows in all."""
    packer = Packer(seq_len, tokenizer.eos_token_id)
    have = 0
    for docs in _token_stream(resolved, source.text_column, tokenizer_dir):
        rows = packer.add(docs)[: need - have]
        have += len(rows)
        yield rows
        if have == need:
            return
    raise SourceTooSmall(
        f"data source '{source.name}' ({source.uri}) holds {have * seq_len:,} tokens after packing, but its "
        f"weight asks for {need * seq_len:,} (train + validation); lower data.token_budget, change its weight, "
        "or add documents"
    )
