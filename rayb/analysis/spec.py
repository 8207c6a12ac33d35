"""The `verdict:` part of a study: the reference, the go/no-go gate's metrics, thresholds and red lines,
`should_scale`, and the sizes scaling-law fits extrapolate to. The gate itself is `rayb/analysis/gate.py`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rayb.eval.registry import BENCHMARKS
from rayb.spec import Spec, added_field

THRESHOLD = re.compile(r"^\s*(<=|<|>=|>)\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*$")


def parse_threshold(text: str) -> tuple[str, float]:
    """'<= 1.15' -> ('<=', 1.15): a condition on the candidate / baseline ratio of a metric's mean."""
    match = THRESHOLD.match(text)
    if not match:
        raise ValueError(f"'{text}' is not a ratio condition; write e.g. '<= 1.15' or '>= 2'")
    return match.group(1), float(match.group(2))


def check_results_column(column: str) -> str:
    """A column the results table can have: a core one, or <suite>.<metric> of a registered suite."""
    family = column.split(".", 1)[0].split(":", 1)[0]
    if column not in GATE_CORE_COLUMNS and ("." not in column or family not in BENCHMARKS):
        raise ValueError(
            f"'{column}' is not a results column: use one of {', '.join(GATE_CORE_COLUMNS)} "
            "or <suite>.<metric> from an eval suite (e.g. statefulness.accuracy)"
        )
    return column


class MetricRule(Spec):
    """How the gate classes one metric: conditions on the ratio candidate mean / baseline mean.
    `<`/`<=` mean lower is better (loss, memory), `>`/`>=` higher is better (accuracy, speed)."""

    column: str = Field(description="results-table column, e.g. val_loss or speed.gen_tokens_per_s")
    good: str = Field(description="'good enough', e.g. '<= 1.15'")
    promising: str
    excellent: str
    conditions: list[str] = Field(
        default=[], description="columns that must be equal for both models, or the ratio is not comparable"
    )

    @field_validator("column")
    @classmethod
    def _known_column(cls, column: str) -> str:
        return check_results_column(column)

    @field_validator("conditions")
    @classmethod
    def _known_conditions(cls, columns: list[str]) -> list[str]:
        return [check_results_column(c) for c in columns]

    @model_validator(mode="after")
    def _ordered(self) -> MetricRule:
        conditions = [parse_threshold(t) for t in (self.good, self.promising, self.excellent)]
        if len({op[0] for op, _ in conditions}) != 1:
            raise ValueError(
                f"good, promising and excellent must all say lower is better (<, <=) or all higher (>, >=); "
                f"got {self.good!r}, {self.promising!r}, {self.excellent!r}"
            )
        limits = [value for _, value in conditions]
        lower = conditions[0][0][0] == "<"
        if limits != sorted(limits, reverse=lower):
            raise ValueError(
                f"excellent must be at least as strict as promising, and promising as good; "
                f"got good {self.good!r}, promising {self.promising!r}, excellent {self.excellent!r}"
            )
        return self

    @property
    def lower_is_better(self) -> bool:
        return self.good.strip().startswith("<")


class RedLine(Spec):
    """A ratio that stops the gate whatever else holds, e.g. {metric: loss, above: 1.3}."""

    metric: str = Field(description="a name under gate.metrics")
    above: float | None = Field(default=None, gt=0)
    below: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_bound(self) -> RedLine:
        if (self.above is None) == (self.below is None):
            raise ValueError(f"red line on '{self.metric}': give exactly one of above or below")
        return self


class ScaleRule(Spec):
    """should_scale: loss ratio ≤ max_loss_ratio with ≥ `advantages` advantages on the other metrics,
    or one advantage with loss ratio < single_advantage_loss_ratio."""

    max_loss_ratio: float = Field(default=1.15, gt=0)
    advantages: int = Field(default=2, ge=1)
    single_advantage_loss_ratio: float = Field(default=1.05, gt=0)
    advantage_class: Literal["good", "promising", "excellent"] = Field(
        default="good",
        description="the class a non-loss metric must reach to count (or the next one up whose threshold beats "
        "the baseline: memory's 'good enough' is 'equal', so a memory advantage needs 'promising')",
    )


GATE_CORE_COLUMNS = ("val_loss", "val_ppl", "val_bpb", "tokens_per_s", "params_total", "train_flops")

# model_construct: the defaults are known good, and validating them here would import every eval suite.
DEFAULT_GATE_METRICS = {
    name: MetricRule.model_construct(
        column=column, good=good, promising=promising, excellent=excellent, conditions=conditions
    )
    for name, column, good, promising, excellent, conditions in [
        ("loss", "val_loss", "<= 1.15", "<= 1.05", "< 1.0", []),  # within 15% / within 5% / better
        (
            "statefulness",
            "statefulness.accuracy",
            ">= 1.1",
            ">= 1.25",
            ">= 1.5",
            [],
        ),  # 10% / 25% / 50% better
        # 20% / 50% faster / 2×, and equal / 20% / 50% less: both over the same number of generated
        # tokens (a model with a short position table generates fewer).
        ("speed", "speed.gen_tokens_per_s", ">= 1.2", ">= 1.5", ">= 2.0", ["speed.gen_tokens"]),
        ("memory", "speed.gen_peak_bytes", "<= 1.0", "<= 0.8", "<= 0.5", ["speed.gen_tokens"]),
    ]
}


