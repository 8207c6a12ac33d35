"""rayb.report.study_report on a synthetic study (no Ray, no training)."""

from __future__ import annotations

import json
import math

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from rayb.report.study_report import build_verdict, format_table, write_report

STEPS = list(range(0, 101, 10))
VAL_STEPS = [50, 100]
LRS = (1e-3, 3e-3)
SEEDS = (0, 1, 2)
# model -> (arch, final val loss at its better lr); "mamba" is clearly better than the reference.
MODELS = {"gpt": ("transformer", 3.0), "mamba": ("mamba", 2.7), "rwkv": ("rwkv", 3.05)}
REFERENCE = "gpt"
ENTROPY = 6.5


def _trial(model: str, arch: str, lr: float, seed: int, final: float) -> dict:
    rng = np.random.default_rng([list(MODELS).index(model), LRS.index(lr), seed])  # deterministic noise
    val_loss = final + (0.0 if lr == LRS[1] else 0.2) + rng.normal(0, 0.01)
    train = [val_loss + 5.0 * math.exp(-s / 30) + rng.normal(0, 0.01) for s in STEPS]
    return {
        "model": model,
        "arch": arch,
        "lr": lr,
        "seed": seed,
        "trial_key": f"{model}-lr{lr:g}-s{seed}",
        "status": "ok",
        "params_total": 12_345_678,
        "params_non_embedding": 10_000_000,
        "train_tokens": 1_000_000,
        "steps": STEPS[-1],
        "final_train_loss": train[-1],
        "val_loss": val_loss,
        "val_ppl": math.exp(val_loss),
        "val_bpb": val_loss / math.log(2) / 4.0,
        "wall_s": 10.0,
        "tokens_per_s": 1e5,
        "checkpoint": f"/tmp/ckpt/{model}/{seed}",
        "curve_step": STEPS,
        "curve_train_loss": train,
        "curve_val_step": VAL_STEPS,
        "curve_val_loss": [val_loss + 0.3, val_loss],
    }


@pytest.fixture
def results() -> pd.DataFrame:
    rows = [
        _trial(m, arch, lr, seed, final)
        for m, (arch, final) in MODELS.items()
        for lr in LRS
        for seed in SEEDS
    ]
    diverged = _trial("rwkv", "rwkv", LRS[1], 3, MODELS["rwkv"][1])
    diverged.update(status="diverged", val_loss=math.nan, val_ppl=math.nan, val_bpb=math.nan)
    rows.append(diverged)
    return pd.DataFrame(rows)


def test_verdict_identifies_better_model(results):
    v = build_verdict(results, "toy", REFERENCE)
    assert v.rows[0].model == REFERENCE
    assert {r.model for r in v.rows} == set(MODELS)
    assert all(r.lr == LRS[1] and r.n_seeds == len(SEEDS) for r in v.rows)
    mamba = v.comparison("mamba", "val_loss")
    rwkv = v.comparison("rwkv", "val_loss")
    assert mamba.delta < 0 and mamba.significant
    assert rwkv.delta > 0
    assert {(c.candidate, c.metric) for c in v.comparisons} == {
        (m, metric) for m in ("mamba", "rwkv") for metric in ("val_loss", "val_bpb")
    }
    assert v.excluded == [{"model": "rwkv", "seed": 3, "lr": LRS[1], "status": "diverged"}]


def test_unknown_reference_raises(results):
    with pytest.raises(ValueError):
        build_verdict(results, "toy", "nope")


def test_write_report(results, tmp_path):
    v = build_verdict(results, "toy", REFERENCE)
    paths = write_report(v, results, tmp_path / "out", unigram_entropy_nats=ENTROPY)
    assert set(paths) == {"report", "json", "plot"}
    assert all(p.exists() and p.stat().st_size > 0 for p in paths.values())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in paths.values())

    img = mpimg.imread(paths["plot"])
    assert img.ndim == 3 and img.shape[0] > 0 and img.shape[1] > 0

    data = json.loads(paths["json"].read_text())
    assert data["study"] == "toy" and data["reference"] == REFERENCE
    assert len(data["comparisons"]) == 4
    assert {r["model"] for r in data["rows"]} == set(MODELS)
    assert data["rows"][0]["summaries"]["val_loss"]["n"] == len(SEEDS)
    assert data["excluded"][0]["status"] == "diverged"

    md = paths["report"].read_text()
    assert "# Study report: toy" in md and "## Verdict" in md
    assert all(m in md for m in MODELS)
    assert "Excluded trials" in md and "diverged" in md
    assert "**mamba** beats **gpt**" in md
    assert "Mann–Whitney p = " in md and "bootstrap 95% CI of Δ" in md and "Holm-adjusted p = " in md
    assert {"mann_whitney_p", "delta_ci_low", "p_holm"} <= set(data["comparisons"][0])
    assert "unigram entropy" in md.lower()
    assert "![loss curves](loss_curves.png)" in md


def test_format_table_renders(results):
    v = build_verdict(results, "toy", REFERENCE)
    console = Console(record=True, width=250)
    console.print(format_table(v))
    text = console.export_text()
    assert all(m in text for m in MODELS)
    assert "yes" in text


def test_verdict_warns_when_seeds_are_too_few_for_the_difference():
    from rayb.report.study_report import verdict_text

    def table(candidate_losses):
        rows = [("gpt", 3.0 + d) for d in (-0.05, 0.0, 0.05)] + [("new", v) for v in candidate_losses]
        return pd.DataFrame(
            [{"model": m, "arch": m, "lr": 1e-3, "seed": i, "status": "ok", "params_total": 1, "val_loss": v,
              "val_ppl": math.exp(v), "val_bpb": v} for i, (m, v) in enumerate(rows)]
        )  # fmt: skip

    close = verdict_text(build_verdict(table([2.93, 2.98, 3.03]), "t", "gpt"))  # Δ −0.02, σ 0.05
    assert "⚠ new vs gpt: 3 seeds are too few to detect a Δ of -0.0200" in close
    far = verdict_text(build_verdict(table([2.0, 2.05, 2.1]), "t", "gpt"))  # Δ −0.95
    assert "⚠" not in far
