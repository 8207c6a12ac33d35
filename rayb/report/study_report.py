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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rayb import storage
from rayb.analysis.efficiency import Efficiency, efficiency
from rayb.analysis.gate import GateDecision, gate_all
from rayb.analysis.scaling import ScalingFit, fit_all, parallel
from rayb.analysis.sequential import Round, replay, seed_values
from rayb.analysis.verdict import Verdict, build_verdict, selected_rows
from rayb.files import read_json, write_atomic
from rayb.report import plots
from rayb.report.html import to_html
from rayb.report.provenance import PROVENANCE_NAME
from rayb.report.sections import (
    DECODES_ALL,
    TABLE_COLUMNS,
    benchmark_tables,
    check_marks,
    efficiency_section,
    entropy_text,
    epoch_table,
    footnote,
    gate_headline,
    gate_section,
    markdown_table,
    model_metrics_section,
    provenance_section,
    rounds_section,
    scaling_section,
    table_rows,
    verdict_text,
)
from rayb.results import RESULTS_NAME, read_results

REPORT_NAME = "report.md"


HTML_NAME = "report.html"


JSON_NAME = "results.json"


def epoch_section(report: StudyReport, image: str | None) -> list[str]:
    rows = epoch_table(report.verdict, report.table)
    if not rows:
        return []
    table = markdown_table(("model", "epoch", "val loss", "val ppl", "model metrics"), rows)
    return ["## Per-epoch validation", "", "All held-out rows at each epoch's end, mean ± std over seeds.",
            "", table, "", *([f"![{FIGURES['metrics.png']}]({image})", ""] if image else [])]  # fmt: skip


