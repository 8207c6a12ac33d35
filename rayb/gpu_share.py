"""A process that holds a share of a GPU (a fractional `gpus_per_trial`, or an evaluation actor's 0.25)
keeps to that share of the device's memory. Ray's fractional GPUs only schedule: without a cap, two
processes on one device can each grow until the other runs out of memory."""

from __future__ import annotations


def cap_gpu_memory(share: float) -> bool:
    """Limit this process's CUDA allocator to `share` of its current device's memory, when it holds less
    than a whole GPU; whether a cap was set. An allocation beyond it raises out-of-memory in this process
    alone."""
    import torch

    if not 0 < share < 1 or not torch.cuda.is_available():
        return False
    torch.cuda.set_per_process_memory_fraction(share)
    return True
