"""The overfit smoke protocol on a tiny GPT-2 and random token rows, without Ray or a real token cache."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import rayb.eval.overfit  # noqa: F401  (registers the benchmark)
from rayb.eval.overfit import OverfitOptions, curves, run_overfit, spike_steps
from rayb.eval.registry import EvalContext, make_options, parse_suite
from rayb.models import build_model

VOCAB, SEQ_LEN, ROWS = 64, 32, 40
FAST = OverfitOptions(examples=16, steps=150, batch_size=8, lr=1e-2, curve_points=1000)


def gpt2() -> nn.Module:
    return build_model("gpt2", {"d_model": 32, "n_layer": 1, "n_head": 2}, VOCAB, SEQ_LEN)


class Unigram(nn.Module):
    """Ignores its input: the best it can learn is the token frequencies, so it cannot memorise rows."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(VOCAB))

    def forward(self, ids):
        return SimpleNamespace(logits=self.bias.expand(*ids.shape, VOCAB))


class WithAux(nn.Module):
    """A tiny GPT-2 that also returns a large training-only penalty on its weights, as an MoE returns
    its balancing loss."""

    def __init__(self, weight: float):
        super().__init__()
        self.inner, self.weight = gpt2(), weight

    def forward(self, ids):
        aux = self.weight * sum((p**2).sum() for p in self.inner.parameters())
        return SimpleNamespace(logits=self.inner(ids).logits, aux_loss=aux)


class NaNOnce(nn.Module):
    """A tiny GPT-2 whose output is NaN on its third forward pass only."""

    def __init__(self):
        super().__init__()
        self.inner, self.calls = gpt2(), 0

    def forward(self, ids):
        self.calls += 1
        logits = self.inner(ids).logits
        return SimpleNamespace(logits=logits * math.nan if self.calls == 3 else logits)


class TrainRows:
    """A token cache's training rows, read as the overfit protocol reads them (TokenCache.train_rows)."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def train_rows(self, first: int, rows: int) -> np.ndarray:
        return self.rows[first : first + rows]


def overfit(fresh=gpt2, options: OverfitOptions = FAST, seed: int = 0, rows: int = ROWS) -> dict:
    cache = TrainRows(np.random.default_rng(0).integers(0, VOCAB, (rows, SEQ_LEN), dtype=np.uint16))
    ctx = EvalContext(gpt2(), None, cache, seed, fresh_model=fresh)
    return run_overfit(ctx, None, options)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A model this small trains faster on one thread than on several (and the test machine is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def memorised():
    with torch.no_grad():  # as evaluation code may call it; the protocol turns gradients back on
        return overfit()


def test_a_tiny_gpt2_memorises_its_rows(memorised):
    m = memorised
    assert m["examples"] == 16 and m["steps"] == 150
    assert m["initial_loss"] == pytest.approx(math.log(VOCAB), abs=0.3)  # untrained: about uniform
    assert m["final_loss"] < 0.1 and m["loss_ratio"] < 0.02
    assert m["memorised"] is True and 1 < m["steps_to_half"] < 150
    assert m["nonfinite_steps"] == 0 and m["grad_spikes"] == 0 and m["grad_spike_steps"] == []


def test_every_step_has_a_finite_positive_pre_clip_grad_norm(memorised):
    m = memorised
    norms = m["curve_grad_norm"]  # curve_points ≥ steps: every step
    assert m["curve_step"] == list(range(1, 151)) and len(norms) == len(m["curve_loss"]) == 150
    assert all(math.isfinite(g) and g > 0 for g in norms)
    assert m["grad_norm_first"] == norms[0] and m["grad_norm_final"] == norms[-1]
    assert m["grad_norm_max"] == max(norms) > 1.0  # pre-clip: it exceeds the clip at some step
    assert min(norms) < m["grad_norm_median"] < m["grad_norm_max"]
    assert m["final_loss"] == pytest.approx(sum(m["curve_loss"][-10:]) / 10)


def test_a_model_that_ignores_its_input_cannot_memorise():
    m = overfit(lambda: Unigram())
    assert m["memorised"] is False and m["final_loss"] > 3.0 and m["steps_to_half"] is None


def test_same_seed_same_metrics_other_seed_differs(memorised):
    assert overfit() == memorised
    other = overfit(seed=1)
    assert other["initial_loss"] != memorised["initial_loss"]
    assert other["curve_grad_norm"] != memorised["curve_grad_norm"]


def test_aux_loss_is_trained_on_but_not_reported():
    short = OverfitOptions(examples=16, steps=20, batch_size=8, lr=1e-2)
    plain, aux = overfit(options=short), overfit(lambda: WithAux(1.0), options=short)
    assert aux["initial_loss"] == plain["initial_loss"]  # same init and batch; the LM loss alone
    assert aux["grad_norm_first"] > 10 * plain["grad_norm_first"]
    assert aux["curve_loss"] != plain["curve_loss"] and aux["final_loss"] > plain["final_loss"]
    assert overfit(lambda: WithAux(0.0), options=short) == plain


def test_a_nonfinite_step_is_counted_and_skipped():
    m = overfit(lambda: NaNOnce(), OverfitOptions(examples=16, steps=30, batch_size=8, lr=1e-2))
    assert m["nonfinite_steps"] == 1 and math.isnan(m["curve_loss"][2])
    assert math.isfinite(m["final_loss"]) and m["final_loss"] < m["initial_loss"]  # weights unharmed
    assert math.isfinite(m["grad_norm_median"]) and math.isfinite(m["grad_norm_max"])


def test_uses_what_rows_the_cache_has():
    assert overfit(options=OverfitOptions(steps=3), rows=5)["examples"] == 5


def test_needs_a_model_to_initialise():
    cache = TrainRows(np.zeros((4, SEQ_LEN), dtype=np.uint16))
    with pytest.raises(ValueError, match="needs a model rayb can initialise"):
        run_overfit(EvalContext(gpt2(), None, cache), None, OverfitOptions())


def test_suite_parses_and_bad_options_are_rejected():
    benchmark, argument = parse_suite("overfit")
    assert benchmark.name == "overfit" and argument is None
    assert make_options(benchmark, {"steps": 5}) == OverfitOptions(steps=5)
    for name in ("examples", "steps", "lr", "batch_size"):
        with pytest.raises(ValueError, match=name):
            make_options(benchmark, {name: 0})
    with pytest.raises(ValueError, match="warmup_steps"):
        make_options(benchmark, {"warmup_steps": -1})
    with pytest.raises(ValueError, match="unknown option"):
        make_options(benchmark, {"epochs": 3})
    with pytest.raises(ValueError, match="takes no argument"):
        parse_suite("overfit:x")


def test_spikes_and_curves():
    assert spike_steps([1.0, 1.2, 0.9, 50.0, 1.0, math.nan, 9.0, 12.0]) == [4, 8]
    assert spike_steps([1.0, math.inf]) == [2]
    c = curves([float(i) for i in range(300)], [1.0] * 300, 50)
    assert len(c["curve_step"]) == 50 and c["curve_step"][0] == 1 and c["curve_step"][-1] == 300
    assert c["curve_loss"] == [s - 1.0 for s in c["curve_step"]]
    assert curves([1.0, 2.0], [3.0, 4.0], 50)["curve_step"] == [1, 2]
