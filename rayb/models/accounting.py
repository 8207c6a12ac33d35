"""Parameter accounting from the built model itself (tied weights counted once)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ParamCount:
    total: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


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
