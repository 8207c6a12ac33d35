"""The go/no-go gate on hand-made results tables: every class, the pass rule, every red line,
should_scale's branches, unmeasured metrics, and the gate's validation in the study file."""

from __future__ import annotations

import math

import pytest
from conftest import tiny_study_dict

from rayb.analysis.gate import gate_all, grade_label, grade_ratio, loss_spikes
from rayb.analysis.spec import GateSpec, MetricRule
from rayb.results import ResultRow, results_frame
from rayb.study import StudyError, parse_study

BASE = {"loss": 3.0, "state": 0.40, "speed": 100.0, "memory": 1000.0}
STEPS = list(range(1, 41))
SMOOTH = [3.0 + 2.0 * 0.9**s for s in STEPS]


def _rows(
    model: str, loss: float, state: float | None, speed: float, memory: float, curve=SMOOTH
) -> list[ResultRow]:
    """Two seeds with the given means (±0.1% either side: every difference the tests grade is significant)."""
    rows = []
    for sign in (-1, 1):
        metrics = {
            "speed.gen_tokens_per_s": speed * (1 + 0.001 * sign),
            "speed.gen_peak_bytes": memory * (1 + 0.001 * sign),
        }
        if state is not None:
            metrics["statefulness.accuracy"] = state * (1 + 0.001 * sign)
        rows.append(
            ResultRow(
                "gate", model, model, 1e-3, (sign + 1) // 2, f"{model}-{sign}", "ok", val_loss=loss * (1 + 0.001 * sign),
                curve_step=STEPS, curve_train_loss=curve, metrics=metrics,
            )
        )  # fmt: skip
    return rows


def decide(loss=1.0, state=1.0, speed=1.0, memory=1.0, curve=SMOOTH, spec=None):
    """The default gate for one candidate whose metrics are the given ratios of the baseline's."""
    table = results_frame(
        _rows("base", **BASE)
        + _rows(
            "cand",
            BASE["loss"] * loss,
            None if state is None else BASE["state"] * state,
            BASE["speed"] * speed,
            BASE["memory"] * memory,
            curve,
        )  # fmt: skip
    )
    (decision,) = gate_all(spec or GateSpec(), table, "base")
    return decision


@pytest.mark.parametrize(
    ("metric", "ratio", "grade"),
    [
        ("loss", 0.99, "excellent"), ("loss", 1.0, "promising"), ("loss", 1.05, "promising"),
        ("loss", 1.10, "good"), ("loss", 1.15, "good"), ("loss", 1.16, "below good"),
        ("statefulness", 1.5, "excellent"), ("statefulness", 1.3, "promising"), ("statefulness", 1.1, "good"),
        ("statefulness", 1.05, "below good"),
        ("speed", 2.0, "excellent"), ("speed", 1.5, "promising"), ("speed", 1.2, "good"), ("speed", 1.1, "below good"),
        ("memory", 0.5, "excellent"), ("memory", 0.8, "promising"), ("memory", 1.0, "good"),
        ("memory", 1.01, "below good"),
    ],
)  # fmt: skip
def test_default_classes_follow_the_written_gate(metric, ratio, grade):
    assert grade_ratio(GateSpec().metrics[metric], ratio) == grade


def test_one_excellent_metric_passes():
    d = decide(loss=1.10, speed=2.5)  # loss good, speed excellent, the rest equal
    assert d.go
    assert d.grade("speed").grade == "excellent" and d.grade("loss").grade == "good"
    assert any(r.startswith("pass rule met: 1 excellent") for r in d.reasons)


def test_two_promising_metrics_pass():
    d = decide(loss=1.03, speed=1.6)
    assert d.go and [d.grade(m).grade for m in ("loss", "speed")] == ["promising", "promising"]


def test_one_promising_metric_does_not_pass():
    d = decide(loss=1.03, speed=1.3)  # promising + good
    assert not d.go and not d.red_lines
    assert any(r.startswith("pass rule not met: 0 excellent") for r in d.reasons)


