"""A rank's CUDA random state on a real device (`pytest -m gpu`; skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_a_rank_restores_its_own_devices_generator(tmp_path):
    from rayb.train.loop import restore_rng, save_rng

    torch.cuda.manual_seed(5)
    save_rng(tmp_path, rank=3)
    expected = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(9)  # the stream moves on (another trial, a restart) ...
    restore_rng(tmp_path, rank=3)  # ... and the rank takes up its own again
    assert torch.equal(torch.rand(4, device="cuda"), expected)
    assert torch.load(tmp_path / "rng_rank3.pt", weights_only=False)["cuda"].device.type == "cpu"
