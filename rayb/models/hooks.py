"""What a model may offer rayb beyond `model(input_ids).logits`: the optional hooks, written down once.

A model plugged in by import path (`arch: my_pkg.model:build`) needs only `forward(input_ids)` returning
an object with `.logits` ([batch, T, vocab]). It may also offer any of these; rayb uses each where the
model has it, and nothing else about a model is looked up by name:

- `aux_loss` on the forward output: a training-only term added to the loss being optimised (an MoE's
  load-balancing loss). The logged and compared loss stays the language-modelling loss.
- `extra_metrics()`: the model's own measurements since the last call (expert load, say), averaged over
  workers, logged per step, and reported over the held-out rows in the results table.
- `no_weight_decay()`: parameter names exempt from weight decay (timm's convention; RWKV-6 uses it).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class AuxLossOutput(Protocol):
    logits: torch.Tensor
    aux_loss: torch.Tensor | None


@runtime_checkable
class ReportsMetrics(Protocol):
    def extra_metrics(self) -> dict[str, float]: ...


@runtime_checkable
class ExemptsFromDecay(Protocol):
    def no_weight_decay(self) -> set[str]: ...


def aux_loss(output: object) -> torch.Tensor | None:
    return output.aux_loss if isinstance(output, AuxLossOutput) else None


def extra_metrics(model: object) -> dict[str, float] | None:
    """The model's metrics since the last call, or None for a model that reports none."""
    return model.extra_metrics() if isinstance(model, ReportsMetrics) else None


def no_weight_decay(model: object) -> set[str]:
    return set(model.no_weight_decay()) if isinstance(model, ExemptsFromDecay) else set()