def test_loss_red_line_stops_an_otherwise_passing_candidate():
    d = decide(loss=1.35, speed=3.0, memory=0.3)  # two excellent, but loss 1.35× the baseline's
    assert not d.go and not d.should_scale
    assert d.red_lines == ["loss ratio 1.350 is above the red line 1.3 (significant at 2 seeds)"]


def test_statefulness_below_baseline_is_a_red_line():
    d = decide(loss=0.9, state=0.95)
    assert not d.go
    assert d.red_lines == ["statefulness ratio 0.950 is below the red line 1 (significant at 2 seeds)"]


def test_a_loss_spike_is_a_red_line():
    spiked = list(SMOOTH)
    spiked[30] = 7.0  # the running average is ~3.3 there
    d = decide(loss=0.9, curve=spiked)
    assert not d.go
    assert len(d.red_lines) == 2  # one per seed (both share the curve)
    assert "step 31: training loss 7 > 2 × its 20-step running average" in d.red_lines[0]


def test_loss_spikes_ignore_warmup_and_catch_nan():
    falling = [10.0, 5.0, 2.0, 1.0, 1.0, 1.0]
    assert loss_spikes(list(range(6)), falling, factor=2.0, window=3) == []
    assert loss_spikes(list(range(6)), [*falling[:5], math.nan], 2.0, 3)[0][0] == 5
    assert loss_spikes([0, 1, 2, 3], [1.0, 1.0, 1.0, 2.5], 2.0, 3) == [(3, 2.5, 1.0)]
    assert loss_spikes([0, 1, 2, 3], [1.0, 1.0, 1.0, 2.0], 2.0, 3) == []  # exactly 2× is not above it


def test_should_scale_with_two_advantages():
    d = decide(loss=1.12, speed=1.3, state=1.2)  # loss within 15%, speed and statefulness good and better
    assert d.should_scale
    assert (
        "should scale: yes, loss ratio 1.120 ≤ 1.15 with 2 significant advantages (statefulness, speed"
        in d.reasons[-1]
    )


def test_should_scale_with_one_advantage_needs_loss_within_5_percent():
    assert decide(loss=1.04, speed=1.3).should_scale
    no = decide(loss=1.08, speed=1.3)
    assert not no.should_scale and no.reasons[-1].startswith(
        "should scale: no, loss ratio 1.080 with 1 significant advantage"
    )


def test_should_not_scale_when_loss_is_too_far_behind():
    d = decide(loss=1.2, speed=3.0, memory=0.3, state=2.0)  # three advantages, loss 20% worse
    assert d.go and not d.should_scale  # the pass rule holds (excellent metrics); scaling does not


def test_equal_memory_is_good_but_not_an_advantage():
    d = decide(loss=1.04, memory=1.0)
    assert d.grade("memory").grade == "good" and not d.grade("memory").better
    assert not d.should_scale
    barely = decide(loss=1.04, memory=0.999)  # better, but only as "good enough" as equal memory
    assert barely.grade("memory").better and not barely.should_scale
    assert decide(loss=1.04, memory=0.8).should_scale  # promising: 20% less is an advantage


def test_advantage_floor_is_the_first_class_beyond_parity():
    from rayb.analysis.gate import advantage_floor

    metrics = GateSpec().metrics
    assert advantage_floor(metrics["memory"], "good") == "promising"
    assert advantage_floor(metrics["speed"], "good") == "good"
    assert advantage_floor(metrics["statefulness"], "promising") == "promising"
    assert advantage_floor(metrics["loss"], "good") == "excellent"  # "< 1.0": better, strictly


def test_unmeasured_metric_is_reported_and_its_red_line_unchecked():
    d = decide(loss=0.9, state=None)
    assert d.grade("statefulness").grade == "not measured"
    assert (
        "statefulness: not measured, no finite statefulness.accuracy for both models (add the `statefulness` suite to eval)"
        in d.reasons
    )
    assert "red line on statefulness not checked: statefulness not measured" in d.reasons
    assert d.go  # loss is excellent, and an unmeasured metric stops nothing


def test_zero_baseline_is_not_measured():
    table = results_frame(_rows("base", 3.0, 0.0, 100.0, 1000.0) + _rows("cand", 2.9, 0.2, 100.0, 1000.0))
    (d,) = gate_all(GateSpec(), table, "base")
    assert d.grade("statefulness").grade == "not measured"
    assert any("baseline mean is 0" in r for r in d.reasons)


