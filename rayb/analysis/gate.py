"""The go/no-go gate: the written rules a team applies to a candidate, applied from the study file.

Each gate metric is a ratio of means over seeds (candidate / baseline, each model at its selected
learning rate), classed "excellent", "promising", "good" or "below good" by the rule's thresholds.
A metric is graded better than parity only when its difference passes the study's significance rule;
otherwise it is graded as parity (ratio 1). The gate says GO on enough excellent or promising metrics
unless a red line is crossed (red lines read the point estimates), and INCONCLUSIVE when the pass rule
holds on the point estimates but not on the significant differences. `should_scale` is a separate
decision weighing the loss ratio against the advantages on the other metrics, with the same three
outcomes. Every decision carries the list of reasons it was made for, so the report can show its work.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from rayb.analysis.spec import GateSpec, MetricRule, parse_threshold
from rayb.analysis.stats import SignificanceRule, finite_values, sample_std, seeds_to_detect, welch

if TYPE_CHECKING:
    import pandas as pd

    from rayb.analysis.scaling import ScalingFit


GO, NO_GO, INCONCLUSIVE = "GO", "NO-GO", "INCONCLUSIVE"

GRADES = ("below good", "good", "promising", "excellent")
"""Classes from worst to best; UNGRADED metrics are outside the order, and count for nothing."""

NOT_MEASURED = "not measured"
NOT_COMPARABLE = "not comparable"  # measured under different conditions (e.g. generation lengths)
UNGRADED = (NOT_MEASURED, NOT_COMPARABLE)

_OPERATORS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass(frozen=True)
class MetricGrade:
    """One gate metric of a candidate against the baseline."""

    metric: str
    column: str
    candidate: float  # mean over the candidate's seeds
    baseline: float
    ratio: float  # candidate / baseline; NaN when not measured
    grade: str  # one of GRADES (what the pass rule counts), or one of UNGRADED
    better: bool  # the point estimate is strictly better than the baseline in the metric's direction
    p_value: float = math.nan  # Welch's t-test over seeds, shown beside the class
    point_grade: str = ""  # the class of the ratio as measured, before the significance rule
    significant: bool = False  # the difference passes the study's significance rule
    test: str = ""  # that rule with the numbers used
    seeds: tuple[int, int] = (0, 0)  # finite seed values: candidate, baseline
    seeds_needed: int | None = None  # per model, for a t-test to detect this Δ at this spread (80% power)

    @property
    def at_parity(self) -> bool:
        """Graded as parity because a better-looking difference did not pass the significance rule."""
        return self.grade != self.point_grade and self.grade not in UNGRADED

    @property
    def seeds_text(self) -> str:
        cand, base = self.seeds
        return f"{cand} seeds" if cand == base else f"{cand} and {base} seeds"


@dataclass(frozen=True)
class GateDecision:
    candidate: str
    baseline: str
    outcome: str  # GO, NO_GO or INCONCLUSIVE
    scale: str  # should_scale: "yes", "no" or "inconclusive"
    grades: list[MetricGrade]
    red_lines: list[str] = field(default_factory=list)  # each red line crossed, as a sentence
    reasons: list[str] = field(default_factory=list)  # why, in the order the rules were applied
    rule: str = ""  # the significance rule the grades rest on, in words

    @property
    def go(self) -> bool:
        return self.outcome == GO

    @property
    def should_scale(self) -> bool:
        return self.scale == "yes"

    def grade(self, metric: str) -> MetricGrade:
        return next(g for g in self.grades if g.metric == metric)

    def undecided(self) -> list[str]:
        """Each metric whose better-looking difference is not significant: what INCONCLUSIVE rests on."""
        return [_undecided_text(g) for g in self.grades if g.at_parity]


def _undecided_text(g: MetricGrade) -> str:
    needed = (
        f"~{g.seeds_needed} seeds per model would detect it at 80% power"
        if g.seeds_needed else "no number of seeds would detect it at this spread"
    )  # fmt: skip
    return f"{g.metric} {g.ratio - 1:+.1%} not significant at {g.seeds_text}; {needed}"


def _holds(condition: str, ratio: float) -> bool:
    op, limit = parse_threshold(condition)
    return _OPERATORS[op](ratio, limit)


def grade_ratio(rule: MetricRule, ratio: float) -> str:
    """The best class whose condition the ratio meets."""
    for grade in reversed(GRADES[1:]):
        if _holds(getattr(rule, grade), ratio):
            return grade
    return GRADES[0]


def _values(rows: pd.DataFrame, column: str) -> np.ndarray:
    return finite_values(rows[column].to_numpy(dtype=float)) if column in rows else np.empty(0)


def _conditions(rule: MetricRule, rows: pd.DataFrame) -> dict[str, list]:
    return {c: sorted(set(_values(rows, c).tolist())) for c in rule.conditions}


def _conditions_differ(rule: MetricRule, candidate: pd.DataFrame, baseline: pd.DataFrame) -> bool:
    return _conditions(rule, candidate) != _conditions(rule, baseline)


def measure(
    name: str,
    rule: MetricRule,
    candidate: pd.DataFrame,
    baseline: pd.DataFrame,
    significance: SignificanceRule,
) -> MetricGrade:
    """Grade one metric from the two models' seed rows. A difference in the metric's favourable direction
    that does not pass `significance` is graded as parity (ratio 1); one against it keeps its class, so
    noise never lifts a grade."""
    cand_values, base_values = _values(candidate, rule.column), _values(baseline, rule.column)
    cand = float(cand_values.mean()) if cand_values.size else math.nan
    base = float(base_values.mean()) if base_values.size else math.nan
    if not (math.isfinite(cand) and math.isfinite(base)) or base == 0:
        return MetricGrade(
            name, rule.column, cand, base, math.nan, NOT_MEASURED, False, point_grade=NOT_MEASURED
        )
    if _conditions_differ(rule, candidate, baseline):
        return MetricGrade(
            name, rule.column, cand, base, cand / base, NOT_COMPARABLE, False, point_grade=NOT_COMPARABLE
        )
    ratio = cand / base
    point = grade_ratio(rule, ratio)
    better = ratio < 1 if rule.lower_is_better else ratio > 1
    significant, test = significance.test(cand_values, base_values)
    return MetricGrade(
        name, rule.column, cand, base, ratio, point if significant or not better else grade_ratio(rule, 1.0),
        better, welch(cand_values, base_values)[1], point, significant, test, (cand_values.size, base_values.size),
        seeds_to_detect(cand - base, sample_std(cand_values), sample_std(base_values), significance.alpha),
    )  # fmt: skip


def loss_spikes(
    steps: list[int], losses: list[float], factor: float, window: int
) -> list[tuple[int, float, float]]:
    """(step, loss, running average) wherever a training loss exceeds `factor` × the mean of the
    `window` losses before it. The first `window` steps (warm-up, falling fast) are never judged."""
    values = np.asarray(losses, dtype=float)
    spikes = []
    for i in range(window, len(values)):
        average = float(values[i - window : i].mean())
        if not values[i] <= factor * average:  # a NaN or inf loss is a spike too
            spikes.append((int(steps[i]), float(values[i]), average))
    return spikes


def _spike_lines(spec: GateSpec, candidate: pd.DataFrame) -> list[str]:
    lines = []
    for row in candidate.itertuples(index=False):
        steps, losses = getattr(row, "curve_step", None), getattr(row, "curve_train_loss", None)
        if steps is None or losses is None or (isinstance(losses, float) and math.isnan(losses)):
            continue
        spikes = loss_spikes(list(steps), list(losses), spec.max_loss_spike, spec.spike_window)
        if spikes:
            step, loss, average = spikes[0]
            more = f" (and {len(spikes) - 1} more)" if len(spikes) > 1 else ""
            lines.append(
                f"loss spike: seed {row.seed}, step {step}: training loss {loss:.4g} > {spec.max_loss_spike:g} × "
                f"its {spec.spike_window}-step running average {average:.4g}{more}"
            )
    return lines


def _differences(
    rule: MetricRule, candidate: pd.DataFrame, baseline: pd.DataFrame, names: tuple[str, str]
) -> str:
    cand, base = _conditions(rule, candidate), _conditions(rule, baseline)
    return "; ".join(
        f"{column}: {names[0]} {_listed(cand[column])}, {names[1]} {_listed(base[column])}"
        for column in rule.conditions if cand[column] != base[column]
    )  # fmt: skip


def _listed(values: list) -> str:
    return "/".join(f"{v:g}" for v in values) or "none"


def _describe(g: MetricGrade, rule: MetricRule, differ: str) -> str:
    if g.grade == NOT_COMPARABLE:
        return f"{g.metric}: not comparable, measured under different conditions ({differ})"
    if g.grade == NOT_MEASURED:
        suite = g.column.split(".", 1)[0] if "." in g.column else None
        why = "baseline mean is 0" if g.baseline == 0 else f"no finite {g.column} for both models"
        hint = f" (add the `{suite}` suite to eval)" if suite and not math.isfinite(g.candidate) else ""
        return f"{g.metric}: not measured, {why}{hint}"
    thresholds = f"good {rule.good}, promising {rule.promising}, excellent {rule.excellent}"
    measured = f"{g.metric}: {g.column} {g.candidate:.4g} vs {g.baseline:.4g}, ratio {g.ratio:.3f}"
    if g.at_parity:
        return (
            f"{measured} ({g.point_grade} as measured) → parity (not significant at {g.seeds_text}: {g.test}), "
            f"counted as {g.grade}, its class at ratio 1 ({thresholds})"
        )
    significance = "significant" if g.significant else "not significant"
    return f"{measured} → {g.grade} ({thresholds}); {significance} at {g.seeds_text}: {g.test}"


def grade_label(g: MetricGrade) -> str:
    """The class as the report's tables show it. A class is a bound on the ratio, and a worse (or equal)
    value can sit inside a flattering one (a loss 0.8% worse is within "promising"'s 5%): such a value
    is named for what it is, never called by the class alone."""
    if g.at_parity:
        return f"parity (not significant at {g.seeds_text})"
    if g.better or g.grade in (GRADES[0], *UNGRADED):
        return g.grade
    direction = "equal" if g.ratio == 1 else "worse"
    significance = "significant" if g.significant else "not significant"
    return f"{direction} ({significance} at {g.seeds_text}), inside the {g.grade} bound"


def _red_lines(spec: GateSpec, grades: dict[str, MetricGrade]) -> tuple[list[str], list[str]]:
    """(red lines crossed, red lines that could not be checked). They fire on the point estimates: a
    difference too noisy to count for a candidate still stops it."""
    crossed, unchecked = [], []
    for line in spec.red_lines:
        g = grades[line.metric]
        if g.grade in UNGRADED:
            unchecked.append(f"red line on {line.metric} not checked: {line.metric} {g.grade}")
            continue
        noise = f"{'significant' if g.significant else 'not significant'} at {g.seeds_text}"
        if line.above is not None and g.ratio > line.above:
            crossed.append(
                f"{line.metric} ratio {g.ratio:.3f} is above the red line {line.above:g} ({noise})"
            )
        elif line.below is not None and g.ratio < line.below:
            crossed.append(
                f"{line.metric} ratio {g.ratio:.3f} is below the red line {line.below:g} ({noise})"
            )
    return crossed, unchecked


def scaling_violations(
    spec: GateSpec, candidate: str, selected: pd.DataFrame, reference: str, reference_fit: ScalingFit | None
) -> tuple[list[str], str | None]:
    """The red line `scaling_violation`: between each size of the candidate's architecture and the next
    (every model of that architecture in the study but the reference), the mean validation loss must fall
    by at least what the reference's fitted law L(N) = a·N^(−b) + c predicts between those parameter
    counts. Returns (violations, why it was not checked)."""
    if not spec.scaling_violation:
        return [], None
    archs = dict(zip(selected.model.astype(str), selected.arch.astype(str), strict=True))
    arch = archs[candidate]
    if arch == archs[reference]:
        return [], f"red line on scaling not checked: {arch} is the reference's architecture, whose law it is"
    same_arch = selected[(selected.arch.astype(str) == arch) & (selected.model.astype(str) != reference)]
    if same_arch.params_total.nunique() < 2:  # before pandas' groupby, which costs milliseconds a call
        return [], f"red line on scaling not checked: {arch} is trained at one size"
    sizes = same_arch.groupby("params_total")["val_loss"].agg(["mean", "var", "count"]).sort_index()
    if reference_fit is None or reference_fit.error or reference_fit.warning:
        why = "no fit" if reference_fit is None else reference_fit.error or reference_fit.warning
        return [], f"red line on scaling not checked: the reference's scaling law is not usable ({why})"
    lines = []
    for (small, a), (large, b) in zip(sizes.iterrows(), list(sizes.iterrows())[1:], strict=False):
        gained = a["mean"] - b["mean"]
        predicted = float(reference_fit.loss(small) - reference_fit.loss(large))
        if gained < predicted:
            error = math.sqrt(np.nan_to_num(a["var"] / a["count"] + b["var"] / b["count"]))
            noise = "significant" if predicted - gained > 2 * error else "not significant"
            lines.append(
                f"scaling_violation: {arch} gains {gained:.4f} nats from {int(small):,} to {int(large):,} "
                f"parameters (means over {int(a['count'])} and {int(b['count'])} seeds), less than the "
                f"{predicted:.4f} the reference's scaling law predicts between those sizes; short by "
                f"{predicted - gained:.4f} ± {error:.4f} (standard error over seeds: {noise})"
            )
    return lines, None


def _at_least(grade: str, floor: str) -> bool:
    return grade in GRADES and GRADES.index(grade) >= GRADES.index(floor)


def _beyond_parity(condition: str) -> bool:
    """Whether meeting the condition means being better than the baseline, not just as good."""
    op, limit = parse_threshold(condition)
    return {"<": limit <= 1, "<=": limit < 1, ">": limit >= 1, ">=": limit > 1}[op]


def advantage_floor(rule: MetricRule, advantage_class: str) -> str:
    """The lowest class, from `advantage_class` up, that is an advantage for this metric: one whose
    threshold is itself better than parity (memory's "good enough" is "equal": its floor is promising)."""
    for grade in GRADES[GRADES.index(advantage_class) :]:
        if _beyond_parity(getattr(rule, grade)):
            return grade
    return GRADES[-1]


def _should_scale(
    spec: GateSpec, grades: dict[str, MetricGrade], crossed: list[str], point: bool = False
) -> tuple[bool, str]:
    """The scaling decision on the graded classes, or with `point` on the classes as measured."""
    rule = spec.should_scale
    loss = grades[spec.loss_metric]
    classes = {name: g.point_grade if point else g.grade for name, g in grades.items()}
    advantages = [
        name for name, grade in classes.items()
        if name != spec.loss_metric and _at_least(grade, advantage_floor(spec.metrics[name], rule.advantage_class))
    ]  # fmt: skip
    named = ", ".join(advantages) or "none"
    if crossed:
        return False, "should scale: no, a red line is crossed"
    if loss.grade in UNGRADED:
        return False, f"should scale: no, {spec.loss_metric} {loss.grade}"
    if loss.ratio <= rule.max_loss_ratio and len(advantages) >= rule.advantages:
        return True, (
            f"should scale: yes, loss ratio {loss.ratio:.3f} ≤ {rule.max_loss_ratio:g} with "
            f"{len(advantages)} significant advantages ({named}; {rule.advantages} needed)"
        )
    if advantages and loss.ratio < rule.single_advantage_loss_ratio:
        return True, (
            f"should scale: yes, loss ratio {loss.ratio:.3f} < {rule.single_advantage_loss_ratio:g} "
            f"with a significant advantage ({named})"
        )
    return False, (
        f"should scale: no, loss ratio {loss.ratio:.3f} with {len(advantages)} significant advantage(s) ({named}); "
        f"needs ≤ {rule.max_loss_ratio:g} with {rule.advantages}, or < {rule.single_advantage_loss_ratio:g} with 1"
    )


def _pass_rule(spec: GateSpec, classes: list[str]) -> tuple[bool, str]:
    excellent = sum(grade == "excellent" for grade in classes)
    promising = sum(_at_least(grade, "promising") for grade in classes)
    passed = excellent >= spec.pass_excellent or promising >= spec.pass_promising
    return passed, (
        f"pass rule {'met' if passed else 'not met'}: {excellent} excellent (≥ {spec.pass_excellent} passes), "
        f"{promising} promising or better (≥ {spec.pass_promising} passes)"
    )


def decide(
    spec: GateSpec, candidate: pd.DataFrame, baseline: pd.DataFrame, names: tuple[str, str],
    significance: SignificanceRule | None = None, scaling: tuple[list[str], str | None] = ([], None),
) -> GateDecision:  # fmt: skip
    """Apply the gate to one candidate's seed rows against the baseline's (each at its selected lr);
    `scaling` is scaling_violations' answer for the candidate."""
    significance = significance or SignificanceRule(spec.significance, spec.alpha)
    grades = {
        name: measure(name, rule, candidate, baseline, significance) for name, rule in spec.metrics.items()
    }
    reasons = [
        _describe(g, rule, _differences(rule, candidate, baseline, names))
        for (name, rule), g in zip(spec.metrics.items(), grades.values(), strict=True)
    ]
    passed, why = _pass_rule(spec, [g.grade for g in grades.values()])
    on_points, _ = _pass_rule(spec, [g.point_grade for g in grades.values()])
    reasons.append(why + (", though it is met on the point estimates" if on_points and not passed else ""))
    crossed, unchecked = _red_lines(spec, grades)
    if spec.max_loss_spike is not None:
        crossed += _spike_lines(spec, candidate)
    crossed += scaling[0]
    unchecked += [scaling[1]] if scaling[1] else []
    reasons += [f"red line: {line}" for line in crossed] + unchecked
    scale, why = _should_scale(spec, grades, crossed)
    scale_on_points = _should_scale(spec, grades, crossed, point=True)[0]
    reasons.append(
        why + (", though it would on the point estimates" if scale_on_points and not scale else "")
    )
    outcome = NO_GO if crossed else GO if passed else INCONCLUSIVE if on_points else NO_GO
    return GateDecision(
        candidate=names[0], baseline=names[1], outcome=outcome,
        scale="yes" if scale else "inconclusive" if scale_on_points else "no",
        grades=list(grades.values()), red_lines=crossed, reasons=reasons, rule=significance.describe(),
    )  # fmt: skip


def gate_all(
    spec: GateSpec, selected: pd.DataFrame, reference: str, significance: SignificanceRule | None = None,
    reference_fit: ScalingFit | None = None,
) -> list[GateDecision]:  # fmt: skip
    """The gate for every candidate (default: every trained model but the reference; pretrained
    references are reference points, not candidates) in `selected`, the results rows of each model
    at its selected learning rate; `significance` defaults to the gate's own rule with fixed seeds, and
    `reference_fit` is the reference architecture's scaling law, for the scaling_violation red line."""
    by_model = {str(m): rows for m, rows in selected.groupby("model", sort=False)}
    if reference not in by_model:
        return []
    pretrained = set(selected.model[selected.pretrained.astype(bool)]) if "pretrained" in selected else set()
    candidates = spec.candidates or [m for m in by_model if m != reference and m not in pretrained]
    return [
        decide(
            spec,
            by_model[name],
            by_model[reference],
            (name, reference),
            significance,
            scaling_violations(spec, name, selected, reference, reference_fit),
        )  # fmt: skip
        if name in by_model
        else GateDecision(
            name,
            reference,
            outcome=NO_GO,
            scale="no",
            grades=[],
            reasons=[f"{name} has no finished trial to gate"],
        )  # fmt: skip
        for name in candidates
    ]
