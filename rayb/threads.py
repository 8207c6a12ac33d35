"""Work that runs beside a block of the caller's, in a thread of its own (a lease's renewal, a progress view)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def beside(work: Callable[[threading.Event], None], name: str) -> Iterator[None]:
    """Run `work(stop)` in a daemon thread while the block runs; then set `stop` and wait for it to end."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
