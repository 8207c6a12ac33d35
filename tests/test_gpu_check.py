"""bench/gpu_check.py's pieces that run without a GPU: its help, its refusal without one, the packing
verdict, the MFU measurements it records for `rayb plan`, the precisions it reports beside MFU, and the
data its studies train on."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rayb.mfu import read_measurements, record_measurements

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_it_explains_itself_and_refuses_without_a_gpu():
    help_text = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    )
    assert "ten seeds packed" in help_text.stdout and "--measured-out" in help_text.stdout
    refused = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert refused.returncode == 1 and "no CUDA device" in refused.stderr


def test_the_packing_verdict_holds_ten_seeds_to_three_times_one():
    assert "2.50× one seed's wall (goal ≤ 3×: met)" in gc.packing_verdict((1e5, 100.0), (4e5, 250.0))
    missed = gc.packing_verdict((1e5, 100.0), (1.5e5, 320.0))
    assert "3.20× one seed's wall (goal ≤ 3×: MISSED); together at 1.50× one seed's tokens/s" in missed
    assert "(rayb plan assumes 1.47×)" in missed


def test_a_measurement_is_what_rayb_plan_reads_for_that_gpu(tmp_path):
    flops = gc.flops_per_token(gc.SMALL)
    packed = gc.measurement("NVIDIA H100 80GB HBM3", gc.SMALL, flops, 2e6, 989e12, 10, "bf16")
    assert packed.gpu == "h100" and packed.trials_per_gpu == 10
    assert packed.mfu == pytest.approx(2e6 * flops / 989e12)
    record_measurements(tmp_path / "mfu.json", [packed])
    assert read_measurements(tmp_path / "mfu.json", "h100") == [packed]
    assert gc.gpu_of("NVIDIA A100-SXM4-40GB") == "a100" and gc.gpu_of("Tesla V100") is None
    assert gc.gpu_of("NVIDIA L4") == "l4" and gc.gpu_of("NVIDIA L40S") is None


def test_precisions_come_from_the_trials_own_records(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "train_result.json").write_text(json.dumps({"precision": "bf16"}))
    assert gc.precisions(tmp_path) == ("bf16", "not run")
    (tmp_path / "eval" / "lm-1.json").write_text(json.dumps({"precision": "bf16 autocast over fp32 weights"}))
    assert gc.precisions(tmp_path) == ("bf16", "bf16 autocast over fp32 weights")
    assert (
        gc.describe_precisions(*gc.precisions(tmp_path))
        == "training bf16, evaluation bf16 autocast over fp32 weights"
    )


def test_its_shortest_study_has_the_data_it_asks_for(ray_session, tmp_path):
    """The check's studies write their own random corpus: at the fewest steps it is run with, the corpus
    still holds the held-out rows (a random 1% of its documents), so a GPU run never stops at the data."""
    from rayb.data.pipeline import prepare_data

    study = gc.gpu_study(tmp_path, "gpu-check", gc.SMALL, 1, 4, 32, 17)
    cache = prepare_data(study.data, tmp_path / "out")
    assert cache.manifest["train_rows"] == 17 * 32 and cache.manifest["val_rows"] > 0
    assert len(list((tmp_path / "data").glob("*.parquet"))) > 1  # Ray Data tokenizes files side by side


def test_the_packing_studies_share_their_tokens_and_none_of_their_trials(tmp_path):
    """The seed trained alone and the ten packed ones share one output: one token cache, tokenized once,
    and no trial, though a GPU share stays out of a trial's key (so a shared seed would be found trained)."""
    alone, packed = (
        gc.gpu_study(tmp_path, name, gc.SMALL, seeds, 4, 32, 17, num_workers=1, **share)
        for name, seeds, share in [("alone", gc.ALONE_SEEDS, {}), ("packed", 10, {"gpus_per_trial": 0.1})]
    )
    assert alone.data == packed.data

    def keys(study, seeds):
        return {study.trial_key(study.models[0], study.train.lr, seed, "data") for seed in seeds}

    assert keys(alone, alone.seeds).isdisjoint(keys(packed, packed.seeds))
    assert keys(alone, [0]) == keys(packed, [0])
