"""A Backpack language model (Hewitt et al., 2023) over the same nanoGPT blocks as its baseline.

Each vocabulary item owns k sense vectors, a function of the word alone. The transformer (the very
blocks `arch: nanogpt` uses) only decides how to weight them: for each sense ℓ a causal attention
α_ℓ over the prefix, and the prediction at position i is a weighted sum of the prefix's sense vectors,
o_i = Σ_ℓ Σ_j α_ℓ[i, j] · C(x_j)_ℓ, scored against the (tied) embedding. Plug it in by import path:

    models:
      - {arch: nanogpt, config: {d_model: 128, n_layer: 4, n_head: 4}}
      - {arch: "examples.backpack:build", name: backpack, config: {d_model: 128, n_layer: 4, n_head: 4, n_senses: 4}}
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rayb.models.common import LMOutput
from rayb.models.nanogpt import GPT, GPTConfig


class SenseNetwork(nn.Module):
    """Word embedding → k sense vectors (a 4·d GELU MLP, as in the paper)."""

    def __init__(self, d_model: int, n_senses: int):
        super().__init__()
        self.n_senses = n_senses
        self.ln = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, n_senses * d_model)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:  # [B, T, d] -> [B, k, T, d]
        B, T, d = emb.shape
        senses = self.out(F.gelu(self.fc(self.ln(emb))))
        return senses.view(B, T, self.n_senses, d).transpose(1, 2)


class Backpack(nn.Module):
    def __init__(self, cfg: GPTConfig, n_senses: int):
        super().__init__()
        self.trunk = GPT(cfg)  # contextualisation network: the baseline's embeddings and blocks
        self.senses = SenseNetwork(cfg.d_model, n_senses)
        # One query/key projection per sense: the weights α_ℓ.
        self.qk = nn.Linear(cfg.d_model, 2 * n_senses * cfg.d_model, bias=False)
        self.ln_out = nn.LayerNorm(cfg.d_model)
        self.n_senses, self.d_model = n_senses, cfg.d_model
        self.max_context = cfg.block_size  # the trunk's learned positions (rayb's evals read this)

    def forward(self, input_ids: torch.Tensor) -> LMOutput:
        B, T = input_ids.shape
        h = self.trunk.hidden_states(input_ids)
        q, k = self.qk(h).view(B, T, 2, self.n_senses, self.d_model).permute(2, 0, 3, 1, 4)  # [B, k, T, d]
        senses = self.senses(self.trunk.wte(input_ids))
        # Attending with the sense vectors as values is exactly Σ_j α_ℓ[i, j] · C(x_j)_ℓ.
        mixed = F.scaled_dot_product_attention(q, k, senses, is_causal=True).sum(dim=1)
        return LMOutput(logits=self.ln_out(mixed) @ self.trunk.wte.weight.T)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.trunk.wte

    def get_output_embeddings(self) -> nn.Linear:
        return self.trunk.lm_head


def build(config: dict, vocab_size: int, seq_len: int) -> Backpack:
    config = dict(config)
    n_senses = config.pop("n_senses", 16)
    return Backpack(GPTConfig(vocab_size=vocab_size, **({"block_size": seq_len} | config)), n_senses)
