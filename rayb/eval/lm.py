"""Language modelling: loss, perplexity and bits per byte, on held-out rows or a named corpus.

`lm` scores the study's held-out rows (the packed validation split): each row on its own, positions
1..T−1 (the first token is context). A pretrained reference with its own tokenizer scores the same rows in
its own tokens (the rows' text as the sources hold it, data/held_out.py), so bits per byte, over the same
bytes for every model, compare across tokenizers. `lm:CORPUS` scores a corpus
(corpora.py) as one token stream with a sliding window: windows of `window` tokens (default: the
trained context) advancing by `stride` (default: half a window), each token scored once with at
least window − stride tokens of context. Bits per byte divides the summed negative log-likelihood by
the UTF-8 bytes of the text, so models with different tokenizers compare on the same text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rayb.data.cache import TokenCache
from rayb.data.held_out import EOS_ITEM, HeldOut
from rayb.eval.corpora import CorpusText, load_corpus, read_corpus, resolve_corpus
from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import context_limit, sliding_window_nll


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
        "val_bpb": nll / (math.log(2) * float(cache.held_out.scored_bytes.sum())),
        "val_tokens": tokens,
        "extra": extra_metrics() if extra_metrics else {},
    }


@dataclass
class LMOptions:
    window: int | None = None  # tokens of context per window; default the trained context
    stride: int | None = None  # default window // 2
    max_tokens: int | None = None  # score only the corpus's first tokens (None: all of it)
    batch_size: int = 16  # held-out rows per forward pass

    def validate(self) -> None:
        if self.window is not None and self.window < 2:
            raise ValueError("window must be at least 2 tokens")
        if self.stride is not None and self.stride < 1:
            raise ValueError("stride must be at least 1")


def own_token_rows(tokenizer, held_out: HeldOut) -> list[tuple[list[int], int]]:
    """Each held-out row in `tokenizer`'s tokens: (ids, index of the first scored one). A document is
    tokenized whole, once, and each row takes its tokens that start inside the row's spans; those that start
    before `context_end` are context, as the study row's first token is."""
    docs = tokenizer(held_out.documents, add_special_tokens=False, return_offsets_mapping=True)
    rows = []
    for items, context_end in zip(held_out.rows, held_out.context_end, strict=True):
        ids, first = [], None
        for k, (doc, start, end) in enumerate(items):
            if doc == EOS_ITEM:
                ids.append(tokenizer.eos_token_id)
                continue
            for token, (begin, _) in zip(docs["input_ids"][doc], docs["offset_mapping"][doc], strict=True):
                if start <= begin < end:
                    if first is None and not (k == 0 and begin < context_end):
                        first = len(ids)
                    ids.append(token)
        # Nothing before the first scored token (the row opened with end-of-text): that token is context.
        rows.append((ids, max(1, first or 0)))
    return rows


def held_out_nll(model: nn.Module, tokenizer, held_out: HeldOut) -> tuple[float, int]:
    """Summed NLL (nats) and count of the scored tokens of every held-out row, in the model's own tokens;
    each row on its own (no context from the row before), as the trained models are scored."""
    limit = context_limit(model)
    nll, count = 0.0, 0
    for ids, first in own_token_rows(tokenizer, held_out):
        if len(ids) <= first:
            continue
        window = min(limit or len(ids), len(ids))  # the whole row at once, where the model's context allows
        row_nll, scored = sliding_window_nll(model, ids[first:], window, max(1, window // 2), ids[:first])
        nll, count = nll + row_nll, count + scored
    return nll, count


def corpus_metrics(ctx: EvalContext, text: str, options: LMOptions) -> dict[str, Any]:
    tokens = ctx.tokenizer(text, add_special_tokens=False)["input_ids"]
    if options.max_tokens is not None:
        tokens = tokens[: options.max_tokens]
        text = ctx.tokenizer.decode(tokens)
    window = options.window or ctx.seq_len
    if (limit := context_limit(ctx.model)) is not None:
        window = min(window, limit)
    stride = options.stride or max(1, window // 2)
    nll, count = sliding_window_nll(ctx.model, tokens, window, stride, ctx.tokenizer.eos_token_id)
    return {
        "loss": nll / count,
        "ppl": math.exp(nll / count),
        "bpb": nll / (math.log(2) * len(text.encode("utf-8"))),
        "tokens": count,
        "window": window,
        "stride": stride,
    }


def run_lm(ctx: EvalContext, corpus: str | CorpusText | None, options: LMOptions) -> dict[str, Any]:
    if corpus is None and ctx.study_tokens:
        return evaluate_lm(ctx.model, ctx.cache, options.batch_size)
    if corpus is None:
        # A pretrained model with its own tokenizer: the same rows in its own tokens. Only bits per byte
        # compares across tokenizers; its loss per (own) token is kept under another name.
        nll, tokens = held_out_nll(ctx.model, ctx.tokenizer, ctx.cache.held_out)
        bpb = nll / (math.log(2) * float(ctx.cache.held_out.scored_bytes.sum()))
        return {"val_loss": math.nan, "val_ppl": math.nan, "val_bpb": bpb, "val_tokens": tokens,
                "extra": {"own_token_loss": nll / tokens}}  # fmt: skip
    return corpus_metrics(ctx, load_corpus(corpus), options)


register_benchmark(
    Benchmark(
        "lm", 2, run_lm, LMOptions,  # 2: references score the rows' own text and bytes (data/held_out.py)
        "perplexity and bits per byte: held-out rows, or a named corpus with a sliding window",
        argument="corpus name or text file", resolve_argument=resolve_corpus, read_argument=read_corpus,
    )
)  # fmt: skip
