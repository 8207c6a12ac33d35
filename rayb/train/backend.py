"""The torch process group of a worker group, set up by Ray Train's own torch functions on the workers
alone.

Ray Train's `TorchConfig` and its backend live in a module that imports torch, and every process that
holds them imports it too: Ray Train's controller, which unpickles its callbacks. It never trains, and the
import (1-2 s of a laptop's 2 cores) lies on the path of every group's start, before its first worker
exists. `TorchGroup` does what `TorchConfig(backend=...)` does for the gloo and nccl backends with the
`env://` rendezvous (the only ones rayb uses), calling the same functions of `ray.train.torch.config`,
imported inside the workers, which train with torch anyway. Those functions are private to Ray: the
pinned Ray (rayb/constraints.txt) is the one they are called on, and every training test runs them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)


@dataclass
class TorchGroup(BackendConfig):
    """A torch.distributed process group over the worker group: `backend` is "gloo" (CPU) or "nccl" (GPU)."""

    backend: str
    timeout_s: int = 1800  # TorchConfig's default for a collective

    @property
    def backend_cls(self):
        return TorchGroupBackend

    @property
    def train_func_context(self):
        return CudaDevice

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class TorchGroupBackend(Backend):
    """Ray Train's `_TorchBackend.on_start` and `on_shutdown` for `env://`, with no torch in this process."""

    share_cuda_visible_devices = True  # as Ray's: a worker sees its node's GPUs of the group, for NCCL

    def on_start(self, worker_group, backend_config: TorchGroup) -> None:
        from ray.train._internal.utils import get_address_and_port

        address, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_rendezvous, address=address, port=port)
        size = len(worker_group)
        ray.get([
            worker_group.execute_single_async(rank, _join_process_group, backend_config.backend, rank, size,
                                              backend_config.timeout_s)
            for rank in range(size)
        ])  # fmt: skip

    def on_shutdown(self, worker_group, backend_config: TorchGroup) -> None:
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        futures = worker_group.execute_async(_leave_process_group, destroy=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
        )
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:  # as Ray's: a group that does not leave in time is left behind
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")


# Run on each worker (each imports ray.train.torch.config, and torch, there).


def _set_rendezvous(address: str, port: int) -> None:
    import os

    from ray.train.torch.config import _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"] = address
    os.environ["MASTER_PORT"] = str(port)
    _set_torch_distributed_env_vars()  # RANK, LOCAL_RANK, WORLD_SIZE, ... before the group forms


# Seconds this worker process took to join its group's process group (the rendezvous, which waits for
# the group's slowest worker, and the backend's set-up; NCCL makes its communicators at the first
# collective, in DeepSpeed's set-up): the training loop reports it beside the group's start.
joined_in_s: float | None = None


def _join_process_group(backend: str, rank: int, size: int, timeout_s: int) -> None:
    """Join the group's process group; a worker kept from an earlier group of one (tune/group.TrialQueue.
    keep) already has the group of one it needs, which DeepSpeed has cached: it keeps it."""
    import time

    import torch.distributed as dist
    from ray.train.torch.config import _setup_torch_process_group

    global joined_in_s
    began = time.perf_counter()
    if dist.is_initialized():
        if (dist.get_world_size(), dist.get_backend()) != (size, backend):
            raise RuntimeError(
                f"a reused Train worker has a {dist.get_backend()} process group of {dist.get_world_size()}, "
                f"not the {backend} group of {size} its worker group needs"
            )
    else:
        _setup_torch_process_group(backend, world_rank=rank, world_size=size, init_method="env://",
                                   timeout_s=timeout_s)  # fmt: skip
    joined_in_s = time.perf_counter() - began


def _leave_process_group(destroy: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    global joined_in_s
    _shutdown_torch(destroy_process_group=destroy)
    joined_in_s = None


class CudaDevice:
    """Ray's TorchConfigContextManager around the training function, imported on the worker that enters it:
    on a GPU worker, torch's current device is the worker's."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._context = TorchConfigContextManager()
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)
