"""Every evaluation runs in the precision the study's models trained in, the same for every architecture:
fp32 weights, under the training precision's autocast (bf16 on GPU by default), and says so."""

from __future__ import annotations

import pytest
import torch
from test_eval_pool import _saved_trial

from rayb.eval.actors import EvalJob, run_job
from rayb.eval.scoring import describe_evaluation_precision, evaluation_autocast
from rayb.models import build_model
from rayb.report.sections import provenance_section
from rayb.train.spec import TrainSpec

pytestmark = pytest.mark.ray


def test_the_evaluation_precision_follows_the_training_precision():
    assert evaluation_autocast(TrainSpec(use_gpu=True).resolved_precision) == torch.bfloat16  # auto, GPU
    assert evaluation_autocast(TrainSpec().resolved_precision) is None  # auto, CPU
    assert evaluation_autocast("bf16-deepspeed") == torch.bfloat16
    lines = "\n".join(provenance_section({"study": {"train": {"use_gpu": True}}}))
    assert "precision: training bf16; every evaluation (scores, speed and memory) bf16 autocast" in lines


def test_a_bf16_study_scores_under_bf16_autocast_and_an_fp32_one_in_fp32(tiny_cache, tmp_path):
    results = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)  # the same weights for both
        trial = _saved_trial(precision, tiny_cache, tmp_path)
        trial = type(trial)(**trial.__dict__ | {"train": TrainSpec(precision=precision)})
        results[precision] = run_job(EvalJob(trial, "lm", {}), threads=1)
    fp32, bf16 = results["fp32"], results["bf16"]
    assert fp32["status"] == bf16["status"] == "ok", (fp32, bf16)
    assert fp32["precision"] == describe_evaluation_precision("fp32") == "fp32"
    assert bf16["precision"] == "bf16 autocast over fp32 weights"
    # The same weights: bf16 matmuls move the loss a little.
    loss32, loss16 = fp32["metrics"]["val_loss"], bf16["metrics"]["val_loss"]
    assert loss32 != loss16 and abs(loss32 - loss16) < 0.05 * loss32


def test_weights_saved_in_bf16_are_evaluated_in_fp32(tiny_cache, tmp_path):
    """transformers loads a checkpoint in the dtype it was saved in: a bf16 checkpoint must not make one
    architecture's fp32 evaluation a bf16 one. Its score equals that of the same (rounded) weights saved
    in fp32, to fp32 rounding; computed in bf16 it would differ by about 1e-3."""
    from rayb.models.checkpoint import save_weights

    torch.manual_seed(0)
    trial = _saved_trial("saved-bf16", tiny_cache, tmp_path)
    rounded = build_model("gpt2", trial.model_config, tiny_cache.manifest["vocab_size"], tiny_cache.seq_len)
    rounded = rounded.to(torch.bfloat16)
    model_dir = tmp_path / "saved-bf16" / "model"
    for f in model_dir.iterdir():
        f.unlink()
    rounded.save_pretrained(model_dir)  # with config.json: transformers loads it in bf16, as saved
    reference = _saved_trial("rounded-fp32", tiny_cache, tmp_path)
    save_weights(rounded.float(), tmp_path / "rounded-fp32" / "model")
    result, expected = (run_job(EvalJob(t, "lm", {}), threads=1) for t in (trial, reference))
    assert result["status"] == expected["status"] == "ok" and result["precision"] == "fp32", result
    assert abs(result["metrics"]["val_loss"] - expected["metrics"]["val_loss"]) < 1e-5
