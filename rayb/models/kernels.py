"""Which implementation each architecture's mixers run on a device, and what would make a slow one fast.

On a GPU the recurrent architectures are only as fast as their fused kernels: transformers' Mamba and
Mamba-2 use mamba-ssm and causal-conv1d when they import, rayb's Gated DeltaNet and RWKV-6 use fla's
Triton kernels; without them each falls back to a correct PyTorch path that is many times slower. That
would make a GPU comparison of speed (and of what a FLOPs budget buys in wall-clock) say more about a
machine's packages than about an architecture, so a GPU study checks these paths before it trains (see
`rayb/train/trainer.py`), and every trial records the paths it took.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CUDA_EXTRA = "pip install -e '.[cuda]' (mamba-ssm, causal-conv1d, flash-linear-attention)"


@dataclass(frozen=True)
class KernelPath:
    component: str  # "selective scan", "attention", ...
    path: str  # the implementation that runs
    slow: bool = False  # a fallback: correct, but far slower than the kernel the architecture is timed with
    install: str = ""  # what makes it fast


@functools.cache
def importable(module: str) -> bool:
    """Whether `module` imports here. Probed only on a GPU device: on a CPU machine importing fla (with
    triton) makes transformers pick kernels that cannot run."""
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or a CUDA extension that fails to load
        return False
    return True


def attention(device: str) -> list[KernelPath]:
    return [KernelPath("attention", f"PyTorch scaled_dot_product_attention ({device})")]


def mamba(device: str) -> list[KernelPath]:
    if device != "cuda":
        from rayb.models.mamba_cpu import kernel

        fused = kernel() is not None
        return [KernelPath("selective scan", "rayb fused CPU scan" if fused else "mambapy parallel scan")]
    if importable("mamba_ssm") and importable("causal_conv1d"):
        return [KernelPath("selective scan", "mamba-ssm mamba_inner_fn with causal-conv1d (CUDA)")]
    return [
        KernelPath("selective scan", "transformers' PyTorch reference scan", slow=True, install=CUDA_EXTRA)
    ]


def mamba2(device: str) -> list[KernelPath]:
    if device != "cuda":
        return [KernelPath("SSD", "rayb grouped chunked SSD (PyTorch, CPU layouts)")]
    if importable("mamba_ssm") and importable("causal_conv1d"):
        return [KernelPath("SSD", "mamba-ssm mamba_chunk_scan_combined with causal-conv1d (Triton/CUDA)")]
    return [KernelPath("SSD", "transformers' PyTorch chunked SSD", slow=True, install=CUDA_EXTRA)]


# fla's gated chunk kernels compute wrong results on Hopper GPUs (H100, H200) under Triton 3.4.0 to 3.7.0
# (fla issue #640). fla 0.6.0 refuses there only in Gated DeltaNet's backward, unless tilelang is installed
# to replace that kernel; its RWKV-6 chunk kernels have no such guard, and on an H200 with Triton 3.6.0
# chunk_rwkv6 disagreed with the recurrence by 0.34 (relative, rayb's bf16 self-check). On such a GPU rayb
# runs its own chunked PyTorch path instead: correct, and reported as the slow fallback it is.
HOPPER_BAD_TRITON = ("3.4.0", "3.7.1")  # [first bad, first fixed)
TRITON_FIX = f"Triton >= {HOPPER_BAD_TRITON[1]} (fla issue #640)"


@functools.cache
def fla_refusal(tilelang_fixes: bool) -> str | None:
    """Why fla's kernels must not run on this machine's CUDA device, or None. `tilelang_fixes`: fla
    replaces the miscompiled kernel with tilelang's where tilelang is installed (Gated DeltaNet)."""
    import importlib.metadata

    import torch
    from packaging.version import Version

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None  # no triton, no fla kernels either
    first_bad, fixed = (Version(v) for v in HOPPER_BAD_TRITON)
    if torch.cuda.get_device_capability()[0] != 9 or not first_bad <= Version(triton) < fixed:
        return None
    if tilelang_fixes and importable("tilelang"):
        return None
    return f"Triton {triton} miscompiles fla's gated chunk kernels on Hopper GPUs"


