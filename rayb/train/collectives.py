"""Every torch.distributed call rayb makes goes through here.

What rayb reduces across workers are host-side numbers: each step's loss, its batch digest, a model's own
metrics, and validation totals. NCCL takes only CUDA tensors (a CPU tensor raises "No backend type
associated with device type cpu"), so on a GPU worker group these travel over a gloo group created beside
NCCL: no device copies, and no extra GPU synchronisation. Where the default group already takes CPU tensors
(gloo on CPU, or a "cpu:gloo,cuda:nccl" group) it is used as it is. DeepSpeed's own collectives (gradient
reduction) stay on the default group, with the tensors on their device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def takes_cpu_tensors(backend: str) -> bool:
    """Whether a process group with this backend accepts CPU tensors ("gloo", "cpu:gloo,cuda:nccl", ...)."""
    return backend == "gloo" or any(part.strip().startswith("cpu:") for part in backend.split(","))


class HostCollectives:
    """All-reductions of host-side numbers across the worker group (created by every rank, in order)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.world = dist.get_world_size()
        self.group = None if takes_cpu_tensors(dist.get_backend()) else dist.new_group(backend="gloo")

    def sum(self, values: Sequence[float], dtype: torch.dtype = torch.float64) -> list[float]:
        """Element-wise sums over the workers (int64 keeps digests exact)."""
        tensor = torch.tensor(list(values), dtype=dtype)
        self._dist.all_reduce(tensor, group=self.group)
        return tensor.tolist()

    def mean(self, values: Sequence[float]) -> list[float]:
        return [value / self.world for value in self.sum(values)]
