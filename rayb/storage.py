"""Where a study's files live: a local directory, or object storage (s3://, gs://, any pyarrow or fsspec URI).

A *location* is a local path or a URI; `join` builds them, so a study's layout is the same on both. For a
local location every function here is plain file I/O, so a local study behaves exactly as it always has.
For a URI:
- small files (results, markers, logs) are read from and written to the store directly: `read_bytes`,
  `write_bytes` (an object appears whole or not at all, as an atomic rename does locally);
- what libraries must open as local files (the token cache, a tokenizer, saved weights) goes through this
  node's mirror of the store (`mirror_root`, under Ray's temp directory): `fetch` and `fetch_tree`
  download a file when the mirror lacks it or the store's copy differs, so a node reads each once;
- what libraries write as local files (save_pretrained, the cache build) is written in a private
  directory (`writable`) and `push`ed, the file that marks the step finished last.
The store is the only copy that counts: a node that dies loses nothing it pushed, and a rerun anywhere finds
every finished step there. Credentials come from the environment or the instance's role, as pyarrow and
fsspec find them (for S3: AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, an instance profile, ...), never from a study.
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from rayb.files import write_atomic

MIRROR_ENV = "RAYB_MIRROR"  # where this node keeps its mirror of object storage (default: mirror_root())


def is_remote(location: str | Path) -> bool:
    scheme = urlparse(str(location)).scheme
    return len(scheme) > 1 and scheme != "file"  # a Windows drive letter is not a scheme


def join(location: str | Path, *parts: str) -> str:
    """`location` / parts, for a path or a URI."""
    if not is_remote(location):
        return str(Path(location, *parts))
    return "/".join([str(location).rstrip("/"), *(p.strip("/") for p in parts)])


def name(location: str | Path) -> str:
    return str(location).rstrip("/").rsplit("/", 1)[-1]


def resolve(location: str | Path) -> str:
    """A location in its canonical form: an absolute local path, or the URI as given (no trailing slash)."""
    return str(location).rstrip("/") if is_remote(location) else str(Path(location).resolve())


@functools.cache
def mirror_root() -> Path:
    """This node's mirror of object storage: RAYB_MIRROR, else beside Ray's files on this node (each node
    has its own), else the system temp directory for a process that has not started Ray (`rayb report URI`,
    or the driver, which picks its mirror before it starts Ray). Fixed for the life of the process."""
    if env := os.environ.get(MIRROR_ENV):
        return Path(env)
    try:
        import ray

        if ray.is_initialized():
            return Path(ray._private.worker._global_node.get_temp_dir_path()) / "rayb-mirror"
    except (ImportError, AttributeError):  # not public API: fall back to the temp directory
        pass
    return Path(tempfile.gettempdir()) / "rayb-mirror"


def local(location: str | Path) -> Path:
    """The local file or directory that stands for `location` in this process."""
    if not is_remote(location):
        return Path(location)
    url = urlparse(str(location))
    return mirror_root() / url.scheme / url.netloc / url.path.lstrip("/")


@functools.lru_cache(maxsize=16)
def _filesystem(scheme: str, netloc: str):
    """A pyarrow filesystem for a URI's scheme and bucket: pyarrow's own (S3, GCS, HDFS), else fsspec's
    wrapped for pyarrow (Azure, HTTP, ...).

    S3's opens a file for writing only as it writes its first part (allow_delayed_open): a file smaller
    than a part (a record, a log, most of a small model's checkpoint) goes up in one PutObject, where an
    eager open takes three requests (start a multipart upload, its one part, complete it). A missing
    bucket then fails at the file's close, which every write here waits for."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    options = "?allow_delayed_open=true" if scheme == "s3" else ""
    try:
        return pafs.FileSystem.from_uri(f"{scheme}://{netloc}/{options}")[0]
    except (pa.ArrowInvalid, ValueError):
        import fsspec

        return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(scheme)))


def filesystem(location: str) -> tuple:
    """(pyarrow filesystem, path within it) of a URI; for Ray Train's `storage_filesystem`, pyarrow and Ray
    Data."""
    url = urlparse(location)
    return _filesystem(url.scheme, url.netloc), f"{url.netloc}{url.path}".rstrip("/")


def exists(location: str | Path) -> bool:
    if not is_remote(location):
        return Path(location).exists()
    import pyarrow.fs as pafs

    fs, path = filesystem(str(location))
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def fetch(location: str | Path) -> Path:
    """The local copy of a file, downloaded if this node lacks it or the store's copy changed; a file the
    store does not have gives a path that does not exist (as a missing local file would)."""
    target = local(location)
    if not is_remote(location):
        return target
    import pyarrow.fs as pafs

    fs, path = filesystem(str(location))
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        _download(fs, info, target)
    elif info.type == pafs.FileType.NotFound:
        target.unlink(missing_ok=True)  # gone from the store: so is the mirror's copy
    return target


def fetch_tree(
    location: str | Path, wanted: Callable[[str], bool] | None = None, into: Path | None = None
) -> Path:
    """The local copy of a directory, each file fetched as `fetch` does (only what changed moves): into
    this node's mirror, or `into` a directory of the caller's; only the files whose path within the
    directory `wanted` accepts (a rank resuming needs its own shards of a checkpoint, not every rank's).
    A local directory is its own copy."""
    if not is_remote(location):
        return Path(location)
    import pyarrow.fs as pafs

    target = into or local(location)
    fs, root = filesystem(str(location))
    for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True)):
        relative = info.path[len(root) :].lstrip("/")
        if info.type == pafs.FileType.File and (wanted is None or wanted(relative)):
            _download(fs, info, target / relative)
    return target


