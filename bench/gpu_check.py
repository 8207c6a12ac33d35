"""The GPU check: each architecture's kernel path, then GPT-2 124M under rayb against a bare PyTorch loop.

Run on a machine with a CUDA device (it refuses to run without one):

    python bench/gpu_check.py                     # 40 measured steps after 10 warm-up steps
    python bench/gpu_check.py --steps 100 --peak-tflops 989
    python bench/gpu_check.py --pack-steps 1000 --measured-out mfu.json
    python bench/gpu_check.py --only packing      # one section (a short GPU lease)
    python bench/gpu_check.py --only packing --mps   # the same under CUDA MPS (needs NVIDIA's MPS daemon)

1. The kernel path every built-in architecture takes on this GPU (mamba-ssm, causal-conv1d, fla, or a
   slow PyTorch fallback) and what would make a slow one fast.
2. GPT-2 124M (`preset: gpt2`, vocabulary 50,257, sequences of 1,024) at the largest micro-batch that fits:
   - a bare single-process loop: transformers' GPT2LMHeadModel with SDPA attention, bf16 autocast, fused
     AdamW, gradient clipping; once eager and once under torch.compile;
   - the same model through rayb (Ray Train, DeepSpeed ZeRO-1, bf16 autocast, one GPU), once eager and once
     with `train.compile: true`.
   Tokens/s is the median over the measured steps of each (rayb's from its own per-step log), and MFU is
   tokens/s × training FLOPs per token (rayb's accounting: 6N plus attention) / the GPU's bf16 peak.
   Targets: the bare loop ≥ 40% MFU; rayb ≥ 0.9× the bare loop's tokens/s.
3. GPT-2 at 3.5M non-embedding parameters (`preset: gpt2-3.5m`) through rayb: one seed alone on the GPU,
   then ten seeds packed on it (`train.gpus_per_trial: 0.1`), each run's training wall-clock from its
   `timings.json`. Target: the ten in at most 3× one seed's wall. With `--mps` the check starts CUDA's
   Multi-Process Service for its run, so the packed trials' processes run their kernels side by side
   rather than taking turns on the GPU; run it with and without to see what MPS buys. Cut short (Ctrl-C,
   SIGTERM), it prints the rates the unfinished trials have logged so far.

Beside each rayb MFU it prints the precision the trials trained in and the one their evaluations ran in
(from the evaluation result files). It records the MFUs rayb reached (GPT-2 124M alone, 3.5M alone, and
the ten packed: the GPU's MFU, all ten together) in the measurements file `rayb plan` prices models by
(format: rayb/mfu.py; default ~/.config/rayb/measured_mfu.json, merged with what is there), except
from a run under MPS: `rayb plan` prices trials as they run without it.

The data is random words under a 50,257-word vocabulary, so the LM head is GPT-2's size; throughput does
not depend on the text.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rayb.eval.actors import EVAL_DIR
from rayb.mfu import Measurement, assumed_packing_gain, default_path, record_measurements
from rayb.models.accounting import model_cost
from rayb.models.presets import PRESETS
from rayb.models.registry import available, get_arch
from rayb.plan import PEAK_FLOPS

SEQ, VOCAB = 1024, 50257
SMALL, PACKED_SEEDS, PACKING_GOAL = "gpt2-3.5m", 10, 3.0  # ten packed seeds in ≤ 3× one seed's wall
# The seed trained alone is none of the packed study's 0-9: both studies share one output (and so one token
# cache), and GPU shares stay out of trial keys, so the packed study would find a shared seed trained.
ALONE_SEEDS = [PACKED_SEEDS]
MPS_CONTROL = "nvidia-cuda-mps-control"  # NVIDIA's MPS daemon, from the driver's utilities


def gpu_of(device: str) -> str | None:
    """The `rayb plan --gpu` name that is a whole word of a CUDA device's name, if any (an L40S is no L4)."""
    words = set(re.split(r"[^a-z0-9]+", device.lower()))
    return next((gpu for gpu in PEAK_FLOPS if gpu in words), None)


def peak_flops(override_tflops: float | None, device: str) -> float:
    if override_tflops:
        return override_tflops * 1e12
    if (gpu := gpu_of(device)) is None:
        raise SystemExit(f"unknown GPU '{device}': pass --peak-tflops (its dense bf16 peak)")
    return PEAK_FLOPS[gpu]


def flops_per_token(preset: str) -> float:
    return model_cost(PRESETS[preset].arch, PRESETS[preset].config, VOCAB, SEQ).train_flops_per_token


