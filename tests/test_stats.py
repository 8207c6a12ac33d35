"""rayb.analysis.stats pinned against scipy on fixed inputs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from rayb.analysis.stats import Comparison, Summary, best_by, compare, summarize, welch
from rayb.results import ResultRow, write_results

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


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_welch_from_summaries_is_scipys_ttest_on_the_seeds(alternative):
    rng = np.random.default_rng(3)
    for _ in range(200):
        cand, ref = (
            rng.normal(3.7, rng.uniform(0.01, 0.2), rng.integers(2, 11)),
            rng.normal(3.7, 0.1, rng.integers(2, 11)),
        )
        shift = rng.normal(0, 0.05)
        expected = sps.ttest_ind(cand - shift, ref, equal_var=False, alternative=alternative)
        assert welch(cand, ref, shift, alternative) == pytest.approx(
            (expected.statistic, expected.pvalue), rel=1e-9
        )


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


def test_mann_whitney_and_bootstrap_match_scipy():
    from rayb.analysis.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED

    c = compare("ref", REF, "cand", CAND, "val_loss")
    assert c.mann_whitney_p == pytest.approx(sps.mannwhitneyu(CAND, REF, alternative="two-sided").pvalue)
    expected = sps.bootstrap(
        (np.asarray(CAND), np.asarray(REF)), lambda a, b, axis: a.mean(axis) - b.mean(axis), vectorized=True,
        paired=False, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile", rng=np.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval  # fmt: skip
    assert (c.delta_ci_low, c.delta_ci_high) == pytest.approx((expected.low, expected.high))
    assert c.delta_ci_low < c.delta < c.delta_ci_high < 0  # the candidate is clearly lower
    single = compare("ref", REF, "cand", [2.9], "val_loss")
    assert math.isnan(single.mann_whitney_p) and math.isnan(single.delta_ci_low)


def test_holm_correction():
    from rayb.analysis.stats import holm, with_holm

    # sorted 0.01, 0.03, 0.04 -> ×3, ×2, ×1 = 0.03, 0.06, 0.04 -> step-down maximum 0.03, 0.06, 0.06
    assert holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    with_nan = holm([0.01, math.nan, 0.04])  # a NaN is not a test: two tests, ×2 and ×1
    assert (
        with_nan[0] == pytest.approx(0.02) and math.isnan(with_nan[1]) and with_nan[2] == pytest.approx(0.04)
    )
    assert holm([0.4, 0.6]) == pytest.approx([0.8, 0.8]) and holm([0.7, 0.9]) == [1.0, 1.0]
    comps = [
        compare("ref", REF, name, vals, "val_loss") for name, vals in (("a", CAND), ("b", [3.0, 3.2, 3.1]))
    ]
    adjusted = with_holm(comps)
    assert [c.p_holm for c in adjusted] == pytest.approx(holm([c.p_value for c in comps]))
    assert all(a.p_holm >= c.p_value for a, c in zip(adjusted, comps, strict=True))


def test_power_and_seeds_needed():
    from rayb.analysis.stats import power, seeds_needed

    # The textbook figure: 64 per group detect d = 0.5 with 80% power at α = 0.05 (two-sided).
    assert power(64, 0.5) == pytest.approx(0.80, abs=0.005)
    assert seeds_needed(std=1.0, difference=0.5) == 64
    assert power(63, 0.5) < 0.8 <= power(64, 0.5)
    assert seeds_needed(std=0.05, difference=0.06) == 12 and seeds_needed(std=0.0, difference=0.1) == 2
    assert seeds_needed(std=1.0, difference=0.0) is None and seeds_needed(std=1.0, difference=1e-4) is None
    # Far in the tail scipy's noncentral t returns NaN: a 27σ difference shows with 2 seeds.
    assert power(2, 27.4) == pytest.approx(1.0) and seeds_needed(std=0.0707, difference=-1.9361) == 2
    # The two tails through scipy.stats' distribution objects give the same numbers.
    for n, d in [(2, 1.5), (3, 0.8), (10, 0.3), (64, 0.5), (500, 0.1)]:
        df, critical, shift = 2 * n - 2, sps.t.ppf(0.975, 2 * n - 2), d * math.sqrt(n / 2)
        tails = sps.nct.sf(critical, df, shift) + sps.nct.cdf(-critical, df, shift)
        assert power(n, d) == pytest.approx(tails, rel=1e-12)


def test_power_cli(tmp_path):
    from typer.testing import CliRunner

    from rayb.cli import app

    runner = CliRunner()
    pilot = runner.invoke(app, ["power", "--std", "0.05", "--mean", "3.0", "--diff", "2%"])
    assert pilot.exit_code == 0 and pilot.output.startswith("12 seeds per model")
    rows = [ResultRow("pilot", m, m, 1e-3, s, f"{m}-{s}", "ok", val_loss=v)
            for m, vals in (("gpt2", REF), ("mamba", CAND)) for s, v in enumerate(vals)]  # fmt: skip
    write_results(rows, tmp_path / "results.parquet")
    study = runner.invoke(app, ["power", str(tmp_path), "--diff", "0.5%"])
    assert study.exit_code == 0, study.output
    assert "gpt2" in study.output and "mamba" in study.output
    assert runner.invoke(app, ["power", str(tmp_path / "missing")]).exit_code == 2
    assert runner.invoke(app, ["power", "--diff", "lots", "--std", "1", "--mean", "1"]).exit_code == 2
