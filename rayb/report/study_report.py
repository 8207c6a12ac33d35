"""Turn a study's results table into a verdict and its report: markdown, self-contained HTML, JSON, plots.

The verdict compares every model at its *own* best learning rate (lowest mean validation loss over
seeds) against a named reference model; the gate, efficiency and scaling analyses use the same rows.
The same cells feed the CLI's rich table and the markdown table, so what is printed and what is
written can never disagree. The report is built from the results table and the provenance record
alone, so `rayb report` can rebuild it at any time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.table import Table

from rayb.analysis.efficiency import Efficiency, efficiency
from rayb.analysis.gate import GateDecision, gate_all
from rayb.analysis.scaling import ScalingFit, fit_all, parallel
from rayb.analysis.stats import (
    OK_STATUS,
    SIGMA_MULTIPLIER,
    Comparison,
    Summary,
    best_by,
    compare,
    finite_values,
    seeds_needed,
    summarize,
    with_holm,
)
from rayb.files import write_atomic
from rayb.report import plots
from rayb.report.html import data_uri, to_html
from rayb.report.provenance import PROVENANCE_NAME
from rayb.report.sections import (
    efficiency_section,
    gate_headline,
    gate_section,
    markdown_table,
    provenance_section,
    scaling_section,
)

SUMMARY_METRICS: tuple[str, ...] = ("val_loss", "val_ppl", "val_bpb")
"""Metrics summarised per model (all lower-is-better)."""

COMPARED_METRICS: tuple[str, ...] = ("val_loss", "val_bpb")
"""Metrics on which each model is compared with the reference (ppl is exp(loss), so redundant)."""

SELECTION_METRIC = "val_loss"
"""Metric that picks each model's best learning rate and decides who "beats" the reference."""

WELCH_ALPHA = 0.05
"""Level at which the report calls a Welch p-value small."""

TABLE_COLUMNS: tuple[str, ...] = (
    "model",
    "arch",
    "params",
    "lr",
    "seeds",
    "val loss mean ± std [95% CI]",
    "ppl",
    "bpb",
    "Δ val loss vs ref",
    "p (Welch)",
    "significant?",
)

RESULTS_NAME = "results.parquet"
REPORT_NAME = "report.md"
HTML_NAME = "report.html"
JSON_NAME = "results.json"


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

    def comparison(self, candidate: str, metric: str) -> Comparison | None:
        """The comparison of `candidate` with the reference on `metric`, if there is one."""
        for comp in self.comparisons:
            if comp.candidate == candidate and comp.metric == metric:
                return comp
        return None


# --------------------------------------------------------------------------------------------- verdict


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


def _compare_all(by_model: dict[str, pd.DataFrame], reference: str, models: list[str]) -> list[Comparison]:
    """Every non-reference model vs the reference on COMPARED_METRICS (skipping all-NaN metrics)."""
    ref_rows = by_model[reference]
    out = []
    for model in models:
        if model == reference:
            continue
        for metric in COMPARED_METRICS:
            ref_vals, cand_vals = ref_rows[metric].to_numpy(float), by_model[model][metric].to_numpy(float)
            if finite_values(ref_vals).size and finite_values(cand_vals).size:
                out.append(compare(reference, ref_vals, model, cand_vals, metric))
    return out