def print_kernels() -> None:
    print("kernel paths on this GPU:")
    for arch in available():
        for path in get_arch(arch).kernels("cuda"):
            slow = f"  SLOW: {path.install}" if path.slow else ""
            print(f"  {arch:<16}{path.component:<16}{path.path}{slow}")


# ----- the bare loop -----------------------------------------------------------------------------------
def bare_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=768, n_layer=12, n_head=12, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")  # fmt: skip
    return GPT2LMHeadModel(config).cuda()


def train_steps(model, optimizer, batch: int, steps: int) -> list[float]:
    """Seconds per optimizer step (forward, backward, clip, fused AdamW), synchronised."""
    times = []
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")
        torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return times


def largest_batch(candidates=(64, 48, 32, 24, 16, 12, 8, 4)) -> int:
    for batch in candidates:
        model = bare_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        try:
            train_steps(model, optimizer, batch, 2)
            return batch
        except torch.OutOfMemoryError:
            pass
        finally:
            del model, optimizer
            torch.cuda.empty_cache()
    raise SystemExit("not even a micro-batch of 4 sequences of 1,024 fits")


def bare_tokens_per_s(batch: int, warmup: int, steps: int, compile: bool) -> float:
    torch.manual_seed(0)
    model = bare_model()
    if compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=True)
    times = train_steps(model, optimizer, batch, warmup + steps)[warmup:]
    del model, optimizer
    torch.cuda.empty_cache()
    return batch * SEQ / statistics.median(times)


def mps_running() -> bool:
    """Whether an MPS control daemon runs on this machine (one a cluster's setup started, say)."""
    import psutil

    return any(process.info["name"] == MPS_CONTROL for process in psutil.process_iter(["name"]))


@contextlib.contextmanager
def sigterm_exits():
    """Ray started, then SIGTERM (a lease's time limit, `timeout`) made SystemExit, so that a run cut short
    still prints what it measured and stops an MPS daemon it started. In that order because Ray's driver
    replaces a handler set before it starts, and under Ray's own the process is killed about 3 s after the
    signal, whatever its cleanup (the study's own, then the check's) still had to do."""
    from rayb.runtime import init_ray

    init_ray()
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def cuda_mps(on: bool):
    """CUDA MPS for the run where asked; yields what the run is under ("on", "off", or a daemon started
    outside the check). The daemon starts before any process of the run creates a CUDA context, so every
    context (this process's, each Ray worker's, each eval actor's) goes through one MPS server and their
    kernels share the GPU's multiprocessors at once. It is told to stop at the end, whatever ends the run
    (a daemon left running would put every later CUDA program on the machine under MPS); it stops once its
    clients, this process among them, have exited."""
    running = mps_running()
    if not on:
        yield "on (a daemon started outside this check)" if running else "off"
        return
    if shutil.which(MPS_CONTROL) is None:
        raise SystemExit(f"--mps: {MPS_CONTROL} is not on PATH (it comes with NVIDIA's driver utilities)")
    if running:
        raise SystemExit("--mps: an MPS daemon already runs here; run without --mps, which runs under it")
    subprocess.run([MPS_CONTROL, "-d"], stdin=subprocess.DEVNULL, check=True)
    try:
        yield "on"
    finally:
        on_sigterm = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the stop short
        try:
            _stop_mps()
        finally:
            signal.signal(signal.SIGTERM, on_sigterm)


def _stop_mps() -> None:
    """Name the MPS servers that ran (none means no process used MPS), then tell the daemon to quit: it
    waits for its clients, this process among them, so the request is left to finish after this exits."""
    try:
        listed = subprocess.run(
            [MPS_CONTROL], input="get_server_list\n", capture_output=True, text=True, timeout=30
        )
        print(f"CUDA MPS servers that ran: {', '.join(listed.stdout.split()) or 'none: no process used MPS'}")
    except subprocess.TimeoutExpired:
        print("CUDA MPS servers that ran: the daemon did not answer in 30 s")
    quit_ = subprocess.Popen([MPS_CONTROL], stdin=subprocess.PIPE, text=True, start_new_session=True)
    try:
        quit_.communicate("quit\n", timeout=5)
    except subprocess.TimeoutExpired:
        print(f"CUDA MPS: the daemon stops once this process exits (else: echo quit | {MPS_CONTROL})")


