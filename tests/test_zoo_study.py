"""Every architecture, and both example candidates, trained through the real path in one tiny study:
Ray Data → Tune → Ray Train + DeepSpeed → eval actors → results table."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.cli import app
from rayb.models.accounting import model_cost

pytestmark = pytest.mark.ray

TINY = {"d_model": 32, "n_layer": 2}
MODELS = [
    {"arch": "gpt2", "config": TINY | {"n_head": 2}},
    {"arch": "nanogpt", "config": TINY | {"n_head": 2, "bias": False, "tie_embeddings": False}},
    {"arch": "pythia", "config": TINY | {"n_head": 2}},
    {"arch": "llama", "size": "66K"},
    {"arch": "mamba", "config": TINY | {"d_state": 4}},
    {"arch": "mamba2", "config": TINY | {"d_state": 16, "head_dim": 16, "chunk_size": 16}},
    {"arch": "gated_deltanet", "config": TINY | {"head_dim": 16, "n_head": 2, "chunk_size": 16}},
    {"arch": "rwkv6", "config": TINY | {"head_size": 16}},
    {"arch": "examples.backpack:build", "name": "backpack", "config": TINY | {"n_head": 2, "n_senses": 4}},
    {"arch": "examples.moe:build", "name": "moe", "config": TINY | {"n_head": 2, "n_experts": 4}},
]


@pytest.fixture(scope="module")
def zoo_run(ray_session, tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    raw = tiny_study_dict(name="zoo", models=MODELS, seeds=1)
    raw["data"]["token_budget"] = 32 * 8 * 12
    raw["train"]["eval_every"] = 12
    study_file = out / "zoo.yaml"
    study_file.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(study_file), "--output", str(out)])
    assert result.exit_code == 0, result.output
    (study_dir,) = (out / "studies").iterdir()
    return pd.read_parquet(study_dir / "results.parquet"), out


def test_every_architecture_trains_and_evaluates(zoo_run):
    table, out = zoo_run
    assert list(table.model) == [m.get("name", m["arch"]) for m in MODELS]
    assert (table.status == "ok").all(), table[["model", "error"]]
    vocab = json.loads(next((out / "cache" / "data").glob("*/manifest.json")).read_text())["vocab_size"]
    assert (table.val_loss < math.log(vocab)).all(), table[["model", "val_loss"]]


def test_results_carry_the_same_accounting_as_rayb_params(zoo_run):
    table, out = zoo_run
    vocab = json.loads(next((out / "cache" / "data").glob("*/manifest.json")).read_text())["vocab_size"]
    for row in table.itertuples():
        config = json.loads(row.config)["model"]
        cost = model_cost(row.arch, config, vocab, 32)
        assert row.params_total == cost.total_params, row.model  # counted from the trained model
        assert row.train_flops == pytest.approx(row.train_tokens * cost.train_flops_per_token)
    llama = table.set_index("model").loc["llama"]
    assert abs(llama.params_total / 66_000 - 1) <= 0.02  # `size: 66K` was solved, then trained


def test_candidate_metrics_reach_the_results_table(zoo_run):
    table, out = zoo_run
    moe = table.set_index("model").loc["moe"]
    assert 0 <= moe["extra.expert_gini"] < 1 and 0 < moe["extra.expert_entropy"] <= 1
    assert table.set_index("model")["extra.expert_gini"].drop("moe").isna().all()
    (trial_dir,) = (out / "trials").glob("moe-*")
    steps = [json.loads(line) for line in (trial_dir / "metrics.jsonl").read_text().splitlines()]
    assert all("extra.expert_gini" in r for r in steps if r["kind"] == "train")