def build_verdict(df: pd.DataFrame, study_name: str, reference: str) -> Verdict:
    """Compare every model, each at its own best learning rate, against `reference`.

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
    comparisons = with_holm(_compare_all(by_model, reference, [r.model for r in rows]))
    return Verdict(
        study=study_name,
        reference=reference,
        metrics=SUMMARY_METRICS,
        rows=rows,
        comparisons=comparisons,
        excluded=_excluded_trials(df) + _non_finite_trials(best),
    )


# --------------------------------------------------------------------------------------------- formatting


def _fmt_params(n: int) -> str:
    """Exact parameter count: matched-size claims are checked to the last parameter."""
    return f"{n:,}"


def _fmt_float(x: float, spec: str) -> str:
    """Format a float, showing non-finite values as a dash rather than 'nan'."""
    return format(x, spec) if math.isfinite(x) else "—"


def _fmt_summary(s: Summary) -> str:
    """mean ± std [ci_low, ci_high]."""
    return f"{s.mean:.4f} ± {s.std:.4f} [{s.ci_low:.4f}, {s.ci_high:.4f}]"


def _fmt_mean(s: Summary | None, spec: str) -> str:
    """Mean of a summary, or a dash when the metric had no finite value."""
    return "—" if s is None else format(s.mean, spec)


def _fmt_delta(comp: Comparison | None) -> str:
    """Signed delta with its relative size; "ref" marks the reference row."""
    if comp is None:
        return "—"
    return f"{comp.delta:+.4f} ({_fmt_float(100 * comp.rel_delta, '+.2f')}%)"


def _table_rows(verdict: Verdict) -> list[list[str]]:
    """Cell strings of the comparison table, shared by the rich and markdown renderings."""
    out = []
    for row in verdict.rows:
        is_ref = row.model == verdict.reference
        comp = None if is_ref else verdict.comparison(row.model, SELECTION_METRIC)
        s = row.summaries
        out.append(
            [
                row.model + (" (ref)" if is_ref else ""),
                row.arch,
                _fmt_params(row.params_total),
                f"{row.lr:.3g}",
                str(row.n_seeds),
                _fmt_summary(s["val_loss"]),
                _fmt_mean(s.get("val_ppl"), ".2f"),
                _fmt_mean(s.get("val_bpb"), ".4f"),
                "ref" if is_ref else _fmt_delta(comp),
                "—" if comp is None else _fmt_float(comp.p_value, ".3g"),
                "—" if comp is None else ("yes" if comp.significant else "no"),
            ]
        )
    return out


def format_table(verdict: Verdict) -> Table:
    """The comparison table the CLI prints (same cells as the markdown report)."""
    table = Table(title=f"{verdict.study}: each model at its best lr, vs {verdict.reference}")
    for col in TABLE_COLUMNS:
        numeric = col not in ("model", "arch", "significant?")
        table.add_column(col, justify="right" if numeric else "left")
    for cells in _table_rows(verdict):
        table.add_row(*cells)
    return table


def _comparison_sentence(verdict: Verdict, comp: Comparison) -> str:
    """One sentence on a candidate vs the reference on the selection metric."""
    verb = "beats" if comp.delta < 0 else ("is worse than" if comp.delta > 0 else "ties")
    rule = "the difference is " + ("significant" if comp.significant else "not significant")
    if math.isfinite(comp.p_value):
        side = "<" if comp.p_value < WELCH_ALPHA else "≥"
        welch = f"Welch p = {comp.p_value:.3g} ({side} {WELCH_ALPHA:g})"
    else:
        welch = "Welch p not available (fewer than 2 seeds)"
    others = ""
    if math.isfinite(comp.mann_whitney_p):
        others = (
            f"; Mann–Whitney p = {comp.mann_whitney_p:.3g}; bootstrap 95% CI of Δ "
            f"[{comp.delta_ci_low:+.4f}, {comp.delta_ci_high:+.4f}]"
        )
    if len({c.candidate for c in verdict.comparisons}) > 1 and math.isfinite(comp.p_holm):
        others += f"; Holm-adjusted p = {comp.p_holm:.3g}"
    return (
        f"**{comp.candidate}** {verb} **{verdict.reference}** on validation loss: "
        f"Δ = {comp.delta:+.4f} nats/token ({_fmt_float(100 * comp.rel_delta, '+.2f')}%), "
        f"{rule} under the rule ({comp.rule}); {welch}{others}."
    )


def verdict_text(verdict: Verdict) -> str:
    """The "Verdict" paragraph, generated from the comparisons on validation loss."""
    comps = [c for c in verdict.comparisons if c.metric == SELECTION_METRIC]
    winners = [c for c in comps if c.delta < 0]
    sig_winners = [c.candidate for c in winners if c.significant]
    if not comps:
        headline = f"No model could be compared with the reference **{verdict.reference}**."
    elif not winners:
        headline = f"No model beats the reference **{verdict.reference}** on validation loss."
    elif sig_winners:
        headline = (
            f"Significant improvement over **{verdict.reference}**: "
            + ", ".join(f"**{m}**" for m in sig_winners)
            + "."
        )
    else:
        headline = (
            f"{len(winners)} model(s) have lower mean validation loss than **{verdict.reference}**, "
            "but none clears the significance rule."
        )
    lines = [
        headline,
        "",
        "Each model is evaluated at its own best learning rate (lowest mean validation loss over seeds). "
        f"A difference counts as significant when |Δmean| > {SIGMA_MULTIPLIER:g}·√(σ_ref² + σ_cand²) over seeds; "
        "Welch's t-test, Mann–Whitney U and a bootstrap interval of Δ are reported alongside "
        "(with Holm's correction when several candidates face the reference).",
        "",
    ]
    lines += [f"- {_comparison_sentence(verdict, c)}" for c in comps]
    lines += [f"- ⚠ {warning}" for c in comps if (warning := _seed_warning(verdict, c))]
    return "\n".join(lines)


def _seed_warning(verdict: Verdict, comp: Comparison) -> str | None:
    """Say so when the seeds run are fewer than a t-test needs to detect the measured Δ with 80% power,
    given the measured spread (the pooled std of the two models)."""
    rows = {r.model: r for r in verdict.rows}
    ref, cand = rows[comp.reference].summaries[comp.metric], rows[comp.candidate].summaries[comp.metric]
    if min(ref.n, cand.n) < 2:
        return None
    needed = seeds_needed(math.sqrt((ref.std**2 + cand.std**2) / 2), comp.delta)
    if needed is not None and min(ref.n, cand.n) >= needed:
        return None
    return (
        f"{comp.candidate} vs {comp.reference}: {min(ref.n, cand.n)} seeds are too few to detect a Δ of "
        f"{comp.delta:+.4f} with 80% power at this spread (it needs {needed or 'more than 10,000'} per model; "
        "see `rayb power`)."
    )


def _entropy_text(verdict: Verdict, unigram_entropy_nats: float) -> str:
    """Compare every model with the unigram-entropy floor a context-free model would reach."""
    above = [r.model for r in verdict.rows if r.summaries["val_loss"].mean >= unigram_entropy_nats]
    status = (
        "every model is below it, i.e. uses context."
        if not above
        else "not below it (no better than unigram frequencies): " + ", ".join(above) + "."
    )
    return f"Unigram entropy of the training tokens (the loss of a context-free model): {unigram_entropy_nats:.4f} nats/token; {status}"


MAX_BENCHMARK_COLUMNS = 10  # per suite table; results.parquet has them all


def _suite_metrics(df: pd.DataFrame, suite: str) -> list[str]:
    """A suite's scalar metric columns (lists, such as curves, stay in results.parquet)."""
    prefix = f"{suite}."
    return [
        c for c in df.columns
        if c.startswith(prefix) and c != f"{suite}.version" and pd.api.types.is_numeric_dtype(df[c])
    ]  # fmt: skip