def test_named_candidate_without_trials_fails_the_gate():
    table = results_frame(_rows("base", **BASE))
    (d,) = gate_all(GateSpec(candidates=["ghost"]), table, "base")
    assert not d.go and d.reasons == ["ghost has no finished trial to gate"]


def test_custom_gate_from_the_study_file():
    gate = {
        "metrics": {"speed": {"column": "speed.gen_tokens_per_s", "good": ">= 1.5", "promising": ">= 3",
                              "excellent": ">= 5"}, "memory": None},
        "pass_promising": 1, "red_lines": [{"metric": "loss", "above": 1.1}], "max_loss_spike": None,
    }  # fmt: skip
    spec = parse_study(tiny_study_dict(verdict={"gate": gate})).verdict.gate
    assert set(spec.metrics) == {"loss", "statefulness", "speed"}  # merged over the defaults, memory dropped
    spiked = list(SMOOTH)
    spiked[30] = 9.0
    d = decide(loss=1.08, speed=2.0, spec=spec, curve=spiked)  # one "good" speed: not enough any more
    assert not d.go and not d.red_lines  # spikes are off
    assert decide(loss=1.04, spec=spec).go  # one promising passes with pass_promising: 1
    assert decide(loss=1.12, speed=9.0, spec=spec).red_lines == [
        "loss ratio 1.120 is above the red line 1.1 (significant at 2 seeds)"
    ]


@pytest.mark.parametrize(
    ("gate", "message"),
    [
        ({"metrics": {"loss": {"column": "val_loss", "good": "<= 1.1", "promising": ">= 1.2", "excellent": "< 1"}}},
         "must all say lower is better"),
        ({"metrics": {"loss": {"column": "val_loss", "good": "<= 1.0", "promising": "<= 1.1", "excellent": "< 0.9"}}},
         "excellent must be at least as strict as promising"),
        ({"metrics": {"loss": {"column": "val_los", "good": "<= 1.1", "promising": "<= 1", "excellent": "< 1"}}},
         "'val_los' is not a results column"),
        ({"metrics": {"loss": {"column": "val_loss", "good": "about 1", "promising": "<= 1", "excellent": "< 1"}}},
         "'about 1' is not a ratio condition"),
        ({"red_lines": [{"metric": "latency", "above": 2}]}, "red_lines.0.metric 'latency' is not under gate.metrics"),
        ({"red_lines": [{"metric": "loss", "above": 2, "below": 1}]}, "give exactly one of above or below"),
        ({"candidates": ["nobody"]}, "verdict.gate.candidates: 'nobody' is not a model label"),
        ({"pass_excelent": 1}, "verdict.gate.pass_excelent: unknown field"),
    ],
)  # fmt: skip
def test_invalid_gate_is_rejected_naming_the_field(gate, message):
    with pytest.raises(StudyError) as err:
        parse_study(tiny_study_dict(verdict={"gate": gate}))
    assert "verdict" in str(err.value) and message in str(err.value)


def test_metric_rule_direction():
    assert MetricRule(column="val_loss", good="<= 1.2", promising="<= 1.1", excellent="< 1").lower_is_better
    assert not GateSpec().metrics["speed"].lower_is_better


