"""Mamba and Mamba-2 on CPU at a usable speed, as transformers' own modules with a faster forward.

Each mixer here is transformers' mixer with only its full-sequence, cache-free CPU path replaced, so
parameter names, initialisation, checkpoints and cached generation stay transformers' own. Everything
else (CUDA, where mamba-ssm is used when installed, and generation with a cache) goes to transformers'
forward unchanged; within `kernels.reference_paths()` so does everything, on transformers' plain
PyTorch functions (Mamba's per-token scan), which the self-checks and tests hold the fast paths to.

**Mamba-1**: a fused selective scan, compiled on first use.

Without mamba-ssm's CUDA kernels, transformers' Mamba falls back to a per-token Python loop, or to
mambapy's parallel scan, which materialises several [batch, T, d_inner, d_state] tensors per layer and
is still ~16× slower than GPT-2 at equal parameters. The scan itself is a tiny amount of arithmetic;
it is slow only because of memory traffic. `csrc/selective_scan.cpp` keeps each channel's state in
cache and walks the sequence once (the backward recomputes it), which is the same trick the CUDA
kernel plays with shared memory.

If the kernel cannot be compiled (no C++ compiler), a warning says so and transformers' path runs.

**Mamba-2**: the chunked SSD written for CPU layouts. transformers' version repeats B and C for
every head and computes C·Bᵀ once per head although heads of a group share it, and permutes between
einsums; here heads are grouped by the B/C they read, so C·Bᵀ is computed once per group and every
product is a plain batched matmul.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.models.mamba.modeling_mamba import MambaMixer, apply_mask_to_padding_states
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

from rayb.files import atomic_directory, one_at_a_time
from rayb.models import kernels

SOURCE = Path(__file__).parent / "csrc" / "selective_scan.cpp"
LINK_FLAGS = ["-shared", "-fopenmp"]  # no -ffast-math: see _build


@functools.cache
def kernel() -> FusedScan | None:
    """The compiled scan, or None (with a warning) where it cannot be built.

    Builds are cached per source, compiler and flags (compile and link) under TORCH_EXTENSIONS_DIR/rayb.
    One process on a machine builds it while the others wait, in a scratch directory moved into place when
    complete; a process killed mid-build leaves no lock behind (files.one_at_a_time)."""
    # AVX2+FMA is where the vectorised exp pays off; it is part of the build key, so machines sharing
    # a home directory never load a build for instructions their CPU lacks.
    vector = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    compile_flags = ["-O3", "-ffast-math", "-fopenmp", "-fPIC"] + (["-mavx2", "-mfma"] if vector else [])
    compiler = os.environ.get("CXX", "c++")
    name = "rayb_selective_scan"
    try:
        build = " ".join([compiler, *compile_flags, "&&", *LINK_FLAGS])
        key = hashlib.sha256(SOURCE.read_bytes() + build.encode()).hexdigest()[:16]
        built = _builds_dir() / f"{name}-{key}" / f"{name}.so"
        if not built.exists():
            with one_at_a_time(built.parent.with_name(f"{name}-{key}.lock")):
                if not built.exists():
                    if built.parent.exists():  # an earlier rayb's build directory, left by a killed build
                        shutil.rmtree(built.parent, ignore_errors=True)
                    _build(compiler, compile_flags, built)
        return FusedScan(ctypes.CDLL(str(built)))
    except Exception as error:  # no compiler: slower, but still correct
        warnings.warn(
            f"rayb could not compile its CPU selective scan ({error}); Mamba falls back to "
            "transformers' much slower scan",
            stacklevel=2,
        )
        return None


def _builds_dir() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions")
    return Path(root) / "rayb"


def _build(compiler: str, compile_flags: list[str], target: Path) -> None:
    """Compile, then link without -ffast-math: linked with it, GCC before 13 adds crtfastmath.o to a shared
    library, whose loading sets the CPU to flush subnormal floats to zero for the whole process (torch's
    arithmetic included)."""
    with atomic_directory(target.parent) as scratch:  # readers see a whole build directory or none
        objects = scratch.path / f"{target.stem}.o"
        for command in (
            [compiler, *compile_flags, "-c", str(SOURCE), "-o", str(objects)],
            [compiler, *LINK_FLAGS, str(objects), "-o", str(scratch.path / target.name)],
        ):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command[:2])} failed: {done.stderr.strip()[-2000:]}")


class FusedScan:
    """csrc/selective_scan.cpp over float32 contiguous tensors, on as many threads as torch uses."""

    _SIZES = [ctypes.c_int64] * 4 + [ctypes.c_int]  # batch, D, T, N; threads

    def __init__(self, library: ctypes.CDLL):
        self._forward, self._backward = library.rayb_scan_forward, library.rayb_scan_backward
        self._forward.argtypes = [ctypes.c_void_p] * 6 + self._SIZES
        self._backward.argtypes = [ctypes.c_void_p] * 11 + self._SIZES
        self._forward.restype = self._backward.restype = None

    def forward(self, u, delta, A, Bs, Cs) -> torch.Tensor:
        _check(u, delta, A, Bs, Cs)
        y = torch.empty_like(u)
        self._forward(*_pointers(u, delta, A, Bs, Cs, y), *u.shape, A.shape[1], torch.get_num_threads())
        return y

    def backward(self, u, delta, A, Bs, Cs, gy) -> list[torch.Tensor]:
        _check(u, delta, A, Bs, Cs, gy)
        (batch, _, T), N, threads = u.shape, A.shape[1], torch.get_num_threads()
        gu, gdelta, gA = torch.empty_like(u), torch.empty_like(delta), u.new_zeros(*u.shape[:2], N)
        gB, gC = (u.new_zeros(threads, batch, T, N) for _ in range(2))  # one slice per thread
        gradients = [gu, gdelta, gA, gB, gC]
        self._backward(*_pointers(u, delta, A, Bs, Cs, gy, *gradients), *u.shape, N, threads)
        return [gu, gdelta, gA.sum(0), gB.sum(0), gC.sum(0)]


def _check(u, delta, A, Bs, Cs, *gy) -> None:
    """The C code reads raw buffers by these shapes: anything else would read memory it does not own."""
    (batch, D, T), N = u.shape, A.shape[-1]
    rows, states = (batch, D, T), (batch, T, N)
    for tensor, shape in zip(
        (u, delta, A, Bs, Cs, *gy), (rows, rows, (D, N), states, states, rows), strict=False
    ):
        if tuple(tensor.shape) != shape or tensor.dtype != torch.float32 or tensor.device.type != "cpu":
            raise ValueError(
                f"selective scan: a {tensor.dtype} {tuple(tensor.shape)} tensor where float32 {shape}"
            )
        if not tensor.is_contiguous():
            raise ValueError("selective scan: every tensor must be contiguous")


def _pointers(*tensors: torch.Tensor) -> list[int]:
    return [t.data_ptr() for t in tensors]


class SelectiveScan(torch.autograd.Function):
    """y[b,d,t] = Σ_n C[b,t,n]·h[b,d,t,n], h_t = exp(δ_t·A)·h_{t−1} + δ_t·u_t·B_t, in float32.

    u, delta: [batch, d_inner, T]; A: [d_inner, d_state]; B, C: [batch, T, d_state]."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C):
        inputs = [x.float().contiguous() for x in (u, delta, A, B, C)]
        ctx.save_for_backward(*inputs)
        ctx.dtypes = [x.dtype for x in (u, delta, A, B, C)]
        return kernel().forward(*inputs).to(u.dtype)

    @staticmethod
    def backward(ctx, grad_y):
        grads = kernel().backward(*ctx.saved_tensors, grad_y.float().contiguous())
        return tuple(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes, strict=True))