def _fmt_seeds(values: np.ndarray) -> str:
    if not finite_values(values).size:
        return "–"
    summary = summarize(values)
    return f"{summary.mean:.4g}" + (f" ± {summary.std:.2g}" if summary.n > 1 else "")


def benchmark_tables(verdict: Verdict, df: pd.DataFrame) -> list[str]:
    """Markdown: one table per eval suite, each model at its selected learning rate, mean ± std over
    seeds; then the evaluations that failed, with their messages."""
    suites = [c.removesuffix(".version") for c in df.columns if c.endswith(".version")]
    ok = df[df.status == "ok"]
    parts = []
    for suite in suites:
        metrics = _suite_metrics(df, suite)[:MAX_BENCHMARK_COLUMNS]
        version = ok[f"{suite}.version"].dropna()
        rows = []
        for row in verdict.rows:
            seeds = ok[(ok.model == row.model) & (ok.lr == row.lr)]
            rows.append([row.model, *(_fmt_seeds(seeds[m].to_numpy(float)) for m in metrics)])
        if metrics:
            title = f"### {suite} (v{int(version.iloc[0])})" if len(version) else f"### {suite}"
            names = [m.removeprefix(f"{suite}.") for m in metrics]
            parts += [title, "", markdown_table(["model", *names], rows), ""]
    failures = [
        [r.model, str(r.seed), suite, error]
        for r in ok.itertuples() for suite, error in json.loads(getattr(r, "eval_errors", "{}") or "{}").items()
    ]  # fmt: skip
    if failures:
        parts += [
            "### Failed evaluations",
            "",
            markdown_table(("model", "seed", "suite", "error"), failures),
            "",
        ]
    return ["## Benchmarks", "", *parts] if parts else []


