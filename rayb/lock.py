"""One `rayb run` of a study at a time, one run training a trial, and one building a data cache: a second
run of the same study on the same output refuses, naming the process that holds it, instead of training
the same trials into the same files beside it. Studies that share trials or data run side by side: a run
of another study leaves the trials a running study is training to it, and waits for them, and a run that
needs a data cache another run is building waits for it and then reads it.

A lock is a small JSON file holding who holds it (host, pid, since when, and for a trial, the study): the
study's `lock.json` in its directory, and a trial's claim, `claims/<trial key>.json` in the output.
- On a local (or NFS) output it is an flock on that file: the operating system lets go of it when the
  process ends however it ends, so the run after a killed driver starts at once.
- On object storage, which has no locks, it is a lease: the holder writes the file, waits SETTLE_S and
  reads it back (two runs that wrote at once both read the later one, so exactly one goes on), then
  rewrites it every HEARTBEAT_S. A lease not renewed for STALE_S (a killed driver) is free to take. A
  run's many claims are taken together: one settling wait, one renewing thread.
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
from rayb.threads import beside

LOCK_NAME = "lock.json"
CLAIMS_DIR = "claims"  # in the output: a claim per trial being trained
HEARTBEAT_S = 10.0
STALE_S = 60.0  # several missed heartbeats: the holder is gone
SETTLE_S = 2.0  # far longer than the gap between a run's check of the lease and its write
WAIT_S = 5.0  # how often a run waiting for another's lock or trial looks again


class StudyLocked(StudyError):
    pass


@contextlib.contextmanager
def study_lock(study_dir: str | Path) -> Iterator[None]:
    """Hold the study's lock while the block runs; raise StudyLocked if another process holds it."""
    with _hold([storage.join(study_dir, LOCK_NAME)], _holder(), _study_locked):
        yield


@contextlib.contextmanager
def trial_claims(output: str | Path, trial_keys: list[str], study_name: str) -> Iterator[dict[str, dict]]:
    """Claim the trials this run will train, while the block runs. Yields {trial key: holder} for those
    another run (of another study sharing them) holds a claim on: this run leaves them to it."""
    holder = _holder() | {"study": study_name}
    elsewhere: dict[str, dict] = {}

    def skip(location: str, other: dict) -> None:
        elsewhere[storage.name(location).removesuffix(".json")] = other

    locations = [claim_location(output, key) for key in trial_keys]
    with _hold(locations, holder, _trial_claimed, skip=skip):
        yield elsewhere


def claim_location(output: str | Path, trial_key: str) -> str:
    return storage.join(output, CLAIMS_DIR, f"{trial_key}.json")


@contextlib.contextmanager
def waiting_lock(location: str, what: str, log) -> Iterator[None]:
    """Hold a lock that another run may hold for a while (a data cache it is building): wait for it, saying
    once who holds it, rather than refuse."""
    said = False
    while True:
        try:
            with _hold([location], _holder(), _busy):
                yield
            return
        except StudyLocked as busy:
            if not said:
                log(f"waiting for {what}: {busy}")
                said = True
            time.sleep(WAIT_S)


def _holder() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
        "token": uuid.uuid4().hex,
    }


@contextlib.contextmanager
def _hold(locations: list[str], holder: dict, refusal, skip=None) -> Iterator[None]:
    """Hold every lock in `locations`. One another process holds raises `refusal(location, its holder)`;
    with `skip`, it is passed to `skip(location, its holder)` instead and the others are held."""
    if not locations:
        yield
    elif storage.is_remote(locations[0]):
        with _leases(locations, holder, refusal, skip):
            yield
    else:
        with contextlib.ExitStack() as held:
            for location in locations:
                try:
                    held.enter_context(_flock(location, holder, refusal))
                except StudyLocked:
                    if skip is None:
                        raise
                    with open(location) as f:
                        skip(location, _parse(f.read()))
            yield


@contextlib.contextmanager
def _flock(location: str, holder: dict, refusal) -> Iterator[None]:
    import fcntl

    path = Path(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise refusal(location, _parse(f.read())) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps(holder))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _leases(locations: list[str], holder: dict, refusal, skip=None) -> Iterator[None]:
    ours = list(locations)

    def check(written: bool) -> None:
        for location in list(ours):
            current = read_json(location)
            taken = current.get("token") != holder["token"] if written else (
                current and time.time() - current.get("renewed", 0) < STALE_S
            )  # fmt: skip
            if not taken:
                continue
            if skip is None:
                raise refusal(location, current)
            skip(location, current)
            ours.remove(location)

    def write() -> None:
        for location in ours:
            write_json_atomic(location, holder | {"renewed": time.time()})

    def renew(stop: threading.Event) -> None:
        while not stop.wait(HEARTBEAT_S):
            write()

    check(written=False)
    write()
    try:
        if ours:
            time.sleep(SETTLE_S)
            check(written=True)
        with beside(renew, "rayb-lock"):
            yield
    finally:  # give back what is ours (a lost race leaves the winner's files alone)
        for location in ours:
            if read_json(location).get("token") == holder["token"]:
                storage.remove(location)


def _parse(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {}


def _who(holder: dict) -> str:
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')} (since {holder.get('since', '?')})"


def _stale_note(location: str) -> str:
    return f" (a lock not renewed for {STALE_S:.0f} s is taken over)" if storage.is_remote(location) else ""


def _study_locked(location: str, holder: dict) -> StudyLocked:
    return StudyLocked(
        f"this study is already running: {_who(holder)} holds {location}. Wait for that run to end, or stop "
        "it; a rerun afterwards redoes nothing it finished" + _stale_note(location)
    )


def _busy(location: str, holder: dict) -> StudyLocked:
    return StudyLocked(f"{_who(holder)} holds {location}" + _stale_note(location))


def _trial_claimed(location: str, holder: dict) -> StudyLocked:
    return StudyLocked(
        f"trial {storage.name(location).removesuffix('.json')} is being trained by study "
        f"'{holder.get('study', '?')}': {_who(holder)} holds {location}. Run this study once that one has "
        "ended: it will find the trial trained" + _stale_note(location)
    )
