"""What DeepSpeed imports that rayb never uses, kept from costing each worker's start: DeepSpeed tolerates
some of these imports failing, and for the rest rayb gives it stand-ins."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

# DeepSpeed's Muon optimizer and the module of its kernels, which DeepSpeed imports as it trains (see
# without_muon).
DEEPSPEED_MUON = "deepspeed.runtime.zero.muon.muon_optimizer"
DEEPSPEED_MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"
# The name under which DeepSpeed lists its shared-memory all-reduce among the ops it may build.
DEEPSPEED_SHM_COMM = "deepspeed_shm_comm"


def without_shm_comm() -> None:
    """Have DeepSpeed's communication backend, as it starts, neither compile nor load its shared-memory
    all-reduce. That C++ extension took 87 CPU-seconds to compile on 2 cores, in the first Train worker of a
    machine with no build of it cached (a fresh laptop, cluster node or CI machine), the others waiting on
    torch's build lock (which a worker killed mid-build leaves held); and it serves only DeepSpeed's
    tensor-parallel inference (`inference_all_reduce`): ZeRO reduces gradients through torch.distributed.
    DeepSpeed probes which ops this machine can build once per process, into a dict it keeps for edits; only
    its CPU accelerator has the op (elsewhere nothing is probed here)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().create_op_builder("ShareMemCommBuilder") is not None:
        deepspeed.ops.__compatible_ops__[DEEPSPEED_SHM_COMM] = False


def hidden(module: str) -> AbstractContextManager[None]:
    """`import module` raises ImportError within (where it is not imported already); after, it imports as
    ever. For imports DeepSpeed makes, and tolerates failing, for what rayb never uses."""
    return _in_place_of({module: None})


def without_muon() -> AbstractContextManager[None]:
    """DeepSpeed imports its Muon optimizer wherever it asks whether the optimizer is one: ZeRO's check of
    the optimizer, the bf16 optimizer's set-up, and ZeRO's gradient reduction in every step. That module
    torch.compiles Muon's kernels as it imports, which imports torch's whole compiler: 2-3.5 s of each
    worker's first step on 2 cores, where the step itself takes 0.5 s. rayb's optimizers are never Muon.
    Within, where the real modules are not imported already, DeepSpeed finds stand-ins: a Muon class that
    no optimizer is an instance of, and a Muon update that raises if ever called."""
    return _in_place_of(
        {
            DEEPSPEED_MUON: _stand_in(DEEPSPEED_MUON, MuonWithAuxAdam=type("MuonWithAuxAdam", (), {})),
            DEEPSPEED_MUON_KERNELS: _stand_in(DEEPSPEED_MUON_KERNELS, muon_update=_no_muon_update),
        }
    )


def _stand_in(name: str, **contents) -> types.ModuleType:
    module = types.ModuleType(name, "rayb's stand-in for DeepSpeed's Muon: rayb never trains with it")
    module.__dict__.update(contents)
    return module


@contextmanager
def _in_place_of(modules: dict[str, types.ModuleType | None]) -> Iterator[None]:
    """Within, `import name` finds modules[name] (None: an ImportError) for each name not imported already;
    after, those names import as ever."""
    installed = [name for name in modules if name not in sys.modules]
    for name in installed:
        sys.modules[name] = modules[name]  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in installed:
            del sys.modules[name]


def _no_muon_update(*args, **kwargs):
    raise RuntimeError("DeepSpeed asked for a Muon update, but rayb trains with no Muon optimizer")
