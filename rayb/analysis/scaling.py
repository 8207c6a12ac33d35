"""Scaling laws: L(N) = a·N^(−b) + c per architecture, from a study with several sizes.

Each seed at each size is one point, so the fit sees the seed spread. Uncertainty comes from a
bootstrap that resamples seeds within each size and refits: it gives intervals for b and for the loss
predicted at named sizes, and the standard error used to ask whether two architectures' curves are
parallel (equal exponents b: the gap between them does not change with scale).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from scipy import optimize
from scipy import stats as sps

if TYPE_CHECKING:
    import pandas as pd

MIN_SIZES = 3  # three parameters need three sizes
BOOTSTRAP_RESAMPLES = 300
BOOTSTRAP_SEED = 0
SCALE = 1e6  # fit in millions of parameters: the same curve, far better conditioned
B_RANGE = (1e-4, 3.0)  # the exponents the fit may take; a bootstrap that reaches either end is undetermined


@dataclass(frozen=True)
class ScalingFit:
    arch: str
    sizes: list[int]  # distinct parameter counts fitted
    points: int  # (size, seed) points
    a: float = math.nan  # L(N) = a·N^(−b) + c, N in parameters
    b: float = math.nan
    c: float = math.nan
    b_low: float = math.nan  # bootstrap 95% interval of b
    b_high: float = math.nan
    b_se: float = math.nan
    predictions: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # size -> (L, low, high)
    error: str | None = None  # why there is no fit
    warning: str | None = None  # why the fit, though made, says little (then no extrapolation is trusted)

    def loss(self, n: float | np.ndarray) -> float | np.ndarray:
        return self.a * np.power(n, -self.b) + self.c


def _power_law(n: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return a * np.power(n, -b) + c


def _jacobian(n: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    power = np.power(n, -b)
    return np.stack([power, -a * power * np.log(n), np.ones_like(n)], axis=1)


def fit_power_law(
    n: np.ndarray, loss: np.ndarray, start: tuple[float, float, float] | None = None
) -> tuple[float, float, float]:
    """Least-squares (a, b, c) for n in millions; b in (0, 3), 0 ≤ c ≤ the lowest loss."""
    floor = float(loss.min())
    p0 = start or (float(loss.max() - 0.5 * floor) * float(n.min()) ** 0.3, 0.3, 0.5 * floor)
    p0 = (p0[0], p0[1], min(p0[2], floor))  # a resample's lowest loss can sit below the start's c
    with warnings.catch_warnings():  # an exact fit (3 sizes, 1 seed) has no covariance: not our concern
        warnings.simplefilter("ignore", optimize.OptimizeWarning)
        params, _ = optimize.curve_fit(
            _power_law, n, loss, p0=p0, jac=_jacobian, bounds=([1e-12, B_RANGE[0], 0.0], [np.inf, B_RANGE[1], floor]),
            maxfev=20_000,
        )  # fmt: skip
    return tuple(float(p) for p in params)


def fit_arch(arch: str, params: np.ndarray, loss: np.ndarray, extrapolate_to: Sequence[int]) -> ScalingFit:
    """Fit one architecture's (parameters, loss) points; bootstrap seeds within each size."""
    ok = np.isfinite(loss)
    params, loss = params[ok], loss[ok]
    sizes = sorted({int(p) for p in params})
    if len(sizes) < MIN_SIZES:
        return ScalingFit(arch, sizes, int(params.size), error=f"needs ≥ {MIN_SIZES} sizes, has {len(sizes)}")
    n = params / SCALE
    try:
        a, b, c = fit_power_law(n, loss)
    except (RuntimeError, ValueError) as exc:
        return ScalingFit(arch, sizes, int(params.size), error=f"fit did not converge: {exc}")

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    groups = [np.flatnonzero(params == s) for s in sizes]
    targets = np.asarray(extrapolate_to, dtype=float) / SCALE
    b_samples, predictions = [], []
    for _ in range(BOOTSTRAP_RESAMPLES):
        idx = np.concatenate([rng.choice(g, size=g.size) for g in groups])
        try:
            sample = fit_power_law(n[idx], loss[idx], start=(a, b, c))
        except (RuntimeError, ValueError):
            continue
        b_samples.append(sample[1])
        predictions.append(_power_law(targets, *sample))
    b_low, b_high = np.percentile(b_samples, [2.5, 97.5]) if b_samples else (math.nan, math.nan)
    if predictions:
        low, high = np.percentile(predictions, [2.5, 97.5], axis=0)
    else:
        low = high = np.full(targets.size, math.nan)
    central = _power_law(targets, a, b, c)
    return ScalingFit(
        arch, sizes, int(params.size), a=a * SCALE**b, b=b, c=c, b_low=float(b_low), b_high=float(b_high),
        warning=_fit_warning(sizes, params, loss, float(b_low), float(b_high)),
        b_se=float(np.std(b_samples, ddof=1)) if len(b_samples) > 1 else math.nan,
        predictions={
            _size_name(int(t)): (float(central[i]), float(low[i]), float(high[i]))
            for i, t in enumerate(extrapolate_to)
        },
    )  # fmt: skip


def _fit_warning(
    sizes: list[int], params: np.ndarray, loss: np.ndarray, b_low: float, b_high: float
) -> str | None:
    """Why a fit says little about scaling: the loss does not fall with size (e.g. larger models
    undertrained at this budget), or the bootstrap's exponents run to the ends of the allowed range."""
    means = [float(loss[params == s].mean()) for s in sizes]
    if means[-1] >= means[0]:
        by_size = ", ".join(f"{_size_name(s)}: {m:.3f}" for s, m in zip(sizes, means, strict=True))
        return f"the loss does not fall with size ({by_size}); this is no scaling law (undertrained larger models?)"
    if not (B_RANGE[0] * 1.01 < b_low and b_high < B_RANGE[1] * 0.99):
        return (
            f"the exponent is not determined by these points (bootstrap b reaches the fit's bounds {B_RANGE})"
        )
    return None


def _size_name(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return str(n)


def fit_all(selected: pd.DataFrame, extrapolate_to: Sequence[int], group: str = "arch") -> list[ScalingFit]:
    """A fit per architecture from each model's seed rows at its selected learning rate."""
    return [
        fit_arch(
            str(arch), rows["params_total"].to_numpy(float), rows["val_loss"].to_numpy(float), extrapolate_to
        )
        for arch, rows in selected.groupby(group, sort=False)
    ]


def parallel(one: ScalingFit, other: ScalingFit, alpha: float = 0.05) -> tuple[bool | None, float]:
    """Whether two fits' exponents are equal within their bootstrap errors (a two-sided z-test);
    None when either has no error estimate or carries a warning. Returns (parallel?, p-value)."""
    se = math.hypot(one.b_se, other.b_se)
    if one.warning or other.warning or not math.isfinite(se) or se == 0:
        return None, math.nan
    p = float(2 * sps.norm.sf(abs(one.b - other.b) / se))
    return p >= alpha, p