def test_validate_warns_about_gate_metrics_no_suite_measures(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from rayb.cli import app

    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(tiny_study_dict(eval=["lm", "statefulness"])))
    result = CliRunner().invoke(app, ["validate", str(study)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "gate metric speed reads speed.gen_tokens_per_s, which no eval suite" in result.output
    assert "gate metric statefulness" not in result.output and "gate metric loss" not in result.output


def test_speed_measured_over_different_generation_lengths_is_not_comparable():
    table = results_frame(_rows("base", **BASE) + _rows("cand", 2.9, 0.4, 300.0, 300.0))
    table["speed.gen_tokens"] = [112, 112, 256, 256]  # the baseline's position table stopped it early
    (d,) = gate_all(GateSpec(), table, "base")
    assert d.grade("speed").grade == d.grade("memory").grade == "not comparable"
    assert (
        "speed: not comparable, measured under different conditions (speed.gen_tokens: cand 256, base 112)"
        in d.reasons
    )
    assert any(r.startswith("pass rule met: 1 excellent") for r in d.reasons)  # only the loss counts
    assert d.should_scale is False  # no comparable advantage besides the loss
    table["speed.gen_tokens"] = 256
    (same,) = gate_all(GateSpec(), table, "base")
    assert same.grade("speed").grade == "excellent" and same.should_scale


def test_noise_is_graded_as_parity_by_default():
    noisy = results_frame(_rows("base", **BASE) + _rows("cand", 2.0, 0.5, 100.0, 1000.0))
    noisy.loc[noisy.model == "cand", "statefulness.accuracy"] = [0.30, 0.70]  # mean 0.5, but all over
    (d,) = gate_all(GateSpec(), noisy, "base")
    state = d.grade("statefulness")
    assert state.point_grade == "promising" and state.ratio == pytest.approx(1.25)  # as measured
    assert state.at_parity and state.grade == "below good"  # its class at ratio 1
    assert grade_label(state) == "parity (not significant at 2 seeds)"
    assert any(r.startswith("statefulness: ") and "→ parity (not significant at 2 seeds: |Δ|=0.1" in r
               for r in d.reasons)  # fmt: skip
    loss = d.grade("loss")  # 2.0 vs 3.0, tight: significant, and graded as measured
    assert loss.significant and loss.grade == loss.point_grade == "excellent" and not loss.at_parity
    (off,) = gate_all(GateSpec(significance="none"), noisy, "base")
    assert off.grade("statefulness").grade == "promising" and off.rule.startswith("no significance rule")


def test_noise_never_lifts_a_grade():
    """A worse-looking difference that is not significant keeps its class: parity would flatter it."""
    noisy = results_frame(_rows("base", **BASE) + _rows("cand", 3.0 * 1.10, 0.4, 100.0, 1000.0))
    noisy.loc[noisy.model == "cand", "val_loss"] = [3.0, 3.6]  # 10% worse on average, all over
    loss = gate_all(GateSpec(), noisy, "base")[0].grade("loss")
    assert not loss.significant and loss.grade == loss.point_grade == "good" and not loss.at_parity


def _two_seed_study(candidate_losses: list[float]):
    table = results_frame(_rows("base", **BASE) + _rows("cand", **BASE))
    table.loc[table.model == "base", "val_loss"] = [3.03, 3.07]
    table.loc[table.model == "cand", "val_loss"] = candidate_losses
    return table


@pytest.mark.parametrize("rule", ["2sigma", "welch", "both"])
def test_one_percent_better_at_p_04_is_inconclusive_never_go(rule):
    table = _two_seed_study([3.00, 3.04])  # 1.0% lower mean loss, Welch p ≈ 0.40
    (d,) = gate_all(GateSpec(significance=rule), table, "base")
    assert d.grade("loss").p_value == pytest.approx(0.40, abs=0.01)
    assert d.outcome == "INCONCLUSIVE" and not d.go
    assert d.grade("loss").point_grade == "excellent" and d.grade("loss").grade == "promising"
    (why,) = d.undecided()
    assert (
        why.startswith("loss -1.0% not significant at 2 seeds; ~")
        and "seeds per model would detect it" in why
    )
    assert "pass rule not met: 0 excellent" in " ".join(d.reasons)
    assert "though it is met on the point estimates" in " ".join(d.reasons)
    (point,) = gate_all(GateSpec(significance="none"), table, "base")
    assert point.outcome == "GO"  # as the written gate alone would say


def test_a_clear_difference_passes_every_rule():
    table = _two_seed_study([2.80, 2.81])  # 8% lower, far beyond the spread
    for rule in ("2sigma", "welch", "both"):
        (d,) = gate_all(GateSpec(significance=rule), table, "base")
        assert d.outcome == "GO" and d.grade("loss").significant, rule


def test_should_scale_is_inconclusive_on_noise():
    table = results_frame(_rows("base", **BASE) + _rows("cand", 3.0 * 1.04, 0.4, 130.0, 1000.0))
    table.loc[table.model == "cand", "speed.gen_tokens_per_s"] = [60.0, 200.0]  # 1.3× on average, all over
    (d,) = gate_all(GateSpec(), table, "base")
    assert d.scale == "inconclusive" and not d.should_scale
    assert "though it would on the point estimates" in d.reasons[-1]


def test_significance_alpha_is_refused_with_its_replacement():
    with pytest.raises(StudyError) as err:
        parse_study(tiny_study_dict(verdict={"gate": {"significance_alpha": 0.05}}))
    assert "write `significance: welch` and `alpha: 0.05`" in str(err.value)


def _sized(model: str, arch: str, params: int, loss: float) -> list[ResultRow]:
    return [
        ResultRow("gate", model, arch, 1e-3, seed, f"{model}-{seed}", "ok", val_loss=loss + 0.002 * seed,
                  params_total=params)
        for seed in range(3)
    ]  # fmt: skip


def _scaling_table(candidate_gain: float):
    """The reference at three sizes on L = 60·N^(−0.3) + 1; the candidate at two, gaining `candidate_gain`."""
    law = {n: 60 * n**-0.3 + 1 for n in (1_000_000, 3_000_000, 10_000_000)}
    rows = [r for i, (n, loss) in enumerate(law.items()) for r in _sized(f"base-{i}", "gpt2", n, loss)]
    rows += _sized("cand-s", "mamba", 1_000_000, law[1_000_000])
    rows += _sized("cand-l", "mamba", 3_000_000, law[1_000_000] - candidate_gain)
    return results_frame(rows), law[1_000_000] - law[3_000_000]


def test_a_candidate_that_scales_worse_than_the_reference_law_crosses_a_red_line():
    from rayb.analysis.scaling import fit_arch

    table, predicted = _scaling_table(candidate_gain=0.5 * _scaling_table(0)[1])
    base = table[table.arch == "gpt2"]
    fit = fit_arch("gpt2", base.params_total.to_numpy(float), base.val_loss.to_numpy(float), [])
    decisions = gate_all(GateSpec(), table, "base-0", reference_fit=fit)
    for d in (d for d in decisions if d.candidate.startswith("cand")):
        (line,) = [r for r in d.red_lines if r.startswith("scaling_violation")]
        assert f"gains {predicted / 2:.4f} nats from 1,000,000 to 3,000,000" in line
        assert f"less than the {predicted:.4f} the reference's scaling law predicts" in line
        assert "(standard error over seeds: significant)" in line and d.outcome == "NO-GO"
    fine, _ = _scaling_table(candidate_gain=1.2 * predicted)
    assert not any(r.startswith("scaling_violation") for d in gate_all(GateSpec(), fine, "base-0", reference_fit=fit)
                   for r in d.red_lines)  # fmt: skip
    off = gate_all(GateSpec(scaling_violation=False), table, "base-0", reference_fit=fit)
    assert not any("scaling" in r for d in off for r in d.reasons)


def test_scaling_is_not_checked_with_one_size_or_without_a_law():
    (d,) = gate_all(GateSpec(), results_frame(_rows("base", **BASE) + _rows("cand", **BASE)), "base")
    assert "red line on scaling not checked: cand is trained at one size" in d.reasons
    table, _ = _scaling_table(0.1)
    d = next(d for d in gate_all(GateSpec(), table, "base-0") if d.candidate == "cand-l")
    assert "red line on scaling not checked: the reference's scaling law is not usable (no fit)" in d.reasons


@pytest.mark.parametrize(("losses", "words", "never"), [
    ([3.05, 3.10], "loss +0.8% worse (not significant at 2 seeds), inside the promising bound", "+0.8% promising"),
    ([2.80, 2.81], "loss -8.0% excellent", "loss -8.0% worse"),
])  # fmt: skip
def test_the_headline_names_a_worse_loss_for_what_it_is(losses, words, never):
    """A loss 0.8% worse, not significant, sits inside "promising"'s 5% bound: the headline says worse."""
    from rayb.report.sections import gate_headline

    (d,) = gate_all(GateSpec(), _two_seed_study(losses), "base")
    headline = gate_headline(d)
    assert words in headline and never not in headline