def fla_module(module: str, tilelang_fixes: bool):
    """fla's `module` (e.g. `fla.ops.rwkv6`) where its kernels may run on this machine's CUDA device, else
    None: fla is missing, or `fla_refusal` says they are wrong here. Only ever asked for CUDA tensors."""
    if not importable(module) or fla_refusal(tilelang_fixes) is not None:
        return None
    return importlib.import_module(module)


def fla(component: str, kernel: str, fallback: str, module: str, tilelang_fixes: bool):
    """The paths of a mixer that runs fla's `kernel` (from `module`) on CUDA where `fla_module` allows,
    else rayb's `fallback`."""

    def paths(device: str) -> list[KernelPath]:
        if device != "cuda":
            return [KernelPath(component, f"{fallback} (PyTorch)")]
        if not importable(module):
            return [KernelPath(component, f"{fallback} (PyTorch)", slow=True, install=CUDA_EXTRA)]
        if why := fla_refusal(tilelang_fixes):
            fix = TRITON_FIX + (" or tilelang" if tilelang_fixes else "")
            return [KernelPath(component, f"{fallback} (PyTorch; {why})", slow=True, install=fix)]
        return [KernelPath(component, f"fla {kernel} (Triton)")]

    return paths


# ---- reference paths: every fast path above has a plain one beside it, and self-checks compare them ----

_REFERENCE = contextvars.ContextVar("rayb_reference_paths", default=False)
# transformers' modules whose kernels (mamba-ssm, causal-conv1d) are chosen when they are imported.
TRANSFORMERS_KERNEL_MODULES = (
    "transformers.models.mamba.modeling_mamba",
    "transformers.models.mamba2.modeling_mamba2",
)


@contextmanager
def reference_paths() -> Iterator[None]:
    """Within the block every mixer runs its plain reference instead of its fast path: the sequential
    recurrence as written (Gated DeltaNet, RWKV-6, Mamba's per-token scan) or transformers' PyTorch
    path (Mamba-2), never a chunked form, a fused scan or a GPU kernel. Slow; for checks and tests."""
    token = _REFERENCE.set(True)
    try:
        yield
    finally:
        _REFERENCE.reset(token)


def reference_only() -> bool:
    """Whether the caller is inside `reference_paths()`."""
    return _REFERENCE.get()


@contextmanager
def transformers_torch_paths() -> Iterator[None]:
    """transformers' own PyTorch functions in place of the kernels it picked at import (mamba-ssm,
    causal-conv1d), for the duration of the block. transformers ≥ 5.24 wraps each torch function with
    the kernel it found (`functools.wraps`), so the plain one is the innermost `__wrapped__`."""
    patched = []
    for name in TRANSFORMERS_KERNEL_MODULES:
        module = importlib.import_module(name)
        for attr, value in list(vars(module).items()):
            plain = inspect.unwrap(value) if callable(value) else value
            if plain is not value and getattr(plain, "__module__", None) == name:
                patched.append((module, attr, value))
                setattr(module, attr, plain)
    try:
        yield
    finally:
        for module, attr, value in patched:
            setattr(module, attr, value)


def describe(paths: list[KernelPath]) -> dict[str, str]:
    """{component: path} as a trial's provenance records it."""
    return {p.component: p.path + (" [slow fallback]" if p.slow else "") for p in paths}


def slow_kernels_message(report: dict[str, list[KernelPath]]) -> str | None:
    """Why a GPU study should not train as it stands (the slow paths, and what to install), or None."""
    slow = [(arch, p) for arch, paths in report.items() for p in paths if p.slow]
    if not slow:
        return None
    lines = [f"{arch}: {p.component} would run {p.path}, far slower than its kernel" for arch, p in slow]
    installs = sorted({p.install for _, p in slow if p.install})
    return (
        "on the GPU workers, "
        + "; ".join(lines)
        + ". Install "
        + " and ".join(installs)
        + " on every GPU node, "
        "or set train.allow_slow_kernels: true to train on the slow path (speed results then reflect it)"
    )
