"""Adaptive seeds at the statistics level: the α-spending boundaries against published values, the rounds'
stopping rules, and simulated studies run through the real gate (no training)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from rayb.analysis.gate import gate_all
from rayb.analysis.sequential import SeedRounds, boundaries, look, replay, seeds_to_run
from rayb.analysis.spec import GateSpec
from rayb.analysis.stats import SignificanceRule

# The smoke study's seed-to-seed spread of validation loss (gpt2 3.716 ± 0.099, llama 3.794 ± 0.076 over
# seeds 0 and 1, configs/smoke.yaml at commit 73e2ca1): a pooled std of 0.088 on a mean of 3.7.
SMOKE_MEAN, SMOKE_STD = 3.7, 0.088
STUDIES = 1000


@pytest.mark.parametrize(
    ("design", "published"),
    [  # K = 5 equally spaced looks, two-sided α = 0.05 (the ldbounds / gsDesign tables)
        ("obrien_fleming", [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]),
        ("pocock", [2.4380, 2.4268, 2.4101, 2.3966, 2.3859]),
    ],
)
def test_spending_boundaries_match_published_tables(design, published):
    assert boundaries([0.2, 0.4, 0.6, 0.8, 1.0], 0.05, design) == pytest.approx(published, abs=2e-3)


def test_one_look_is_the_fixed_sample_test():
    assert boundaries([1.0], 0.05, "obrien_fleming") == pytest.approx([1.95996], abs=1e-4)


def test_a_clear_difference_stops_early_and_a_close_one_runs_to_max():
    rng = np.random.default_rng(1)
    rounds = SeedRounds(2, 6)
    values = {
        "gpt2": list(rng.normal(3.7, 0.09, 6)),
        "mamba": list(rng.normal(1.8, 0.02, 6)),  # half the loss: decided as soon as the level allows
        "llama": list(rng.normal(3.73, 0.08, 6)),  # within noise, and not provably within ±1%
    }
    history = replay(values, "gpt2", rounds)
    stopped = {model: (r.seeds[model], why) for r in history for model, why in r.stopped.items()}
    assert stopped["mamba"][0] < 6 and stopped["mamba"][1].startswith("significant at")
    assert stopped["llama"] == (6, "reached max = 6 seeds") and stopped["gpt2"][0] == 6
    assert [r.seeds["gpt2"] for r in history] == [2, 3, 4, 5, 6]


def test_parity_is_decided_when_the_interval_sits_inside_the_margin():
    rounds = SeedRounds(3, 8, parity=0.05)
    values = {"ref": [3.70, 3.71, 3.69], "same": [3.705, 3.70, 3.695]}
    (first,) = replay(values, "ref", rounds)
    assert first.looks[0].state == "parity"
    assert first.stopped["same"].startswith("within ±5.0% parity at 3 seeds (equivalence at ")
    assert first.stopped["ref"] == "every comparison decided"


def test_parity_is_the_confidence_interval_at_twice_the_level_inside_the_margin():
    rounds = SeedRounds(3, 8, parity=0.01)
    rng = np.random.default_rng(5)
    states = set()
    for _ in range(300):
        ref, cand = (
            rng.normal(3.7, 0.02, 6),
            rng.normal(3.7 + rng.normal(0, 0.02), rng.uniform(0.005, 0.05), 6),
        )
        pair = look("cand", cand, ref, rounds)
        states.add(pair.state)
        if pair.state != "significant":
            interval = sps.ttest_ind(cand, ref, equal_var=False).confidence_interval(1 - 2 * pair.level)
            margin = 0.01 * ref.mean()
            assert (pair.state == "parity") == (-margin < interval.low and interval.high < margin)
    assert states == {"significant", "parity", "open"}


def test_the_next_round_asks_for_one_more_seed_of_open_models_only():
    rounds = SeedRounds(2, 5)
    assert seeds_to_run({"ref": [], "cand": []}, "ref", rounds) == {"ref": 2, "cand": 2}
    values = {"ref": [3.70, 3.80], "far": [1.00, 1.01], "near": [3.72, 3.78]}
    assert seeds_to_run(values, "ref", rounds) == {"ref": 3, "far": 3, "near": 3}  # nothing decided at 2
    values = {m: v + [v[0] + 0.001] for m, v in values.items()}
    counts = seeds_to_run(values, "ref", rounds)
    assert counts["far"] == 3 and counts["ref"] == counts["near"] == 4


def _simulate(rounds: SeedRounds, relative_difference: float, seed: int) -> tuple[float, float, float]:
    """(share of studies with a GO, share where the loss difference was significant, mean seeds per model)
    over STUDIES simulated two-model studies, each gated by the default gate with the study's rule."""
    rng = np.random.default_rng(seed)
    gate, rule = GateSpec(), SignificanceRule("2sigma", rounds.alpha, rounds)
    go = significant = seeds = 0
    for _ in range(STUDIES):
        values = {
            "base": list(rng.normal(SMOKE_MEAN, SMOKE_STD, rounds.max)),
            "cand": list(rng.normal(SMOKE_MEAN * (1 + relative_difference), SMOKE_STD, rounds.max)),
        }
        history = replay(values, "base", rounds)
        ran = dict(history[-1].seeds) | {m: r.seeds[m] for r in history for m in r.stopped}
        table = pd.DataFrame(
            [
                {"model": m, "arch": m, "params_total": 1_000_000, "seed": i, "val_loss": values[m][i]}
                for m, n in ran.items()
                for i in range(n)
            ]  # fmt: skip
        )
        (decision,) = gate_all(gate, table, "base", rule)
        go += decision.go
        significant += decision.grade("loss").significant
        seeds += sum(ran.values()) / 2
    return go / STUDIES, significant / STUDIES, seeds / STUDIES


@pytest.mark.parametrize("rounds", [SeedRounds(2, 6), SeedRounds(3, 10)], ids=["2-6", "3-10"])
def test_same_distribution_gets_a_false_go_in_at_most_5_percent(rounds):
    false_go, _, mean_seeds = _simulate(rounds, 0.0, seed=11)
    print(
        f"\n{rounds.describe()}: false GO in {false_go:.1%} of {STUDIES} studies, {mean_seeds:.2f} seeds per model"
    )
    assert false_go <= 0.05


@pytest.mark.parametrize("rounds", [SeedRounds(2, 6), SeedRounds(3, 10)], ids=["2-6", "3-10"])
def test_a_true_5_percent_difference_is_detected_in_80_percent(rounds):
    go, detected, mean_seeds = _simulate(rounds, -0.05, seed=12)
    print(f"\n{rounds.describe()}: 5% lower loss detected in {detected:.1%} of {STUDIES} studies (GO in {go:.1%}), "
          f"{mean_seeds:.2f} seeds per model")  # fmt: skip
    assert detected >= 0.80 and go == detected  # a significant 5% gain is "excellent": the gate passes
