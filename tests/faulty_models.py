"""Test-only architectures, named by import path (`faulty_models:nan_after`) like a user's own model."""

from __future__ import annotations

import torch

from rayb.models import build_model
from rayb.models.common import LMOutput


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


class _RaisesAt(torch.nn.Module):
    """A GPT-2 whose `raise_at`-th training forward pass raises, as a bug in a user's model would."""

    def __init__(self, inner: torch.nn.Module, raise_at: int):
        super().__init__()
        self.inner, self.raise_at, self.calls = inner, raise_at, 0

    def forward(self, input_ids):
        if self.training:
            self.calls += 1
            if self.calls >= self.raise_at:
                raise RuntimeError(f"injected failure at forward pass {self.calls}")
        return self.inner(input_ids)


def raises_at(config: dict, vocab_size: int, seq_len: int) -> torch.nn.Module:
    config = dict(config)
    raise_at = config.pop("raise_at")
    return _RaisesAt(build_model("gpt2", config, vocab_size, seq_len), raise_at)


class _StaleState(torch.nn.Module):
    """A small recurrent LM (a decaying sum of embeddings) with the commonest bug of a new recurrent
    model: its forward returns the state it was given instead of the one it computed. The full forward
    is right, so it trains and scores log-likelihoods normally; only decoding goes wrong."""

    def __init__(self, vocab_size: int, width: int):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, width)
        self.decay = torch.nn.Parameter(torch.full((width,), 0.9))
        self.head = torch.nn.Linear(width, vocab_size)

    def forward(self, input_ids, state=None, return_state=False):
        x = self.emb(input_ids)
        h = torch.zeros_like(x[:, 0]) if state is None else state
        outputs = []
        for t in range(x.shape[1]):
            h = self.decay * h + x[:, t]
            outputs.append(h)
        logits = self.head(torch.stack(outputs, dim=1))
        return LMOutput(logits=logits, state=state if return_state else None)  # the bug: not `h`


def stale_state(config: dict, vocab_size: int, seq_len: int) -> torch.nn.Module:
    return _StaleState(vocab_size, config.get("width", 32))
