"""What DeepSpeed imports that rayb never uses, kept from costing each worker's start: DeepSpeed tolerates
some of these imports failing, and for the rest rayb gives it stand-ins."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

# DeepSpeed's Muon optimizer and the module of its kernels, which DeepSpeed imports as it trains (see
# without_muon).
DEEPSPEED_MUON = "deepspeed.runtime.zero.muon.muon_optimizer"
DEEPSPEED_MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"


@contextmanager
def hidden(module: str) -> Iterator[None]:
    """`import module` raises ImportError within (where it is not imported already); after, it imports as
    ever. For imports DeepSpeed makes, and tolerates failing, for what rayb never uses."""
    hide = module not in sys.modules
    if hide:
        sys.modules[module] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if hide:
            del sys.modules[module]


@contextmanager
def without_muon() -> Iterator[None]:
    """DeepSpeed imports its Muon optimizer wherever it asks whether the optimizer is one: ZeRO's check of
    the optimizer, the bf16 optimizer's set-up, and ZeRO's gradient reduction in every step. That module
    torch.compiles Muon's kernels as it imports, which imports torch's whole compiler: 2-3.5 s of each
    worker's first step on 2 cores, where the step itself takes 0.5 s. rayb's optimizers are never Muon.
    Within, where the real modules are not imported already, DeepSpeed finds stand-ins: a Muon class that
    no optimizer is an instance of, and a Muon update that raises if ever called."""
    stand_ins = {
        DEEPSPEED_MUON: {"MuonWithAuxAdam": type("MuonWithAuxAdam", (), {})},
        DEEPSPEED_MUON_KERNELS: {"muon_update": _no_muon_update},
    }
    installed = [name for name in stand_ins if name not in sys.modules]
    for name in installed:
        module = types.ModuleType(name, "rayb's stand-in for DeepSpeed's Muon: rayb never trains with it")
        module.__dict__.update(stand_ins[name])
        sys.modules[name] = module
    try:
        yield
    finally:
        for name in installed:
            del sys.modules[name]


def _no_muon_update(*args, **kwargs):
    raise RuntimeError("DeepSpeed asked for a Muon update, but rayb trains with no Muon optimizer")
