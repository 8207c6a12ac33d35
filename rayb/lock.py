"""One `rayb run` of a study at a time: a second run of the same study on the same output refuses, naming
the process that holds it, instead of training the same trials into the same files beside it.

The lock is `lock.json` in the study directory, holding who runs the study (host, pid, since when).
- On a local (or NFS) output it is an flock on that file: the operating system lets go of it when the
  process ends however it ends, so the run after a killed driver starts at once.
- On object storage, which has no locks, it is a lease: the holder writes the file, waits SETTLE_S and
  reads it back (two runs that wrote at once both read the later one, so exactly one goes on), then
  rewrites it every HEARTBEAT_S. A lease not renewed for STALE_S (a killed driver) is free to take.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from rayb import storage
from rayb.files import read_json, write_json_atomic
from rayb.study import StudyError

LOCK_NAME = "lock.json"
HEARTBEAT_S = 10.0
STALE_S = 60.0  # several missed heartbeats: the holder is gone
SETTLE_S = 2.0  # far longer than the gap between a run's check of the lease and its write


class StudyLocked(StudyError):
    pass


@contextlib.contextmanager
def study_lock(study_dir: str | Path) -> Iterator[None]:
    """Hold the study's lock while the block runs; raise StudyLocked if another process holds it."""
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
        "token": uuid.uuid4().hex,
    }
    location = storage.join(study_dir, LOCK_NAME)
    hold = _lease if storage.is_remote(location) else _flock
    with hold(location, holder):
        yield


@contextlib.contextmanager
def _flock(location: str, holder: dict) -> Iterator[None]:
    import fcntl

    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise _locked(location, _parse(f.read())) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps(holder))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _lease(location: str, holder: dict) -> Iterator[None]:
    current = read_json(location)
    if current and time.time() - current.get("renewed", 0) < STALE_S:
        raise _locked(location, current)
    write_json_atomic(location, holder | {"renewed": time.time()})
    time.sleep(SETTLE_S)
    current = read_json(location)
    if current.get("token") != holder["token"]:
        raise _locked(location, current)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(HEARTBEAT_S):
            write_json_atomic(location, holder | {"renewed": time.time()})

    thread = threading.Thread(target=renew, name="rayb-lock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if read_json(location).get("token") == holder["token"]:
            storage.remove(location)


def _parse(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {}


def _locked(location: str, holder: dict) -> StudyLocked:
    who = f"process {holder.get('pid', '?')} on {holder.get('host', '?')} (since {holder.get('since', '?')})"
    return StudyLocked(
        f"this study is already running: {who} holds {location}. Wait for that run to end, or stop it; "
        "a rerun afterwards redoes nothing it finished"
        + (f" (a lock not renewed for {STALE_S:.0f} s is taken over)" if storage.is_remote(location) else "")
    )
