"""Evaluation precision on a CUDA device (`pytest -m gpu`; skipped elsewhere): every architecture's forward
in the precision rayb evaluates a bf16 study in (bf16 autocast over fp32 weights, with the GPU's kernels)
against the CPU fp32 forward of the same weights through its plain reference path; and Gated DeltaNet's
fp32 forward, which fla's chunked kernels refuse, through rayb's chunked path."""

from __future__ import annotations

import pytest
import torch
from test_gpu_training import ARCHS

from rayb.eval.lm import logits_nll
from rayb.eval.scoring import evaluation_autocast
from rayb.models import build_model, kernels
from rayb.models.registry import get_arch

pytestmark = pytest.mark.gpu
VOCAB, SEQ = 300, 256


def forwards(model: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype | None):
    """(GPU logits in `dtype` autocast, CPU fp32 logits through the reference path), both on the CPU."""
    with torch.no_grad():
        with kernels.reference_paths():
            expected = model(ids).logits
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            got = model.cuda()(ids.cuda()).logits.float().cpu()
    return got, expected


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_architecture_evaluates_in_bf16_within_bf16_of_the_cpu_fp32_reference(arch):
    torch.manual_seed(0)
    model = build_model(arch, ARCHS[arch], VOCAB, SEQ).eval()
    ids = torch.randint(0, VOCAB, (2, SEQ))
    got, expected = forwards(model, ids, evaluation_autocast("bf16"))
    error = ((got - expected).norm() / expected.norm()).item()
    loss, reference = (logits_nll(x, ids).item() / ids[:, 1:].numel() for x in (got, expected))
    print(f"{arch}: logits relative error {error:.1e}, loss {loss:.4f} vs {reference:.4f}")
    assert error < 5e-2 and abs(loss - reference) < 2e-2, (arch, error, loss, reference)


def test_gated_deltanet_evaluates_in_fp32_on_the_gpu():
    torch.manual_seed(0)
    model = build_model("gated_deltanet", get_arch("gated_deltanet").shape(256, 2), VOCAB, SEQ).eval()
    ids = torch.randint(0, VOCAB, (2, SEQ))
    got, expected = forwards(model, ids, None)
    error = (got - expected).norm() / expected.norm()
    assert error < 1e-4, f"relative error {error:.2e}"
