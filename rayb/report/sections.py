"""The report's sections as markdown (and the comparison table for the terminal): the verdict and its
table, the gate, efficiency, scaling laws, per-benchmark and per-epoch tables, model metrics and
provenance. Each function turns analysis values into lines; none computes anything."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import yaml
from rich.table import Table

from rayb.analysis.efficiency import Efficiency
from rayb.analysis.gate import INCONCLUSIVE, UNGRADED, GateDecision, grade_label
from rayb.analysis.scaling import MIN_SIZES, ScalingFit
from rayb.analysis.sequential import Round
from rayb.analysis.stats import Comparison, Summary, finite_values, seeds_to_detect, summarize
from rayb.analysis.verdict import SELECTION_METRIC, ModelRow, Verdict
from rayb.eval.scoring import describe_evaluation_precision
from rayb.train.spec import TrainSpec


def markdown_table(header: Sequence[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table ('|' in cells escaped)."""

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def fmt(x: float, spec: str = ".4g") -> str:
    """A float, with a dash for NaN/inf."""
    return format(x, spec) if math.isfinite(x) else "—"


def gate_headline(decision: GateDecision) -> str:
    """GO, NO-GO or INCONCLUSIVE with what it rests on: the graded metrics with their Δ, the significance
    rule and the seeds. should_scale is the gate's separate, second decision."""
    head = f"Gate, **{decision.candidate}** vs **{decision.baseline}**: **{decision.outcome}**"
    graded = [g for g in decision.grades if g.grade not in UNGRADED]
    if not graded:
        return f"{head}; {'; '.join(decision.reasons)}."
    if decision.outcome == INCONCLUSIVE:
        head += ": " + "; ".join(decision.undecided())
    elif decision.red_lines:
        head += f" ({len(decision.red_lines)} red line{'s' if len(decision.red_lines) > 1 else ''})"
    elif not decision.go:
        head += " (pass rule not met)"
    basis = ", ".join(f"{g.metric} {g.ratio - 1:+.1%} {grade_label(g)}" for g in graded)
    return (
        f"{head}; should_scale: {decision.scale}. On {basis}; significance: {decision.rule}, "
        f"at {graded[0].seeds_text}."
    )


def gate_section(decisions: list[GateDecision]) -> list[str]:
    """Per candidate: the graded metrics and every reason for the decision."""
    if not decisions:
        return []
    parts = ["## Gate", ""]
    for d in decisions:
        parts += [f"### {d.candidate} vs {d.baseline}", "", gate_headline(d), ""]
        rows = [
            [g.metric, g.column, fmt(g.candidate), fmt(g.baseline), fmt(g.ratio, ".3f"), grade_label(g),
             *(["—"] * 3 if g.grade in UNGRADED else [fmt(g.p_value, ".2g"), "yes" if g.significant else "no",
                                                     g.seeds_text])]
            for g in d.grades
        ]  # fmt: skip
        if rows:
            header = (
                "metric",
                "column",
                d.candidate,
                d.baseline,
                "ratio",
                "class",
                "Welch p",
                "significant?",
                "seeds",
            )
            parts += [markdown_table(header, rows), ""]
        parts += [f"- {reason}" for reason in d.reasons] + [""]
    return parts


def rounds_section(rounds: list[Round], design: str) -> list[str]:
    """Adaptive seeds: per model, the seeds run and why it stopped; then each round's looks."""
    if not rounds:
        return []
    runs = {model: (n, "still open: its next round has not run") for model, n in rounds[-1].seeds.items()}
    for r in rounds:
        runs |= {model: (r.seeds[model], why) for model, why in r.stopped.items()}
    looks = [
        [str(r.number), ", ".join(f"{m} {n}" for m, n in r.seeds.items()),
         "; ".join(f"{x.candidate} Δ {x.delta:+.4f}, p {fmt(x.p_value, '.2g')} vs {x.level:.2g}: {x.state}" for x in r.looks),
         "; ".join(f"{m}: {why}" for m, why in r.stopped.items()) or "—"]
        for r in rounds
    ]  # fmt: skip
    return [
        "## Seeds",
        "",
        f"Seeds were added in rounds: {design}.",
        "",
        *(f"- {model}: {n} seeds, {why}" for model, (n, why) in runs.items()),
        "",
        markdown_table(("round", "seeds", "comparisons with the reference", "stopped"), looks),
        "",
    ]