class GateSpec(Spec):
    """The go/no-go gate. The default is one team's written gate: pass on ≥ 1 excellent or ≥ 2 promising
    metrics, stopped by the red lines (loss > 1.3× baseline, statefulness below it, loss spikes), with its
    written significance rule: a difference counts only when |Δmean| > 2·√(σ₁²+σ₂²) over seeds."""

    metrics: dict[str, MetricRule] = Field(
        default_factory=lambda: dict(DEFAULT_GATE_METRICS),
        description="merged over the defaults (loss, statefulness, speed, memory); `name: null` drops one",
    )
    loss_metric: str = Field(default="loss", description="the metric should_scale weighs the others against")
    candidates: list[str] | None = Field(
        default=None, description="models gated; default all but the reference"
    )
    pass_excellent: int = Field(default=1, ge=1, description="pass with this many excellent metrics")
    pass_promising: int = Field(default=2, ge=1, description="... or this many promising (or better)")
    red_lines: list[RedLine] = Field(
        default_factory=lambda: [
            RedLine.model_construct(metric="loss", above=1.3, below=None),
            RedLine.model_construct(metric="statefulness", above=None, below=1.0),
        ]
    )
    max_loss_spike: float | None = Field(
        default=2.0,
        gt=1,
        description="red line: a training loss above this × its running average (null: off)",
    )
    spike_window: int = Field(default=20, ge=2, description="steps in the running average of the spike check")
    scaling_violation: bool = added_field(
        True,
        description="red line: a candidate trained at several sizes must improve from each size to the next "
        "by at least what the reference's fitted scaling law predicts between them",
    )
    significance: Literal["2sigma", "welch", "both", "none"] = Field(
        default="2sigma",
        description="the rule a difference must pass to grade above parity: '2sigma' |Δmean| > 2·√(σ₁²+σ₂²) "
        "over seeds (the written plan's), 'welch' Welch's t-test at `alpha`, 'both', or 'none' (point estimates)",
    )
    alpha: float = Field(
        default=0.05, gt=0, lt=1,
        description="two-sided level of the Welch test; with adaptive seeds, the overall level spent over the rounds",
    )  # fmt: skip
    should_scale: ScaleRule = ScaleRule()

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, value: Any) -> Any:
        if isinstance(value, dict) and "significance_alpha" in value:
            raise ValueError(
                "significance_alpha is gone: significance is now part of every grade (default the 2σ rule); "
                f"write `significance: welch` and `alpha: {value['significance_alpha']}` for a Welch test"
            )
        return value

    @field_validator("metrics", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        merged = {name: rule.model_dump() for name, rule in DEFAULT_GATE_METRICS.items()} | value
        return {name: rule for name, rule in merged.items() if rule is not None}

    @model_validator(mode="after")
    def _names(self) -> GateSpec:
        names = set(self.metrics)
        for where, name in [("loss_metric", self.loss_metric)] + [
            (f"red_lines.{i}.metric", line.metric) for i, line in enumerate(self.red_lines)
        ]:
            if name not in names:
                raise ValueError(f"{where} '{name}' is not under gate.metrics ({', '.join(sorted(names))})")
        return self


class SeedRoundsSpec(Spec):
    """`seeds: {min: 3, max: 10}`: adaptive seeds. Every model runs `min` seeds, then one more per round
    while a comparison it takes part in is undecided, up to `max` (rayb/analysis/sequential.py)."""

    min: int = Field(ge=2, description="seeds every model runs (Welch's test needs two)")
    max: int = Field(le=100, description="seeds a model may reach")
    design: Literal["obrien_fleming", "pocock"] = Field(
        default="obrien_fleming", description="the α-spending function over the rounds"
    )
    parity: float = Field(
        default=0.01, ge=0, lt=1,
        description="a difference shown to lie within ±parity × the reference's mean is decided as parity",
    )  # fmt: skip

    @model_validator(mode="after")
    def _ordered(self) -> SeedRoundsSpec:
        if self.max <= self.min:
            raise ValueError(
                f"max ({self.max}) must exceed min ({self.min}); for fixed seeds write `seeds: {self.min}`"
            )
        return self

    def rounds(self, alpha: float):
        """The sequential design, at the gate's overall α."""
        from rayb.analysis.sequential import SeedRounds

        return SeedRounds(self.min, self.max, alpha, self.design, self.parity)


def significance_rule(gate: GateSpec, seed_rounds: SeedRoundsSpec | None):
    """The rule every grade and comparison of a study rests on (rayb/analysis/stats.py)."""
    from rayb.analysis.stats import SignificanceRule

    return SignificanceRule(
        gate.significance, gate.alpha, seed_rounds.rounds(gate.alpha) if seed_rounds else None
    )


class VerdictSpec(Spec):
    reference: str | None = Field(default=None, description="model label the others are compared against")
    gate: GateSpec = GateSpec()
    extrapolate_to: list[str | int] = Field(
        default=["125M", "350M", "1.3B"], description="sizes the scaling-law fits predict the loss at"
    )

    @field_validator("extrapolate_to")
    @classmethod
    def _sizes(cls, value: list[str | int]) -> list[str | int]:
        from rayb.models.sizing import parse_size

        for size in value:
            parse_size(size)
        return value
