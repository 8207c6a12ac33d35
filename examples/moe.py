"""A sparse mixture-of-experts FFN candidate: nanoGPT blocks whose MLP is top-k routed experts.

Plug it into a study by import path, with the GELU-MLP GPT as its baseline (`arch: nanogpt`):

    models:
      - {arch: nanogpt, config: {d_model: 128, n_layer: 4, n_head: 4}}
      - {arch: "examples.moe:build", name: moe, config: {d_model: 128, n_layer: 4, n_head: 4, n_experts: 8}}

Each expert is a GELU MLP of width d_ff / top_k, so a token's active FFN compute equals the dense
baseline's and the comparison isolates routing. Training adds the Switch Transformer load-balancing
loss (`aux_loss` on the output, which rayb's trainer adds to the LM loss). `extra_metrics()` reports
the expert-load Gini coefficient (0 = perfectly even) and normalised load entropy (1 = even) over the
tokens routed since the last call; rayb logs them per step and into the study's results table.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rayb.models.common import LMOutput
from rayb.models.nanogpt import GPT, Block, GPTConfig


class MoEFFN(nn.Module):
    def __init__(self, d_model: int, d_expert: int, n_experts: int, top_k: int, std: float = 0.02):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        # All experts' weights in two tensors: [experts, in, out].
        self.w_in = nn.Parameter(torch.randn(n_experts, d_model, d_expert) * std)
        self.w_out = nn.Parameter(torch.randn(n_experts, d_expert, d_model) * std)
        self.register_buffer("load", torch.zeros(n_experts), persistent=False)
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.router(tokens), dim=-1)
        weight, expert = probs.topk(self.top_k, dim=-1)
        weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(tokens)
        for e in range(self.w_in.shape[0]):
            row, slot = (expert == e).nonzero(as_tuple=True)
            if row.numel():
                h = F.gelu(tokens[row] @ self.w_in[e], approximate="tanh") @ self.w_out[e]
                out.index_add_(0, row, h * weight[row, slot, None])
        routed = F.one_hot(expert, probs.shape[-1]).sum(dim=(0, 1)).to(probs.dtype)
        # Switch Transformer: n_experts · Σ (share of routed tokens) · (mean router probability).
        self.aux_loss = probs.shape[-1] * (routed / routed.sum() * probs.mean(0)).sum()
        self.load += routed.detach()
        return out.view_as(x)


class MoEGPT(GPT):
    def __init__(self, cfg: GPTConfig, n_experts: int, top_k: int, aux_weight: float):
        ffns = [
            MoEFFN(cfg.d_model, cfg.d_ff // top_k, n_experts, top_k, cfg.init_std) for _ in range(cfg.n_layer)
        ]
        super().__init__(cfg, blocks=[Block(cfg, mlp=ffn) for ffn in ffns])
        self.ffns, self.aux_weight = ffns, aux_weight

    def forward(self, input_ids: torch.Tensor) -> LMOutput:
        out = super().forward(input_ids)
        out.aux_loss = self.aux_weight * sum(f.aux_loss for f in self.ffns) / len(self.ffns)
        return out

    def extra_metrics(self) -> dict[str, float]:
        load = torch.stack([f.load for f in self.ffns]).sum(0).double()
        for f in self.ffns:
            f.load.zero_()
        if load.sum() == 0:
            return {}
        share = load / load.sum()
        n = len(share)
        gini = (share[:, None] - share[None, :]).abs().sum() / (2 * n * share.sum())
        entropy = -(share * share.clamp_min(1e-12).log()).sum() / math.log(n)
        return {"expert_gini": gini.item(), "expert_entropy": entropy.item()}


def build(config: dict, vocab_size: int, seq_len: int) -> MoEGPT:
    config = dict(config)
    n_experts, top_k = config.pop("n_experts", 8), config.pop("top_k", 2)
    aux_weight = config.pop("aux_weight", 0.01)
    return MoEGPT(
        GPTConfig(vocab_size=vocab_size, **({"block_size": seq_len} | config)), n_experts, top_k, aux_weight
    )
