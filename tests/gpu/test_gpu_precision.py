"""Gated DeltaNet on a CUDA device (`pytest -m gpu`; skipped elsewhere): fla's kernels under bf16 autocast,
and an fp32 forward, which fla's chunked kernels refuse, through rayb's chunked path, each against the CPU
fp32 forward of the same weights."""

from __future__ import annotations

import pytest
import torch

from rayb.models import build_model
from rayb.models.registry import get_arch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("autocast", "tolerance"), [(True, 5e-2), (False, 1e-4)])
def test_gated_deltanet_runs_on_the_gpu_in_bf16_autocast_and_in_fp32(autocast, tolerance):
    torch.manual_seed(0)
    model = build_model("gated_deltanet", get_arch("gated_deltanet").shape(256, 2), 300, 256).eval()
    ids = torch.randint(0, 300, (2, 256))
    with torch.no_grad():
        expected = model(ids).logits
        gpu = model.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            got = gpu(ids.cuda()).logits.float().cpu()
    error = (got - expected).norm() / expected.norm()
    assert error < tolerance, f"relative error {error:.2e} (autocast {autocast})"
