"""Architectures by name. A builder takes (config dict, vocab_size, seq_len) and returns a causal LM
whose forward(input_ids) returns an object with `.logits`; `save_pretrained` is used when present.

A user's own model plugs in without editing rayb: give `arch: my_pkg.model:build` in the study file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from torch import nn

Builder = Callable[[dict[str, Any], int, int], nn.Module]
_REGISTRY: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    def wrap(fn: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"architecture '{name}' is already registered")
        _REGISTRY[name] = fn
        return fn

    return wrap


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_builder(arch: str) -> Builder:
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
        return builder
    raise ValueError(
        f"unknown architecture '{arch}'; available: {', '.join(available())}, "
        "or an import path 'pkg.module:build'"
    )


def check_arch(arch: str) -> None:
    get_builder(arch)


def build_model(arch: str, config: dict[str, Any], vocab_size: int, seq_len: int) -> nn.Module:
    try:
        return get_builder(arch)(dict(config), vocab_size, seq_len)
    except TypeError as exc:  # unknown keyword in the study's model config
        raise ValueError(f"model '{arch}': bad config {config}: {exc}") from None


def _load_builtins() -> None:
    import rayb.models.baselines  # noqa: F401  (registers on import)