def _legacy_cache(cache, kwargs: dict):
    """The call's cache, whichever name it came under: transformers ≥ 5.24 passes `cache`, earlier
    releases `cache_params`. Missing a renamed cache would drop the state in decoding with no error.
    It is passed on positionally (hidden_states, cache, attention_mask), which every release takes."""
    return cache if cache is not None else kwargs.pop("cache_params", None)


@contextmanager
def _sequential_scan(mixer: MambaMixer):
    """transformers' plain per-token scan, whatever the config chose (mambapy's parallel scan)."""
    chosen, mixer.use_mambapy = mixer.use_mambapy, False
    try:
        yield
    finally:
        mixer.use_mambapy = chosen


class FusedScanMambaMixer(MambaMixer):
    """transformers' MambaMixer whose full-sequence CPU forward runs the fused scan."""

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        cache = _legacy_cache(cache, kwargs)
        if kernels.reference_only():
            with _sequential_scan(self), kernels.transformers_torch_paths():
                return super().forward(hidden_states, cache, attention_mask, **kwargs)
        if cache is not None or hidden_states.device.type != "cpu" or kernel() is None:
            return super().forward(hidden_states, cache, attention_mask, **kwargs)
        seq_len, dtype = hidden_states.shape[1], hidden_states.dtype
        hidden_states = apply_mask_to_padding_states(hidden_states, attention_mask)
        x, gate = self.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)  # [batch, d_inner, T]
        x = self.act(self.conv1d(x)[..., :seq_len])  # conv1d pads both sides: keep the causal part
        x = apply_mask_to_padding_states(x.transpose(1, 2), attention_mask)  # [batch, T, d_inner]
        time_step, B, C = torch.split(
            self.x_proj(x), [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1
        )
        delta = F.softplus(self.dt_proj(time_step))  # dt_proj's bias is Mamba's delta bias
        A = -torch.exp(self.A_log.float())
        u = x.transpose(1, 2)
        y = SelectiveScan.apply(u, delta.transpose(1, 2), A, B, C)
        y = (y + u * self.D[:, None]) * F.silu(gate)  # transformers gates with SiLU whatever hidden_act is
        return self.out_proj(y.transpose(1, 2).to(dtype))


def _segment_sum(a: torch.Tensor) -> torch.Tensor:
    """[..., l] -> [..., l, l]: entry (i, j) = a[j+1] + ... + a[i] for j ≤ i, −inf above the diagonal.
    Masked cumulative sums rather than differences of one cumsum, which lose precision in float32."""
    size = a.size(-1)
    ones = torch.ones(size, size, dtype=torch.bool, device=a.device)
    sums = a[..., None].expand(*a.shape, size).masked_fill(~ones.tril(-1), 0).cumsum(-2)
    return sums.masked_fill(~ones.tril(), float("-inf"))


def chunked_ssd(x, dt, A, B, C, chunk: int) -> torch.Tensor:
    """Mamba-2's SSD, y_t = Σ_s≤t C_t·B_s·exp(Σ_(s,t] dt·A)·dt_s·x_s, in float32 chunks of `chunk`.

    x [b,t,h,p]; dt [b,t,h] (after softplus); A [h]; B, C [b,t,g,n] with h a multiple of g.
    Returns y [b,t,h,p] (without the D skip)."""
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    if pad := (-t) % chunk:
        x, dt, B, C = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (x, dt, B, C))
    c, r = (t + pad) // chunk, h // g
    # Layout [b, g, r, c, l, ...]: heads grouped by the B/C group they read, chunks, positions.
    x = (x * dt[..., None]).view(b, c, chunk, g, r, p).permute(0, 3, 4, 1, 2, 5)
    a = (dt * A).view(b, c, chunk, g, r).permute(0, 3, 4, 1, 2)
    B = B.view(b, c, chunk, g, n).permute(0, 3, 1, 2, 4)[:, :, None]
    C = C.view(b, c, chunk, g, n).permute(0, 3, 1, 2, 4)[:, :, None]
    decay = a.cumsum(-1)
    y = ((C @ B.transpose(-1, -2)) * torch.exp(_segment_sum(a))) @ x  # within each chunk
    chunk_states = (x * torch.exp(decay[..., -1:] - decay)[..., None]).transpose(-1, -2) @ B
    # State entering chunk i: Σ_j<i chunk j's state decayed over chunks j+1..i−1 ([b,g,r,c,p,n]).
    carried = torch.exp(_segment_sum(F.pad(decay[..., -1], (1, 0))))[..., :-1, 1:]
    states = (carried @ chunk_states.flatten(-2)).view(chunk_states.shape)
    y = y + (C @ states.transpose(-1, -2)) * torch.exp(decay)[..., None]  # from earlier chunks
    return y.permute(0, 3, 4, 1, 2, 5).reshape(b, c * chunk, h, p)[:, :t]


