"""Parameter, FLOP and inference-memory accounting.

Two independent sources that tests hold against each other:
- *measured*, from the built model on the meta device (no memory, no time): parameters counted from
  the module (tied weights once), forward FLOPs from `torch.utils.flop_counter.FlopCounterMode`;
- *analytic*, each architecture's closed-form `Cost` (registered with it).

FLOP conventions (the same for every architecture, so ratios are fair): 2 FLOPs per multiply-add of
every matrix product, the output head included and the embedding lookup excluded; attention counts
QKᵀ and AV over the whole context T (4·T·d per layer, no causal discount — what FlopCounterMode counts
for scaled_dot_product_attention); recurrent mixers count their own per-token state work; norms,
activations and other elementwise work are left out. Training FLOPs are 3× forward (backward ≈ 2×).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TRAIN_FLOPS_FACTOR = 3  # forward + backward (about twice the forward)


@dataclass(frozen=True)
class ParamCount:
    total: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


@dataclass(frozen=True)
class Cost:
    """One architecture at one config and context length."""

    embedding_params: int  # token (and position) embeddings, plus an untied output head
    non_embedding_params: int
    forward_flops_per_token: float  # at the given context length, conventions above
    kv_cache_per_token: int = 0  # inference cache elements added per token (attention's K and V)
    state_size: int = 0  # fixed inference state elements per sequence (recurrent state, conv buffers)

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.non_embedding_params

    @property
    def train_flops_per_token(self) -> float:
        return TRAIN_FLOPS_FACTOR * self.forward_flops_per_token


def count_params(model: nn.Module) -> ParamCount:
    unique = {id(p): p for p in model.parameters()}
    embedding_ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    # An untied output head is vocabulary-sized too; count it with the embeddings.
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        embedding_ids |= {id(p) for p in head.parameters()}
    return ParamCount(
        total=sum(p.numel() for p in unique.values()),
        embedding=sum(unique[i].numel() for i in embedding_ids if i in unique),
    )


def build_on_meta(arch: str, config: dict[str, Any], vocab_size: int, seq_len: int) -> nn.Module:
    """The real model class, with shapes but no storage: a 760M model costs nothing to count."""
    from rayb.models.registry import build_model

    with torch.device("meta"):
        return build_model(arch, config, vocab_size, seq_len)


def measured_forward_flops(model: nn.Module, seq_len: int) -> float:
    """Matrix-product FLOPs per token of one forward pass over a `seq_len` sequence, counted by torch.

    A transformers model counts with its cache on: without one its mask code reads the position ids'
    values (to find packed sequences), which a model on the meta device has none of. Filling the cache
    is copies, not matrix products, so the count is the same."""
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    ids = torch.zeros(1, seq_len, dtype=torch.long, device=device)
    cache = {"use_cache": True} if "use_cache" in inspect.signature(model.forward).parameters else {}
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids, **cache)
    return counter.get_total_flops() / seq_len


def model_cost(arch: str, config: dict[str, Any], vocab_size: int, seq_len: int) -> Cost:
    """The registered closed form, or, for a user's model, what its built model measures."""
    from rayb.models.registry import configure, get_arch

    spec = get_arch(arch)
    if spec.cost is not None:
        return spec.cost(configure(arch, config, vocab_size, seq_len), seq_len)
    model = build_on_meta(arch, config, vocab_size, seq_len)
    params = count_params(model)
    try:
        flops = measured_forward_flops(model, seq_len)
    except (
        NotImplementedError,
        RuntimeError,
    ):  # data-dependent shapes (e.g. expert routing) need real values
        from rayb.models.registry import build_model

        flops = measured_forward_flops(build_model(arch, config, vocab_size, seq_len), seq_len)
    return Cost(
        embedding_params=params.embedding,
        non_embedding_params=params.non_embedding,
        forward_flops_per_token=flops,
    )


INFERENCE_BYTES = 2  # cache and state sizes are reported in bf16


def account(
    name: str,
    vocab_size: int | None = None,
    seq_len: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything `rayb params` prints for a preset, a registered architecture or an import path."""
    from rayb.models.presets import PRESETS

    preset = PRESETS.get(name)
    arch = preset.arch if preset else name
    config = (preset.config if preset else {}) | (overrides or {})
    vocab_size = vocab_size or (preset.vocab_size if preset else 50257)
    seq_len = seq_len or (preset.seq_len if preset else 1024)
    cost = model_cost(arch, config, vocab_size, seq_len)
    counted = count_params(build_on_meta(arch, config, vocab_size, seq_len))
    return {
        "name": name, "arch": arch, "config": config, "vocab_size": vocab_size, "seq_len": seq_len,
        "total_params": cost.total_params, "embedding_params": cost.embedding_params,
        "non_embedding_params": cost.non_embedding_params, "counted_total_params": counted.total,
        "counted_non_embedding_params": counted.non_embedding,
        "flops_per_token": cost.forward_flops_per_token, "train_flops_per_token": cost.train_flops_per_token,
        "kv_cache_bytes_per_token": cost.kv_cache_per_token * INFERENCE_BYTES,
        "state_bytes": cost.state_size * INFERENCE_BYTES,
        "published_params": preset.published_params if preset else None,
        "hub_id": preset.hub_id if preset else None,
    }  # fmt: skip
