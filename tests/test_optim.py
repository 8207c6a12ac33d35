"""ADOPT and ADOPT-atan2 (train.optimizer) against the paper's algorithm, written out here step by step."""

from __future__ import annotations

import math

import pytest
import torch

from rayb.train.engine import make_optimizer

LR, BETAS, WD, EPS, A = 1e-2, (0.9, 0.99), 0.1, 1e-6, 1.27


def reference(grads: list[torch.Tensor], p0: torch.Tensor, atan2: bool) -> torch.Tensor:
    """ADOPT (Taniguchi et al. 2024, Algorithm 3): v₀ = g₀², no update at step 0; then normalise g by
    the *previous* √v (max with ε, clipped at t^¼), or with atan2(g, √v) and scale a; momentum; step;
    then update v. Weight decay as AdamW: p ← p·(1 − lr·wd)."""
    p, m, v = p0.clone(), torch.zeros_like(p0), grads[0] ** 2
    p *= 1 - LR * WD
    for t, g in enumerate(grads[1:], start=1):
        p *= 1 - LR * WD
        if atan2:
            normed = torch.atan2(g, v.sqrt())
        else:
            normed = (g / v.sqrt().clamp(min=EPS)).clamp(-(t**0.25), t**0.25)
        m = BETAS[0] * m + (1 - BETAS[0]) * normed
        p -= LR * (A if atan2 else 1.0) * m
        v = BETAS[1] * v + (1 - BETAS[1]) * g**2
    return p


@pytest.mark.parametrize("name", ["adopt", "adopt_atan2"])
def test_matches_the_algorithm(name):
    torch.manual_seed(0)
    p0 = torch.randn(64)
    grads = [torch.randn(64) * (1 + 5 * (i == 3)) for i in range(8)]  # one large step exercises the clip
    param = torch.nn.Parameter(p0.clone())
    opt = make_optimizer(name, [{"params": [param], "weight_decay": WD}], LR, BETAS)
    for g in grads:
        param.grad = g.clone()
        opt.step()
    expected = reference(grads, p0, atan2=name == "adopt_atan2")
    torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["adamw", "adopt", "adopt_atan2"])
def test_each_optimizer_fits_a_least_squares_problem(name):
    torch.manual_seed(0)
    x, w = torch.randn(256, 16), torch.randn(16)
    y = x @ w
    model = torch.nn.Linear(16, 1, bias=False)
    opt = make_optimizer(name, [{"params": model.parameters(), "weight_decay": 0.0}], 3e-2, (0.9, 0.999))
    for _ in range(300):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
        loss.backward()
        opt.step()
    assert loss.item() < 1e-3 * y.var().item(), loss.item()
    assert math.isfinite(loss.item())
