"""A process holding a share of a GPU keeps to that share of its memory, and the report says that training
throughput came from a shared device. (No GPU here: the CUDA API records what is asked of it; the cap
itself is checked in tests/gpu/.)"""

from __future__ import annotations

import torch

from rayb.gpu_share import cap_gpu_memory
from rayb.report.sections import provenance_section


def test_a_share_of_a_gpu_caps_the_processes_memory_to_it(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda share: asked.append(share))
    assert cap_gpu_memory(0.25) and asked == [0.25]
    assert not cap_gpu_memory(1.0) and not cap_gpu_memory(0.0) and asked == [0.25]  # a whole GPU, or none
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not cap_gpu_memory(0.5) and asked == [0.25]  # no GPU in this process


def test_the_report_marks_training_throughput_measured_on_a_shared_gpu():
    shared = "\n".join(provenance_section({"study": {"train": {"use_gpu": True, "gpus_per_trial": 0.25}}}))
    assert "shared GPUs: each training worker held 0.25 of a GPU" in shared and "`tokens_per_s`" in shared
    whole = "\n".join(provenance_section({"study": {"train": {"use_gpu": True}}}))
    assert "shared GPUs" not in whole
