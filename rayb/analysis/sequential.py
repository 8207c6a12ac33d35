"""Adaptive seeds: a group-sequential Welch test that decides, round by round, which models need more seeds.

A study that writes `seeds: {min: 3, max: 10}` trains `min` seeds of every model, then one more seed per
round for the models whose comparisons are still open, up to `max`. Looking at the data after every
round and stopping when a difference looks significant would pass noise far more often than the nominal
α, so each look gets its own, stricter level: the α is *spent* over the looks by a Lan–DeMets spending
function (O'Brien–Fleming-type by default: almost nothing early, nearly all of α at the last look; or
Pocock-type: evenly). The boundaries are computed once per design by recursive numerical integration
(Armitage–McPherson–Rowe) of the standardised statistic's path, a Brownian motion sampled at the
information fractions n/max. Each look then compares Welch's two-sided p-value with that look's nominal
level: the usual small-sample use of a normal-theory design.

A comparison (candidate vs reference on the gate's loss column) is decided when it is significant at
its look, or when it is clearly within parity: the equivalence test (two one-sided Welch tests at the
look's level) puts the difference inside ±`parity` of the reference's mean. A model stops once every
comparison it takes part in is decided, or at `max`. Pure: numbers in, decisions out; the runner and
the report replay the same rounds from the results table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np
from scipy import integrate, optimize
from scipy import stats as sps

from rayb.analysis.stats import welch

if TYPE_CHECKING:
    import pandas as pd

Design = Literal["obrien_fleming", "pocock"]
DESIGN_NAMES = {"obrien_fleming": "O'Brien–Fleming", "pocock": "Pocock"}
GRID_POINTS = 1001  # per look: the boundaries agree with published tables to 3 decimals


def spent(design: Design, alpha: float, t: np.ndarray) -> np.ndarray:
    """Lan–DeMets spending functions: the two-sided α spent by information fraction t, as symmetric
    boundaries that spend α/2 on each side (the convention of gsDesign and ldbounds)."""
    if design == "obrien_fleming":
        return 2 * 2 * sps.norm.sf(sps.norm.isf(alpha / 4) / np.sqrt(t))
    return alpha * np.log1p((math.e - 1) * t)


def boundaries(fractions: list[float], alpha: float, design: Design) -> list[float]:
    """Two-sided critical values of the standardised statistic Z_k = S(t_k)/√t_k at each look, such that
    the chance of crossing look k's boundary first is the α spent between looks k−1 and k."""
    t = np.asarray(fractions, dtype=float)
    increments = np.diff(spent(design, alpha, t), prepend=0.0)
    edge = float(sps.norm.isf(increments[0] / 2)) * math.sqrt(t[0])  # the first look: S ~ N(0, t₁)
    grid = np.linspace(-edge, edge, GRID_POINTS)
    density = sps.norm.pdf(grid, scale=math.sqrt(t[0]))  # S's density on the paths still going
    critical = [edge / math.sqrt(t[0])]
    for k in range(1, t.size):
        step = math.sqrt(t[k] - t[k - 1])

        def crossing(b: float, grid=grid, density=density, step=step) -> float:
            beyond = sps.norm.sf((b - grid) / step) + sps.norm.cdf((-b - grid) / step)
            return float(integrate.simpson(density * beyond, x=grid))

        target = increments[k]
        edge = optimize.brentq(
            lambda b, target=target: crossing(b) - target, 1e-9, 50.0 * math.sqrt(t[k]), xtol=1e-10
        )
        new_grid = np.linspace(-edge, edge, GRID_POINTS)
        kernel = sps.norm.pdf((new_grid[:, None] - grid[None, :]) / step) / step
        density = integrate.simpson(kernel * density[None, :], x=grid, axis=1)
        grid = new_grid
        critical.append(edge / math.sqrt(t[k]))
    return critical


@dataclass(frozen=True)
class SeedRounds:
    """The sequential design of a study with adaptive seeds (built from the study's `seeds:` mapping)."""

    min: int
    max: int
    alpha: float = 0.05
    design: Design = "obrien_fleming"
    parity: float = 0.01  # relative to the reference's mean: a difference inside it is parity

    @cached_property
    def levels(self) -> list[float]:
        """Nominal two-sided level at each look, for n = min .. max seeds per model."""
        looks = range(self.min, self.max + 1)
        return [
            float(2 * sps.norm.sf(c))
            for c in boundaries([n / self.max for n in looks], self.alpha, self.design)
        ]

    def level(self, n: int) -> float:
        """The nominal level of the look at which the model with fewer seeds has n of them."""
        return self.levels[min(max(n, self.min), self.max) - self.min]

    def describe(self) -> str:
        return (
            f"group-sequential Welch t-test, {DESIGN_NAMES[self.design]} α-spending (Lan–DeMets), overall "
            f"α = {self.alpha:g} over looks at {self.min}–{self.max} seeds per model; parity within ±{self.parity:.1%}"
        )


