"""`rayb plan`'s MFU: each model's by its size (measured by bench/gpu_check.py, or the stated assumption),
or one the user gives; and the team studies of small models packed several trials to a GPU. Pure: no
Ray, no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rayb import mfu
from rayb.cli import app
from rayb.mfu import Measurement, model_mfu, read_measurements, record_measurements
from rayb.models.accounting import model_cost
from rayb.models.presets import PRESETS
from rayb.plan import plan_study
from rayb.study import load_study, parse_study
from rayb.tune.packs import Capacity, trial_slots

CONFIGS = Path(__file__).parent.parent / "configs"
GATE = CONFIGS / "groundthink-gate.yaml"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _no_user_measurements(tmp_path, monkeypatch):
    """The default measurements file is the test's own (none), never the user's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def _flops(study, label: str) -> float:
    plan = plan_study(study, 312e12, 1.0)
    model = next(m for m in plan.models if m.label == label)
    return model.flops_per_trial / model.tokens_per_trial


def _measured(model: str, flops: float, value: float, trials: int = 1, gpu: str = "a100") -> Measurement:
    return Measurement(gpu, f"NVIDIA {gpu.upper()}", "2025-01-01", model, flops, trials, value, "bf16")


def _gate_with(models: list[dict], seeds: int = 10, **train) -> object:
    raw = yaml.safe_load(GATE.read_text())
    raw["models"], raw["verdict"] = models, {"reference": models[0].get("name") or models[0]["preset"]}
    raw["seeds"], raw["train"] = seeds, raw["train"] | train
    return parse_study(raw)


