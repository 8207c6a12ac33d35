"""rayb: fair, seeded, matched-compute comparisons of language-model architectures on Ray."""

import atexit
import gc

__version__ = "0.1.0"

# At exit, Python's last garbage collection walks every object torch, transformers, DeepSpeed and Ray have
# made: about 1.2 s of CPU in each process that imported them (a CLI run; every Ray worker that ran rayb
# code) to free memory the OS takes back anyway, and on 2 cores it competes with the next trial's start-up.
# Frozen, they are skipped. Exit handlers still run in full; only objects already unreachable in reference
# cycles by then are left to the OS rather than finalized.
atexit.register(gc.freeze)
