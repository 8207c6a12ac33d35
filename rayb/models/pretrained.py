"""Checkpoints a study did not train: reference models it only evaluates (`pretrained:`) and the weights a
finetuning arm starts from (`init_from:`).

A study names one as a local `save_pretrained` directory, a hub id, or `study:FILE#MODEL` (the final
weights of MODEL in another study; the runner runs that study first). Each resolves to a `Checkpoint`:
where the weights and their tokenizer are, and, for weights rayb saved itself without a transformers
config, the architecture and config to rebuild them with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rayb import storage


@dataclass(frozen=True)
class Checkpoint:
    source: str  # as the study wrote it
    model: str  # a directory or a hub id
    tokenizer: str  # a tokenizer directory or a hub id
    key: str  # identifies the weights: the study trial's key, or the source itself
    arch: str | None = None  # set for rayb's own weights files (no config.json)
    config: dict[str, Any] | None = None
    vocab_size: int | None = None
    seq_len: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def model_files(self) -> str:
        """Where this process opens the weights: the directory or hub id, or this node's copy of weights
        on object storage (another study's trial on the same store)."""
        return _opened(self.model)

    @property
    def tokenizer_files(self) -> str:
        return _opened(self.tokenizer)


def _opened(location: str) -> str:
    return str(storage.fetch_tree(location)) if storage.is_remote(location) else location


def hub_checkpoint(source: str, location: str) -> Checkpoint:
    """A local save_pretrained directory or a hub id (`location`): the weights and their tokenizer live
    together. Its key is the source as the study wrote it, so trial keys do not depend on where it is."""
    return Checkpoint(source=source, model=location, tokenizer=location, key=source)


def load_model(checkpoint: Checkpoint) -> nn.Module:
    """The checkpoint's causal LM (CPU kernels for Mamba on CPU, and no cache unless asked, as for every
    rayb model)."""
    if checkpoint.arch is not None:
        from rayb.models.checkpoint import load_trained

        return load_trained(
            Path(checkpoint.model_files), checkpoint.arch, checkpoint.config or {}, checkpoint.vocab_size,
            checkpoint.seq_len,
        )  # fmt: skip
    from transformers import AutoModelForCausalLM

    from rayb.models.checkpoint import as_rayb_runs

    try:
        return as_rayb_runs(AutoModelForCausalLM.from_pretrained(checkpoint.model))
    except OSError as exc:  # not on disk, and the hub unreachable or switched off
        raise OSError(
            f"cannot load '{checkpoint.source}': {exc}. Run `rayb data prepare STUDY` where the hub is "
            "reachable (it caches the checkpoint), or give a local save_pretrained directory"
        ) from None


def fresh_model(checkpoint: Checkpoint) -> nn.Module:
    """An untrained model of the checkpoint's architecture and shape."""
    if checkpoint.arch is not None:
        from rayb.models import build_model

        return build_model(
            checkpoint.arch, checkpoint.config or {}, checkpoint.vocab_size, checkpoint.seq_len
        )
    from transformers import AutoConfig, AutoModelForCausalLM

    from rayb.models.checkpoint import as_rayb_runs

    return as_rayb_runs(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(checkpoint.model)))


def initialise_from(model: nn.Module, checkpoint: Checkpoint) -> nn.Module:
    """Copy the checkpoint's weights into `model` (same architecture and shapes, or a clear error)."""
    state = load_model(checkpoint).state_dict()
    own = model.state_dict()
    wrong = [f"{n}: {tuple(t.shape)} vs {tuple(own[n].shape)}" for n, t in state.items() if n in own and t.shape != own[n].shape]  # fmt: skip
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if wrong or missing or unexpected:
        raise ValueError(
            f"init_from '{checkpoint.source}' does not fit the model: "
            + "; ".join(
                f"{what} {names[:4]}{' ...' if len(names) > 4 else ''}"
                for what, names in (
                    ("shape mismatch", wrong),
                    ("missing", missing),
                    ("unexpected", unexpected),
                )
                if names
            )
        )
    with torch.no_grad():
        model.load_state_dict(state)
    return model


def count_checkpoint_params(checkpoint: Checkpoint) -> tuple[int, int]:
    """(total, non-embedding) parameters, counted on the meta device without loading weights."""
    from rayb.models import count_params

    with torch.device("meta"):
        counts = count_params(fresh_model(checkpoint))
    return counts.total, counts.non_embedding