def efficiency_section(
    rows: list[Efficiency], reference: str, pareto_image: str | None, marks: dict[str, str] | None = None
) -> list[str]:
    if not rows:
        return []
    table = [
        [
            _marked(r.model, marks) + (" (ref)" if r.model == reference else ""), f"{r.params:,}", fmt(r.train_flops, ".3g"),
            fmt(r.val_loss), fmt(r.ppl, ".3f"), fmt(r.arch_efficiency, ".3f"), fmt(r.tokens_per_s, ".4g"),
            fmt(r.compute_efficiency, ".3f"), "yes" if r.pareto else "no",
        ]
        for r in rows
    ]  # fmt: skip
    header = ("model", "params", "training FLOPs", "val loss", "ppl", "ppl / ref ppl",
              "gen tokens/s", "compute efficiency vs ref", "Pareto")  # fmt: skip
    parts = [
        "## Efficiency",
        "",
        markdown_table(header, table),
        "",
        "Architecture efficiency is perplexity over the reference's (below 1 is better). Compute efficiency "
        "is generation throughput per unit perplexity, over the reference's (above 1 is better; needs the "
        "`speed` suite). A model is on the Pareto frontier when no other reaches a lower validation loss "
        "with no more training FLOPs.",
        "",
        *footnote(marks),
    ]
    if pareto_image:
        parts += [f"![loss vs training FLOPs]({pareto_image})", ""]
    return parts


def scaling_section(
    fits: list[ScalingFit], parallels: list[tuple[str, str, bool | None, float]], image: str | None
) -> list[str]:
    parts = ["## Scaling laws", ""]
    fitted = [f for f in fits if f.error is None]
    if not fitted:
        sizes = ", ".join(f"{f.arch} {len(f.sizes)}" for f in fits)
        return parts + [
            f"No fit: L(N) = a·N^(−b) + c needs at least {MIN_SIZES} sizes of an architecture "
            f"(sizes per architecture here: {sizes}).",
            "",
        ]
    targets = list(fitted[0].predictions)
    rows = [
        [f.arch, ", ".join(f"{s:,}" for s in f.sizes), str(f.points), fmt(f.a, ".4g"),
         f"{fmt(f.b, '.3f')} [{fmt(f.b_low, '.3f')}, {fmt(f.b_high, '.3f')}]", fmt(f.c, ".3f"),
         *(f"{fmt(f.predictions[t][0], '.3f')} [{fmt(f.predictions[t][1], '.3f')}, {fmt(f.predictions[t][2], '.3f')}]"
           for t in targets)]
        for f in fitted
    ]  # fmt: skip
    header = ("arch", "sizes", "points", "a", "b [95% CI]", "c", *(f"L({t}) [95% CI]" for t in targets))
    parts += [markdown_table(header, rows), ""]
    parts += [f"- {f.arch}: no fit, {f.error}" for f in fits if f.error is not None]
    parts += [f"- ⚠ {f.arch}: {f.warning}" for f in fitted if f.warning]
    for arch, ref_arch, same, p in parallels:
        if same is None:
            parts.append(f"- {arch} vs {ref_arch}: cannot tell whether the curves are parallel")
        else:
            verdict = "parallel (exponents equal within error)" if same else "not parallel"
            parts.append(f"- {arch} vs {ref_arch}: {verdict}, p = {p:.3g} for equal b")
    parts += [
        "",
        "Each seed at each size is a point; intervals are from a bootstrap over seeds within each size. "
        "N is the total parameter count.",
        "",
    ]
    if image:
        parts += [f"![scaling law]({image})", ""]
    return parts


DECODES_ALL = "decoding"  # check_marks' suite for tables with decode-based columns (efficiency: gen tokens/s)


def check_marks(provenance: dict[str, Any], suite: str | None) -> dict[str, str]:
    """{model: why} for the models whose scores in `suite` rest on a self-check that failed and that the
    study file overrode: a fast path's failure touches every score (suite None: the comparison table);
    a decoding failure the suites that decode, and DECODES_ALL."""
    from rayb.eval.registry import parse_suite

    decodes = suite == DECODES_ALL or (suite is not None and parse_suite(suite)[0].decodes)
    return {
        c["model"]: f"{c['check']} self-check failed and was overridden (relative error {c['error']:.2g}, "
        f"tolerance {c['tolerance']:.0e}; {c['path']})"
        for c in provenance.get("self_checks", [])
        if c.get("overridden") and (c["check"] == "fast path" or decodes)
    }


def _marked(model: str, marks: dict[str, str] | None) -> str:
    return f"{model} †" if marks and model in marks else model


