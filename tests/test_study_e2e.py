"""A tiny study through the real path: Ray Data → Tune → Ray Train + DeepSpeed → eval actors → verdict."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml
from conftest import tiny_study_dict
from typer.testing import CliRunner

from rayb.cli import app
from rayb.study import parse_study

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def study_run(ray_session, tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    study_file = out / "tiny.yaml"
    study_file.write_text(yaml.safe_dump(tiny_study_dict()))
    result = CliRunner().invoke(app, ["run", str(study_file), "--output", str(out)])
    return out, study_file, result


def test_study_writes_results_table_and_report(study_run):
    out, study_file, result = study_run
    assert result.exit_code == 0, result.output
    study = parse_study(yaml.safe_load(study_file.read_text()))
    (study_dir,) = (out / "studies").iterdir()
    table = pd.read_parquet(study_dir / "results.parquet")

    assert len(table) == 4  # 2 models × 1 lr × 2 seeds, each exactly once
    assert sorted(zip(table.model, table.seed, strict=True)) == [
        ("gpt2", 0),
        ("gpt2", 1),
        ("mamba", 0),
        ("mamba", 1),
    ]
    assert (table.status == "ok").all(), table[["model", "seed", "error"]]
    assert table.trial_key.is_unique
    assert (table.steps == study.steps).all()
    manifest = json.loads(next((out / "cache" / "data").glob("*/manifest.json")).read_text())
    for row in table.itertuples():
        assert row.val_loss < math.log(manifest["vocab_size"])  # learned something
        assert row.val_ppl == pytest.approx(math.exp(row.val_loss))
        assert 0 < row.val_bpb < row.val_loss / math.log(2)  # more than one byte per token
        assert len(row.curve_train_loss) == study.steps and list(row.curve_val_step) == [8, 16, 24]
    # Seeds differ in initialisation, so their results differ too.
    assert table.groupby("model").val_loss.nunique().eq(2).all()

    verdict = json.loads((study_dir / "results.json").read_text())
    assert verdict["reference"] == "gpt2"
    assert {c["candidate"] for c in verdict["comparisons"]} == {"mamba"}
    assert (study_dir / "loss_curves.png").stat().st_size > 10_000
    assert "mamba" in (study_dir / "report.md").read_text()
    assert "gpt2 (ref)" in result.output  # the comparison table is printed


def test_rerun_trains_nothing(study_run):
    out, study_file, _ = study_run
    (study_dir,) = (out / "studies").iterdir()
    before = {p: p.stat().st_mtime_ns for p in (out / "trials").rglob("model.safetensors")}
    result = CliRunner().invoke(app, ["run", str(study_file), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "trained 0 trials, evaluated 0" in result.output
    assert {p: p.stat().st_mtime_ns for p in (out / "trials").rglob("model.safetensors")} == before
    assert len(pd.read_parquet(study_dir / "results.parquet")) == 4
