"""Every torch.distributed call rayb makes goes through here.

What rayb reduces across workers are host-side numbers: each step's loss, its batch digest, a model's own
metrics, and validation totals; and what it decides once for all ranks (which trials remain, the
checkpoint to resume from, a model's metric names) rank 0 decides and broadcasts, since ranks reading
shared storage on their own can disagree (NFS and EFS cache directory listings) and then hang on
mismatched collectives. NCCL takes only CUDA tensors (a CPU tensor raises "No backend type
associated with device type cpu"), so on a GPU worker group these travel over a gloo group created beside
NCCL: no device copies, and no extra GPU synchronisation. Where the default group already takes CPU tensors
(gloo on CPU, or a "cpu:gloo,cuda:nccl" group) it is used as it is. DeepSpeed's own collectives (gradient
reduction) stay on the default group, with the tensors on their device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def takes_cpu_tensors(backend: str) -> bool:
    """Whether a process group with this backend accepts CPU tensors ("gloo", "cpu:gloo,cuda:nccl", ...)."""
    return backend == "gloo" or any(part.strip().startswith("cpu:") for part in backend.split(","))


class HostCollectives:
    """Collectives of host-side values across the worker group (created by every rank, in order)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.group = None if takes_cpu_tensors(dist.get_backend()) else dist.new_group(backend="gloo")

    def sum(self, values: Sequence[float], dtype: torch.dtype = torch.float64) -> list[float]:
        """Element-wise sums over the workers (int64 keeps digests exact)."""
        tensor = torch.tensor(list(values), dtype=dtype)
        self._dist.all_reduce(tensor, group=self.group)
        return tensor.tolist()

    def mean(self, values: Sequence[float]) -> list[float]:
        return [value / self.world for value in self.sum(values)]

    def broadcast(self, value: T) -> T:
        """Rank 0's `value` (any picklable object), on every rank; other ranks' values are ignored."""
        box: list[Any] = [value]
        self._dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