def _selected_seeds(df: pd.DataFrame, row: ModelRow) -> pd.DataFrame:
    return df[(df.status == "ok") & (df.model == row.model) & (df.lr == row.lr)]


def epoch_table(verdict: Verdict, df: pd.DataFrame) -> list[list[str]]:
    """Rows (model, epoch, val loss, val ppl, each model metric): mean ± std over seeds per epoch."""
    if "epoch_val_loss" not in df:
        return []
    rows = []
    for row in verdict.rows:
        seeds = _selected_seeds(df, row)
        losses = [list(v) for v in seeds.epoch_val_loss if v is not None and len(v)]
        extras = [json.loads(v or "[]") for v in seeds.get("epoch_extra", [])]
        names = sorted({n for per_seed in extras for epoch in per_seed for n in epoch})
        for epoch in range(min(map(len, losses), default=0)):
            loss = np.array([seed[epoch] for seed in losses], dtype=float)
            metrics = [
                np.array(
                    [e[epoch].get(n, math.nan) if epoch < len(e) else math.nan for e in extras], dtype=float
                )
                for n in names
            ]
            rows.append([row.model, str(epoch + 1), _fmt_seeds(loss), _fmt_seeds(np.exp(loss)),
                         "; ".join(f"{n} {_fmt_seeds(m)}" for n, m in zip(names, metrics, strict=True)) or "–"])  # fmt: skip
    return rows


def epoch_section(report: StudyReport, image: str | None) -> list[str]:
    rows = epoch_table(report.verdict, report.table)
    if not rows:
        return []
    table = markdown_table(("model", "epoch", "val loss", "val ppl", "model metrics"), rows)
    return ["## Per-epoch validation", "", "All held-out rows at each epoch's end, mean ± std over seeds.",
            "", table, "", *([f"![{FIGURES['metrics.png']}]({image})", ""] if image else [])]  # fmt: skip


def model_metrics_section(verdict: Verdict, df: pd.DataFrame) -> list[str]:
    """A model's own metrics (`extra_metrics()`), measured over the held-out rows by the lm suite."""
    names = [c for c in df.columns if c.startswith("extra.") and pd.api.types.is_numeric_dtype(df[c])]
    if not names or df[names].isna().all().all():
        return []
    rows = [
        [row.model, *(_fmt_seeds(_selected_seeds(df, row)[n].to_numpy(float)) for n in names)]
        for row in verdict.rows
    ]
    return ["## Model metrics", "", "Reported by the models themselves over the held-out rows (– : not reported).",
            "", markdown_table(["model", *(n.removeprefix("extra.") for n in names)], rows), ""]  # fmt: skip


def summary_text(report: StudyReport) -> str:
    """summary.txt: the verdict, the comparison and the per-epoch numbers, as plain text."""
    verdict = report.verdict
    lines = [f"Study {verdict.study}: reference {verdict.reference}", ""]
    lines += [gate_headline(d).replace("**", "") for d in report.gate]
    lines += [
        "",
        verdict_text(verdict).replace("**", ""),
        "",
        markdown_table(TABLE_COLUMNS, _table_rows(verdict)),
        "",
    ]
    if rows := epoch_table(verdict, report.table):
        lines += ["Per-epoch validation (mean ± std over seeds):", ""]
        lines += [markdown_table(("model", "epoch", "val loss", "val ppl", "model metrics"), rows), ""]
    lines += [line for line in model_metrics_section(verdict, report.table) if not line.startswith("#")]
    return "\n".join(lines).rstrip() + "\n"