def _download(fs, info, target: Path) -> None:
    if (
        target.exists()
        and target.stat().st_size == info.size
        and int(target.stat().st_mtime) == _seconds(info)
    ):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with tmp.open("wb") as sink:
            _read_whole(fs, info.path, sink)
        os.utime(tmp, (_seconds(info), _seconds(info)))  # the store's time: the next fetch sees it unchanged
        os.replace(tmp, target)  # readers on this node never see half a file
    finally:
        tmp.unlink(missing_ok=True)


_READ_ATTEMPTS = 10


def _read_whole(fs, path: str, sink: BinaryIO) -> None:
    """Copy one version of a store's object, whole, into `sink` (emptied before each attempt).

    A store's reader asks for the object's size, then for that many bytes; an object replaced between the
    two comes back as the new version cut to the old one's size, or short of it, with no error (on S3: a
    JSON file cut mid-value, a metrics log missing its last lines). So a read counts only if it gave the
    size the reader asked for and the object still has that size after it; else it reads again. Not
    seen: a version replaced twice during the read, the second time by one of the first's size, nor
    one replaced by another of its size between the 8 MiB parts of a large file (rayb rewrites only
    small files; checkpoints and token shards are written once). A read the store breaks off (an error
    other than the object missing: moto's S3 server did so to a reader of an object being replaced) is
    read again in the same way; where the last read failed so, its error is raised."""
    for attempt in range(_READ_ATTEMPTS):
        sink.seek(0)
        sink.truncate()
        error = None
        try:
            with fs.open_input_file(path) as source:
                size = source.size()
                shutil.copyfileobj(source, sink, 8 << 20)
            if sink.tell() == size == fs.get_file_info(path).size:
                return
        except FileNotFoundError:
            raise
        except OSError as exc:
            error = exc
        time.sleep(0.01 * 2**attempt)  # a writer mid-burst: let it finish
    if error is not None:
        raise error
    raise OSError(f"{path} changed on the store during each of {_READ_ATTEMPTS} reads of it")


def _seconds(info) -> int:
    return int(info.mtime.timestamp()) if info.mtime else 0


def writable(location: str | Path) -> Path:
    """Where this process writes a file or directory that libraries produce before `push`: the location
    itself when it is local, else a directory private to this process (a reader's fetch on the same node
    never touches it)."""
    if not is_remote(location):
        return Path(location)
    return mirror_root() / f"writes-{os.getpid()}" / local(location).relative_to(mirror_root())


_kept: dict[Path, tuple[int, int]] = {}  # files pushed and kept by this process: (size, mtime) when pushed


def push(location: str | Path, *, last: tuple[str, ...] = (), keep: bool = False) -> None:
    """Upload `writable(location)` (a file, or a directory tree with the files named in `last` uploaded
    after the rest) to the store, then drop the private copy unless `keep`. A kept copy pushed again
    uploads only the files that changed since (a study directory is pushed as each trial ends)."""
    if not is_remote(location):
        return
    source = writable(location)
    fs, path = filesystem(str(location))
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    for file in sorted(files, key=lambda f: f.name in last):
        stat = file.stat()
        stamp = (stat.st_size, stat.st_mtime_ns)
        if keep and _kept.get(file) == stamp:
            continue
        relative = file.relative_to(source).as_posix() if file != source else ""
        with file.open("rb") as data, fs.open_output_stream("/".join(filter(None, [path, relative]))) as out:
            shutil.copyfileobj(data, out, 8 << 20)
        if keep:
            _kept[file] = stamp
    if not keep:
        shutil.rmtree(source, ignore_errors=True) if source.is_dir() else source.unlink(missing_ok=True)


def read_bytes(location: str | Path) -> bytes | None:
    """A file's contents, or None where there is no such file."""
    if not is_remote(location):
        return Path(location).read_bytes() if Path(location).is_file() else None
    fs, path = filesystem(str(location))
    buffer = io.BytesIO()
    try:
        _read_whole(fs, path, buffer)
    except FileNotFoundError:
        return None
    return buffer.getvalue()


def write_bytes(location: str | Path, data: bytes) -> None:
    """Write a whole file: locally through a temp file and a rename, on a store as one object; readers
    never see half of it either way."""
    if not is_remote(location):
        write_atomic(Path(location), data)
        return
    fs, path = filesystem(str(location))
    with fs.open_output_stream(path) as out:
        out.write(data)


def listdir(location: str | Path) -> list[str]:
    """The names of a directory's entries (none where there is no such directory)."""
    if not is_remote(location):
        return sorted(p.name for p in Path(location).iterdir()) if Path(location).is_dir() else []
    import pyarrow.fs as pafs

    fs, path = filesystem(str(location))
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in infos)


def remove(location: str | Path) -> None:
    """Delete a file or directory tree, locally or on the store."""
    if not is_remote(location):
        target = Path(location)
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        return
    import pyarrow.fs as pafs

    fs, path = filesystem(str(location))
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)
