"""GPT-2 in nanoGPT's form: one file, readable top to bottom, with nanoGPT's two switches.

`bias=False` drops every Linear and LayerNorm bias; `tie_embeddings=False` gives the output head its
own matrix. With both on (the defaults) this is GPT-2 exactly: at GPT-2 small's shape it counts the
same 124,439,808 parameters as transformers' GPT2LMHeadModel. Its blocks are also the shared trunk of
the example candidates under examples/ (a Backpack and a sparse-expert FFN), so a candidate and its
baseline differ only in what the candidate changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rayb.models import kernels
from rayb.models.accounting import Cost
from rayb.models.common import LMOutput, attention_heads, init_normal
from rayb.models.registry import Architecture, InnerWidth, register


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 1024  # longest sequence (learned position embeddings)
    d_model: int = 768
    n_layer: int = 12
    n_head: int = 12
    d_ff: int | None = None  # MLP width; 4·d_model by default
    bias: bool = True
    tie_embeddings: bool = True
    init_std: float = 0.02

    def __post_init__(self):
        self.d_ff = self.d_ff or 4 * self.d_model
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm residual block; `mlp` can be swapped for another FFN (see examples/moe.py)."""

    def __init__(self, cfg: GPTConfig, mlp: nn.Module | None = None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = mlp if mlp is not None else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig, blocks: list[nn.Module] | None = None):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(
            blocks if blocks is not None else [Block(cfg) for _ in range(cfg.n_layer)]
        )
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(lambda m: init_normal(m, cfg.init_std))
        # GPT-2: scale the residual projections by 1/√(2·n_layer) so the residual stream's variance
        # does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=cfg.init_std / (2 * cfg.n_layer) ** 0.5)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.cfg.block_size}")
        x = self.wte(input_ids) + self.wpe(torch.arange(T, device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, input_ids: torch.Tensor) -> LMOutput:
        return LMOutput(logits=self.lm_head(self.hidden_states(input_ids)))

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head


def configure(config: dict, vocab_size: int, seq_len: int) -> GPTConfig:
    return GPTConfig(vocab_size=vocab_size, **({"block_size": seq_len} | config))


def cost(cfg: GPTConfig, seq_len: int) -> Cost:
    d, f, L, b = cfg.d_model, cfg.d_ff, cfg.n_layer, int(cfg.bias)
    norms = (2 * L + 1) * d * (1 + b)
    layer_matrices = 4 * d * d + 2 * d * f
    layer_biases = b * (3 * d + d + f + d)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    return Cost(
        embedding_params=(cfg.vocab_size + cfg.block_size) * d + head,
        non_embedding_params=L * (layer_matrices + layer_biases) + norms,
        forward_flops_per_token=2 * (L * layer_matrices + cfg.vocab_size * d) + L * 4 * seq_len * d,
        kv_cache_per_token=2 * L * d,
    )


def shape(d_model: int, n_layer: int) -> dict:
    return {"d_model": d_model, "n_layer": n_layer, "n_head": attention_heads(d_model)}


register(
    Architecture(
        name="nanogpt",
        configure=configure,
        model=GPT,
        cost=cost,
        shape=shape,
        knobs=(InnerWidth("d_ff", lambda d_model: 4 * d_model),),
        description="GPT-2 in nanoGPT's form: optional biases (bias) and untied head (tie_embeddings)",
        kernel_paths=kernels.attention,
    )
)