FIGURES = {  # file name -> alt text, in the order the report shows them
    "loss_curves.png": "loss curves",
    "pareto.png": "loss vs training FLOPs",
    "context_scaling.png": "long-context degradation",
    "speed.png": "speed and memory",
    "scaling_law.png": "scaling law",
    "metrics.png": "per-epoch validation loss, perplexity and model metrics",
    "overfit.png": "smoke protocol: overfitting curves and gradient norms",
    "babilong.png": "BABILong-style accuracy by context length",
}
SUMMARY_NAME = "summary.txt"


@dataclass
class StudyReport:
    """Everything the report shows, computed from the results table and the provenance record."""

    verdict: Verdict
    table: pd.DataFrame
    provenance: dict[str, Any]
    gate: list[GateDecision]
    efficiency: list[Efficiency]
    scaling: list[ScalingFit]
    parallels: list[tuple[str, str, bool | None, float]]  # (arch, reference arch, parallel?, p)
    figures: dict[str, bytes]  # FIGURES name -> PNG, for the figures there is data for

    @property
    def unigram_entropy_nats(self) -> float | None:
        return self.provenance.get("unigram_entropy_nats")


def selected_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Each model's finished trials at its selected (best mean validation loss) learning rate."""
    return best_by(df, "model", "lr", SELECTION_METRIC)