def _plan(*args: str) -> str:
    result = runner.invoke(app, ["plan", *map(str, args)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_small_model_is_priced_at_a_lower_mfu_than_a_large_one():
    study = _gate_with([{"preset": "gpt2-3.5m"}, {"arch": "llama", "size": "1B", "name": "llama-1b"}],
                       num_workers=4, micro_batch=32, gpus_per_trial=None)  # fmt: skip
    small, large = plan_study(study, 312e12).models
    assert small.mfu.source == large.mfu.source == "assumed"
    assert small.mfu.value < 0.5 * large.mfu.value and large.mfu.value == mfu.ASSUMED_CEILING
    # Priced each at its own MFU, the small model costs more GPU-hours per FLOP.
    hours = plan_study(study, 312e12)
    assert (
        hours.trial_gpu_hours(small) / small.flops_per_trial
        > 2 * hours.trial_gpu_hours(large) / large.flops_per_trial
    )


def test_the_assumed_curve_rises_with_size_to_its_ceiling():
    sizes = [1e6, 1e7, 1e8, 1e9, 1e10]
    values = [mfu.assumed_mfu(6 * n) for n in sizes]
    assert values == sorted(values) and values[0] < 0.1 < values[2] and values[-2] == values[-1] == 0.4


def test_measurements_are_interpolated_in_log_size_and_stand_only_near_the_sizes_measured():
    measured = [_measured("small", 1e8, 0.10), _measured("large", 1e10, 0.30)]
    assert model_mfu(1e9, 1, measured) == mfu.Mfu(pytest.approx(0.20), "measured")  # halfway in log(size)
    assert model_mfu(1e8 / 1.4, 1, measured).value == 0.10  # within 1.5× of the smallest measured size
    beyond = model_mfu(1e8 / 2, 1, measured)
    assert beyond == mfu.Mfu(mfu.assumed_mfu(1e8 / 2), "assumed")


def test_packed_trials_take_a_packed_measurement_else_an_assumed_gain():
    alone = [_measured("small", 1e8, 0.10)]
    # Between the gains measured on an H200 and an H100: ten packed trials together at 1.38× one alone.
    assert model_mfu(1e8, 10, alone) == mfu.Mfu(
        pytest.approx(0.138, abs=1e-3), "measured alone, ×1.4 assumed"
    )
    assert model_mfu(1e8, 4, alone + [_measured("small", 1e8, 0.15, trials=4)]) == mfu.Mfu(0.15, "measured")
    assert model_mfu(1e8, 10, []) == mfu.Mfu(pytest.approx(1.38 * mfu.assumed_mfu(1e8), rel=1e-2), "assumed")
    capped = model_mfu(1e8, 100, [_measured("small", 1e8, 0.30)])  # 100**0.139 × 30% would pass the ceiling
    assert capped == mfu.Mfu(mfu.ASSUMED_CEILING, "measured alone, ×1.9 assumed")


def test_the_measurements_file_round_trips_and_replaces_a_measurement_of_the_same_run(tmp_path):
    path = tmp_path / "mfu.json"
    record_measurements(path, [_measured("gpt2", 8.5e8, 0.3), _measured("gpt2", 8.5e8, 0.5, gpu="h100")])
    record_measurements(path, [_measured("gpt2", 8.5e8, 0.35), _measured("gpt2-3.5m", 1.1e8, 0.2, trials=10)])
    assert json.loads(path.read_text())["format"] == "rayb-measured-mfu"
    assert {(m.model, m.trials_per_gpu, m.mfu) for m in read_measurements(path, "A100")} == {
        ("gpt2", 1, 0.35), ("gpt2-3.5m", 10, 0.2)
    }  # fmt: skip
    assert [m.mfu for m in read_measurements(path, "h100")] == [0.5]
    path.write_text(json.dumps({"measurements": []}))
    with pytest.raises(ValueError, match="not a rayb-measured-mfu file"):
        read_measurements(path, "a100")


def test_plan_names_each_models_mfu_and_where_it_comes_from(tmp_path):
    study = load_study(GATE)
    path = tmp_path / "mfu.json"
    record_measurements(path, [_measured("gpt2-3.5m", _flops(study, "gpt2-3.5m"), 0.12),
                               _measured("gpt2-125m", _flops(study, "gpt2-125m"), 0.35)])  # fmt: skip
    text = _plan(GATE, "--measured", path)
    assert (
        "gpt2-3.5m │ 16,615,808 │ 10 │ 3,814 │ 999,817,216 │ 1.11e+17 │ 15% measured alone, ×1.2 assumed"
        in text
    )
    assert "40% measured alone, ×1.2 assumed" in text  # gpt2-125m's 35%, ×1.21 past the ceiling: capped
    assert f"MFU measured: by bench/gpu_check.py on NVIDIA A100 on 2025-01-01 ({path})" in text
    assert "GPU-hours at each model's MFU of 312 TFLOP/s per GPU" in text
    assumed = _plan(GATE, "--gpu", "a10g")  # no measurement of an A10G anywhere
    assert (
        "26% assumed" in assumed
        and "MFU measured: none for a10g in " in assumed
        and "or rayb's own" in assumed
    )
    assert "an assumption, not a measurement" in assumed


def test_rayb_prices_by_its_own_measurements_where_the_user_has_none_of_that_gpu():
    """The H200 and H100 measurements rayb ships, of presets whose FLOPs per token the accounting still
    gives."""
    shipped = read_measurements(mfu.SHIPPED, "h200")
    assert {(m.model, m.trials_per_gpu) for m in shipped} == {
        ("gpt2", 1),
        ("gpt2-3.5m", 1),
        ("gpt2-3.5m", 10),
    }
    h100 = read_measurements(mfu.SHIPPED, "h100")
    assert {(m.model, m.trials_per_gpu) for m in h100} == {("gpt2-3.5m", 1), ("gpt2-3.5m", 10)}
    for m in shipped + h100:  # at gpu_check's vocabulary and sequence length
        cost = model_cost(PRESETS[m.model].arch, PRESETS[m.model].config, 50257, 1024)
        assert m.train_flops_per_token == cost.train_flops_per_token
    text = _plan(GATE, "--gpu", "h200")
    assert (
        "gpt2-3.5m │ 16,615,808 │ 10 │ 3,814 │ 999,817,216 │ 1.11e+17 │ 3% measured alone, ×1.2 assumed"
        in text
    )
    assert (
        f"MFU measured: by bench/gpu_check.py on NVIDIA H200 on 2026-11-27 (rayb's own, {mfu.SHIPPED})"
        in text
    )
    # The user's own measurements of that GPU replace rayb's.
    record_measurements(mfu.default_path(), [_measured("gpt2-3.5m", 1.1e8, 0.12, gpu="h200")])
    assert "15% measured alone, ×1.2 assumed" in _plan(GATE, "--gpu", "h200")


def test_an_mfu_the_user_gives_prices_every_model(tmp_path):
    text = _plan(GATE, "--mfu", "0.3")
    assert text.count("30% given (--mfu)") == 7 and "GPU-hours at 30% MFU of 312 TFLOP/s" in text
    assert "MFU assumed" not in text
    both = runner.invoke(app, ["plan", str(GATE), "--mfu", "0.3", "--measured", str(tmp_path / "x.json")])
    assert both.exit_code == 2 and "pass one" in both.output
    (tmp_path / "bad.json").write_text("{}")
    bad = runner.invoke(app, ["plan", str(GATE), "--measured", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "not a rayb-measured-mfu file" in " ".join(bad.output.split())


def test_a_shared_gpu_is_priced_for_every_trial_on_it():
    """Four trials to a GPU at a flat MFU: the same GPU-hours as one trial per GPU, each trial four
    times as long, since the four split the GPU's throughput."""
    whole, shared = (
        plan_study(_gate_with([{"preset": "gpt2-3.5m"}], seeds=8, num_workers=1, gpus_per_trial=share), 312e12, 0.4)
        for share in (None, 0.25)
    )  # fmt: skip
    assert shared.gpu_hours == pytest.approx(whole.gpu_hours)
    assert shared.wall_hours(gpus=1) == pytest.approx(whole.wall_hours(gpus=1))  # eight trials, one GPU
    assert shared.wall_hours(gpus=8) == pytest.approx(4 * whole.wall_hours(gpus=8))  # each trial alone


PACKED = {"groundthink-gate": 4, "some-vs-gpt2": 4}  # team studies of small models: trials per GPU


@pytest.mark.parametrize("name", ["groundthink-gate", "some-vs-gpt2", "neuromorphic", "titans", "backpack"])
def test_team_studies_of_small_models_pack_several_trials_to_a_gpu(name):
    if name not in PACKED:  # large models (or backpack's 250K-token head): whole GPUs, as planned
        assert "gpus_per_trial" not in yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())["train"]
        return
    study = load_study(CONFIGS / f"{name}.yaml")
    assert study.train.gpus_per_trial == 1 / PACKED[name] and study.train.num_workers == 1
    assert trial_slots(study.train, Capacity.of_gpus(8)) == 8 * PACKED[name]


def test_plan_shows_the_gate_study_four_trials_to_a_gpu():
    text = _plan(GATE)
    assert "0.25 GPUs per trial" in text and "32 groups at once (32 fit, 4 to a GPU)" in text
