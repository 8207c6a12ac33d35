"""rayb.analysis.stats pinned against scipy on fixed inputs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from rayb.analysis.stats import Comparison, Summary, best_by, compare, summarize

REF = [3.10, 3.14, 3.12, 3.11]
CAND = [2.95, 2.99, 2.97]


def test_summarize_matches_scipy():
    s = summarize(REF)
    arr = np.asarray(REF)
    lo, hi = sps.t.interval(0.95, len(arr) - 1, loc=arr.mean(), scale=sps.sem(arr))
    assert s.n == 4
    assert s.mean == pytest.approx(arr.mean())
    assert s.std == pytest.approx(arr.std(ddof=1))
    assert (s.ci_low, s.ci_high) == pytest.approx((lo, hi))


def test_summarize_single_value():
    assert summarize([2.5]) == Summary(n=1, mean=2.5, std=0.0, ci_low=2.5, ci_high=2.5)


def test_summarize_ignores_non_finite():
    assert summarize([*REF, math.nan, math.inf, -math.inf]) == summarize(REF)


def test_summarize_raises_when_nothing_finite():
    with pytest.raises(ValueError):
        summarize([math.nan, math.inf])
    with pytest.raises(ValueError):
        summarize([])


def test_compare_matches_welch_ttest():
    c = compare("ref", REF, "cand", CAND, "val_loss")
    expected = sps.ttest_ind(CAND, REF, equal_var=False)
    assert isinstance(c, Comparison)
    assert (c.reference, c.candidate, c.metric) == ("ref", "cand", "val_loss")
    assert c.welch_t == pytest.approx(expected.statistic)
    assert c.p_value == pytest.approx(expected.pvalue)
    assert c.delta == pytest.approx(np.mean(CAND) - np.mean(REF))
    assert c.rel_delta == pytest.approx(c.delta / abs(np.mean(REF)))


def test_rule_significant_case():
    c = compare("ref", REF, "cand", CAND, "val_loss")
    threshold = 2 * math.sqrt(np.var(REF, ddof=1) + np.var(CAND, ddof=1))
    assert abs(c.delta) > threshold
    assert c.significant
    assert f"{threshold:.3g}" in c.rule and ">" in c.rule


def test_rule_not_significant_case():
    noisy = [3.00, 3.20, 3.05, 3.15]
    c = compare("ref", REF, "cand", noisy, "val_loss")
    threshold = 2 * math.sqrt(np.var(REF, ddof=1) + np.var(noisy, ddof=1))
    assert abs(c.delta) <= threshold
    assert not c.significant
    assert "≤" in c.rule


def test_compare_single_seed_gives_nan_welch_and_no_significance():
    c = compare("ref", [3.0], "cand", [2.0, 2.1], "val_loss")
    assert math.isnan(c.welch_t) and math.isnan(c.p_value)
    assert not c.significant
    assert c.delta == pytest.approx(2.05 - 3.0)


def test_compare_ignores_non_finite():
    a = compare("ref", [*REF, math.nan], "cand", [*CAND, math.inf], "val_loss")
    b = compare("ref", REF, "cand", CAND, "val_loss")
    assert a == b


def _grid() -> pd.DataFrame:
    rows = []
    # model a: lr 1e-3 mean 3.0, lr 3e-3 mean 2.9 -> picks 3e-3
    for lr, base in ((1e-3, 3.0), (3e-3, 2.9)):
        for seed, eps in enumerate((-0.01, 0.0, 0.01)):
            rows.append({"model": "a", "lr": lr, "seed": seed, "status": "ok", "val_loss": base + eps})
    # model b: lr 3e-3 would win but only through a diverged row, which must be ignored
    for lr, base in ((1e-3, 2.8), (3e-3, 2.85)):
        for seed, eps in enumerate((-0.01, 0.0, 0.01)):
            rows.append({"model": "b", "lr": lr, "seed": seed, "status": "ok", "val_loss": base + eps})
    rows.append({"model": "b", "lr": 3e-3, "seed": 3, "status": "diverged", "val_loss": 0.1})
    return pd.DataFrame(rows)


def test_best_by_picks_lowest_mean_and_drops_non_ok():
    best = best_by(_grid(), "model", "lr", "val_loss")
    chosen = best.groupby("model")["lr"].unique().to_dict()
    assert list(chosen["a"]) == [3e-3]
    assert list(chosen["b"]) == [1e-3]
    assert (best["status"] == "ok").all()
    assert len(best) == 6
