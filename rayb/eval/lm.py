"""Language-modelling metrics on the study's held-out rows: loss, perplexity, bits per byte.

Bits per byte divides the summed negative log-likelihood by the UTF-8 bytes behind the scored tokens,
so models with different tokenizers can be compared on the same text.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rayb.data.cache import TokenCache


def next_token_nll(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood (nats) of tokens 1..T-1 of each row given their prefixes."""
    return logits_nll(model(ids).logits, ids)


def logits_nll(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum")


def as_ids(rows: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(device)


@torch.no_grad()
def evaluate_lm(model: nn.Module, cache: TokenCache, batch_size: int = 16) -> dict[str, float]:
    model.eval()
    device = next(model.parameters()).device
    extra_metrics = getattr(model, "extra_metrics", None)  # a candidate's own metrics (see examples/)
    if extra_metrics:
        extra_metrics()  # start counting from the validation pass
    nll = 0.0
    for start in range(0, len(cache.val), batch_size):
        nll += next_token_nll(model, as_ids(cache.val[start : start + batch_size], device)).item()
    tokens = len(cache.val) * (cache.seq_len - 1)
    loss = nll / tokens
    return {
        "val_loss": loss,
        "val_ppl": math.exp(loss),
        "val_bpb": nll / (math.log(2) * float(cache.val_bytes.sum())),
        "val_tokens": tokens,
        "extra": extra_metrics() if extra_metrics else {},
    }


def load_trained(model_dir: Path, arch: str, config: dict, vocab_size: int, seq_len: int) -> nn.Module:
    """Load a trained model from its safetensors directory (HF `save_pretrained` or rayb's own)."""
    model_dir = Path(model_dir)
    if (model_dir / "config.json").exists():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model_dir, use_safetensors=True)  # never unpickle
    from rayb.models import build_model
    from rayb.models.checkpoint import load_weights

    return load_weights(build_model(arch, config, vocab_size, seq_len), model_dir)
