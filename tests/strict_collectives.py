"""Collectives that behave, towards rayb's own calls, as NCCL behaves: the default process group takes no
CPU tensor ("No backend type associated with device type cpu"), and reports its backend as "nccl".

On a CPU machine the worker group runs gloo, which takes anything, so a CPU tensor sent over NCCL on a GPU
node never fails here. Installed in a Ray Train worker (`strict_train_loop`) it makes that failure
visible on CPU. Calls from outside rayb (DeepSpeed's gradient reduction, Ray's own) are left alone: they
run on the device tensors DeepSpeed keeps there.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

CHECKED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "reduce_scatter_tensor",
)


def _from_rayb(depth: int = 2) -> bool:
    return sys._getframe(depth).f_globals.get("__name__", "").startswith("rayb.")


def install() -> None:
    if getattr(dist, "_strict_installed", False):
        return
    real_backend = dist.get_backend

    def get_backend(group=None):
        if _from_rayb() and (group is None or group is dist.group.WORLD):
            return "nccl"
        return real_backend(group)

    def strict(name):
        original = getattr(dist, name)

        def call(*args, **kwargs):
            if _from_rayb():
                group = kwargs.get("group")
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                if (group is None or group is dist.group.WORLD) and any(
                    t.device.type != "cuda" for t in tensors
                ):
                    raise RuntimeError(f"{name}: No backend type associated with device type cpu")
            return original(*args, **kwargs)

        return call

    for name in CHECKED:
        setattr(dist, name, strict(name))
    dist.get_backend = get_backend
    dist._strict_installed = True


def strict_train_loop(config):
    """rayb's training loop, with strict collectives installed in the worker first."""
    install()
    from rayb.train.loop import train_loop_per_worker

    train_loop_per_worker(config)