def footnote(marks: dict[str, str] | None) -> list[str]:
    return [f"† {model}: {why}" for model, why in (marks or {}).items()] + ([""] if marks else [])


def self_checks_section(provenance: dict[str, Any]) -> list[str]:
    """The checks run before training (models/selfcheck.py), and whether the packages were the tested set."""
    checks = provenance.get("self_checks")
    pinned = provenance.get("pinned")
    if checks is None and pinned is None:
        return []
    lines = ["### Self-checks", ""]
    if pinned is not None:
        differs = pinned.get("differs", {})
        lines += [
            "Installed packages: the tested set (rayb/constraints.txt)." if not differs
            else "Installed packages differ from the tested set (rayb/constraints.txt): "
            + ", ".join(f"{name} {have or 'missing'} (tested {want})" for name, (want, have) in differs.items()),
            "",
        ]  # fmt: skip
    rows = [
        [c["model"], c["check"], c["path"] or "—", f"{c['device']} {c['dtype']}".strip(),
         "—" if c["error"] is None else fmt(c["error"], ".2g"),
         "—" if c["tolerance"] is None else f"{c['tolerance']:.0e}", f"{c['seconds']:.2f}",
         ("FAILED, overridden" if c["overridden"] else "ok") if c["error"] is not None else c["note"]]
        for c in checks or []
    ]  # fmt: skip
    if rows:
        header = ("model", "check", "path", "device", "relative error", "tolerance", "seconds", "result")
        lines += [markdown_table(header, rows), ""]
    return lines


