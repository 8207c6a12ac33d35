"""The five teams' study files: every full-size file validates and plans; every `*-tiny.yaml` runs end to
end through the real path (Ray Data → Ray Train + DeepSpeed → eval actors → report) and its
report carries what its full-size plan asks for. Together they train every architecture of the zoo."""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from rayb.cli import app
from rayb.models.accounting import model_cost
from rayb.results import read_results
from rayb.study import load_study

ROOT = Path(__file__).parent.parent
CONFIGS = ROOT / "configs"
PLANS = ["neuromorphic", "titans", "some-vs-gpt2", "backpack", "groundthink-gate"]
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def _repo_root():
    # The study files name their users' models by import path (examples.backpack:build), from the repo root.
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        patch.syspath_prepend(str(ROOT))
        yield


# Per full-size study: what validate's size warnings must say, and what they must not.
SIZE_WARNINGS = {
    # The gate compares candidate-8m with gpt2-8m only: RWKV-6's untied head makes it 1.54× the total;
    # candidate-3.5m is within ±2% and not compared.
    "groundthink-gate": (
        ["candidate-8m vs gpt2-8m, matched by non-embedding parameters, still differ in total parameters "
         "40,178,560 vs 26,072,736 (1.54×, more than 1.25×)"],
        ["candidate-3.5m"],
    ),
    # titans' Mamba-2 at 360M has 39 layers, 19.5 blocks: as deep as Transformer++'s 19.
    "titans": (["gdn-360m vs transformerpp-360m"], ["mamba2-360m vs"]),
}  # fmt: skip


@pytest.mark.parametrize("plan", [*PLANS, "backpack-pretrain"])
def test_full_size_studies_validate_and_plan(plan):
    result = runner.invoke(app, ["validate", f"configs/{plan}.yaml"])
    assert result.exit_code == 0, result.output
    # The size warnings: after the last model's line (it ends "N training FLOPs"), before the self-checks.
    output = " ".join(result.output.split())
    warnings = re.split(r"training FLOPs(?! per)", output)[-1].split("self-checks")[0]
    present, absent = SIZE_WARNINGS.get(plan, ([], []))
    assert all(w in warnings for w in present) and not any(w in warnings for w in absent), warnings
    result = runner.invoke(app, ["plan", f"configs/{plan}.yaml", "--gpu", "a100", "--mfu", "0.4"])
    assert result.exit_code == 0, result.output
    assert "GPU-hours at 40% MFU of 312 TFLOP/s per GPU" in " ".join(result.output.split())
    assert load_study(f"configs/{plan}.yaml").train.use_gpu


def test_plan_arithmetic_and_the_backpack_parameter_check():
    study = load_study("configs/backpack.yaml")
    from rayb.plan import plan_study

    plan = plan_study(study, peak_flops=100e12, mfu=0.5)
    transformer = next(m for m in plan.models if m.label == "transformer")
    assert transformer.params_total == 202_819_968  # the plan's exact count
    assert transformer.trials == len(study.seeds)
    assert transformer.tokens_per_trial == study.steps * study.train.global_batch * study.data.seq_len
    assert plan.gpu_hours == pytest.approx(plan.flops / 50e12 / 3600)
    assert "202,819,968 parameters" in runner.invoke(app, ["validate", "configs/backpack.yaml"]).output


def test_plan_needs_the_size_of_a_hub_tokenizer(tmp_path):
    raw = (CONFIGS / "neuromorphic.yaml").read_text().replace("  vocab_size: 32000\n", "")
    (tmp_path / "study.yaml").write_text(raw)
    result = runner.invoke(app, ["plan", str(tmp_path / "study.yaml")])
    assert result.exit_code == 2 and "set data.vocab_size" in result.output


@pytest.fixture(scope="module")
def team_runs(ray_session, tmp_path_factory):
    """Runs each tiny study on first use, into one shared output (the backpack study reuses the
    pretraining it starts from); each test's timeout then covers one study, not all five."""
    out = tmp_path_factory.mktemp("teams")

    @functools.cache
    def run(plan):
        result = CliRunner().invoke(app, ["run", str(CONFIGS / f"{plan}-tiny.yaml"), "--output", str(out)])
        study = load_study(CONFIGS / f"{plan}-tiny.yaml")
        study_dir = out / "studies" / f"{study.name}-{study.fingerprint()}"
        table = (
            read_results(study_dir / "results.parquet") if (study_dir / "results.parquet").exists() else None
        )
        return result, study, study_dir, table

    return run


@pytest.mark.ray
@pytest.mark.parametrize("plan", PLANS)
def test_tiny_study_runs_end_to_end(team_runs, plan):
    result, study, study_dir, table = team_runs(plan)
    assert result.exit_code == 0, result.output
    assert (table.status == "ok").all(), table[["model", "seed", "error"]]
    assert all(e == {} for e in table.eval_errors), table.eval_errors  # every suite ran on every checkpoint
    assert list(dict.fromkeys(table.model)) == [m.label for m in study.models]
    report = (study_dir / "report.md").read_text()
    for section in ("## Verdict", "## Comparison", "## Gate", "## Benchmarks", "## Provenance"):
        assert section in report, section
    assert (study_dir / "report.html").stat().st_size > 20_000
    assert (study_dir / "summary.txt").read_text().startswith(f"Study {study.name}")
    vocab = study.data.nominal_vocab  # bpe:N trains exactly N tokens on these corpora; bytes is 257
    for row in table[table.pretrained == ""].itertuples():  # the accounting `rayb params` prints
        cost = model_cost(row.arch, json.loads(row.model_config), vocab, study.data.seq_len)
        assert row.params_total == cost.total_params, row.model
        assert row.train_flops == pytest.approx(row.train_tokens * cost.train_flops_per_token)


