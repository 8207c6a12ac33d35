"""The speed suite times the model alone: the device idle at every timing's start, the inputs made before."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rayb.eval.registry import EvalContext
from rayb.eval.speed import SpeedOptions, run_speed, timed_runs
from rayb.models import build_model
from rayb.models.registry import get_arch


def test_each_timing_starts_with_the_device_idle_after_the_warm_ups(monkeypatch):
    """A CUDA call returns before its kernels finish: without a synchronisation after the warm-ups, the first
    timed repeat absorbs their queued work. (No GPU here: the CUDA API records what is asked of it.)"""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    timed_runs(lambda: events.append("call"), torch.device("cuda"), warmup=2, repeats=2)
    assert events == ["call", "call", "sync", "call", "sync", "call", "sync"]
    events.clear()
    timed_runs(lambda: events.append("call"), torch.device("cpu"), warmup=1, repeats=1)
    assert events == ["call", "call"]  # a CPU computes as it is called: nothing to wait for


class Recording(torch.nn.Module):
    """A model that notes the input tensor of each call."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.inputs = model, []

    def forward(self, ids, **kwargs):
        self.inputs.append(ids)
        return self.model(ids, **kwargs)


def test_the_inputs_of_the_length_scaling_runs_are_made_before_they_are_timed():
    """Drawing random ids on the CPU and copying them to the device is not the model's time: every run at
    one length (warm-up, timed repeats, memory run) gets the one tensor made before them."""
    torch.manual_seed(0)
    model = Recording(build_model("gpt2", get_arch("gpt2").shape(32, 2), 64, 64).eval())
    cache = SimpleNamespace(manifest={"vocab_size": 64}, seq_len=64)
    options = SpeedOptions(
        prefill_tokens=16, gen_tokens=2, prompt_tokens=4, lengths=[8, 16], warmup=1, repeats=2
    )
    out = run_speed(EvalContext(model, None, cache), None, options)
    assert out["scaling_lengths"] == [8, 16]
    calls_per_measure = options.warmup + options.repeats + 1
    scaling_calls = model.inputs[-2 * calls_per_measure :]
    for n, calls in zip(
        [8, 16], (scaling_calls[:calls_per_measure], scaling_calls[calls_per_measure:]), strict=True
    ):
        assert {ids.shape[1] for ids in calls} == {n}
        assert len({id(ids) for ids in calls}) == 1
