"""Self-checks (rayb/models/selfcheck.py): they pass on every built-in architecture, catch a lost cache,
a stale state and a broken fast path, and stop a study before anything trains."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.cli import app
from rayb.models import available
from rayb.models.selfcheck import DECODING, FAST_PATH, ModelToCheck, check_models, relative_error

SHAPES = {
    "gpt2": {"d_model": 64, "n_layer": 2, "n_head": 2},
    "pythia": {"d_model": 64, "n_layer": 2, "n_head": 2},
    "llama": {"d_model": 64, "n_layer": 2, "n_head": 2},
    "nanogpt": {"d_model": 64, "n_layer": 2, "n_head": 2},
    "mamba": {"d_model": 64, "n_layer": 2, "d_state": 8},
    "mamba2": {"d_model": 64, "n_layer": 2, "chunk_size": 16},
    "gated_deltanet": {"d_model": 64, "n_layer": 2, "head_dim": 16, "chunk_size": 16},
    "rwkv6": {"d_model": 64, "n_layer": 2, "head_size": 16},
}
HAS_FAST_PATH = {"mamba", "mamba2", "gated_deltanet", "rwkv6"}
HAS_MEMORY = set(SHAPES) - {"nanogpt"}  # nanoGPT recomputes the prefix: nothing to check


def checks(arch: str, **kwargs) -> dict[str, object]:
    results = check_models([ModelToCheck(arch, arch, SHAPES[arch])], 300, 64, **kwargs)
    return {r.check: r for r in results}


def test_every_builtin_architecture_is_covered():
    assert set(SHAPES) == set(available())


@pytest.mark.parity
@pytest.mark.parametrize("arch", sorted(SHAPES))
def test_decoding_equals_the_full_forward_and_fast_paths_their_references(arch):
    """On the installed libraries (the canary runs this on the newest ones)."""
    got = checks(arch)
    decoding, fast = got[DECODING], got[FAST_PATH]
    assert (decoding.error is not None) == (arch in HAS_MEMORY), decoding
    assert (fast.error is not None) == (arch in HAS_FAST_PATH), fast
    assert not decoding.failed and not fast.failed, (decoding.describe(), fast.describe())
    assert decoding.seconds + fast.seconds < 5  # the budget; measured well under 1 s here


@pytest.mark.parametrize("arch", ["mamba", "mamba2"])
def test_a_cache_the_mixer_drops_fails_the_decoding_check(arch, monkeypatch):
    """transformers 5.24 renamed the mixers' cache argument: a mixer that reads only the old name runs
    its cache-free path during decoding. That is what this reproduces."""
    from rayb.models import mamba_cpu

    monkeypatch.setattr(mamba_cpu, "_legacy_cache", lambda cache, kwargs: kwargs.pop("cache_params", None))
    decoding = checks(arch)[DECODING]
    assert decoding.failed and decoding.error > 0.1, decoding


@pytest.mark.parametrize(
    ("arch", "module", "kernel"),
    [("rwkv6", "rayb.models.rwkv6", "chunked_wkv"),
     ("gated_deltanet", "rayb.models.gated_deltanet", "chunk_gated_delta_rule"),
     ("mamba2", "rayb.models.mamba_cpu", "chunked_ssd")],
)  # fmt: skip
def test_a_broken_fast_path_fails_its_check(arch, module, kernel, monkeypatch):
    import importlib

    mod = importlib.import_module(module)
    right = getattr(mod, kernel)

    def slightly_wrong(*args, **kwargs):
        out = right(*args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        wrong = first + 1e-2 * first.roll(1, dims=1)  # each position leaks into the next: a causal bug
        return (wrong, *out[1:]) if isinstance(out, tuple) else wrong

    monkeypatch.setattr(mod, kernel, slightly_wrong)
    fast = checks(arch)[FAST_PATH]
    assert fast.failed, fast


def test_the_relative_error_is_float64s_to_its_last_digits_and_nan_fails():
    generator = torch.Generator().manual_seed(0)
    want = torch.randn(100_000, generator=generator) * 30
    for scale in (1e-7, 1e-5, 1e-2):
        got = want + scale * torch.randn(100_000, generator=generator)
        exact = (got.double() - want.double()).abs().max() / want.double().abs().max()
        assert relative_error(got, want) == pytest.approx(exact.item(), rel=1e-6)
    assert relative_error(want.bfloat16(), want) == pytest.approx(
        ((want.bfloat16().double() - want.double()).abs().max() / want.double().abs().max()).item(), rel=1e-6
    )
    assert relative_error(torch.ones(3), torch.zeros(3)) == 1.0  # no scale: the absolute error
    broken = want.clone()
    broken[7] = float("nan")
    assert math.isnan(relative_error(broken, want)) and math.isnan(relative_error(want, broken))


def test_a_model_that_cannot_be_built_is_recorded_not_raised():
    results = check_models([ModelToCheck("bad", "gpt2", {"d_model": 30, "n_head": 4})], 300, 64)
    assert results[0].error is None and "raised" in results[0].note and not results[0].failed


def _study_file(tmp_path, **overrides) -> str:
    study = tiny_study_dict(
        models=[
            {"arch": "gpt2", "config": {"d_model": 32, "n_layer": 2, "n_head": 2}},
            {"arch": "faulty_models:stale_state", "name": "mine", "config": {"width": 32}},
        ],
        eval=["lm", "speed"],
        **overrides,
    )
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return str(path)


def test_validate_stops_on_a_stale_state_naming_the_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["validate", _study_file(tmp_path)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert "mine: decoding (state" in output and "checks.allow_decoding_mismatch: [mine]" in output
    assert "gpt2: decoding" in output and "transformers" in output  # the versions installed


def test_a_study_that_does_not_decode_skips_the_decoding_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = yaml.safe_load(open(_study_file(tmp_path)))
    (tmp_path / "lm_only.yaml").write_text(yaml.safe_dump(study | {"eval": ["lm"]}))
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "lm_only.yaml")])
    assert result.exit_code == 0, result.output
    assert "decoding" not in result.output


def test_an_override_must_name_a_model(tmp_path):
    result = CliRunner().invoke(
        app, ["validate", _study_file(tmp_path, checks={"allow_decoding_mismatch": ["nobody"]})]
    )
    assert result.exit_code == 2 and "checks" in result.output and "nobody" in result.output


@pytest.mark.ray
def test_run_stops_before_any_trial_trains(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", _study_file(tmp_path), "--output", str(tmp_path / "out")])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, output
    assert "self-checks failed before training: mine: decoding" in output
    assert not (tmp_path / "out" / "trials").exists()  # nothing trained, nothing claimed


@pytest.mark.ray
def test_an_overridden_failure_runs_and_the_report_marks_its_scores(ray_session, tmp_path, monkeypatch):
    from rayb.runner import run_study
    from rayb.study import load_study

    monkeypatch.chdir(tmp_path)
    path = _study_file(
        tmp_path, checks={"allow_decoding_mismatch": ["mine"]}, seeds=1,
        eval_options={"speed": {"prefill_tokens": 16, "gen_tokens": 4, "lengths": [8, 16], "warmup": 0, "repeats": 1}},
    )  # fmt: skip
    outcome = run_study(load_study(path), tmp_path / "out", log=lambda _: None)
    checks_run = outcome.report.provenance["self_checks"]
    mine = next(c for c in checks_run if c["model"] == "mine" and c["check"] == DECODING)
    assert mine["overridden"] and mine["error"] > mine["tolerance"]
    report = outcome.files["report"].read_text()
    assert "mine †" in report and "decoding self-check failed" in report
    assert torch.isfinite(torch.tensor(outcome.table["speed.gen_tokens_per_s"].to_numpy())).all()


def test_what_the_checks_build_models_with_imports_in_a_background_thread():
    """The driver imports it while Ray starts (runner.run_study): a fresh interpreter has it once the
    thread ends."""
    code = (
        "import sys; from rayb.models.selfcheck import import_in_background; "
        "assert 'transformers.modeling_utils' not in sys.modules; import_in_background().join(); "
        "assert 'transformers.modeling_utils' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
