"""Data sources: a registry of URI schemes that resolve to a list of parquet files and a filesystem.

`embedded://edu` is rayb's own generated corpus (no hub needed; `embedded://europarl` is a generated
parallel-corpus stand-in with Europarl's schema, see parallel.py); plain paths are local parquet files,
directories or globs; `hf://`, `s3://` and `gs://` go through pyarrow / fsspec filesystems for users
who can reach them. A new scheme plugs in with `@register_scheme("name")`.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rayb.data import corpus
from rayb.files import write_atomic
from rayb.registry import Registry

EMBEDDED_SOURCES = (*corpus.SOURCES, "europarl")


@dataclass(frozen=True)
class ResolvedSource:
    paths: list[str]
    filesystem: pafs.FileSystem | None = None
    # What identifies the content (file names and sizes); part of the data cache key.
    fingerprint: list = field(default_factory=list)


Resolver = Callable[[str, Path], ResolvedSource]
SCHEMES: Registry[Resolver] = Registry("data scheme")
_REMOTE = ("hf", "s3", "gs")


def register_scheme(name: str) -> Callable[[Resolver], Resolver]:
    return SCHEMES.decorator(name)


def scheme_of(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else "file"


def check_uri(uri: str) -> None:
    """The URI's form, checked when a study is parsed (no I/O: local files are checked by `local_uri`)."""
    scheme = scheme_of(uri)
    if scheme.lower() in SCHEMES and scheme not in SCHEMES:
        raise ValueError(f"write the scheme of '{uri}' in lower case: {scheme.lower()}://")
    if scheme not in SCHEMES:
        others = [f"{name}://" for name in SCHEMES.names() if name != "file"]
        raise ValueError(
            f"unknown data scheme '{scheme.lower()}://'; use one of {', '.join(others)} or a path"
        )
    if scheme == "embedded":
        embedded_args(uri)


def local_uri(uri: str, base_dir: Path) -> str:
    """A local path as an absolute one (relative paths are read from the study file's directory); other
    URIs unchanged. A local path that holds no parquet file is an error."""
    if scheme_of(uri) != "file":
        return uri
    try:
        path = Path(uri.removeprefix("file://")).expanduser()
    except RuntimeError:  # '~user' of an unknown user
        path = Path(uri.removeprefix("file://"))
    absolute = str(path if path.is_absolute() else base_dir / path)
    if not _local_files(absolute):
        raise ValueError(
            f"no parquet files at '{uri}' (looked in {absolute}; give a .parquet file, a directory of them or a glob)"
        )
    return absolute


def resolve(uri: str, cache_root: Path) -> ResolvedSource:
    return SCHEMES.get(scheme_of(uri))(uri, cache_root)


def embedded_args(uri: str) -> tuple[str, int, int]:
    parsed = urlparse(uri)
    source = parsed.netloc
    if source not in EMBEDDED_SOURCES:
        raise ValueError(f"unknown embedded source '{source}'; available: {', '.join(EMBEDDED_SOURCES)}")
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    unknown = set(query) - {"docs", "seed"}
    if unknown:
        raise ValueError(
            f"'{uri}': unknown option(s) {sorted(unknown)}; embedded sources take docs= and seed="
        )
    try:
        docs, seed = int(query.get("docs", 5000)), int(query.get("seed", 0))
    except ValueError:
        raise ValueError(f"'{uri}': docs and seed must be whole numbers") from None
    if docs < 1:
        raise ValueError(f"'{uri}': docs must be at least 1")
    return source, docs, seed


@register_scheme("embedded")
def _resolve_embedded(uri: str, cache_root: Path) -> ResolvedSource:
    source, docs, seed = embedded_args(uri)
    out = cache_root / "corpus" / f"{source}-d{docs}-s{seed}-v{corpus.GENERATOR_VERSION}"
    if source == "europarl":
        paths = [str(_write_parallel(out, docs, seed))]
    else:
        paths = [str(p) for p in corpus.write_corpus(out, source, n_docs=docs, seed=seed)]
    return ResolvedSource(paths, None, [source, docs, seed, corpus.GENERATOR_VERSION])


def _write_parallel(out: Path, docs: int, seed: int) -> Path:
    from rayb.data.parallel import parallel_rows

    path = out / "part-00000.parquet"
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        sink = pa.BufferOutputStream()
        pq.write_table(parallel_rows(docs, seed), sink)
        write_atomic(path, sink.getvalue().to_pybytes())
    return path


def _local_files(uri: str) -> list[str]:
    """Parquet files at a local file, directory or glob; [] when there are none or the path is unusable."""
    try:
        path = Path(uri.removeprefix("file://")).expanduser()
        if path.is_file():
            return [str(path.resolve())] if path.suffix == ".parquet" else []
        if path.is_dir():
            return sorted(str(p.resolve()) for p in path.rglob("*.parquet"))
        matches = glob.glob(str(path), recursive=True)
    except (OSError, RuntimeError):  # a name too long, '~user' of an unknown user, ...
        return []
    return sorted(str(Path(p).resolve()) for p in matches if p.endswith(".parquet"))


@register_scheme("file")
def _resolve_local(uri: str, cache_root: Path) -> ResolvedSource:
    paths = _local_files(uri)
    if not paths:
        raise FileNotFoundError(f"no parquet files at '{uri}'")
    return ResolvedSource(paths, None, [(p, Path(p).stat().st_size) for p in paths])


def _resolve_remote(uri: str, cache_root: Path) -> ResolvedSource:
    """hf:// through huggingface_hub's fsspec filesystem; s3:// and gs:// through pyarrow's own."""
    if uri.startswith("hf://"):
        from huggingface_hub import HfFileSystem

        fs_spec = HfFileSystem()
        root = uri.removeprefix("hf://")
        pattern = root if any(c in root for c in "*?[") else root.rstrip("/") + "/**/*.parquet"
        paths = sorted(fs_spec.glob(pattern)) if not root.endswith(".parquet") else [root]
        filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(fs_spec))
    else:
        filesystem, root = pafs.FileSystem.from_uri(uri)
        infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
        paths = sorted(i.path for i in infos if i.path.endswith(".parquet")) or [root]
    if not paths:
        raise FileNotFoundError(f"no parquet files at '{uri}'")
    return ResolvedSource(paths, filesystem, [uri, paths])


for _scheme in _REMOTE:
    register_scheme(_scheme)(_resolve_remote)
