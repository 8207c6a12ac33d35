"""Efficiency: what a model's quality costs, to train and to run.

- architecture efficiency: candidate perplexity / reference perplexity (below 1 is better);
- compute efficiency: performance per inference time, (tokens/s ÷ perplexity) relative to the
  reference's (above 1 is better), from the speed suite's generation throughput;
- the Pareto frontier of validation loss against training FLOPs: the models no other model beats on
  both at once.
All numbers are means over each model's seeds at its selected learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayb.analysis.stats import finite_values

if TYPE_CHECKING:
    import pandas as pd

THROUGHPUT_COLUMN = "speed.gen_tokens_per_s"


@dataclass(frozen=True)
class Efficiency:
    model: str
    params: int
    train_flops: float
    val_loss: float
    ppl: float
    tokens_per_s: float  # generation throughput from the speed suite; NaN when not measured
    arch_efficiency: float  # ppl / reference ppl
    compute_efficiency: float  # (tokens_per_s / ppl) / the reference's
    pareto: bool  # on the loss-vs-training-FLOPs frontier


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For points to minimise on both coordinates, whether each is on the frontier: no other point is
    at least as good on both and strictly better on one. Non-finite points are never on it."""
    flags = []
    for i, (x, y) in enumerate(points):
        if not (math.isfinite(x) and math.isfinite(y)):
            flags.append(False)
            continue
        dominated = any(
            ox <= x and oy <= y and (ox < x or oy < y)
            for j, (ox, oy) in enumerate(points)
            if j != i and math.isfinite(ox) and math.isfinite(oy)
        )
        flags.append(not dominated)
    return flags


def _mean(rows: pd.DataFrame, column: str) -> float:
    values = finite_values(rows[column].to_numpy(dtype=float)) if column in rows else []
    return float(values.mean()) if len(values) else math.nan


def efficiency(selected: pd.DataFrame, reference: str) -> list[Efficiency]:
    """One Efficiency per model in `selected` (each model's rows at its selected learning rate)."""
    means = {}
    for model, rows in selected.groupby("model", sort=False):
        means[str(model)] = {
            "params": int(rows["params_total"].max()),
            "train_flops": _mean(rows, "train_flops"),
            "val_loss": _mean(rows, "val_loss"),
            "ppl": _mean(rows, "val_ppl"),
            "tokens_per_s": _mean(rows, THROUGHPUT_COLUMN),
        }
    ref = means.get(reference)
    front = pareto_front([(m["train_flops"], m["val_loss"]) for m in means.values()])
    out = []
    for (model, m), on_front in zip(means.items(), front, strict=True):
        arch = m["ppl"] / ref["ppl"] if ref else math.nan
        compute = (m["tokens_per_s"] / m["ppl"]) / (ref["tokens_per_s"] / ref["ppl"]) if ref else math.nan
        out.append(
            Efficiency(model=model, **m, arch_efficiency=arch, compute_efficiency=compute, pareto=on_front)
        )
    return out