# ----- rayb --------------------------------------------------------------------------------------------
def write_data(root: Path, tokens: int, shards: int = 16) -> None:
    """Random words under a GPT-2-sized word vocabulary, in `shards` files that Ray Data tokenizes side by
    side (one file would be one task on one core), and that vocabulary as a tokenizer directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    eos = "<|endoftext|>"
    words = [f"w{i}" for i in range(VOCAB - 1)]
    tokenizer = Tokenizer(
        models.WordLevel({word: i for i, word in enumerate(words)} | {eos: VOCAB - 1}, unk_token=eos)
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, unk_token=eos, pad_token=eos)
    wrapped.save_pretrained(root / "tokenizer")
    ids = np.random.default_rng(0).integers(0, VOCAB - 1, (tokens // 1000 + 1, 1000))
    docs = [" ".join([words[i] for i in row.tolist()]) for row in ids]
    (root / "data").mkdir()
    for shard in range(shards):
        pq.write_table(pa.table({"text": docs[shard::shards]}), root / "data" / f"part-{shard:02d}.parquet")


def gpu_study(root: Path, name: str, preset: str, seeds: int | list[int], batch: int, global_batch: int,
              steps: int, **train):  # fmt: skip
    """A one-model study of `steps` steps on the GPU, on the random words under `root` (written by the
    first study of that shape): studies of one section share them, and their token cache."""
    from rayb.study import parse_study

    # Twice the budget: the held-out share is a random 1% of documents, too few of them at short runs.
    if not (root / "data").exists():
        write_data(root, 2 * steps * global_batch * SEQ)
    return parse_study({
        "name": name, "models": [{"preset": preset}], "seeds": seeds, "eval": ["lm"],
        "data": {"sources": [{"name": "random", "uri": str(root / "data"), "weight": 1.0}],
                 "tokenizer": str(root / "tokenizer"), "seq_len": SEQ, "token_budget": steps * global_batch * SEQ,
                 "val_share": 0.01},
        "train": {"lr": 1e-4, "warmup_steps": 5, "micro_batch": batch, "global_batch": global_batch,
                  "eval_every": steps, "use_gpu": True, "allow_slow_kernels": True, **train},
    })  # fmt: skip


def run_rayb(study, out: Path) -> tuple[list[Path], float, float]:
    """(each trial's directory, the whole run's wall seconds, its training stage's seconds)."""
    from rayb.runner import run_study
    from rayb.stages import TIMINGS

    began = time.perf_counter()
    outcome = run_study(study, out, log=lambda msg: print(f"  rayb: {msg}"))
    wall = time.perf_counter() - began
    stages = json.loads((Path(outcome.study_dir) / TIMINGS).read_text())
    trial_dirs = [Path(t.trial_dir) for t in outcome.trials]
    # Where a GPU machine's fixed costs go (CUDA start-up in each process, kernel self-checks): the study's
    # stages, and the first trial's parts outside its steps.
    first = json.loads((trial_dirs[0] / "train_result.json").read_text())["timings"]
    print(f"  rayb: {wall:.0f} s in all; stages {_seconds(stages)}; first trial {_seconds(first)}")
    return trial_dirs, wall, stages["training_s"]


def _seconds(parts: dict[str, float]) -> str:
    return ", ".join(
        f"{name.removesuffix('_s')} {value:.1f}" for name, value in parts.items() if name.endswith("_s")
    )


def step_rates(trial_dir: Path, warmup: int) -> list[float]:
    """The trial's tokens/s at each step after `warmup`, from its own per-step log (a log still being written
    ends at its last whole line; none yet, no steps)."""
    log = trial_dir / "metrics.jsonl"
    text = log.read_text() if log.exists() else ""
    lines = text.splitlines()[: None if text.endswith("\n") else -1]
    records = [json.loads(line) for line in lines]
    return [r["tokens_per_s"] for r in records if r["kind"] == "train" and r["step"] > warmup]


def median_tokens_per_s(trial_dir: Path, warmup: int) -> float:
    """The trial's median tokens/s over its steps after `warmup`."""
    return statistics.median(step_rates(trial_dir, warmup))


def print_so_far(trial_dirs: list[Path], warmup: int) -> None:
    """Trials cut short (a GPU lease's time limit, Ctrl-C): each one's median tokens/s so far, and together
    (their rate side by side, where they all ran at once)."""
    rates = [statistics.median(steps) for trial in trial_dirs if (steps := step_rates(trial, warmup))]
    each = ", ".join(f"{rate:,.0f}" for rate in rates) or "none"
    print(f"cut short: {len(rates)} of {len(trial_dirs)} trials past step {warmup}, at {each} tokens/s; "
          f"together {sum(rates):,.0f} tokens/s")  # fmt: skip


def precisions(trial_dir: Path) -> tuple[str, str]:
    """(what the trial trained in, from its train_result.json; what its evaluations ran in, from their
    result files)."""
    trained = json.loads((trial_dir / "train_result.json").read_text())["precision"]
    evaluated = {
        json.loads(p.read_text()).get("precision", "not recorded")
        for p in (trial_dir / EVAL_DIR).glob("*.json")
    }
    return trained, ", ".join(sorted(evaluated)) or "not run"


def describe_precisions(trained: str, evaluated: str) -> str:
    return f"training {trained}, evaluation {evaluated}"


def measurement(
    device: str, model: str, flops: float, tokens_per_s: float, peak: float, trials: int, precision: str
) -> Measurement:
    """One line of the measurements file: `tokens_per_s` is the whole GPU's, all `trials` together."""
    return Measurement(gpu_of(device) or device.lower(), device, datetime.date.today().isoformat(), model, flops,
                       trials, tokens_per_s * flops / peak, precision)  # fmt: skip


def packing_verdict(
    alone: tuple[float, float], packed: tuple[float, float], seeds: int = PACKED_SEEDS
) -> str:
    """Ten packed seeds against one alone, each (tokens/s, training seconds): the wall against the goal,
    and the throughput gain against the one rayb plan assumes (rayb/mfu.py's assumed_packing_gain)."""
    ratio, gain = packed[1] / alone[1], packed[0] / alone[0]
    met = "met" if ratio <= PACKING_GOAL else "MISSED"
    return (f"{seeds} seeds packed on one GPU trained in {packed[1]:.0f} s, one seed alone in {alone[1]:.0f} s: "
            f"{ratio:.2f}× one seed's wall (goal ≤ {PACKING_GOAL:g}×: {met}); together at {gain:.2f}× one "
            f"seed's tokens/s (rayb plan assumes {assumed_packing_gain(seeds):.2f}×)")  # fmt: skip


def print_rate(name: str, rate: float, flops: float, peak: float, notes: tuple[str, str]) -> None:
    """One measured setup, printed as soon as it is measured: a run cut short still reports what it got."""
    print(
        f"measured: {name:<34}{rate:>12,.0f} tokens/s{rate * flops / peak:>8.1%} MFU  {describe_precisions(*notes)}"
    )


def gpt2_check(args, peak: float, device: str) -> list[Measurement]:
    """Section 2: GPT-2 124M, a bare loop against rayb; rayb's eager MFU as a measurement."""
    flops = flops_per_token("gpt2")
    batch = args.batch or largest_batch()
    print(f"\nGPT-2 124M, micro-batch {batch} × {SEQ}, {flops / 1e9:.3f} GFLOPs per trained token")
    rates, notes, walls = {}, {}, {}
    for compile in (False, True):
        name = f"bare loop, {'torch.compile' if compile else 'eager'}"
        rates[name] = bare_tokens_per_s(batch, args.warmup, args.steps, compile)
        notes[name] = ("bf16 autocast", "none")
        print_rate(name, rates[name], flops, peak, notes[name])
    with tempfile.TemporaryDirectory(prefix="rayb-gpu-check-") as root:
        for compile in (False, True):  # the second run reuses the first's token cache
            name = f"rayb, {'train.compile' if compile else 'eager'}"
            study = gpu_study(Path(root), f"gpu-check{'-compiled' if compile else ''}", "gpt2", 1, batch, batch,
                              args.warmup + args.steps, compile=compile)  # fmt: skip
            (trial,), walls[name], _ = run_rayb(study, Path(root) / "out")
            rates[name], notes[name] = median_tokens_per_s(trial, args.warmup), precisions(trial)
            kernels = json.loads((trial / "train_result.json").read_text())["kernels"]
            print_rate(name, rates[name], flops, peak, notes[name])
    bare = max(rates["bare loop, eager"], rates["bare loop, torch.compile"])
    rayb = max(rates["rayb, eager"], rates["rayb, train.compile"])
    print(f"\nbare loop (best) MFU {bare * flops / peak:.1%} (target ≥ 40%)")
    print(f"rayb (best) / bare loop (best) tokens/s: {rayb / bare:.2f}× (target ≥ 0.9×)")
    runs = ", ".join(f"{name} {wall:.0f} s" for name, wall in walls.items())
    print(f"rayb's whole runs, data preparation to report: {runs}; kernels {kernels}")
    # Studies train eager unless they set train.compile: price them at the eager path.
    eager = "rayb, eager"
    return [measurement(device, "gpt2", flops, rates[eager], peak, 1, notes[eager][0])]


def packing_check(args, peak: float, device: str) -> list[Measurement]:
    """Section 3: the 3.5M model, one seed alone on the GPU, then ten packed on it."""
    flops = flops_per_token(SMALL)
    print(f"\n{SMALL}: {args.pack_steps} steps of {args.pack_global} × {SEQ}, micro-batch {args.pack_batch}")
    runs, finished = {}, set()
    with tempfile.TemporaryDirectory(prefix="rayb-gpu-check-") as root:
        for seeds in (ALONE_SEEDS, PACKED_SEEDS):
            alone = seeds is ALONE_SEEDS
            share = {} if alone else {"gpus_per_trial": 1 / PACKED_SEEDS}
            study = gpu_study(Path(root), f"gpu-check-{'alone' if alone else 'packed'}", SMALL, seeds,
                              args.pack_batch, args.pack_global, args.pack_steps, num_workers=1, **share)  # fmt: skip
            out = Path(root) / "out"  # the second study reuses the first's token cache
            try:
                trials, _, training_s = run_rayb(study, out)
            except (SystemExit, KeyboardInterrupt):  # what the steps logged so far is still a measurement
                started = sorted((out / "trials").glob("*"))
                print_so_far([trial for trial in started if trial.name not in finished], args.warmup)
                raise
            finished |= {trial.name for trial in trials}
            # The trials train side by side: together, the GPU's rate.
            rate = sum(median_tokens_per_s(t, args.warmup) for t in trials)
            runs[len(trials)] = (rate, training_s, precisions(trials[0]))
            label = "one seed alone" if alone else f"{PACKED_SEEDS} seeds packed (together)"
            print_rate(label, rate, flops, peak, runs[len(trials)][2])
    print(packing_verdict(runs[1][:2], runs[PACKED_SEEDS][:2]))
    return [
        measurement(device, SMALL, flops, rate, peak, seeds, notes[0])
        for seeds, (rate, _, notes) in runs.items()
    ]


SECTIONS = {"gpt2": gpt2_check, "packing": packing_check}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40, help="measured steps")
    parser.add_argument(
        "--warmup", type=int, default=10, help="unmeasured steps first (compilation, allocator)"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak of the GPU")
    parser.add_argument(
        "--batch", type=int, default=None, help="micro-batch (default: the largest that fits)"
    )
    parser.add_argument("--pack-steps", type=int, default=500, help=f"steps of each {SMALL} seed")
    parser.add_argument(
        "--pack-batch", type=int, default=4, help=f"{SMALL}'s micro-batch (a tenth of the GPU each)"
    )
    parser.add_argument("--pack-global", type=int, default=32, help=f"{SMALL}'s sequences per step")
    parser.add_argument(
        "--measured-out", type=Path, default=default_path(), help="the MFU measurements file to add to"
    )
    parser.add_argument(
        "--only", choices=sorted(SECTIONS), help="run this section alone (the kernels always print)"
    )
    parser.add_argument(
        "--mps", action="store_true", help=f"run under CUDA MPS (starts and stops {MPS_CONTROL})"
    )
    args = parser.parse_args()
    # Asked of NVML, which makes no CUDA context: an MPS daemon must start before this process's first.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: the GPU check runs on a GPU machine")
    with sigterm_exits(), cuda_mps(args.mps) as mps:
        device = torch.cuda.get_device_name()
        peak = peak_flops(args.peak_tflops, device)
        print(f"{device}, torch {torch.__version__}, peak {peak / 1e12:.0f} TFLOP/s (bf16), CUDA MPS {mps}")
        print_kernels()
        sections = [SECTIONS[args.only]] if args.only else SECTIONS.values()
        measured = [m for section in sections for m in section(args, peak, device)]
    if mps != "off":  # `rayb plan` prices trials as they run without MPS
        print(f"\nMFU measurements not recorded: measured under CUDA MPS ({mps})")
        return
    record_measurements(args.measured_out, measured)
    print(f"\nMFU measurements for `rayb plan --gpu {measured[0].gpu}` added to {args.measured_out}")


if __name__ == "__main__":
    main()
