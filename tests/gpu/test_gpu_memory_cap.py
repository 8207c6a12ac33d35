"""On a CUDA device (`pytest -m gpu`; skipped elsewhere): a process capped to a quarter of the GPU cannot
allocate half of it."""

from __future__ import annotations

import pytest
import torch

from rayb.gpu_share import cap_gpu_memory

pytestmark = pytest.mark.gpu


def test_a_quarter_of_a_gpu_cannot_take_half_its_memory():
    total = torch.cuda.get_device_properties(0).total_memory
    assert cap_gpu_memory(0.25)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(total // 2, dtype=torch.uint8, device="cuda")
        torch.empty(total // 8, dtype=torch.uint8, device="cuda")  # within the share
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