@dataclass(frozen=True)
class PairLook:
    """One comparison at one look."""

    candidate: str
    n: int  # seeds of the model with fewer
    delta: float  # candidate mean − reference mean
    p_value: float  # Welch, two-sided
    level: float
    state: Literal["significant", "parity", "open"]


def look(candidate: str, cand: np.ndarray, ref: np.ndarray, rounds: SeedRounds) -> PairLook:
    """Judge one comparison at the look its seed counts reach."""
    n = int(min(cand.size, ref.size))
    level = rounds.level(n)
    delta = float(cand.mean() - ref.mean())
    if n < 2:
        return PairLook(candidate, n, delta, math.nan, level, "open")
    if max(cand.var(), ref.var()) == 0:  # nothing varies: any difference is certain, none is parity
        return PairLook(candidate, n, delta, float(delta == 0), level, "significant" if delta else "parity")
    _, p_value = welch(cand, ref)
    if p_value < level:
        return PairLook(candidate, n, delta, p_value, level, "significant")
    # Two one-sided tests at `level` each: the difference is above −margin and below +margin (the same
    # as the 1 − 2·level confidence interval lying inside the margin).
    margin = rounds.parity * abs(float(ref.mean()))
    inside = welch(cand, ref, -margin, "greater")[1] < level and welch(cand, ref, margin, "less")[1] < level
    return PairLook(candidate, n, delta, p_value, level, "parity" if inside else "open")


@dataclass
class Round:
    number: int
    seeds: dict[str, int]  # model -> seeds it has at this look
    looks: list[PairLook]
    stopped: dict[str, str] = field(default_factory=dict)  # model -> why it gets no more seeds


def replay(values: dict[str, list[float]], reference: str, rounds: SeedRounds) -> list[Round]:
    """The rounds a study's seeds went through: `values` holds each model's loss per seed, in the order
    the seeds were run. A round looks at the first n seeds of every model still running; a model stops
    when each of its comparisons is decided (the reference: all of them), or at `max`. Only complete
    rounds are returned: the replay ends where a model lacks the seeds its round asks for."""
    running = {m: rounds.min for m in values}
    decided: dict[str, PairLook] = {}
    history = []
    for number in range(1, rounds.max - rounds.min + 2):
        if any(len(values[m]) < n for m, n in running.items()):
            break
        ref = np.asarray(values[reference][: running.get(reference, len(values[reference]))], dtype=float)
        looks = []
        for model in values:
            if model != reference and model in running:
                pair = look(model, np.asarray(values[model][: running[model]], dtype=float), ref, rounds)
                looks.append(pair)
                if pair.state != "open":
                    decided[model] = pair
        this = Round(number, dict(running), looks)
        history.append(this)
        for model in list(running):
            why = _stop_reason(model, reference, values, decided, running[model], rounds)
            if why:
                this.stopped[model] = why
                del running[model]
            else:
                running[model] += 1
        if not running:
            break
    return history


def _stop_reason(
    model: str, reference: str, values: dict, decided: dict[str, PairLook], n: int, rounds: SeedRounds
) -> str | None:
    if model == reference:
        open_pairs = [m for m in values if m != reference and m not in decided]
        if not open_pairs:
            return "every comparison decided"
    elif model in decided:
        pair = decided[model]
        if pair.state == "significant":
            return f"significant at {pair.n} seeds (Welch p = {pair.p_value:.2g} < {pair.level:.2g})"
        return f"within ±{rounds.parity:.1%} parity at {pair.n} seeds (equivalence at {pair.level:.2g})"
    return f"reached max = {rounds.max} seeds" if n >= rounds.max else None


def seeds_to_run(values: dict[str, list[float]], reference: str, rounds: SeedRounds) -> dict[str, int]:
    """How many seeds each model should have once the next round is trained (the runner's question):
    a stopped model keeps what it has; every other model runs at the next look's count."""
    history = replay(values, reference, rounds)
    stopped = {model: r.seeds[model] for r in history for model in r.stopped}
    return {model: stopped.get(model, rounds.min + len(history)) for model in values}


def seed_values(selected: pd.DataFrame, column: str) -> dict[str, list[float]]:
    """Each trained model's finite `column` values at its selected learning rate, in seed order: the order
    rounds run them (adaptive studies run seeds 0..max-1). A seed that diverged is not replaced."""
    trained = selected[~selected["pretrained"].astype(bool)] if "pretrained" in selected else selected
    return {
        str(model): [float(v) for v in rows.sort_values("seed")[column] if math.isfinite(float(v))]
        for model, rows in trained.groupby("model", sort=False)
    }
