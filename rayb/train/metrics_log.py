"""A trial's metrics log, written by rank 0 as it trains and uploaded to object storage beside it."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from rayb import storage

logger = logging.getLogger(__name__)


class MetricsLog:
    """Rank 0's own append-only JSONL log (Ray keeps only metrics reported with checkpoints). On object
    storage it is appended locally and uploaded every PUSH_EVERY_S by a thread of its own (a store has no
    append, and the whole log's upload grows with the run: the training thread never waits for it), and
    with each checkpoint and at the end, where the caller waits for it; a trial resumed on another node
    (or process) first takes the store's copy up."""

    PUSH_EVERY_S = 10.0

    def __init__(self, location: str, enabled: bool):
        self.location, self.enabled = location, enabled
        self.path = storage.writable(location)
        self._pushed = time.monotonic()
        self._uploader = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if storage.is_remote(location):
                if earlier := storage.read_bytes(location):
                    self.path.write_bytes(earlier)
                self._uploader = _Uploader(location)

    def write(self, **record: Any) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            if self._uploader and time.monotonic() - self._pushed > self.PUSH_EVERY_S:
                self._uploader.request()
                self._pushed = time.monotonic()

    def push(self, final: bool = False) -> None:
        """Upload the log now (after any upload under way), and wait for it."""
        if self._uploader:
            self._uploader.upload(final)


class _Uploader:
    """Uploads a file that grows (storage.push) from a thread of its own when asked, or at once when told:
    one upload at a time, the last one (final) dropping the local copy and ending the thread."""

    def __init__(self, location: str):
        self.location = location
        self._lock = threading.Lock()
        self._asked = threading.Event()
        self._done = False
        threading.Thread(target=self._serve, name=f"upload {location}", daemon=True).start()

    def request(self) -> None:
        self._asked.set()

    def upload(self, final: bool = False) -> None:
        with self._lock:
            if not self._done:
                storage.push(self.location, keep=not final)
                self._done = final
        if final:
            self._asked.set()  # wake the thread to end

    def _serve(self) -> None:
        while not self._done:
            self._asked.wait()
            self._asked.clear()
            try:
                self.upload()
            except Exception:  # the next upload (a checkpoint's, the end's) tries again, and raises
                logger.warning("uploading %s failed", self.location, exc_info=True)
