"""The reverse test's own pieces (bench/reverse_test.py), fast and without training: its schedule, batch
order, batch digest, parameter groups, validation loss and cache lookup, each against its definition and
against what rayb does."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from rayb.data import held_out
from rayb.data.cache import TokenCache, micro_batch_rows, row_digest
from rayb.eval.lm import evaluate_lm
from rayb.train.engine import param_groups as rayb_param_groups
from rayb.train.loop import validation_rows as rayb_validation_rows
from rayb.train.schedule import lr_multiplier

_spec = importlib.util.spec_from_file_location(
    "reverse_test", Path(__file__).resolve().parents[1] / "bench" / "reverse_test.py"
)
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)

PEAK, STEPS, WARMUP, MIN = 3e-3, 128, 10, 0.1


def test_schedule_at_points_of_the_formula():
    lr = lambda s, schedule="cosine": rt.learning_rate(s, PEAK, STEPS, WARMUP, schedule, MIN)  # noqa: E731
    assert lr(0) == pytest.approx(PEAK / WARMUP)  # the first step already moves
    assert lr(4) == pytest.approx(PEAK * 5 / WARMUP)
    assert lr(WARMUP - 1) == pytest.approx(PEAK)
    assert lr(WARMUP) == pytest.approx(PEAK)  # cosine starts at the peak
    assert lr(WARMUP + (STEPS - WARMUP) // 2) == pytest.approx(PEAK * (1 + MIN) / 2)  # halfway: the mean
    assert lr(STEPS) == pytest.approx(PEAK * MIN)  # reaches the floor after the last step
    assert lr(STEPS + 50) == pytest.approx(PEAK * MIN)
    assert lr(STEPS - 1) > PEAK * MIN
    assert lr(70, "constant") == PEAK and lr(3, "constant") == pytest.approx(PEAK * 4 / WARMUP)
    decay = [lr(s) for s in range(WARMUP, STEPS)]
    assert all(a > b for a, b in zip(decay, decay[1:], strict=False))


@pytest.mark.parametrize(
    "steps,warmup,schedule,floor",
    [(128, 10, "cosine", 0.1), (40, 0, "cosine", 0.0), (7, 7, "cosine", 0.1), (50, 5, "constant", 0.1)],
)
def test_schedule_equals_rayb_at_every_step(steps, warmup, schedule, floor):
    for s in range(steps):
        ours = rt.learning_rate(s, PEAK, steps, warmup, schedule, floor)
        assert ours == pytest.approx(PEAK * lr_multiplier(s, steps, warmup, schedule, floor), rel=1e-12)


@pytest.mark.parametrize("world,micro", [(1, 16), (1, 4), (2, 4), (4, 2)])
def test_batch_order_is_rows_s_times_g(world, micro):
    g = 16
    seen = []
    for s in range(5):
        rows = rt.batch_rows(s, g)
        assert rows.tolist() == list(range(s * g, (s + 1) * g))
        rayb_rows = np.concatenate(
            [
                micro_batch_rows(s, m, r, world, g, micro)
                for m in range(g // (micro * world))
                for r in range(world)
            ]
        )
        assert sorted(rayb_rows.tolist()) == rows.tolist()  # whatever the workers, the same global batch
        seen.extend(rows.tolist())
    assert seen == list(range(5 * g))  # consecutive, no row twice


def test_batch_digest_equals_rayb():
    rows = np.random.default_rng(0).integers(0, 2048, size=(8, 16)).astype(np.uint16)
    assert rt.batch_digest(rows) == row_digest(rows)
    assert rt.batch_digest(rows[:4]) + rt.batch_digest(rows[4:]) == rt.batch_digest(rows)
    assert rt.batch_digest(rows[::-1]) == rt.batch_digest(rows)  # order-free within a batch, like rayb's


def _tiny_gpt2():
    torch.manual_seed(0)
    return rt.build_gpt2({"d_model": 16, "n_layer": 2, "n_head": 2}, vocab_size=64, seq_len=12)


def test_param_groups_decay_matrices_only():
    model = _tiny_gpt2()
    decayed, kept = rt.param_groups(model, 0.1)
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decayed["params"]} >= {"transformer.wte.weight", "transformer.wpe.weight"}
    assert all(p.dim() >= 2 for p in decayed["params"]) and all(p.dim() < 2 for p in kept["params"])
    assert len(decayed["params"]) + len(kept["params"]) == len(list(model.parameters()))
    ours = [{id(p) for p in g["params"]} for g in (decayed, kept)]
    assert ours == [{id(p) for p in g["params"]} for g in rayb_param_groups(model, 0.1)]


def _write_cache(path: Path, train: np.ndarray, val: np.ndarray) -> Path:
    path.mkdir(parents=True)
    manifest = {"seq_len": train.shape[1], "vocab_size": 64, "dtype": "uint16",
                "train_rows": len(train), "val_rows": len(val)}  # fmt: skip
    (path / "manifest.json").write_text(json.dumps(manifest))
    train.astype(np.uint16).tofile(path / "train.bin")
    val.astype(np.uint16).tofile(path / "val.bin")
    # bits per byte's denominator: 3 bytes per scored token (rows of one document each)
    rows = [[(i, 0, 3 * train.shape[1])] for i in range(len(val))]
    record = held_out.HeldOut(
        ["x" * 3 * train.shape[1]] * len(val),
        rows,
        np.full(len(val), 3),
        np.full(len(val), 3 * (train.shape[1] - 1)),
    )
    held_out.write(record, path / held_out.HELD_OUT_DIR)
    return path


def test_validation_loss_equals_rayb_lm_suite(tmp_path):
    rng = np.random.default_rng(1)
    cache = _write_cache(tmp_path / "c", rng.integers(0, 64, (8, 12)), rng.integers(0, 64, (21, 12)))
    model = _tiny_gpt2()
    val = rt.open_split(cache, "val")
    assert val.shape == (21, 12) and np.array_equal(val, TokenCache(cache).val)
    ours = rt.validation_loss(model, val)
    assert ours == pytest.approx(evaluate_lm(model, TokenCache(cache))["val_loss"], rel=1e-6)
    assert ours == pytest.approx(rt.validation_loss(model, val, batch_size=5), rel=1e-6)
    assert math.log(64) * 0.8 < ours < math.log(64) * 1.2  # an untrained model is near uniform


@pytest.mark.parametrize("total,n", [(1000, 128), (21, 16), (7, 3), (16, 16), (5, 128)])
def test_interim_validation_rows_equal_rayb_s(total, n):
    assert np.array_equal(rt.interim_rows(total, n), rayb_validation_rows(total, n))
    assert len(rt.interim_rows(total, n)) == min(total, n)


def test_find_cache_picks_the_cache_holding_the_trials_batches(tmp_path):
    rng = np.random.default_rng(2)
    out = tmp_path / "rayb_out"
    study_dir = out / "studies" / "s-123"
    study_dir.mkdir(parents=True)
    _write_cache(out / "cache" / "data" / "aaa", rng.integers(0, 64, (8, 12)), rng.integers(0, 64, (2, 12)))
    wanted = rng.integers(0, 64, (8, 12))
    _write_cache(out / "cache" / "data" / "bbb", wanted, rng.integers(0, 64, (2, 12)))
    _write_cache(out / "cache" / "data" / "ccc", rng.integers(0, 64, (2, 12)), rng.integers(0, 64, (2, 12)))
    first = row_digest(wanted[:4])
    assert rt.find_cache(study_dir, 4, first) == out / "cache" / "data" / "bbb"
    with pytest.raises(SystemExit, match="pass --cache"):
        rt.find_cache(study_dir, 4, first + 1)


def test_later_epochs_reorder_the_batches_as_rayb_does():
    from rayb.data import cache as rayb_cache

    if not hasattr(rayb_cache, "epoch_batch"):
        pytest.skip("this rayb trains one epoch only")
    g, n, seed = 4, 6, int("2fab079b54e8"[:8], 16)
    for step in range(3 * n):
        ours = rt.batch_rows(step, g, n, seed)
        assert (
            ours.tolist()
            == rayb_cache.micro_batch_rows(rayb_cache.epoch_batch(step, n, seed), 0, 0, 1, g, g).tolist()
        )
    epoch1 = [int(rt.batch_rows(s, g, n, seed)[0]) // g for s in range(n, 2 * n)]
    assert sorted(epoch1) == list(range(n)) and epoch1 != list(range(n))  # every batch once, reordered
