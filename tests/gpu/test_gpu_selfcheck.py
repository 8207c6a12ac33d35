"""The self-checks on a CUDA device (`pytest -m gpu`; skipped elsewhere): with the kernels installed there
(mamba-ssm, causal-conv1d, fla), every architecture's fast path under bf16 autocast agrees with its
plain PyTorch reference, and its decoding with its full forward, within the bf16 and fp32 tolerances."""

from __future__ import annotations

import pytest
import torch
from test_gpu_training import ARCHS

from rayb.models.selfcheck import ModelToCheck, check_models

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_kernels_agree_with_their_references_on_the_gpu(arch):
    results = check_models([ModelToCheck(arch, arch, ARCHS[arch])], 300, 128, "cuda", torch.bfloat16)
    for result in results:
        print(result.describe())
        assert not result.failed, result.describe()
        assert "raised" not in result.note, result.note
