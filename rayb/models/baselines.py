"""Baselines that transformers ships: GPT-2, Pythia (GPT-NeoX), Transformer++ (Llama), Mamba, Mamba-2.

Each takes rayb's common size names (d_model, n_layer, n_head, d_ff, d_state) and passes any other key
straight to the transformers config, so every knob of the real architecture stays reachable. Dropout
is off: at these scales and budgets it only adds seed noise to the comparison. Each also carries its
closed-form `Cost` (see accounting.py for the conventions); tests hold it against the built model.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from rayb.models import kernels, nanogpt
from rayb.models.accounting import Cost
from rayb.models.common import attention_heads, swiglu_width
from rayb.models.registry import Architecture, InnerWidth, Knob, register

FOUR_D = (InnerWidth("d_ff", lambda d_model: 4 * d_model),)  # GPT-2's and Pythia's MLP
MAMBA_D_STATE, MAMBA2_D_STATE = 16, 128
# transformers sets Mamba's and Mamba-2's inner width only as an integer `expand` × d_model (a saved checkpoint
# is rebuilt from it), so size matching turns the state size instead, from half to twice its default, in steps
# of 4 (Mamba) and 16 (Mamba-2). Half to twice Mamba's d_state moves a layer by only -8 to +16 × 6·d_model
# parameters, so its Δ projection's rank (transformers' time_step_rank, ⌈d_model/16⌉ by default, 4·d_model
# parameters a unit) turns next, from half to twice its default too.
MAMBA_KNOBS = (
    Knob("d_state", lambda d_model: MAMBA_D_STATE, 4, (0.5, 2.0)),
    Knob("time_step_rank", lambda d_model: math.ceil(d_model / 16), 1, (0.5, 2.0)),
)
MAMBA2_KNOBS = (Knob("d_state", lambda d_model: MAMBA2_D_STATE, 16, (0.5, 2.0)),)


def _hf_model(cfg):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(cfg)


def _attention_shape(d_model: int, n_layer: int) -> dict[str, Any]:
    return {"d_model": d_model, "n_layer": n_layer, "n_head": attention_heads(d_model)}


# ----- GPT-2 ----------------------------------------------------------------------------------------
def gpt2_config(config: dict[str, Any], vocab_size: int, seq_len: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=config.pop("n_positions", seq_len),
        n_embd=config.pop("d_model", 768),
        n_layer=config.pop("n_layer", 12),
        n_head=config.pop("n_head", 12),
        n_inner=config.pop("d_ff", None),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        # GPT-2's default special ids (50256) lie outside a smaller study vocabulary; rayb's tokenizer owns them.
        bos_token_id=config.pop("bos_token_id", None),
        eos_token_id=config.pop("eos_token_id", None),
        **config,
    )


def gpt2_cost(cfg, seq_len: int) -> Cost:
    # transformers' GPT-2 is nanoGPT's GPT with biases: one formula for both.
    return nanogpt.cost(
        nanogpt.GPTConfig(
            vocab_size=cfg.vocab_size, block_size=cfg.n_positions, d_model=cfg.n_embd, n_layer=cfg.n_layer,
            n_head=cfg.n_head, d_ff=cfg.n_inner, tie_embeddings=cfg.tie_word_embeddings,
        ),
        seq_len,
    )  # fmt: skip


# ----- Pythia (GPT-NeoX): parallel residual, rotary on a quarter of each head, untied head ---------
def pythia_config(config: dict[str, Any], vocab_size: int, seq_len: int):
    from transformers import GPTNeoXConfig

    d_model = config.pop("d_model", 768)
    rotary = {"rope_type": "default", "rope_theta": config.pop("rope_theta", 10000.0),
              "partial_rotary_factor": config.pop("rotary_pct", 0.25)}  # fmt: skip
    return GPTNeoXConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        num_hidden_layers=config.pop("n_layer", 12),
        num_attention_heads=config.pop("n_head", 12),
        intermediate_size=config.pop("d_ff", 4 * d_model),
        max_position_embeddings=config.pop("max_position_embeddings", seq_len),
        rope_parameters=rotary,
        **config,
    )


def pythia_cost(cfg, seq_len: int) -> Cost:
    d, f, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    matrices = 4 * d * d + 2 * d * f
    biases = int(cfg.attention_bias) * 4 * d + f + d
    return Cost(
        embedding_params=V * d * (1 if cfg.tie_word_embeddings else 2),
        non_embedding_params=L * (matrices + biases + 4 * d) + 2 * d,
        forward_flops_per_token=2 * (L * matrices + V * d) + L * 4 * seq_len * d,
        kv_cache_per_token=2 * L * d,
    )


# ----- Transformer++ (Llama): RoPE, RMSNorm, SwiGLU, no biases --------------------------------------
def llama_config(config: dict[str, Any], vocab_size: int, seq_len: int):
    from transformers import LlamaConfig

    d_model = config.pop("d_model", 768)
    n_head = config.pop("n_head", 12)
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=config.pop("d_ff", swiglu_width(d_model)),
        num_hidden_layers=config.pop("n_layer", 12),
        num_attention_heads=n_head,
        num_key_value_heads=config.pop("n_kv_head", n_head),
        max_position_embeddings=config.pop("max_position_embeddings", seq_len),
        tie_word_embeddings=config.pop("tie_word_embeddings", True),
        **config,
    )


def llama_cost(cfg, seq_len: int) -> Cost:
    d, f, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    head_dim = cfg.head_dim or d // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    matrices = 2 * d * q + 2 * d * kv + 3 * d * f
    biases = int(cfg.attention_bias) * (q + 2 * kv + d) + int(cfg.mlp_bias) * (2 * f + d)
    return Cost(
        embedding_params=V * d * (1 if cfg.tie_word_embeddings else 2),
        non_embedding_params=L * (matrices + biases + 2 * d) + d,
        forward_flops_per_token=2 * (L * matrices + V * d) + L * 4 * seq_len * q,
        kv_cache_per_token=2 * L * kv,
    )


# ----- Mamba ----------------------------------------------------------------------------------------
def mamba_config(config: dict[str, Any], vocab_size: int, seq_len: int):
    """Mamba-1. On CPU the mixers run rayb's fused scan (selective_scan.py); `use_mambapy` only
    matters where that cannot run: cached generation, or a machine without a C++ compiler."""
    from transformers import MambaConfig

    return MambaConfig(
        vocab_size=vocab_size,
        hidden_size=config.pop("d_model", 768),
        num_hidden_layers=config.pop("n_layer", 24),
        state_size=config.pop("d_state", MAMBA_D_STATE),
        expand=config.pop("expand", 2),
        conv_kernel=config.pop("d_conv", 4),
        use_mambapy=config.pop("use_mambapy", not torch.cuda.is_available()),
        tie_word_embeddings=config.pop("tie_word_embeddings", True),
        **config,
    )


def mamba_model(cfg):
    """transformers' Mamba or Mamba-2 with rayb's faster CPU forward (mamba_cpu.py)."""
    from rayb.models.mamba_cpu import use_cpu_mixers

    return use_cpu_mixers(_hf_model(cfg))


# The selective scan's elementwise work per token and channel: the Mamba paper's 9·B·L·D·N.
MAMBA_SCAN_FLOPS_PER_STATE = 9


def mamba_cost(cfg, seq_len: int) -> Cost:
    d, L, V, N, k = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.state_size, cfg.conv_kernel
    di, r = cfg.intermediate_size, cfg.time_step_rank
    matrices = 2 * d * di + di * (r + 2 * N) + r * di + di * d
    others = di * k + int(cfg.use_conv_bias) * di + int(cfg.use_bias) * (2 * di + d) + di + di * N + di + d
    return Cost(
        embedding_params=V * d * (1 if cfg.tie_word_embeddings else 2),
        non_embedding_params=L * (matrices + others) + d,
        forward_flops_per_token=2 * (L * (matrices + di * k) + V * d)
        + L * MAMBA_SCAN_FLOPS_PER_STATE * di * N,
        state_size=L * di * (N + k - 1),
    )


# ----- Mamba-2 --------------------------------------------------------------------------------------
def mamba2_config(config: dict[str, Any], vocab_size: int, seq_len: int):
    from transformers import Mamba2Config

    d_model = config.pop("d_model", 768)
    expand = config.pop("expand", 2)
    head_dim = config.pop("head_dim", 64)
    if (expand * d_model) % head_dim:
        raise ValueError(f"expand·d_model ({expand * d_model}) must be a multiple of head_dim ({head_dim})")
    return Mamba2Config(
        vocab_size=vocab_size,
        hidden_size=d_model,
        num_hidden_layers=config.pop("n_layer", 24),
        state_size=config.pop("d_state", MAMBA2_D_STATE),
        expand=expand,
        head_dim=head_dim,
        num_heads=expand * d_model // head_dim,
        n_groups=config.pop("n_groups", 1),
        conv_kernel=config.pop("d_conv", 4),
        chunk_size=config.pop("chunk_size", mamba2_device_defaults("cpu")["chunk_size"]),
        tie_word_embeddings=config.pop("tie_word_embeddings", True),
        **config,
    )


def mamba2_device_defaults(device: str) -> dict[str, Any]:
    # The SSD chunk: 256 suits the CUDA kernel; PyTorch's chunked path on CPU is ~1.6× faster at 64 (its
    # intra-chunk work grows with the chunk). The function is the same either way; FLOPs and rounding are not.
    return {"chunk_size": 256 if device == "cuda" else 64}


def mamba2_cost(cfg, seq_len: int) -> Cost:
    d, L, V, N, k = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.state_size, cfg.conv_kernel
    H, P, G = cfg.num_heads, cfg.head_dim, cfg.n_groups
    di = H * P
    conv_dim = di + 2 * G * N
    in_proj = d * (2 * di + 2 * G * N + H)
    matrices = in_proj + di * d
    others = (conv_dim * k + int(cfg.use_conv_bias) * conv_dim + int(cfg.use_bias) * (2 * di + 2 * G * N + H + d)
              + 3 * H + di + d)  # fmt: skip
    # SSD in chunks of Q tokens, per token: C·Bᵀ and the masked (C·Bᵀ)·x inside the chunk (2·Q·H·(N+P)),
    # the chunk state Bᵀ·x and its read-out C·state (4·H·P·N).
    chunk = min(cfg.chunk_size, seq_len)
    ssd = 2 * chunk * H * (N + P) + 4 * di * N
    return Cost(
        embedding_params=V * d * (1 if cfg.tie_word_embeddings else 2),
        non_embedding_params=L * (matrices + others) + d,
        forward_flops_per_token=2 * (L * (matrices + conv_dim * k) + V * d) + L * ssd,
        state_size=L * (di * N + conv_dim * (k - 1)),
    )


def _mamba2_shape(d_model: int, n_layer: int) -> dict[str, Any]:
    return {"d_model": d_model, "n_layer": n_layer, "head_dim": 64 if (2 * d_model) % 64 == 0 else 32}


for _arch in (
    Architecture("gpt2", gpt2_config, _hf_model, gpt2_cost, _attention_shape, knobs=FOUR_D,
                 description="GPT-2 (transformers GPT2LMHeadModel)", kernel_paths=kernels.attention),
    Architecture("pythia", pythia_config, _hf_model, pythia_cost, _attention_shape, knobs=FOUR_D,
                 description="Pythia (transformers GPTNeoXForCausalLM): parallel residual, partial rotary",
                 kernel_paths=kernels.attention),
    Architecture("llama", llama_config, _hf_model, llama_cost, _attention_shape,
                 knobs=(InnerWidth("d_ff", swiglu_width),),
                 description="Transformer++ (transformers LlamaForCausalLM): RoPE, RMSNorm, SwiGLU",
                 kernel_paths=kernels.attention),
    Architecture("mamba", mamba_config, mamba_model, mamba_cost,
                 lambda d, n: {"d_model": d, "n_layer": n}, aspect=32.0, layers_per_block=2, knobs=MAMBA_KNOBS,
                 description="Mamba-1 (transformers MambaForCausalLM; rayb's fused selective scan on CPU)",
                 kernel_paths=kernels.mamba, reference="transformers' per-token scan"),
    Architecture("mamba2", mamba2_config, mamba_model, mamba2_cost, _mamba2_shape, aspect=32.0,
                 layers_per_block=2, knobs=MAMBA2_KNOBS,
                 description="Mamba-2 (transformers Mamba2ForCausalLM; rayb's grouped chunked SSD on CPU)",
                 device_defaults=mamba2_device_defaults, kernel_paths=kernels.mamba2,
                 reference="transformers' PyTorch SSD"),
):  # fmt: skip
    register(_arch)
