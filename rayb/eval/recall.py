"""Recall: multi-query associative recall (MQAR) and passkey retrieval.

**MQAR**, as in the Zoology benchmark (Arora et al. 2023): a sequence opens with `kv` key–value
pairs, then asks the keys back in random order, each query key followed by its value; a model is
right at a query when its argmax after the key is the key's value. Keys and values are token ids
from disjoint halves of the vocabulary (the tokenizer plays no part), so chance is ≈ 1/vocabulary.
Scored for several kv counts at several sequence lengths.

**Passkey**: a five-digit key stated once in filler text (documents from rayb's generator) at a
random depth, then "What is the pass key? The pass key is"; the right key must out-score four
other keys by log-likelihood (chance 0.2). Lengths from 1K tokens doubling to `max_length` (32K), as
far as the architecture's position table allows; skipped lengths are listed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from rayb.data.corpus import generate_document
from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import choose, context_limit, device_of

FILLER_SEED = 2**31 - 2  # documents no study trains on


@dataclass
class RecallOptions:
    kv_counts: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    mqar_lengths: list[int] = field(default_factory=lambda: [128, 256])
    mqar_examples: int = 64
    passkey_lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384, 32768])
    passkey_examples: int = 10
    batch_size: int = 16


def mqar_batch(
    n: int, kv: int, length: int, vocab: int, rng: random.Random
) -> tuple[torch.Tensor, torch.Tensor]:
    """n sequences of `length` tokens; returns (ids [n, length], mask of the positions whose next
    token is a queried value [n, length])."""
    if 4 * kv > length:
        raise ValueError(
            f"{kv} key-value pairs need {4 * kv} tokens (pairs, then queries); length is {length}"
        )
    half = vocab // 2
    if kv > half - 1:
        raise ValueError(f"{kv} distinct keys need a vocabulary over {2 * kv + 2}, got {vocab}")
    ids = torch.zeros(n, length, dtype=torch.long)
    queried = torch.zeros(n, length, dtype=torch.bool)
    for row in range(n):
        keys = rng.sample(range(1, half), kv)
        values = [rng.randrange(half, vocab) for _ in keys]
        sequence = [t for pair in zip(keys, values, strict=True) for t in pair]
        while len(sequence) + 2 <= length:
            i = rng.randrange(kv)
            queried[row, len(sequence)] = True  # the key's position predicts the value
            sequence += [keys[i], values[i]]
        sequence += [0] * (length - len(sequence))
        ids[row] = torch.tensor(sequence)
    return ids, queried


@torch.no_grad()
def mqar_accuracy(
    model, kv: int, length: int, vocab: int, examples: int, seed: int, batch_size: int = 16
) -> float:
    rng = random.Random(f"mqar-{kv}-{length}-{seed}")
    ids, queried = mqar_batch(examples, kv, length, vocab, rng)
    correct = total = 0
    for start in range(0, examples, batch_size):
        batch, mask = ids[start : start + batch_size], queried[start : start + batch_size]
        predicted = model(batch.to(device_of(model))).logits.argmax(-1).cpu()
        target = torch.roll(batch, -1, dims=1)
        correct += int((predicted == target)[mask].sum())
        total += int(mask.sum())
    return correct / total


def passkey_items(
    tokenizer, length: int, examples: int, seed: int
) -> list[tuple[list[int], list[list[int]], int]]:
    """(context ids, candidate continuations, index of the right one) per example, each context
    about `length` tokens long."""
    rng = random.Random(f"passkey-{length}-{seed}")
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    question = encode("\nWhat is the pass key? The pass key is")
    items = []
    for i in range(examples):
        keys = rng.sample(range(10000, 100000), 5)
        key_line = encode(f"\nThe pass key is {keys[0]}. Remember it. {keys[0]} is the pass key.\n")
        filler, doc = [], 0
        budget = length - len(key_line) - len(question)
        while len(filler) < budget:
            filler += encode(
                generate_document("edu" if doc % 2 else "web", FILLER_SEED, i * 1000 + doc) + "\n"
            )
            doc += 1
        filler = filler[:budget]
        depth = rng.randrange(len(filler) + 1)
        context = filler[:depth] + key_line + filler[depth:] + question
        order = rng.sample(range(5), 5)
        items.append((context, [encode(f" {keys[j]}.") for j in order], order.index(0)))
    return items


def passkey_accuracy(model, tokenizer, length: int, examples: int, seed: int) -> float:
    items = passkey_items(tokenizer, length, examples, seed)
    picks = choose(model, [(context, choices) for context, choices, _ in items], length + 16, batch_size=1)
    return sum(pick == answer for pick, (_, _, answer) in zip(picks, items, strict=True)) / len(items)


def run_recall(ctx: EvalContext, _: str | None, options: RecallOptions) -> dict[str, Any]:
    limit = context_limit(ctx.model)
    metrics: dict[str, Any] = {}
    for length in options.mqar_lengths:
        if limit is not None and length > limit:
            continue
        for kv in options.kv_counts:
            if 4 * kv <= length:
                metrics[f"mqar_acc.kv{kv}.len{length}"] = mqar_accuracy(
                    ctx.model, kv, length, ctx.vocab_size, options.mqar_examples, ctx.seed, options.batch_size
                )
    mqar = [v for k, v in metrics.items() if k.startswith("mqar_acc.")]
    metrics["mqar_acc"] = sum(mqar) / len(mqar) if mqar else float("nan")
    lengths = [n for n in options.passkey_lengths if limit is None or n + 16 <= limit]
    for length in lengths:
        metrics[f"passkey_acc.len{length}"] = passkey_accuracy(
            ctx.model, ctx.tokenizer, length, options.passkey_examples, ctx.seed
        )
    metrics["passkey_lengths"] = lengths
    metrics["passkey_skipped_lengths"] = [n for n in options.passkey_lengths if n not in lengths]
    return metrics


register_benchmark(
    Benchmark("recall", 1, run_recall, RecallOptions, "multi-query associative recall and passkey retrieval")
)