def read_study_dir(study_dir: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A study directory's results table and provenance record: all a report is built from.
    Raises FileNotFoundError naming what is missing."""
    study_dir = Path(study_dir)
    results, record = study_dir / RESULTS_NAME, study_dir / PROVENANCE_NAME
    for path in (results, record):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist; give a study directory (rayb_out/studies/<name>-<hash>) of a study "
                "that has finished (a study run by an older rayb: `rayb run` it again, which redoes no "
                "finished work)"
            )
    return pd.read_parquet(results), json.loads(record.read_text())


def build_report(df: pd.DataFrame, provenance: dict[str, Any]) -> StudyReport:
    """The report of a study from its results table and its provenance record (which holds the
    validated study: its name, reference, gate and extrapolation sizes)."""
    from rayb.models.sizing import parse_size
    from rayb.study import VerdictSpec

    study = provenance["study"]
    spec = VerdictSpec.model_validate(study.get("verdict", {}))
    verdict = build_verdict(df, study["name"], provenance["reference"])
    selected = selected_rows(df)
    targets = [parse_size(size) for size in spec.extrapolate_to]
    fits = fit_all(selected, targets)
    ref_arch = str(selected.loc[selected.model == verdict.reference, "arch"].iloc[0])
    ref_fit = next(f for f in fits if f.arch == ref_arch)
    parallels = [
        (f.arch, ref_arch, *parallel(f, ref_fit))
        for f in fits
        if f.arch != ref_arch and f.error is None and ref_fit.error is None
    ]
    rows = efficiency(selected, verdict.reference)
    seq_len = study.get("data", {}).get("seq_len")
    figures = {
        "loss_curves.png": plots.loss_curves(selected, study["name"], provenance.get("unigram_entropy_nats")),
        "pareto.png": plots.pareto(rows),
        "context_scaling.png": plots.context_scaling(selected, seq_len),
        "speed.png": plots.speed(selected),
        "scaling_law.png": plots.scaling_law(selected, fits, targets),
        "metrics.png": plots.epoch_metrics(selected),
        "overfit.png": plots.overfit(selected),
        "babilong.png": plots.babilong(selected),
    }
    order = [row.model for row in verdict.rows]
    gate = sorted(
        gate_all(spec.gate, selected, verdict.reference),
        key=lambda d: order.index(d.candidate) if d.candidate in order else len(order),
    )
    return StudyReport(
        verdict=verdict, table=df, provenance=provenance, gate=gate,
        efficiency=rows, scaling=fits, parallels=parallels,
        figures={name: png for name, png in figures.items() if png is not None},
    )  # fmt: skip


def _image(report: StudyReport, name: str, image_src) -> str | None:
    return image_src(name) if name in report.figures else None


def _figure_line(report: StudyReport, name: str, image_src, missing: str) -> list[str]:
    src = _image(report, name, image_src)
    return [f"![{FIGURES[name]}]({src})" if src else missing, ""]


def render_markdown(report: StudyReport, image_src=lambda name: name) -> str:
    """The full report text; `image_src` maps a figure's file name to its link (a data URI for HTML)."""
    verdict = report.verdict
    parts = [
        f"# Study report: {verdict.study}",
        "",
        "## Verdict",
        "",
        *(f"- {gate_headline(d)}" for d in report.gate),
        "",
        verdict_text(verdict),
        "",
        "## Comparison",
        "",
        markdown_table(TABLE_COLUMNS, _table_rows(verdict)),
        "",
    ]
    if report.unigram_entropy_nats is not None:
        parts += [_entropy_text(verdict, report.unigram_entropy_nats), ""]
    parts += gate_section(report.gate)
    parts += efficiency_section(report.efficiency, verdict.reference, _image(report, "pareto.png", image_src))
    parts += scaling_section(report.scaling, report.parallels, _image(report, "scaling_law.png", image_src))
    if verdict.excluded:
        rows = [
            [e["model"], f"{e['lr']:.3g}", str(e["seed"]), e["status"], str(e.get("step", "—"))]
            for e in verdict.excluded
        ]
        parts += [
            "## Excluded trials",
            "",
            markdown_table(("model", "lr", "seed", "status", "step"), rows),
            "",
        ]
    parts += epoch_section(report, _image(report, "metrics.png", image_src))
    parts += model_metrics_section(verdict, report.table)
    parts += benchmark_tables(verdict, report.table)
    if src := _image(report, "overfit.png", image_src):
        parts += [
            "### Smoke protocol: overfitting a fixed set",
            "",
            f"![{FIGURES['overfit.png']}]({src})",
            "",
        ]
    if src := _image(report, "babilong.png", image_src):
        parts += ["### BABILong-style accuracy", "", f"![{FIGURES['babilong.png']}]({src})", ""]
    parts += ["### Context scaling", ""]
    parts += _figure_line(
        report, "context_scaling.png", image_src, "Not measured: add `long_context` to eval."
    )
    parts += ["### Speed and memory", ""]
    parts += _figure_line(report, "speed.png", image_src, "Not measured: add `speed` to eval.")
    parts += ["## Loss curves", ""]
    parts += _figure_line(report, "loss_curves.png", image_src, "No training curve was logged.")
    parts += provenance_section(report.provenance)
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------- json


def _json_safe(obj: Any) -> Any:
    """Replace NaN/inf by None and numpy scalars by Python ones: strict JSON has no NaN."""
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def report_to_dict(report: StudyReport) -> dict:
    """The report's findings as plain JSON-ready data: the verdict (rows with summaries, comparisons,
    excluded), the gate decisions, efficiency, scaling fits and provenance."""
    data = dataclasses.asdict(report.verdict)
    data["unigram_entropy_nats"] = report.unigram_entropy_nats
    data["gate"] = [dataclasses.asdict(d) for d in report.gate]
    data["efficiency"] = [dataclasses.asdict(e) for e in report.efficiency]
    data["scaling"] = [dataclasses.asdict(f) for f in report.scaling]
    data["parallel"] = [
        dict(zip(("arch", "reference_arch", "parallel", "p"), p, strict=True)) for p in report.parallels
    ]
    data["provenance"] = report.provenance
    return _json_safe(data)


# --------------------------------------------------------------------------------------------- writing


def write_report(report: StudyReport, out_dir: Path) -> dict[str, Path]:
    """Write report.md (with its PNG figures), report.html (self-contained) and results.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:  # a rebuilt report must not show a figure whose data is gone
        (out_dir / name).unlink(missing_ok=True)
    for name, png in report.figures.items():
        write_atomic(out_dir / name, png)
    payload = json.dumps(report_to_dict(report), indent=2, allow_nan=False)
    page = to_html(render_markdown(report, lambda name: data_uri(report.figures[name])), report.verdict.study)
    return {
        "json": write_atomic(out_dir / JSON_NAME, (payload + "\n").encode()),
        "report": write_atomic(out_dir / REPORT_NAME, render_markdown(report).encode()),
        "summary": write_atomic(out_dir / SUMMARY_NAME, summary_text(report).encode()),
        "html": write_atomic(out_dir / HTML_NAME, page.encode()),
    }