def summary_text(report: StudyReport) -> str:
    """summary.txt: the verdict, the comparison and the per-epoch numbers, as plain text."""
    verdict = report.verdict
    lines = [f"Study {verdict.study}: reference {verdict.reference}", ""]
    lines += [gate_headline(d).replace("**", "") for d in report.gate]
    lines += [f"⚠ {warning}" for warning in report.size_warnings]
    lines += [line for line in rounds_section(report.rounds, report.design) if not line.startswith("#")]
    lines += [
        "",
        verdict_text(verdict).replace("**", ""),
        "",
        markdown_table(TABLE_COLUMNS, table_rows(verdict)),
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
    rounds: list[Round] = dataclasses.field(default_factory=list)  # adaptive seeds, replayed from the table
    design: str = ""  # the adaptive seeds' sequential design, in words
    size_warnings: list[str] = dataclasses.field(default_factory=list)  # analysis/comparability.py

    @property
    def unigram_entropy_nats(self) -> float | None:
        return self.provenance.get("unigram_entropy_nats")


def read_study_dir(study_dir: Path | str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A study directory's results table and provenance record (on local disk or object storage): all a
    report is built from. Raises FileNotFoundError naming what is missing."""
    results, record = storage.join(study_dir, RESULTS_NAME), storage.join(study_dir, PROVENANCE_NAME)
    for location in (results, record):
        if not storage.exists(location):
            raise FileNotFoundError(
                f"{location} does not exist; give a study directory (rayb_out/studies/<name>-<hash>) of a "
                "study that has finished (a study run by an older rayb: `rayb run` it again, which redoes no "
                "finished work)"
            )
    return read_results(storage.fetch(results)), read_json(record)


def build_report(df: pd.DataFrame, provenance: dict[str, Any]) -> StudyReport:
    """The report of a study from its results table and its provenance record (which holds the
    validated study: its name, reference, gate and extrapolation sizes)."""
    from rayb.analysis.spec import SeedRoundsSpec, VerdictSpec, significance_rule
    from rayb.models.sizing import parse_size

    study = provenance["study"]
    spec = VerdictSpec.model_validate(study.get("verdict", {}))
    seed_rounds = SeedRoundsSpec.model_validate(study["seed_rounds"]) if study.get("seed_rounds") else None
    rule = significance_rule(spec.gate, seed_rounds)
    verdict = build_verdict(df, study["name"], provenance["reference"], rule)
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
        gate_all(spec.gate, selected, verdict.reference, rule, ref_fit),
        key=lambda d: order.index(d.candidate) if d.candidate in order else len(order),
    )
    rounds = []
    if rule.rounds is not None:
        column = spec.gate.metrics[spec.gate.loss_metric].column
        rounds = replay(seed_values(selected, column), verdict.reference, rule.rounds)
    return StudyReport(
        verdict=verdict, table=df, provenance=provenance, gate=gate,
        efficiency=rows, scaling=fits, parallels=parallels,
        figures={name: png for name, png in figures.items() if png is not None},
        rounds=rounds, design=rule.rounds.describe() if rule.rounds else "",
        size_warnings=_size_warnings(df, study, verdict.reference, spec.gate.candidates),
    )  # fmt: skip


def _size_warnings(df: pd.DataFrame, study: dict[str, Any], reference: str, candidates) -> list[str]:
    """analysis/comparability.py's warnings, on the counts the results table recorded for each model."""
    from rayb.analysis.comparability import Counted, size_warnings
    from rayb.models.spec import ModelSpec

    def known(value):  # a count the trial did not record is 0 or NaN in the table
        return value if pd.notna(value) and value > 0 else None

    counted = df[df.params_total > 0].drop_duplicates("model")
    counts = {
        row.model: Counted(row.arch, json.loads(row.model_config), int(row.params_total),
                           known(row.params_non_embedding), known(row.train_flops_per_token))
        for row in counted.itertuples()
    }  # fmt: skip
    models = [ModelSpec.model_validate(m) for m in study["models"]]
    return size_warnings(models, counts, reference, candidates, study.get("train", {}).get("flops_budget"))


def _image(report: StudyReport, name: str) -> str | None:
    return name if name in report.figures else None


def _figure_line(report: StudyReport, name: str, missing: str) -> list[str]:
    src = _image(report, name)
    return [f"![{FIGURES[name]}]({src})" if src else missing, ""]


def render_markdown(report: StudyReport) -> str:
    """The full report text, linking each figure by its file name."""
    verdict = report.verdict
    parts = [
        f"# Study report: {verdict.study}",
        "",
        "## Verdict",
        "",
        *(f"- {gate_headline(d)}" for d in report.gate),
        *(f"- ⚠ {warning}" for warning in report.size_warnings),
        *(f"- ⚠ {model}: {why}" for model, why in check_marks(report.provenance, DECODES_ALL).items()),
        "",
        verdict_text(verdict),
        "",
        "## Comparison",
        "",
        markdown_table(TABLE_COLUMNS, table_rows(verdict, check_marks(report.provenance, None))),
        "",
        *footnote(check_marks(report.provenance, None)),
    ]
    if report.unigram_entropy_nats is not None:
        parts += [entropy_text(verdict, report.unigram_entropy_nats), ""]
    parts += rounds_section(report.rounds, report.design)
    parts += gate_section(report.gate)
    parts += efficiency_section(
        report.efficiency, verdict.reference, _image(report, "pareto.png"),
        check_marks(report.provenance, DECODES_ALL),
    )  # fmt: skip
    parts += scaling_section(report.scaling, report.parallels, _image(report, "scaling_law.png"))
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
    parts += epoch_section(report, _image(report, "metrics.png"))
    parts += model_metrics_section(verdict, report.table)
    parts += benchmark_tables(verdict, report.table, report.provenance)
    if src := _image(report, "overfit.png"):
        parts += [
            "### Smoke protocol: overfitting a fixed set",
            "",
            f"![{FIGURES['overfit.png']}]({src})",
            "",
        ]
    if src := _image(report, "babilong.png"):
        parts += ["### BABILong-style accuracy", "", f"![{FIGURES['babilong.png']}]({src})", ""]
    parts += ["### Context scaling", ""]
    parts += _figure_line(report, "context_scaling.png", "Not measured: add `long_context` to eval.")
    parts += ["### Speed and memory", ""]
    parts += _figure_line(report, "speed.png", "Not measured: add `speed` to eval.")
    parts += ["## Loss curves", ""]
    parts += _figure_line(report, "loss_curves.png", "No training curve was logged.")
    parts += provenance_section(report.provenance)
    return "\n".join(parts)


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
    data["gate"] = [
        dataclasses.asdict(d) | {"go": d.go, "should_scale": d.should_scale, "undecided": d.undecided()}
        for d in report.gate
    ]
    data["efficiency"] = [dataclasses.asdict(e) for e in report.efficiency]
    data["scaling"] = [dataclasses.asdict(f) for f in report.scaling]
    data["parallel"] = [
        dict(zip(("arch", "reference_arch", "parallel", "p"), p, strict=True)) for p in report.parallels
    ]
    data["size_warnings"] = report.size_warnings
    data["provenance"] = report.provenance
    return _json_safe(data)


def write_report(report: StudyReport, out_dir: Path) -> dict[str, Path]:
    """Write report.md (with its PNG figures), report.html (self-contained) and results.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:  # a rebuilt report must not show a figure whose data is gone
        (out_dir / name).unlink(missing_ok=True)
    for name, png in report.figures.items():
        write_atomic(out_dir / name, png)
    payload = json.dumps(report_to_dict(report), indent=2, allow_nan=False)
    markdown = render_markdown(report)
    return {
        "json": write_atomic(out_dir / JSON_NAME, (payload + "\n").encode()),
        "report": write_atomic(out_dir / REPORT_NAME, markdown.encode()),
        "summary": write_atomic(out_dir / SUMMARY_NAME, summary_text(report).encode()),
        "html": write_atomic(
            out_dir / HTML_NAME, to_html(markdown, report.verdict.study, report.figures).encode()
        ),
    }
