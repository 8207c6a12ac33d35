"""The speed and memory protocol, the same for every architecture, at batch 1.

* prefill: wall time of one forward pass over `prefill_tokens` (1024) tokens;
* generation: tokens/s over `gen_tokens` (256) greedy tokens after a short prompt, through the
  architecture's own KV cache or recurrent state (decoding.Decoder; "recompute" where it has neither);
* peak memory of each: the tensors' peak (the CUDA allocator's on GPU, PyTorch's allocations as
  torch.profiler records them on CPU) above what was allocated before, and the process's peak RSS;
* scaling: forward time and memory at context lengths 256 → 2048 (doubling), with the fitted growth
  exponent (slope of log time against log length: ≈1 linear, ≈2 quadratic).

Each number is the median of `repeats` runs after `warmup` unmeasured ones; the output records the
protocol (lengths, repeats, warm-ups, threads, device). Lengths beyond a model's position table are
skipped and the output says so.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rayb.eval.decoding import Decoder
from rayb.eval.registry import Benchmark, EvalContext, register_benchmark
from rayb.eval.scoring import context_limit, device_of


@dataclass
class SpeedOptions:
    prefill_tokens: int = 1024
    gen_tokens: int = 256
    prompt_tokens: int = 16
    lengths: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048])
    warmup: int = 1
    repeats: int = 3

    def validate(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be ≥ 1 and warmup ≥ 0")
        if len(self.lengths) < 2 or sorted(self.lengths) != self.lengths:
            raise ValueError("lengths must be at least two increasing context lengths")


@functools.cache
def _this_process():
    import psutil  # Ray's own dependency; portable where /proc is not (macOS laptops)

    return psutil.Process()


def _rss_bytes() -> int:
    return _this_process().memory_info().rss


MEMORY_RECORD = "[memory]"  # torch.profiler's record of one allocation (nbytes > 0) or free (nbytes < 0)


def allocation_peak(profiler: torch.profiler.profile) -> int:
    """The highest running total, in time order, of the bytes PyTorch allocated less those it freed while
    `profiler` recorded, from its raw records. Version 1 of `speed` summed `profiler.events()`, each op's
    allocations net of its frees: blind to a buffer an op frees before it ends (so never above this peak
    for the models' forward and decoding, which tests/test_eval.py compares), and 30-40x a short
    generation's own time to build, an event object per op."""
    records = [e for e in profiler.profiler.kineto_results.events() if e.name() == MEMORY_RECORD]
    records.sort(key=lambda e: e.start_ns())  # stable: records made at the same time keep their order
    return max(itertools.accumulate((e.nbytes() for e in records), initial=0))


class PeakMemory:
    """Peak memory of the tensors allocated while the block runs, above what was allocated before it:
    the CUDA allocator's peak on GPU; on CPU, the running total of PyTorch's allocations and frees as
    torch.profiler records them (the process RSS hides this: freed blocks are reused, not returned).
    `rss` is the process's peak resident set during the block, sampled every millisecond."""

    def __init__(self, device: torch.device):
        self.device, self.peak, self.rss = device, 0, 0

    def __enter__(self):
        self.rss, self.sampling = _rss_bytes(), True
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self.profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            self.profiler.__enter__()
        return self

    def _sample(self):
        while self.sampling:
            self.rss = max(self.rss, _rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.sampling = False  # the block has ended: what the profiler does next is not the model's memory
        self.sampler.join()
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.profiler.__exit__(*exc)
            self.peak = allocation_peak(self.profiler)


def measure(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> tuple[float, int, int]:
    """(median seconds, peak tensor bytes, peak process RSS bytes) of `fn` after `warmup` unmeasured
    calls. Times come from unprofiled runs; memory from one more run, profiled on CPU."""
    times = timed_runs(fn, device, warmup, repeats)
    with PeakMemory(device) as memory:
        fn()
    return statistics.median(times), memory.peak, memory.rss


def timed_runs(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after `warmup` unmeasured ones. On a GPU every timing
    starts and ends with the device idle: calls return before their kernels finish, so without the
    synchronisation after the warm-ups the first timed call would absorb the warm-ups' queued work."""
    for _ in range(warmup):
        fn()
    _synchronize(device)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - began)
    return times


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def growth_exponent(lengths: list[int], values: list[float]) -> float:
    """Slope of log(value) against log(length): ≈1 for linear growth, ≈2 for quadratic."""
    if len(lengths) < 2:
        return float("nan")
    return float(np.polyfit(np.log(lengths), np.log(values), 1)[0])


@torch.no_grad()
def run_speed(ctx: EvalContext, _: str | None, options: SpeedOptions) -> dict[str, Any]:
    model, device = ctx.model, device_of(ctx.model)
    limit = context_limit(model)
    generator = torch.Generator().manual_seed(ctx.seed)
    random_ids = lambda n: torch.randint(0, ctx.vocab_size, (1, n), generator=generator).to(device)  # noqa: E731
    runs = {"warmup": options.warmup, "repeats": options.repeats}

    prefill = min(options.prefill_tokens, limit or options.prefill_tokens)
    ids = random_ids(prefill)
    prefill_s, prefill_peak, prefill_rss = measure(lambda: model(ids), device, **runs)

    prompt = random_ids(options.prompt_tokens)
    gen_tokens = min(options.gen_tokens, (limit or 1 << 30) - options.prompt_tokens)
    decoder = Decoder(model)

    def generate():
        logits = decoder.prefill(prompt)
        for _ in range(gen_tokens):
            logits = decoder.step(logits.argmax(-1))

    gen_s, gen_peak, gen_rss = measure(generate, device, **runs)

    lengths = [n for n in options.lengths if limit is None or n <= limit]
    # The ids are made before timing: drawing them on the CPU and copying them to the device is not the
    # model's time.
    scaling = [measure(functools.partial(model, random_ids(n)), device, **runs) for n in lengths]
    times, peaks = [t for t, _, _ in scaling], [max(p, 1) for _, p, _ in scaling]
    return {
        "prefill_tokens": prefill, "prefill_s": prefill_s, "prefill_tokens_per_s": prefill / prefill_s,
        "prefill_peak_bytes": prefill_peak, "prefill_peak_rss_bytes": prefill_rss,
        "gen_tokens": gen_tokens, "gen_tokens_per_s": gen_tokens / gen_s, "gen_peak_bytes": gen_peak,
        "gen_peak_rss_bytes": gen_rss,
        "decoding_memory": decoder.memory,
        "scaling_lengths": lengths, "scaling_s": times, "scaling_peak_bytes": peaks,
        "time_exponent": growth_exponent(lengths, times), "memory_exponent": growth_exponent(lengths, peaks),
        "skipped_lengths": [n for n in options.lengths if n not in lengths],
        "device": str(device), "threads": torch.get_num_threads(), **runs,
    }  # fmt: skip


register_benchmark(
    Benchmark(
        "speed", 2, run_speed, SpeedOptions,
        "prefill time, generation tokens/s, peak memory, and their growth with context length",
        exclusive_device=True,  # timings and peak memory are the model's alone, not a shared GPU's
        decodes=True,
    )
)  # fmt: skip
