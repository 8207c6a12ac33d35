"""Architectures by name.

An `Architecture` splits building a model into two steps so that everything else can reason about a
model without building it: `configure(config, vocab_size, seq_len)` turns the study's small dict into
the architecture's full config object (all defaults resolved, unknown keys rejected), and `model(cfg)`
builds the causal LM from it. `cost(cfg, seq_len)` gives the analytic parameter and FLOP accounting,
and `shape(d_model, n_layer)` the architecture's shape rules (heads, FFN width) that size matching
searches over, with `knobs`, the keys it fine-tunes a count with (the feed-forward width, Mamba's state
size). A model's forward(input_ids) returns an object with `.logits`.

A user's own model plugs in without editing rayb: `arch: my_pkg.model:build` in the study file names
a function build(config, vocab_size, seq_len) -> nn.Module; it is counted from the built model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from rayb.models.kernels import KernelPath
from rayb.registry import Registry, UnknownName, is_import_path

if TYPE_CHECKING:
    from rayb.models.accounting import Cost


@dataclass(frozen=True)
class Knob:
    """A config key size matching may move off its default to land a count (sizing.py): its default at a
    d_model, the step its values move in, and how far it may go, as multiples of the default (low, high)."""

    key: str
    default: Callable[[int], int]
    step: int
    band: tuple[float, float]


@dataclass(frozen=True)
class InnerWidth(Knob):
    """The feed-forward (or inner) width: in multiples of 32, the usual head size, within ±30% of its default."""

    step: int = 32
    band: tuple[float, float] = (0.7, 1.3)


@dataclass(frozen=True)
class Architecture:
    name: str
    configure: Callable[[dict[str, Any], int, int], Any]  # (config, vocab_size, seq_len) -> cfg object
    model: Callable[[Any], nn.Module]  # cfg object -> causal LM
    cost: Callable[[Any, int], Cost] | None = None  # (cfg object, seq_len) -> analytic accounting
    shape: Callable[[int, int], dict[str, Any]] | None = None  # (d_model, n_layer) -> config dict
    aspect: float = 64.0  # the d_model / n_layer ratio size matching prefers (GPT-2 small: 768/12)
    # Size matching's fine knobs (sizing.py), turned in this order: the inner width where the config sets it
    # in steps of 32, else what else sizes a layer finely (Mamba's state size).
    knobs: tuple[Knob, ...] = ()
    # Layers that make up one transformer block's worth of model: 2 for a mixer-only layer (Mamba's), whose
    # one mixer stands in for both attention and MLP. Depth is compared in blocks.
    layers_per_block: int = 1
    description: str = ""
    # ("cpu" | "cuda") -> config entries whose best default differs by device and changes the FLOPs or the
    # numerics (Mamba-2's SSD chunk). They are pinned into every trial's config on the driver, so a GPU
    # worker trains the model the driver counted, whichever machine the driver runs on.
    device_defaults: Callable[[str], dict[str, Any]] | None = None
    # ("cpu" | "cuda") -> the implementation each mixer runs there (models/kernels.py); None: not inspected
    kernel_paths: Callable[[str], list[KernelPath]] | None = None
    # The plain path the fast one is held to (models/selfcheck.py), as `kernels.reference_paths()` runs
    # it; "" where the architecture has no fast path of its own.
    reference: str = ""

    def build(self, config: dict[str, Any], vocab_size: int, seq_len: int) -> nn.Module:
        return self.model(self.configure(dict(config), vocab_size, seq_len))

    def pinned(self, device: str) -> dict[str, Any]:
        return self.device_defaults(device) if self.device_defaults else {}

    def kernels(self, device: str) -> list[KernelPath]:
        if self.kernel_paths is None:
            return [KernelPath("model", "not inspected (a model without declared kernel paths)")]
        return self.kernel_paths(device)


ARCHITECTURES: Registry[Architecture] = Registry(
    "architecture",
    builtins={
        **dict.fromkeys(("gpt2", "pythia", "llama", "mamba", "mamba2"), "rayb.models.baselines"),
        "gated_deltanet": "rayb.models.gated_deltanet",
        "nanogpt": "rayb.models.nanogpt",
        "rwkv6": "rayb.models.rwkv6",
    },
)


def register(arch: Architecture) -> Architecture:
    return ARCHITECTURES.register(arch.name, arch)


def available() -> list[str]:
    return ARCHITECTURES.names()


class ModelBuildError(ValueError):
    """A model that could not be configured or built; the cause (a user's builder's own exception, with
    its traceback) is chained to it."""


def get_arch(arch: str) -> Architecture:
    """A registered architecture, or a user's builder (by import path) wrapped as one."""
    if not is_import_path(arch):
        try:
            return ARCHITECTURES.get(arch)
        except UnknownName as exc:
            raise UnknownName(f"{exc}, or an import path 'pkg.module:build'") from None
    module_name, _, attr = arch.partition(":")
    try:
        builder = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # ImportError, AttributeError, TypeError (relative), errors in the module
        raise ModelBuildError(f"cannot import '{arch}': {type(exc).__name__}: {exc}{_origin(exc)}") from exc
    if not callable(builder):
        raise ValueError(
            f"'{arch}' is not callable; it must be build(config, vocab_size, seq_len) -> nn.Module"
        )
    return Architecture(
        name=arch,
        configure=lambda config, vocab_size, seq_len: (config, vocab_size, seq_len),
        model=lambda args: builder(*args),
    )


def configure(arch: str, config: dict[str, Any], vocab_size: int, seq_len: int) -> Any:
    spec = get_arch(arch)
    try:
        return spec.configure(dict(config), vocab_size, seq_len)
    except Exception as exc:  # an unknown key, or a shape the architecture rejects (its config's own checks)
        raise ModelBuildError(f"model '{arch}': bad config {config}: {exc}") from exc


def build_model(arch: str, config: dict[str, Any], vocab_size: int, seq_len: int) -> nn.Module:
    spec = get_arch(arch)
    cfg = configure(arch, config, vocab_size, seq_len)
    try:
        model = spec.model(cfg)
    except Exception as exc:  # e.g. a user builder that rejects a keyword or a shape
        raise ModelBuildError(
            f"model '{arch}' failed to build from {config}: {type(exc).__name__}: {exc}{_origin(exc)}"
        ) from exc
    return without_default_cache(model)


def without_default_cache(model: nn.Module) -> nn.Module:
    """`model` with its config's `use_cache` off, where it has one. transformers models build a cache on
    every forward while it is on (their default), training included: GPT-2, Pythia and Llama copy each
    layer's keys and values into it at every step and hold the copy until the backward pass, and Mamba
    in eval mode takes its slow cached path for plain scoring. rayb's forwards need none; its decoding
    asks for the cache (`use_cache=True`), as lm-eval's generation does, and gets it as before."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", None):
        config.use_cache = False
    return model


def _origin(exc: BaseException) -> str:
    """Where an exception was raised (its innermost frame), so a bug in a user's own code is found at once."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" (raised at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})" if tb is not None else ""
