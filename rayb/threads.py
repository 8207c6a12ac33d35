"""Work that runs beside a block of the caller's, in a thread of its own (a lease's renewal, a progress view,
imports made while the driver waits)."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
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


def import_in_background(*modules: str, name: str, idle_cpu_only: bool = False) -> threading.Thread:
    """Start importing `modules` in a daemon thread, for the driver to do while it waits on work elsewhere
    that leaves a core free; with `idle_cpu_only`, at the lowest CPU priority (Linux: a thread's own nice
    value), so that it takes no CPU from processes that would use it. Join the thread before importing
    anything of theirs yourself: two threads importing modules of one package at once can each wait on an
    import lock the other holds. A module that fails to import is left to the import that needs it, which
    raises its error where it matters."""

    def load() -> None:
        if idle_cpu_only and sys.platform == "linux":
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError:
                pass

    thread = threading.Thread(target=load, name=name, daemon=True)
    thread.start()
    return thread
