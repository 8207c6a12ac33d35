"""rayb: fair, seeded, matched-compute comparisons of language-model architectures on Ray."""

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

__version__ = "0.1.0"

# Python's full garbage collection walks every object a process tracks, and a process that has imported
# torch, transformers, DeepSpeed and Ray tracks about 400,000: 0.23-0.35 s of CPU each time. Objects made
# by imports live as long as the process, so rayb leaves them out (gc.freeze): a frozen object is still
# freed when its last reference goes, but a reference cycle it is part of is never collected.
#
# At exit, Python's last garbage collection walks every object torch, transformers, DeepSpeed and Ray have
# made: about 1.2 s of CPU in each process that imported them (a CLI run; every Ray worker that ran rayb
# code) to free memory the OS takes back anyway, and on 2 cores it competes with the next trial's start-up.
# Frozen, they are skipped. Exit handlers still run in full; only objects already unreachable in reference
# cycles by then are left to the OS rather than finalized.
atexit.register(gc.freeze)


@contextmanager
def imports_frozen() -> Iterator[None]:
    """Within, the process imports what it works with and Python collects nothing; after, all of it is
    frozen. A Train worker's start (trainer.RayTrainWorker) took 4.8 CPU-seconds against 5.4, and four
    small trials' collections 0.02 s against 1.1 s (it collects after every trial): `python
    bench/frozen_heap.py`. The little that importing leaves unreachable, about 9,000 objects, is frozen
    with it rather than walked for (0.35 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
