"""Several studies side by side: each model at its selected learning rate, its difference from its
own study's reference, and its gate decision, in one table; plus one loss-vs-compute plot."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from rayb.analysis.efficiency import pareto_front
from rayb.files import digest, write_atomic
from rayb.report import plots
from rayb.report.html import to_html
from rayb.report.sections import fmt, gate_headline, markdown_table, verdict_text
from rayb.report.study_report import StudyReport, build_report, read_study_dir

HEADER = ("study", "model", "arch", "params", "training FLOPs", "seeds", "val loss mean ± std",
          "Δ vs study ref", "significant?", "gate")  # fmt: skip
PLOT_NAME = "pareto.png"


@dataclass
class Comparison:
    reports: list[StudyReport]
    rows: list[list[str]]
    notes: list[str]
    pareto: bytes | None


def _rows(report: StudyReport) -> list[list[str]]:
    verdict, flops = report.verdict, {e.model: e.train_flops for e in report.efficiency}
    gate = {d.candidate: d.outcome + (", scale" if d.should_scale else "") for d in report.gate}
    rows = []
    for row in verdict.rows:
        comp = verdict.comparison(row.model, "val_loss")
        loss = row.summaries["val_loss"]
        rows.append([
            verdict.study, row.model, row.arch, f"{row.params_total:,}", fmt(flops.get(row.model, math.nan), ".3g"),
            str(row.n_seeds), f"{loss.mean:.4f} ± {loss.std:.4f}",
            "ref" if comp is None else f"{comp.delta:+.4f} ({fmt(100 * comp.rel_delta, '+.2f')}%)",
            "—" if comp is None else ("yes" if comp.significant else "no"), gate.get(row.model, "—"),
        ])  # fmt: skip
    return rows


def compare_studies(study_dirs: list[Path]) -> Comparison:
    """Build each study's report from its directory and line them up."""
    reports = [build_report(*read_study_dir(d)) for d in study_dirs]
    data = {digest(r.provenance["study"]["data"]) for r in reports}
    notes = []
    if len(data) > 1:
        notes.append(
            "⚠ These studies differ in their data (sources, tokenizer, context or budget): losses are "
            "comparable within a study, not across studies."
        )
    points = [
        dataclasses.replace(e, model=f"{r.verdict.study}/{e.model}") for r in reports for e in r.efficiency
    ]
    front = pareto_front([(e.train_flops, e.val_loss) for e in points])
    points = [dataclasses.replace(e, pareto=on) for e, on in zip(points, front, strict=True)]
    return Comparison(reports, [row for r in reports for row in _rows(r)], notes, plots.pareto(points))


def render_markdown(comparison: Comparison) -> str:
    parts = [
        f"# Comparison of {len(comparison.reports)} studies",
        "",
        markdown_table(HEADER, comparison.rows),
        "",
    ]
    parts += [*comparison.notes, ""] if comparison.notes else []
    for report in comparison.reports:
        parts += [
            f"## {report.verdict.study}",
            "",
            f"study hash `{report.provenance.get('fingerprint', '?')}`",
            "",
        ]
        parts += [verdict_text(report.verdict).split("\n", 1)[0], ""]
        parts += [f"- {gate_headline(d)}" for d in report.gate] + [""]
    if comparison.pareto:
        parts += [
            "## Loss vs training FLOPs, all studies",
            "",
            f"![loss vs training FLOPs]({PLOT_NAME})",
            "",
        ]
    return "\n".join(parts)


def write_comparison(comparison: Comparison, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(comparison)
    files = {"report": write_atomic(out_dir / "comparison.md", markdown.encode())}
    if comparison.pareto:
        files["plot"] = write_atomic(out_dir / PLOT_NAME, comparison.pareto)
    page = to_html(markdown, "rayb comparison", {PLOT_NAME: comparison.pareto})
    files["html"] = write_atomic(out_dir / "comparison.html", page.encode())
    return files
