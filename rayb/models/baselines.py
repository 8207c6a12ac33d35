"""Baseline architectures, built from transformers' own config and model classes.

Each builder accepts rayb's common size names (d_model, n_layer, n_head, d_ff) and passes any other
key straight to the transformers config, so every knob of the real architecture stays reachable.
Dropout is off: at these scales and budgets it only adds seed noise to the comparison.
"""

from __future__ import annotations

from typing import Any

import torch

from rayb.models.registry import register


def _take(config: dict[str, Any], key: str, default: Any) -> Any:
    return config.pop(key, default)


@register("gpt2")
def gpt2(config: dict[str, Any], vocab_size: int, seq_len: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=vocab_size,
        n_positions=_take(config, "n_positions", seq_len),
        n_embd=_take(config, "d_model", 768),
        n_layer=_take(config, "n_layer", 12),
        n_head=_take(config, "n_head", 12),
        n_inner=_take(config, "d_ff", None),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **config,
    )
    return GPT2LMHeadModel(cfg)


@register("llama")
def llama(config: dict[str, Any], vocab_size: int, seq_len: int):
    """Transformer++: RoPE, RMSNorm, SwiGLU, no biases."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d_model = _take(config, "d_model", 768)
    n_head = _take(config, "n_head", 12)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        # SwiGLU's three matrices at 8/3·d keep the MLP's parameters equal to a 4·d GELU MLP.
        intermediate_size=_take(config, "d_ff", _round_up(8 * d_model // 3, 64)),
        num_hidden_layers=_take(config, "n_layer", 12),
        num_attention_heads=n_head,
        num_key_value_heads=_take(config, "n_kv_head", n_head),
        max_position_embeddings=_take(config, "max_position_embeddings", seq_len),
        tie_word_embeddings=_take(config, "tie_word_embeddings", True),
        **config,
    )
    return LlamaForCausalLM(cfg)


@register("mamba")
def mamba(config: dict[str, Any], vocab_size: int, seq_len: int):
    """Mamba-1. Without the CUDA kernels, transformers' default fallback is a per-token Python loop;
    the `mambapy` parallel scan is the same computation, tens of times faster on CPU."""
    from transformers import MambaConfig, MambaForCausalLM

    cfg = MambaConfig(
        vocab_size=vocab_size,
        hidden_size=_take(config, "d_model", 768),
        num_hidden_layers=_take(config, "n_layer", 24),
        state_size=_take(config, "d_state", 16),
        expand=_take(config, "expand", 2),
        conv_kernel=_take(config, "d_conv", 4),
        use_mambapy=_take(config, "use_mambapy", not torch.cuda.is_available()),
        tie_word_embeddings=_take(config, "tie_word_embeddings", True),
        **config,
    )
    return MambaForCausalLM(cfg)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
