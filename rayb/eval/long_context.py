"""Long context: loss by position, and perplexity at 1×, 2×, 4×, 8× the trained context.

The held-out rows are joined into one token stream and cut into windows of m × the trained context;
every token of a window is scored. `ppl@{m}x` is the perplexity over whole windows of that length
and `loss_by_position@{m}x` the mean loss in `buckets` equal spans of position, which shows where a
model stops using (or starts being hurt by) its context. The "useful context window" is the largest
multiple up to which perplexity stays within `tolerance` of the perplexity at 1×. Multiples beyond a
position table, or longer than the held-out stream, are skipped and listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import context_limit, device_of


@dataclass
class LongContextOptions:
    multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    buckets: int = 8
    max_windows: int = 16  # windows per multiple (the first ones of the stream)
    tolerance: float = 0.1  # "useful": perplexity at most (1 + tolerance) × the 1× perplexity

    def validate(self) -> None:
        if 1 not in self.multiples:
            raise ValueError("multiples must include 1 (the trained context, the baseline of the curve)")


@torch.no_grad()
def position_losses(model, stream: np.ndarray, window: int, max_windows: int) -> np.ndarray:
    """Per-position losses [windows, window − 1] over consecutive windows of the stream."""
    n = min(max_windows, len(stream) // window)
    rows = torch.from_numpy(stream[: n * window].astype(np.int64)).view(n, window)
    losses = []
    for row in rows:  # one window at a time: at 8× the context a batch would not fit
        logits = model(row[None].to(device_of(model))).logits[0, :-1].float()
        losses.append(F.cross_entropy(logits, row[1:].to(logits.device), reduction="none").cpu())
    return torch.stack(losses).numpy()


def run_long_context(ctx: EvalContext, _: str | None, options: LongContextOptions) -> dict[str, Any]:
    stream = ctx.held_out_stream()
    limit = context_limit(ctx.model)
    metrics: dict[str, Any] = {"multiples": [], "skipped_multiples": []}
    for m in sorted(options.multiples):
        window = m * ctx.seq_len
        if (limit is not None and window > limit) or len(stream) < window:
            metrics["skipped_multiples"].append(m)
            continue
        losses = position_losses(ctx.model, stream, window, options.max_windows)
        metrics["multiples"].append(m)
        metrics[f"ppl@{m}x"] = math.exp(float(losses.mean()))
        spans = np.array_split(np.arange(losses.shape[1]), options.buckets)
        metrics[f"loss_by_position@{m}x"] = [float(losses[:, s].mean()) for s in spans if len(s)]
    useful = 0
    for m in metrics["multiples"]:  # the curve up to the first multiple that degrades
        if not metrics[f"ppl@{m}x"] <= (1 + options.tolerance) * metrics.get("ppl@1x", math.nan):
            break
        useful = m
    metrics["useful_context_multiple"] = useful
    metrics["useful_context_tokens"] = metrics["useful_context_multiple"] * ctx.seq_len
    return metrics


register_benchmark(
    Benchmark(
        "long_context", 1, run_long_context, LongContextOptions,
        "loss by position and perplexity at 1×–8× the trained context (the useful context window)",
    )
)  # fmt: skip
