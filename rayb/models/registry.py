"""Architectures by name.

An `Architecture` splits building a model into two steps so that everything else can reason about a
model without building it: `configure(config, vocab_size, seq_len)` turns the study's small dict into
the architecture's full config object (all defaults resolved, unknown keys rejected), and `model(cfg)`
builds the causal LM from it. `cost(cfg, seq_len)` gives the analytic parameter and FLOP accounting,
and `shape(d_model, n_layer)` the architecture's shape rules (heads, FFN width) that size matching
searches over. A model's forward(input_ids) returns an object with `.logits`.

A user's own model plugs in without editing rayb: `arch: my_pkg.model:build` in the study file names
a function build(config, vocab_size, seq_len) -> nn.Module; it is counted from the built model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from rayb.models.accounting import Cost


@dataclass(frozen=True)
class Architecture:
    name: str
    configure: Callable[[dict[str, Any], int, int], Any]  # (config, vocab_size, seq_len) -> cfg object
    model: Callable[[Any], nn.Module]  # cfg object -> causal LM
    cost: Callable[[Any, int], Cost] | None = None  # (cfg object, seq_len) -> analytic accounting
    shape: Callable[[int, int], dict[str, Any]] | None = None  # (d_model, n_layer) -> config dict
    aspect: float = 64.0  # the d_model / n_layer ratio size matching prefers (GPT-2 small: 768/12)
    description: str = ""

    def build(self, config: dict[str, Any], vocab_size: int, seq_len: int) -> nn.Module:
        return self.model(self.configure(dict(config), vocab_size, seq_len))


_REGISTRY: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    if arch.name in _REGISTRY:
        raise ValueError(f"architecture '{arch.name}' is already registered")
    _REGISTRY[arch.name] = arch
    return arch


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_arch(arch: str) -> Architecture:
    """A registered architecture, or a user's builder (by import path) wrapped as one."""
    _load_builtins()
    if arch in _REGISTRY:
        return _REGISTRY[arch]
    if ":" in arch:
        module_name, _, attr = arch.partition(":")
        try:
            builder = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # ImportError, AttributeError, TypeError (relative), errors in the module
            raise ValueError(f"cannot import '{arch}': {type(exc).__name__}: {exc}") from None
        if not callable(builder):
            raise ValueError(
                f"'{arch}' is not callable; it must be build(config, vocab_size, seq_len) -> nn.Module"
            )
        return Architecture(
            name=arch,
            configure=lambda config, vocab_size, seq_len: (config, vocab_size, seq_len),
            model=lambda args: builder(*args),
        )
    raise ValueError(
        f"unknown architecture '{arch}'; available: {', '.join(available())}, "
        "or an import path 'pkg.module:build'"
    )


def check_arch(arch: str) -> None:
    get_arch(arch)


def configure(arch: str, config: dict[str, Any], vocab_size: int, seq_len: int) -> Any:
    spec = get_arch(arch)
    try:
        return spec.configure(dict(config), vocab_size, seq_len)
    except Exception as exc:  # an unknown key, or a shape the architecture rejects (its config's own checks)
        raise ValueError(f"model '{arch}': bad config {config}: {exc}") from None


def build_model(arch: str, config: dict[str, Any], vocab_size: int, seq_len: int) -> nn.Module:
    spec = get_arch(arch)
    cfg = configure(arch, config, vocab_size, seq_len)
    try:
        return spec.model(cfg)
    except Exception as exc:  # e.g. a user builder that rejects a keyword or a shape
        raise ValueError(
            f"model '{arch}' failed to build from {config}: {type(exc).__name__}: {exc}"
        ) from None


def _load_builtins() -> None:
    # Each module registers its architectures on import.
    import rayb.models.baselines  # noqa: F401
    import rayb.models.gated_deltanet  # noqa: F401
    import rayb.models.nanogpt  # noqa: F401
    import rayb.models.rwkv6  # noqa: F401
