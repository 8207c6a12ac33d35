"""Result files and directories: written atomically, so a crash never leaves half of one where a finished
one is expected; and `digest`, the short stable hash that names every hash-keyed output path."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def digest(value: Any, length: int = 12) -> str:
    """A short, stable hash of a JSON-able value (key order does not matter)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def write_atomic(path: Path, data: bytes) -> Path:
    """Write via a temp file in the same directory + os.replace, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json_atomic(location: str | Path, value: Any) -> None:
    """Write a JSON file whole, to a local path or an object store (rayb/storage.py)."""
    from rayb import storage

    storage.write_bytes(location, json.dumps(value, indent=2, default=float).encode())


def read_json(location: str | Path) -> dict[str, Any]:
    """A result file's contents (local or on an object store), or {} when that step has not finished."""
    from rayb import storage

    data = storage.read_bytes(location)
    return json.loads(data) if data is not None else {}


class AtomicDirectory:
    """The scratch directory of `atomic_directory`; `won` says whether it became the target."""

    def __init__(self, path: Path):
        self.path = path
        self.won = False


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[AtomicDirectory]:
    """Build a directory in private scratch space beside `target`, then move it into place in one rename.

    Readers never see a half-built `target`: it appears whole or not at all. If the block raises, the
    scratch directory is removed (nothing leaks). If another process put a complete `target` in place
    first, this copy is discarded and `won` stays False: the caller then uses the one that is there.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    scratch.chmod(0o755)  # mkdtemp makes it private; a finished cache is readable like any other directory
    handle = AtomicDirectory(scratch)
    try:
        yield handle
        try:
            os.replace(scratch, target)  # also succeeds onto an empty directory
            handle.won = True
        except OSError:
            if not (target.is_dir() and any(target.iterdir())):
                raise  # not a lost race: a real failure to move the result into place
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def one_at_a_time(lock_file: Path) -> Iterator[None]:
    """Within, this is the only holder of `lock_file` on the machine: for a build that one process does while
    the others wait to read what it built. An flock, which the operating system lets go of as its process
    ends, so a build killed midway (OOM, preemption) leaves no lock for the next process to wait on forever,
    as torch's build directories do. Where the lock cannot be had (a read-only home, a file system that
    takes no locks), the block runs unguarded."""
    import fcntl

    with contextlib.ExitStack() as held:
        with contextlib.suppress(OSError):
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            fcntl.flock(held.enter_context(open(lock_file, "w")), fcntl.LOCK_EX)
        yield
