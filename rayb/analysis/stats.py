"""Seed-level statistics for architecture comparisons.

Every number here is computed over *seeds*: one value per trained model run. Trials that blew up
produce NaN/inf losses; those are dropped here (the report layer records them as excluded) so a
single divergence cannot poison a mean.

Significance is judged several ways on purpose. The headline rule, |Δmean| > 2·√(σ_ref² + σ_cand²), is
deliberately conservative and easy to read off a table; beside it are Welch's t-test, the Mann–Whitney
U test (no normality assumed), a bootstrap confidence interval of the difference of means, and Holm's
correction when one reference is compared with several candidates. All come from the same seed values.
`seeds_needed` turns a measured seed-to-seed spread into the seeds a given difference needs.

Which of these a study's gate and verdict rest on is its `SignificanceRule`: the 2σ rule (the default),
Welch at α, both, or none; with adaptive seeds, Welch at the sequential design's level for the look.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import special
from scipy import stats as sps

if TYPE_CHECKING:  # pandas is only needed by callers of best_by; keep this module import-light.
    import pandas as pd

    from rayb.analysis.sequential import SeedRounds

CI_LEVEL = 0.95
"""Two-sided confidence level of Summary.ci_low/ci_high and of the bootstrap interval of Δ."""

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # the interval is part of a report: the same seeds give the same interval

SIGMA_MULTIPLIER = 2.0
"""k in the significance rule |Δmean| > k·√(σ_ref² + σ_cand²)."""

OK_STATUS = "ok"


@dataclass(frozen=True)
class Summary:
    """Mean, sample std (ddof=1) and Student-t confidence interval of one metric over seeds."""

    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class Comparison:
    """A candidate model against the reference on one metric (lower is better for losses)."""

    reference: str
    candidate: str
    metric: str
    delta: float
    rel_delta: float
    welch_t: float
    p_value: float  # Welch
    significant: bool
    rule: str
    mann_whitney_p: float = math.nan
    delta_ci_low: float = math.nan  # bootstrap percentile interval of Δ
    delta_ci_high: float = math.nan
    p_holm: float = math.nan  # Welch p adjusted over every candidate compared on this metric


def finite_values(values: Sequence[float]) -> np.ndarray:
    """Values as a float array with NaN/inf removed (diverged seeds must not enter a mean)."""
    arr = np.asarray(values, dtype=float).ravel()
    return arr[np.isfinite(arr)]


def sample_std(arr: np.ndarray) -> float:
    """Sample std with ddof=1; 0.0 for a single value, where spread is not estimable."""
    return float(np.std(arr, ddof=1)) if arr.size > 1 else 0.0


def summarize(values: Sequence[float]) -> Summary:
    """Summarise one metric over seeds; non-finite values are ignored.

    Raises ValueError when no finite value is left, because a summary of nothing would silently
    read as a result.
    """
    arr = finite_values(values)
    if arr.size == 0:
        raise ValueError("summarize() needs at least one finite value")
    mean = float(arr.mean())
    std = sample_std(arr)
    if arr.size == 1:
        return Summary(n=1, mean=mean, std=0.0, ci_low=mean, ci_high=mean)
    half_width = float(sps.t.ppf(0.5 + CI_LEVEL / 2, arr.size - 1)) * std / math.sqrt(arr.size)
    return Summary(n=int(arr.size), mean=mean, std=std, ci_low=mean - half_width, ci_high=mean + half_width)


def welch(
    cand: np.ndarray, ref: np.ndarray, shift: float = 0.0, alternative: str = "two-sided"
) -> tuple[float, float]:
    """Welch's t statistic and p-value of mean(cand) − mean(ref) against `shift` (two-sided by default;
    "less" or "greater" for one side); NaN when either side has fewer than two seeds.

    From each side's mean, std and count (scipy's ttest_ind_from_stats): the same numbers as scipy's
    ttest_ind, whose checks of its array arguments cost 1.2 ms a call on 2 cores, against 65 µs; adaptive
    seeds test every open comparison at every look, and their check by simulation (tests/test_sequential.py)
    thousands of times."""
    if cand.size < 2 or ref.size < 2:
        return math.nan, math.nan
    with warnings.catch_warnings():  # equal values on both sides (e.g. a memory figure): p is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        result = sps.ttest_ind_from_stats(
            cand.mean() - shift, cand.std(ddof=1), cand.size, ref.mean(), ref.std(ddof=1), ref.size,
            equal_var=False, alternative=alternative,
        )  # fmt: skip
    return float(result.statistic), float(result.pvalue)


def _mann_whitney(cand: np.ndarray, ref: np.ndarray) -> float:
    """Two-sided Mann–Whitney U p-value; NaN when either side has fewer than two seeds."""
    if cand.size < 2 or ref.size < 2:
        return math.nan
    return float(sps.mannwhitneyu(cand, ref, alternative="two-sided").pvalue)


def bootstrap_delta_ci(cand: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(cand) − mean(ref), resampling each side's seeds
    independently (BCa needs more seeds than studies have); NaN with fewer than two per side."""
    if cand.size < 2 or ref.size < 2:
        return math.nan, math.nan
    result = sps.bootstrap(
        (cand, ref), lambda c, r, axis: c.mean(axis=axis) - r.mean(axis=axis), vectorized=True,
        paired=False, confidence_level=CI_LEVEL, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (NaNs stay NaN and do not count as tests).
    scipy has Benjamini–Hochberg (false_discovery_control) but not Holm's step-down."""
    p = np.asarray(p_values, dtype=float)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    adjusted = np.full(p.shape, math.nan)
    running = 0.0
    for rank, i in enumerate(order):  # the i-th smallest is multiplied by the tests not yet passed
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def power(n_per_group: int, effect_size: float, alpha: float = 0.05) -> float:
    """Power of a two-sided two-sample t-test with n seeds per model at standardized effect size
    d = Δ/σ (noncentral t; equal spread assumed)."""
    df = 2 * n_per_group - 2
    if df < 1:
        return math.nan
    # scipy.stats' t.ppf and nct.cdf compute with these special functions, at 3-4 µs a call against
    # 120-130 µs through the distribution objects; `seeds_needed` bisects over power, for every metric a
    # gate grades. The upper tail is the lower tail of −T, a noncentral t with the shift negated.
    critical = special.stdtrit(df, 1 - alpha / 2)
    shift = abs(effect_size) * math.sqrt(n_per_group / 2)
    result = float(special.nctdtr(df, -shift, -critical) + special.nctdtr(df, shift, -critical))
    if not math.isfinite(result):  # scipy's noncentral t gives NaN far in the tail (huge effects)
        result = float(sps.norm.sf(critical - shift) + sps.norm.cdf(-critical - shift))
    return result


def seeds_needed(
    std: float, difference: float, target_power: float = 0.8, alpha: float = 0.05, cap: int = 10_000
) -> int | None:
    """Smallest seeds per model for the t-test to detect `difference` (absolute) at `target_power`,
    given the seed-to-seed std; None if even `cap` seeds are not enough (or nothing varies)."""
    if difference == 0:
        return None
    if std == 0:  # no seed-to-seed spread: any difference shows with the minimum of two seeds
        return 2
    effect = abs(difference) / std
    if power(cap, effect, alpha) < target_power:
        return None
    low, high = 1, cap  # power grows with n: bisect for the first n that reaches the target
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if power(middle, effect, alpha) >= target_power else (middle, high)
    return high


def seeds_to_detect(
    difference: float, std_one: float, std_other: float, alpha: float = 0.05, target_power: float = 0.8
) -> int | None:
    """Seeds per model a t-test needs to detect an observed difference at the two models' observed spread
    (their pooled std): what `rayb power` answers for it. None when no number of seeds is enough."""
    return seeds_needed(math.sqrt((std_one**2 + std_other**2) / 2), difference, target_power, alpha)


def _sigma_rule(delta: float, std_ref: float, std_cand: float, n_ref: int, n_cand: int) -> tuple[bool, str]:
    """Apply |Δ| > k·√(σ₁²+σ₂²) and describe it with the numbers used.

    With a single seed on either side the spread is unknown (its std is reported as 0), so the
    rule would call any difference significant; we refuse to claim significance in that case.
    """
    threshold = SIGMA_MULTIPLIER * math.sqrt(std_ref**2 + std_cand**2)
    k = f"{SIGMA_MULTIPLIER:g}"
    if min(n_ref, n_cand) < 2:
        return False, f"|Δ|={abs(delta):.3g}; rule {k}·√(σ₁²+σ₂²) needs ≥2 seeds per model"
    significant = abs(delta) > threshold
    op = ">" if significant else "≤"
    return significant, f"|Δ|={abs(delta):.3g} {op} {k}·√(σ₁²+σ₂²)={threshold:.3g}"


@dataclass(frozen=True)
class SignificanceRule:
    """What a difference must pass to count: '2sigma' (|Δmean| > 2·√(σ₁²+σ₂²)), 'welch' (p < alpha),
    'both', or 'none'. With adaptive seeds (`rounds`) Welch's level is the sequential design's at the
    look the seeds reach, and the 2σ rule is kept only under 'both': it is a fixed-seed rule whose error
    rate no design controls."""

    kind: str = "2sigma"
    alpha: float = 0.05
    rounds: SeedRounds | None = None

    def test(self, cand: np.ndarray, ref: np.ndarray) -> tuple[bool, str]:
        """(significant?, the rule with the numbers used) for finite seed values on each side."""
        if self.kind == "none":
            return True, "significance off"
        parts, passed = [], True
        if self.kind == "both" or (self.kind == "2sigma" and self.rounds is None):
            ok, text = _sigma_rule(
                float(cand.mean() - ref.mean()), sample_std(ref), sample_std(cand), ref.size, cand.size
            )
            passed, parts = passed and ok, parts + [text]
        if self.kind in ("welch", "both") or self.rounds is not None:
            ok, text = self._welch(cand, ref)
            passed, parts = passed and ok, parts + [text]
        return passed, "; ".join(parts)

    def _welch(self, cand: np.ndarray, ref: np.ndarray) -> tuple[bool, str]:
        p_value = welch(cand, ref)[1]
        if not math.isfinite(p_value):
            return False, "Welch's test needs ≥2 seeds per model"
        n = min(cand.size, ref.size)
        level = self.alpha if self.rounds is None else self.rounds.level(n)
        where = "" if self.rounds is None else f", the sequential level at {n} seeds"
        return (
            p_value < level,
            f"Welch p = {p_value:.2g} {'<' if p_value < level else '≥'} {level:.2g}{where}",
        )

    def describe(self) -> str:
        """The rule in words, for the report's verdict line and method paragraph."""
        sigma = f"|Δmean| > {SIGMA_MULTIPLIER:g}·√(σ₁²+σ₂²) over seeds"
        if self.kind == "none":
            return "no significance rule (point estimates graded as they are)"
        if self.rounds is not None:
            return self.rounds.describe() + (f", and {sigma}" if self.kind == "both" else "")
        welch_text = f"Welch's t-test at α = {self.alpha:g}"
        return {"2sigma": sigma, "welch": welch_text, "both": f"{sigma} and {welch_text}"}[self.kind]


DEFAULT_SIGNIFICANCE = SignificanceRule()  # the study file's default: the 2σ rule, fixed seeds


def compare(
    reference: str,
    ref_values: Sequence[float],
    candidate: str,
    cand_values: Sequence[float],
    metric: str,
    rule: SignificanceRule = DEFAULT_SIGNIFICANCE,
) -> Comparison:
    """Compare candidate against reference on one metric; delta = candidate mean − reference mean;
    `significant` under the study's `rule`.

    Non-finite values are dropped on both sides, exactly as in summarize(), so the Comparison and
    the Summaries shown next to it are computed from the same seeds.
    """
    ref = finite_values(ref_values)
    cand = finite_values(cand_values)
    if ref.size == 0 or cand.size == 0:
        raise ValueError(f"compare({metric}) needs at least one finite value on each side")
    delta = float(cand.mean() - ref.mean())
    ref_abs = abs(float(ref.mean()))
    rel_delta = delta / ref_abs if ref_abs > 0 else math.nan
    welch_t, p_value = welch(cand, ref)
    significant, text = rule.test(cand, ref)
    low, high = bootstrap_delta_ci(cand, ref)
    return Comparison(
        reference=reference,
        candidate=candidate,
        metric=metric,
        delta=delta,
        rel_delta=rel_delta,
        welch_t=welch_t,
        p_value=p_value,
        significant=significant,
        rule=text,
        mann_whitney_p=_mann_whitney(cand, ref),
        delta_ci_low=low,
        delta_ci_high=high,
        p_holm=p_value,
    )


def with_holm(comparisons: list[Comparison]) -> list[Comparison]:
    """The comparisons with `p_holm` adjusted across the candidates compared on each metric."""
    out = list(comparisons)
    for metric in dict.fromkeys(c.metric for c in comparisons):
        idx = [i for i, c in enumerate(comparisons) if c.metric == metric]
        for i, adjusted in zip(idx, holm([comparisons[i].p_value for i in idx]), strict=True):
            out[i] = dataclasses.replace(comparisons[i], p_holm=adjusted)
    return out


def best_by(df: pd.DataFrame, group: str, within: str, metric: str) -> pd.DataFrame:
    """Rows of each `group` at the `within` value with the lowest mean `metric` over its rows.

    Used to compare every model at its own best learning rate, so an architecture is not penalised
    for a learning-rate grid tuned to another. Only status == "ok" rows count, and non-finite metric
    values are ignored in the means; a group with no finite value at all is dropped. The means are over
    the seeds every `within` value of the group has (all of them in a fixed-seed study; the first round's
    in an adaptive one, whose later seeds run at the value chosen then), unless they share none. Ties go
    to the smallest `within` value so the choice is deterministic.
    """
    ok = df[df["status"] == OK_STATUS]
    finite = ok[np.isfinite(ok[metric].astype(float))]
    if "seed" in finite:
        shared = finite.groupby([group, "seed"])[within].transform("nunique") == finite.groupby(group)[
            within
        ].transform("nunique")
        finite = finite[shared | ~shared.groupby(finite[group]).transform("any")]
    means = finite.groupby([group, within], sort=True)[metric].mean()
    chosen = means.groupby(level=0, sort=False).idxmin()  # -> (group value, within value) per group
    keep = set(chosen.tolist())
    mask = [(g, w) in keep for g, w in zip(ok[group], ok[within], strict=True)]
    return ok[mask]
