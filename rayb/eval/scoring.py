"""Scoring primitives every benchmark shares: continuation log-likelihoods and sliding-window NLL.

A model here is anything rayb trains: `model(ids).logits` of shape [batch, T, vocab]. Only the logits
are used, so transformers models, rayb's own and a user's candidate are scored the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def context_limit(model: nn.Module) -> int | None:
    """The longest input a model accepts: learned position tables (GPT-2, nanoGPT) have one; rotary
    and recurrent models do not (None). A user's model may declare `max_context`."""
    if (limit := getattr(model, "max_context", None)) is not None:
        return int(limit)
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    for name in ("n_positions", "block_size"):
        if (limit := getattr(config, name, None)) is not None:
            return int(limit)
    return None


def evaluation_autocast(training_precision: str) -> torch.dtype | None:
    """The autocast dtype a study's evaluations run under, given its training precision
    (`TrainSpec.resolved_precision`): the precision its models trained in, so speed, memory and scores
    reflect the models as they were trained (bf16 by default on GPU; fp32 on CPU). None: fp32. It is one
    precision for every architecture of the study: every model's weights load in fp32, whatever dtype
    its checkpoint was saved in, and the kernels run under the one autocast."""
    return None if training_precision == "fp32" else torch.bfloat16


def describe_evaluation_precision(training_precision: str) -> str:
    """The evaluation precision in words, for result files and the report."""
    return "fp32" if evaluation_autocast(training_precision) is None else "bf16 autocast over fp32 weights"


def device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


@torch.no_grad()
def continuation_logprobs(
    model: nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_length: int,
    batch_size: int = 16,
) -> list[tuple[float, bool]]:
    """For each (context ids, continuation ids): log P(continuation | context) and whether every
    continuation token is the argmax (lm-eval's `is_greedy`). Inputs longer than `max_length` keep
    their last `max_length` tokens, as lm-eval does. Requests of equal length are batched together."""
    device = device_of(model)
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        rows = [(list(requests[i][0]) + list(requests[i][1]))[-(max_length + 1) :] for i in batch]
        width = max(len(r) for r in rows) - 1
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for j, row in enumerate(rows):  # right-padded: causal models never look at the padding
            ids[j, : len(row) - 1] = torch.tensor(row[:-1])
        logprobs = F.log_softmax(model(ids.to(device)).logits.float(), dim=-1).cpu()
        for j, i in enumerate(batch):
            n = len(requests[i][1])
            target = torch.tensor(rows[j][-n:])
            scored = logprobs[j, len(rows[j]) - 1 - n : len(rows[j]) - 1]
            results[i] = (
                scored.gather(1, target[:, None]).sum().item(),
                bool((scored.argmax(-1) == target).all()),
            )
    return results


def choose(
    model: nn.Module,
    items: Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]],
    max_length: int,
    batch_size: int = 16,
) -> list[int]:
    """For each (context ids, [choice ids, ...]): the index of the choice with the highest
    log-likelihood given the context (multiple choice scored as lm-eval's `acc`)."""
    requests = [(context, choice) for context, choices in items for choice in choices]
    scores = iter(lp for lp, _ in continuation_logprobs(model, requests, max_length, batch_size))
    picks = []
    for _, choices in items:
        mine = [next(scores) for _ in choices]
        picks.append(max(range(len(mine)), key=mine.__getitem__))
    return picks


@torch.no_grad()
def sliding_window_nll(
    model: nn.Module, tokens: Sequence[int], window: int, stride: int, prefix: int | Sequence[int]
) -> tuple[float, int]:
    """Summed NLL (nats) and count of every token of `tokens`, each predicted from up to `window`
    tokens of context: windows of `window` inputs advance by `stride`, and each scores only the tokens
    no earlier window scored (the last window ends at the text's end). The first token is predicted
    from `prefix` (end-of-text, or the context tokens before `tokens`), so nothing is left unscored. With
    stride == window this is exactly lm-eval's `loglikelihood_rolling`; smaller strides give every token
    more context."""
    if not 0 < stride <= window:
        raise ValueError(f"stride must be in 1..window ({window}), got {stride}")
    prefix = [prefix] if isinstance(prefix, int) else list(prefix)
    stream = torch.tensor([*prefix, *tokens], dtype=torch.long)
    device, at = device_of(model), len(prefix)  # at: where tokens[0] is in the stream
    nll, scored = 0.0, 0  # scored: tokens of `tokens` done so far
    while scored < len(tokens):
        end = min(scored + (window if scored == 0 else stride), len(tokens))  # score tokens[scored:end]
        inputs = stream[max(0, at + end - 1 - window) : at + end - 1]  # each predicts the token after it
        logits = model(inputs[None].to(device)).logits[0].float()
        new = end - scored
        nll += F.cross_entropy(
            logits[-new:], stream[at + scored : at + end].to(device), reduction="sum"
        ).item()
        scored = end
    return nll, len(tokens)
