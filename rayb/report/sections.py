"""Markdown for the report's decision and evidence sections: the gate, efficiency, scaling laws and
provenance. Each function turns analysis values into lines; none computes anything."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import yaml

from rayb.analysis.efficiency import Efficiency
from rayb.analysis.gate import GateDecision
from rayb.analysis.scaling import MIN_SIZES, ScalingFit


def markdown_table(header: Sequence[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table ('|' in cells escaped)."""

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def fmt(x: float, spec: str = ".4g") -> str:
    """A float, with a dash for NaN/inf."""
    return format(x, spec) if math.isfinite(x) else "—"


def gate_headline(decision: GateDecision) -> str:
    """GO or NO-GO with the short why; should_scale is the gate's separate, second decision."""
    if decision.go:
        go = "**GO**"
    elif decision.red_lines:
        go = f"**NO-GO** ({len(decision.red_lines)} red line{'s' if len(decision.red_lines) > 1 else ''})"
    else:
        go = "**NO-GO** (pass rule not met)"
    scale = "should_scale: yes" if decision.should_scale else "should_scale: no"
    return f"Gate, **{decision.candidate}** vs **{decision.baseline}**: {go}; {scale}."


def gate_section(decisions: list[GateDecision]) -> list[str]:
    """Per candidate: the graded metrics and every reason for the decision."""
    if not decisions:
        return []
    parts = ["## Gate", ""]
    for d in decisions:
        parts += [f"### {d.candidate} vs {d.baseline}", "", gate_headline(d), ""]
        rows = [
            [g.metric, g.column, fmt(g.candidate), fmt(g.baseline), fmt(g.ratio, ".3f"), g.grade, fmt(g.p_value, ".2g")]
            for g in d.grades
        ]  # fmt: skip
        if rows:
            header = ("metric", "column", d.candidate, d.baseline, "ratio", "class", "Welch p")
            parts += [markdown_table(header, rows), ""]
        parts += [f"- {reason}" for reason in d.reasons] + [""]
    return parts


def efficiency_section(rows: list[Efficiency], reference: str, pareto_image: str | None) -> list[str]:
    if not rows:
        return []
    table = [
        [
            r.model + (" (ref)" if r.model == reference else ""), f"{r.params:,}", fmt(r.train_flops, ".3g"),
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
        "",
        markdown_table(("package", "version"), [[k, v] for k, v in provenance.get("versions", {}).items()]),
        "",
        "Study file, validated, with every default filled in:",
        "",
        "```yaml",
        yaml.safe_dump(provenance.get("study", {}), sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return lines
