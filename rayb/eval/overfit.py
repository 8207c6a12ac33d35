"""The smoke protocol: can a freshly initialised model memorise a small set of training rows?

Every model, untrained and seeded alike, overfits the study's first `examples` (1,000) packed training
rows: AdamW (no weight decay, a short linear warm-up, then a constant rate) for `steps` (300) steps on
seeded random minibatches, with the global gradient norm clipped at `grad_clip`. It is a cheap check
of trainability that the main comparison cannot give: an architecture that cannot drive the loss on
a thousand rows towards zero has a bug or an optimisation problem, whatever its validation loss.
Alongside the loss it records the pre-clip gradient norm of every step, so models compare on how
well-conditioned their training is (large or spiking norms, non-finite steps), not only how fast.

A step whose loss or gradient norm is not finite is counted in `nonfinite_steps` and its update is
skipped (as a mixed-precision gradient scaler would), so one bad batch does not poison the weights.
The fresh model trains on the evaluated model's device (eval actors build it on the CPU), in fp32.
The curves come back downsampled to at most `curve_points` points, for the report to plot.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rayb.eval.lm import as_ids, logits_nll
from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import device_of

FINAL_WINDOW = 10  # final_loss is the mean loss of this many last steps (one minibatch is noisy)
SPIKE_FACTOR = 10.0  # a step whose gradient norm exceeds this multiple of the running median is a spike


@dataclass
class OverfitOptions:
    examples: int = 1000  # the first rows of the training cache to memorise (fewer if it has fewer)
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 10  # linear from lr / warmup_steps up to lr, then constant
    grad_clip: float = 1.0
    # 0.5 nats/token means the right next token gets ~60% probability on (geometric) average. Natural
    # text stays well above that for any model small enough to train here (≈2–4 nats), so reaching it
    # means the rows were memorised, not merely modelled. The loss_ratio metric is scale-free.
    target_loss: float = 0.5
    curve_points: int = 50

    def validate(self) -> None:
        for name in ("examples", "steps", "batch_size", "lr", "grad_clip", "target_loss", "curve_points"):
            if not getattr(self, name) > 0:
                raise ValueError(f"overfit option {name} must be positive (got {getattr(self, name)})")
        if self.warmup_steps < 0:
            raise ValueError(f"overfit option warmup_steps must be ≥ 0 (got {self.warmup_steps})")


def run_overfit(ctx: EvalContext, _: str | None, options: OverfitOptions) -> dict[str, Any]:
    if ctx.fresh_model is None:
        raise ValueError("the overfit protocol needs a model rayb can initialise (EvalContext.fresh_model)")
    rows = np.asarray(ctx.cache.train_rows(0, options.examples))  # only these rows, not the whole split
    if len(rows) == 0:
        raise ValueError("the overfit protocol needs training rows, and the cache has none")
    device = device_of(ctx.model)
    torch.manual_seed(ctx.seed)
    model = ctx.fresh_model().to(device).train()
    losses, norms = _train(model, as_ids(rows, device), options, ctx.seed)
    return {"examples": len(rows), "steps": options.steps} | summarise(losses, norms, options)


def _train(
    model: nn.Module, ids: torch.Tensor, options: OverfitOptions, seed: int
) -> tuple[list[float], list[float]]:
    """Per-step LM loss (nats/token) and pre-clip global gradient norm."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    batches = _minibatches(len(ids), options.batch_size, seed)
    losses, norms = [], []
    with torch.set_grad_enabled(True):  # evaluation code may call this under no_grad
        for step in range(options.steps):
            for group in optimizer.param_groups:
                group["lr"] = options.lr * min(1.0, (step + 1) / max(1, options.warmup_steps))
            batch = ids[torch.from_numpy(next(batches)).to(ids.device)]
            out = model(batch)
            loss = logits_nll(out.logits, batch) / batch[:, 1:].numel()
            # A model's own training-only term (e.g. an MoE balancing loss) trains as it does in
            # rayb's trainer; the recorded loss stays the LM loss every model is compared on.
            aux = getattr(out, "aux_loss", None)
            optimizer.zero_grad(set_to_none=True)
            (loss if aux is None else loss + aux).backward()
            norm = torch.nn.utils.clip_grad_norm_(params, options.grad_clip).item()
            losses.append(loss.item())
            norms.append(norm)
            if math.isfinite(norm) and math.isfinite(losses[-1]):
                optimizer.step()
    return losses, norms


def _minibatches(n: int, batch_size: int, seed: int):
    """Row indices: seeded, each row once per pass over the rows (a batch may span two passes)."""
    rng = np.random.default_rng(seed)
    size = min(batch_size, n)
    order = np.empty(0, dtype=np.int64)
    while True:
        while len(order) < size:
            order = np.concatenate([order, rng.permutation(n)])
        yield order[:size]
        order = order[size:]


def summarise(losses: list[float], norms: list[float], options: OverfitOptions) -> dict[str, Any]:
    initial = losses[0]
    final = statistics.fmean(losses[-FINAL_WINDOW:])
    finite = [g for g in norms if math.isfinite(g)]
    half = next((i + 1 for i, loss in enumerate(losses) if loss <= initial / 2), None)
    spikes = spike_steps(norms)
    return {
        "initial_loss": initial,
        "final_loss": final,
        "loss_ratio": final / initial,
        "memorised": bool(final <= options.target_loss),
        "target_loss": options.target_loss,
        "steps_to_half": half,
        "grad_norm_first": norms[0],
        "grad_norm_median": statistics.median(finite) if finite else math.nan,
        "grad_norm_max": max(finite) if finite else math.nan,
        "grad_norm_final": norms[-1],
        "grad_spikes": len(spikes),
        "grad_spike_steps": spikes,
        "nonfinite_steps": sum(
            not (math.isfinite(a) and math.isfinite(g)) for a, g in zip(losses, norms, strict=True)
        ),
        **curves(losses, norms, options.curve_points),
    }


def spike_steps(norms: list[float]) -> list[int]:
    """Steps (1-based) whose gradient norm exceeds SPIKE_FACTOR × the median of the finite norms before it."""
    seen: list[float] = []
    spikes = []
    for i, norm in enumerate(norms):
        if seen and norm > SPIKE_FACTOR * _sorted_median(seen):
            spikes.append(i + 1)
        if math.isfinite(norm):
            bisect.insort(seen, norm)
    return spikes


def _sorted_median(values: list[float]) -> float:
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def curves(losses: list[float], norms: list[float], points: int) -> dict[str, list]:
    """The per-step curves at up to `points` evenly spaced steps, always the first and the last."""
    picks = np.unique(np.linspace(0, len(losses) - 1, min(points, len(losses))).round().astype(int))
    return {
        "curve_step": [int(i) + 1 for i in picks],
        "curve_loss": [losses[i] for i in picks],
        "curve_grad_norm": [norms[i] for i in picks],
    }


register_benchmark(
    Benchmark(
        "overfit", 1, run_overfit, OverfitOptions,
        "smoke protocol: a fresh model memorises 1,000 training rows; loss and gradient-norm curves",
    )
)  # fmt: skip
