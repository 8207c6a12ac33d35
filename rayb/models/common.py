"""Pieces shared by the architectures rayb implements itself (those transformers does not ship)."""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LMOutput:
    logits: torch.Tensor
    state: Any = None  # per-layer recurrent state after the last token, when asked for


def autocast_off(kernel):
    """Run a PyTorch stand-in for a fused kernel (or its reference) with autocast off. The kernels
    accumulate in fp32; under bf16 autocast every matmul inside a stand-in would round to bf16, and the
    chunked and sequential forms, rounding at different places, would disagree by tens of percent on a GPU
    (seen on an H100: RWKV-6 0.3, Gated DeltaNet 0.1). The stand-ins cast their inputs to fp32 themselves."""

    @functools.wraps(kernel)
    def in_fp32(*args, **kwargs):
        device = next(a for a in args if isinstance(a, torch.Tensor)).device.type
        # The meta device, which FLOP counting runs on, has no autocast to turn off.
        off = (
            torch.autocast(device, enabled=False)
            if torch.amp.is_autocast_available(device)
            else nullcontext()
        )
        with off:
            return kernel(*args, **kwargs)

    return in_fp32


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def attention_heads(d_model: int) -> int:
    """Shape rule for attention: 64-wide heads (GPT-2, Pythia, Llama); 32- or 16-wide for widths that
    are not multiples of 64 (tiny models)."""
    head_dim = next(h for h in (64, 32, 16, 8, 4, 2, 1) if d_model % h == 0)
    return max(1, d_model // head_dim)


def swiglu_width(d_model: int) -> int:
    # SwiGLU's three matrices at 8/3·d keep the MLP's parameters equal to a 4·d GELU MLP.
    return round_up(8 * d_model // 3, 64)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def init_normal(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialisation: N(0, std) weights, zero biases (norms keep their ones)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=std)