def _ok(team_runs, plan):
    result, study, study_dir, table = team_runs(plan)
    if result.exit_code != 0:
        pytest.fail(f"{plan}-tiny did not run: {result.output[-2000:]}")
    return study, study_dir, table


@pytest.mark.ray
def test_neuromorphic_evaluates_pretrained_references_with_their_own_tokenizers(team_runs):
    study, study_dir, table = _ok(team_runs, "neuromorphic")
    references = table[table.pretrained != ""].set_index("model")
    assert list(references.index) == ["pythia-pretrained", "mamba-pretrained"]
    assert (references.steps == 0).all() and (references.params_total > 0).all()
    # Their tokenizers are not the study's: loss per token is not comparable, bits per byte is.
    assert references.val_loss.isna().all() and (references.val_bpb > 0).all()
    corpora = [c for c in table.columns if c.startswith("lm:embedded://") and c.endswith(".ppl")]
    assert len(corpora) == 3 and table[corpora].notna().all().all()
    assert table["lm_eval:rayb_text.bits_per_byte"].notna().all()
    # References are reference points, not candidates of the gate.
    gated = {c["candidate"] for c in json.loads((study_dir / "results.json").read_text())["gate"]}
    assert gated == {"mamba-scratch"}
    # Every suite here may run on a drained Train worker, and on one machine every job waits for them, the
    # references' too (there from the start): no eval actor imports torch and transformers again.
    result, *_ = team_runs("neuromorphic")
    evaluations = re.findall(r"eval \d+/\d+: \w+ × \S+ in [\d.]+s(.*): ok", result.output)
    assert len(evaluations) == 22 and set(evaluations) == {" on a drained Train worker"}, result.output


@pytest.mark.ray
def test_titans_trains_all_on_adopt_atan2_and_measures_bytes_and_babilong(team_runs):
    study, study_dir, table = _ok(team_runs, "titans")
    assert {train["optimizer"] for train in table.train} == {"adopt_atan2"}
    assert table.steps.nunique() == 1  # same steps, batch and sequence length for every model
    # A token per byte (end-of-text tokens add loss but no bytes, hence the tolerance).
    assert np.allclose(table.val_bpb, table.val_loss / math.log(2), rtol=0.01)
    assert table["babilong.accuracy"].between(0, 1).all() and table["babilong.acc.len1024"].notna().all()
    assert (study_dir / "babilong.png").exists() and "BABILong" in (study_dir / "report.md").read_text()


@pytest.mark.ray
def test_some_vs_gpt2_reports_each_epoch_and_the_expert_load(team_runs):
    study, study_dir, table = _ok(team_runs, "some-vs-gpt2")
    assert all(len(losses) == study.train.epochs for losses in table.epoch_val_loss)
    assert all(list(losses) == sorted(losses, reverse=True) for losses in table.epoch_val_loss)  # it learns
    some = table[table.model == "some"]
    assert (
        some["extra.expert_gini"].between(0, 1).all()
        and table.loc[table.model != "some", "extra.expert_gini"].isna().all()
    )
    for extras in some.epoch_extra:
        assert all(0 <= e["expert_gini"] < 1 and 0 < e["expert_entropy"] <= 1 for e in extras)
    assert (study_dir / "metrics.png").stat().st_size > 10_000
    summary = (study_dir / "summary.txt").read_text()
    assert "Per-epoch validation" in summary and "expert_gini" in summary


@pytest.mark.ray
def test_backpack_finetuning_arm_starts_from_the_pretrained_weights(team_runs):
    study, study_dir, table = _ok(team_runs, "backpack")
    first_loss = table.groupby("model").curve_train_loss.apply(lambda c: sum(x[0] for x in c) / len(c))
    # From scratch a byte model starts near ln(257) = 5.55; the finetuning arm starts from weights
    # already trained on text, so its very first batch scores far lower.
    assert (
        first_loss["transformer"] > 5.0
        and first_loss["transformer-finetuned"] < first_loss["transformer"] - 1
    )
    params = table.groupby("model").params_total.max()
    assert params["backpack"] > params["transformer"] == params["transformer-finetuned"]


@pytest.mark.ray
def test_groundthink_gate_scaling_overfit_and_reverse_test(team_runs):
    study, study_dir, table = _ok(team_runs, "groundthink-gate")
    report = (study_dir / "report.md").read_text()
    assert "Gate, **candidate-s** vs **gpt2-s**" in report
    assert (study_dir / "scaling_law.png").exists() and "## Scaling laws" in report
    assert (study_dir / "overfit.png").exists()
    assert (table["overfit.final_loss"] < table["overfit.initial_loss"]).all()
    for column in ("statefulness.accuracy", "long_context.ppl@1x", "speed.gen_tokens_per_s"):
        assert table[column].notna().all(), column
    # The context curve goes past the trained length for the candidate; GPT-2's learned positions stop it.
    beyond = table.set_index("model")["long_context.ppl@4x"]
    assert beyond[["candidate-s"]].notna().all() and beyond.drop("candidate-s").isna().all()
    sys.path.insert(0, str(ROOT / "bench"))
    from reverse_test import reverse_test

    (check,) = reverse_test(study_dir, model="gpt2-m", seeds=[0], tolerance=0.05)
    assert check["passed"], check
    assert check["rayb_median_step_s"] > 0 and check["ref_median_step_s"] > 0  # bench/overhead's step ratio
