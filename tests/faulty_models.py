"""Test-only architectures, named by import path (`faulty_models:nan_after`) like a user's own model."""

from __future__ import annotations

import torch

from rayb.models import build_model


class _NanAfter(torch.nn.Module):
    """A GPT-2 whose training forward pass returns NaN logits from its `nan_at`-th call on."""

    def __init__(self, inner: torch.nn.Module, nan_at: int):
        super().__init__()
        self.inner, self.nan_at, self.calls = inner, nan_at, 0

    def forward(self, input_ids):
        out = self.inner(input_ids)
        if self.training:
            self.calls += 1
            if self.calls >= self.nan_at:
                out.logits = out.logits * float("nan")
        return out


def nan_after(config: dict, vocab_size: int, seq_len: int) -> torch.nn.Module:
    config = dict(config)
    nan_at = config.pop("nan_at")
    return _NanAfter(build_model("gpt2", config, vocab_size, seq_len), nan_at)