def provenance_section(provenance: dict[str, Any]) -> list[str]:
    if not provenance:
        return ["## Provenance", "", "Not recorded (this study ran before rayb recorded provenance).", ""]
    git = provenance.get("git") or {}
    commit = git.get("commit", "not a git checkout") + (
        " (with uncommitted changes)" if git.get("dirty") else ""
    )
    hardware = provenance.get("hardware", {})
    cluster = hardware.get("ray_cluster", {})
    lines = [
        "## Provenance",
        "",
        f"- study hash: `{provenance.get('fingerprint', '?')}`; started {provenance.get('started', '?')}",
        f"- rayb commit: `{commit}`",
        f"- driver: {hardware.get('cpu', '?')}, {hardware.get('logical_cpus', '?')} logical CPUs, "
        f"{hardware.get('memory_gib', '?')} GiB, GPUs: {', '.join(hardware.get('gpus') or []) or 'none'} "
        f"({hardware.get('host_os', '?')})",
        f"- Ray cluster: {json.dumps(cluster, sort_keys=True)}",
        *_precision_lines(provenance.get("study", {})),
        "",
        markdown_table(("package", "version"), [[k, v] for k, v in provenance.get("versions", {}).items()]),
        "",
        *self_checks_section(provenance),
        "Study file, validated, with every default filled in:",
        "",
        "```yaml",
        yaml.safe_dump(provenance.get("study", {}), sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return lines


def _precision_lines(study: dict[str, Any]) -> list[str]:
    """The precision the models trained in, the one every evaluation ran in (the same for all), and
    whether training shared its GPUs."""
    if "train" not in study:
        return []
    train = TrainSpec.model_validate(study["train"])
    precision = train.resolved_precision
    lines = [
        f"- precision: training {precision}; every evaluation (scores, speed and memory) "
        f"{describe_evaluation_precision(precision)}, the same for every architecture"
    ]
    if train.use_gpu and train.gpus_per_worker < 1:
        lines.append(
            f"- shared GPUs: each training worker held {train.gpus_per_worker:g} of a GPU (its memory capped "
            "to that share): training throughput (`tokens_per_s`) was measured on a shared device and "
            "depends on what else ran there; the `speed` suite had a GPU of its own"
        )
    return lines


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


def _fmt_params(n: int) -> str:
    """Exact parameter count: matched-size claims are checked to the last parameter."""
    return f"{n:,}"


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
    return f"{comp.delta:+.4f} ({fmt(100 * comp.rel_delta, '+.2f')}%)"


def table_rows(verdict: Verdict, marks: dict[str, str] | None = None) -> list[list[str]]:
    """Cell strings of the comparison table, shared by the rich and markdown renderings; `marks` (see
    `check_marks`) puts a dagger beside a model whose scores a failed, overridden self-check affects."""
    out = []
    for row in verdict.rows:
        is_ref = row.model == verdict.reference
        comp = None if is_ref else verdict.comparison(row.model, SELECTION_METRIC)
        s = row.summaries
        out.append(
            [
                _marked(row.model, marks) + (" (ref)" if is_ref else ""),
                row.arch,
                _fmt_params(row.params_total),
                f"{row.lr:.3g}",
                str(row.n_seeds),
                _fmt_summary(s["val_loss"]),
                _fmt_mean(s.get("val_ppl"), ".2f"),
                _fmt_mean(s.get("val_bpb"), ".4f"),
                "ref" if is_ref else _fmt_delta(comp),
                "—" if comp is None else fmt(comp.p_value, ".3g"),
                "—" if comp is None else ("yes" if comp.significant else "no"),
            ]
        )
    return out


def format_table(verdict: Verdict) -> Table:
    """The comparison table the CLI prints (same cells as the markdown report)."""
    table = Table(
        title=f"{verdict.study}: each model at its best lr, vs {verdict.reference}; significant: {verdict.rule}"
    )
    for col in TABLE_COLUMNS:
        numeric = col not in ("model", "arch", "significant?")
        table.add_column(col, justify="right" if numeric else "left")
    for cells in table_rows(verdict):
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
        f"Δ = {comp.delta:+.4f} nats/token ({fmt(100 * comp.rel_delta, '+.2f')}%), "
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
        f"A difference counts as significant under the study's rule: {verdict.rule}. "
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
    needed = seeds_to_detect(comp.delta, ref.std, cand.std)
    if needed is not None and min(ref.n, cand.n) >= needed:
        return None
    return (
        f"{comp.candidate} vs {comp.reference}: {min(ref.n, cand.n)} seeds are too few to detect a Δ of "
        f"{comp.delta:+.4f} with 80% power at this spread (it needs {needed or 'more than 10,000'} per model; "
        "see `rayb power`)."
    )


def entropy_text(verdict: Verdict, unigram_entropy_nats: float) -> str:
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
        if c.startswith(prefix) and c not in (f"{suite}.version", f"{suite}.truncated")
        and pd.api.types.is_numeric_dtype(df[c])
    ]  # fmt: skip


def _fmt_seeds(values: np.ndarray) -> str:
    if not finite_values(values).size:
        return "–"
    summary = summarize(values)
    return f"{summary.mean:.4g}" + (f" ± {summary.std:.2g}" if summary.n > 1 else "")


def benchmark_tables(
    verdict: Verdict, df: pd.DataFrame, provenance: dict[str, Any] | None = None
) -> list[str]:
    """Markdown: one table per eval suite, each model at its selected learning rate, mean ± std over
    seeds, a dagger on the scores a failed, overridden self-check affects; then the evaluations that
    failed, with their messages."""
    suites = [c.removesuffix(".version") for c in df.columns if c.endswith(".version")]
    ok = df[df.status == "ok"]
    parts = []
    for suite in suites:
        metrics = _suite_metrics(df, suite)[:MAX_BENCHMARK_COLUMNS]
        version = ok[f"{suite}.version"].dropna()
        marks = check_marks(provenance or {}, suite)
        rows = []
        for row in verdict.rows:
            seeds = ok[(ok.model == row.model) & (ok.lr == row.lr)]
            rows.append([_marked(row.model, marks), *(_fmt_seeds(seeds[m].to_numpy(float)) for m in metrics)])
        if metrics:
            title = f"### {suite} (v{int(version.iloc[0])})" if len(version) else f"### {suite}"
            names = [m.removeprefix(f"{suite}.") for m in metrics]
            parts += [title, "", markdown_table(["model", *names], rows), "", *footnote(marks)]
            parts += truncation_note(ok, suite)
    failures = [
        [r.model, str(r.seed), suite, error]
        for r in ok.itertuples()
        for suite, error in r.eval_errors.items()
    ]
    if failures:
        parts += [
            "### Failed evaluations",
            "",
            markdown_table(("model", "seed", "suite", "error"), failures),
            "",
        ]
    return ["## Benchmarks", "", *parts] if parts else []


def truncation_note(ok: pd.DataFrame, suite: str) -> list[str]:
    """How many of an lm-eval task's samples lost the start of their context to fit the model's."""
    cut, samples = ok.get(f"{suite}.truncated"), ok.get(f"{suite}.sample_len")
    if cut is None or samples is None or not (cut > 0).any():
        return []
    worst = ok.loc[cut.idxmax()]
    return [
        f"Contexts cut to fit: up to {int(worst[cut.name])} of {int(worst[samples.name])} samples per "
        f"checkpoint ({worst.model}) lost their start, so this task measures less than it says.",
        "",
    ]


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
        extras = [list(v) for v in seeds.epoch_extra]
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