class ChunkedSSDMamba2Mixer(Mamba2Mixer):
    """transformers' Mamba2Mixer whose full-sequence CPU forward runs `chunked_ssd`."""

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        cache = _legacy_cache(cache, kwargs)
        if kernels.reference_only():
            with kernels.transformers_torch_paths():
                return super().forward(hidden_states, cache, attention_mask, **kwargs)
        if cache is not None or hidden_states.device.type != "cpu":
            return super().forward(hidden_states, cache, attention_mask, **kwargs)
        batch, seq_len, _ = hidden_states.shape
        dtype = hidden_states.dtype
        hidden_states = apply_mask_to_padding_states(hidden_states, attention_mask)
        gate, xBC, dt = self.in_proj(hidden_states).split(
            [self.intermediate_size, self.conv_dim, self.num_heads], dim=-1
        )
        xBC = self.act(self.conv1d(xBC.transpose(1, 2))[..., :seq_len]).transpose(1, 2)
        xBC = apply_mask_to_padding_states(xBC, attention_mask)
        x, B, C = xBC.split([self.intermediate_size, *[self.n_groups * self.ssm_state_size] * 2], dim=-1)
        dt = F.softplus(dt + self.dt_bias).clamp(*self.time_step_limit)
        x = x.reshape(batch, seq_len, self.num_heads, self.head_dim)
        group_shape = (batch, seq_len, self.n_groups, self.ssm_state_size)
        y = chunked_ssd(
            x,
            dt,
            -torch.exp(self.A_log.float()),
            B.reshape(group_shape),
            C.reshape(group_shape),
            self.chunk_size,
        )
        y = (y + x * self.D[:, None]).reshape(batch, seq_len, -1)
        return self.out_proj(self.norm(y, gate).to(dtype))


_CPU_MIXERS = {MambaMixer: FusedScanMambaMixer, Mamba2Mixer: ChunkedSSDMamba2Mixer}


def use_cpu_mixers(model: torch.nn.Module) -> torch.nn.Module:
    """Give every Mamba/Mamba-2 mixer in `model` its CPU forward; parameters are untouched. Plain scoring
    takes it once the model builds no cache unless asked (registry.without_default_cache); generation
    asks for the cache and gets transformers' recurrent step as before."""
    for module in model.modules():
        if type(module) in _CPU_MIXERS:
            module.__class__ = _CPU_MIXERS[type(module)]
    return model
