"""The verdict: every model at its own best learning rate, summarised over seeds and compared with the
reference (statistics in stats.py). Pure: a results table in, a `Verdict` out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from rayb.analysis.stats import (
    DEFAULT_SIGNIFICANCE,
    OK_STATUS,
    Comparison,
    SignificanceRule,
    Summary,
    best_by,
    compare,
    finite_values,
    summarize,
    with_holm,
)

SUMMARY_METRICS: tuple[str, ...] = ("val_loss", "val_ppl", "val_bpb")
"""Metrics summarised per model (all lower-is-better)."""


COMPARED_METRICS: tuple[str, ...] = ("val_loss", "val_bpb")
"""Metrics on which each model is compared with the reference (ppl is exp(loss), so redundant)."""


SELECTION_METRIC = "val_loss"
"""Metric that picks each model's best learning rate and decides who "beats" the reference."""


@dataclass
class ModelRow:
    """One model at its best learning rate, summarised over its seeds."""

    model: str
    arch: str
    lr: float
    params_total: int
    n_seeds: int
    summaries: dict[str, Summary]


@dataclass
class Verdict:
    """Everything the report says: per-model summaries, comparisons to the reference, exclusions."""

    study: str
    reference: str
    metrics: tuple[str, ...]
    rows: list[ModelRow]
    comparisons: list[Comparison]
    excluded: list[dict] = field(default_factory=list)
    rule: str = DEFAULT_SIGNIFICANCE.describe()  # what `significant` means in the comparisons, in words

    def comparison(self, candidate: str, metric: str) -> Comparison | None:
        """The comparison of `candidate` with the reference on `metric`, if there is one."""
        for comp in self.comparisons:
            if comp.candidate == candidate and comp.metric == metric:
                return comp
        return None


def _excluded_trials(df: pd.DataFrame) -> list[dict]:
    """Trials that did not finish "ok" (any learning rate): they never enter a mean."""
    bad = df[df["status"] != OK_STATUS]
    return [
        {"model": str(r.model), "seed": int(r.seed), "lr": float(r.lr), "status": str(r.status),
         "step": int(getattr(r, "steps", 0))}  # the step a diverged trial stopped at
        for r in bad.itertuples(index=False)
    ]  # fmt: skip


def _non_finite_trials(best: pd.DataFrame) -> list[dict]:
    """Status-"ok" trials whose summarised metrics are NaN/inf: summarize() drops them, so record them here."""
    out = []
    for r in best.itertuples(index=False):
        bad = [m for m in SUMMARY_METRICS if not math.isfinite(float(getattr(r, m)))]
        if bad:
            status = "non-finite " + ", ".join(bad)
            out.append(
                {
                    "model": str(r.model),
                    "seed": int(r.seed),
                    "lr": float(r.lr),
                    "status": status,
                    "step": int(getattr(r, "steps", 0)),
                }
            )
    return out


def _model_row(model: str, rows: pd.DataFrame) -> ModelRow:
    """Summarise one model's best-lr seeds."""
    first = rows.iloc[0]
    return ModelRow(
        model=model,
        arch=str(first["arch"]),
        lr=float(first["lr"]),
        params_total=int(rows["params_total"].max()),
        n_seeds=len(rows),
        summaries={
            m: summarize(rows[m].to_numpy(dtype=float))
            for m in SUMMARY_METRICS
            if finite_values(rows[m].to_numpy(dtype=float)).size  # e.g. ppl can overflow to inf
        },
    )


def _compare_all(
    by_model: dict[str, pd.DataFrame], reference: str, models: list[str], rule: SignificanceRule
) -> list[Comparison]:
    """Every non-reference model vs the reference on COMPARED_METRICS (skipping all-NaN metrics)."""
    ref_rows = by_model[reference]
    out = []
    for model in models:
        if model == reference:
            continue
        for metric in COMPARED_METRICS:
            ref_vals, cand_vals = ref_rows[metric].to_numpy(float), by_model[model][metric].to_numpy(float)
            if finite_values(ref_vals).size and finite_values(cand_vals).size:
                out.append(compare(reference, ref_vals, model, cand_vals, metric, rule))
    return out


def build_verdict(
    df: pd.DataFrame, study_name: str, reference: str, rule: SignificanceRule = DEFAULT_SIGNIFICANCE
) -> Verdict:
    """Compare every model, each at its own best learning rate, against `reference`, under `rule`.

    Rows are ordered reference first, then by mean validation loss, so the table reads best-first.
    Raises ValueError if the reference is absent or has no usable trial, since every comparison
    would then be meaningless.
    """
    if reference not in set(df["model"]):
        raise ValueError(f"reference model {reference!r} not in results (have {sorted(set(df['model']))})")
    best = selected_rows(df)
    by_model = {str(m): g for m, g in best.groupby("model", sort=False)}
    if reference not in by_model:
        raise ValueError(
            f"reference model {reference!r} has no finished trial with a finite {SELECTION_METRIC}"
        )

    rows = [_model_row(m, g) for m, g in by_model.items()]
    rows.sort(key=lambda r: (r.model != reference, r.summaries[SELECTION_METRIC].mean))
    comparisons = with_holm(_compare_all(by_model, reference, [r.model for r in rows], rule))
    return Verdict(
        study=study_name,
        reference=reference,
        metrics=SUMMARY_METRICS,
        rows=rows,
        comparisons=comparisons,
        excluded=_excluded_trials(df) + _non_finite_trials(best),
        rule=rule.describe(),
    )


def selected_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Each model's finished trials at its selected (best mean validation loss) learning rate."""
    return best_by(df, "model", "lr", SELECTION_METRIC)
