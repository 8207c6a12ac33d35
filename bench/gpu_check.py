"""The GPU check: each architecture's kernel path, then GPT-2 124M under rayb against a bare PyTorch loop.

Run on a machine with a CUDA device (it refuses to run without one):

    python bench/gpu_check.py                     # 40 measured steps after 10 warm-up steps
    python bench/gpu_check.py --steps 100 --peak-tflops 989

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

The data is random words under a 50,257-word vocabulary, so the LM head is GPT-2's size; throughput does
not depend on the text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rayb.models.accounting import model_cost
from rayb.models.presets import PRESETS
from rayb.models.registry import available, get_arch
from rayb.plan import PEAK_FLOPS

SEQ, VOCAB = 1024, 50257


def peak_flops(override_tflops: float | None) -> float:
    if override_tflops:
        return override_tflops * 1e12
    name = torch.cuda.get_device_name().lower()
    for gpu, flops in PEAK_FLOPS.items():
        if gpu in name:
            return flops
    raise SystemExit(f"unknown GPU '{name}': pass --peak-tflops (its dense bf16 peak)")


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


# ----- rayb --------------------------------------------------------------------------------------------
def write_data(root: Path, tokens: int) -> tuple[Path, Path]:
    """Random words under a GPT-2-sized word vocabulary, and that vocabulary as a tokenizer directory."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    eos = "<|endoftext|>"
    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {eos: VOCAB - 1}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=eos))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, unk_token=eos, pad_token=eos)
    wrapped.save_pretrained(root / "tokenizer")
    rng = np.random.default_rng(0)
    docs = [" ".join(f"w{i}" for i in rng.integers(0, VOCAB - 1, 1000)) for _ in range(tokens // 1000 + 1)]
    (root / "data").mkdir()
    pq.write_table(pa.table({"text": docs}), root / "data" / "part.parquet")
    return root / "data", root / "tokenizer"


def rayb_tokens_per_s(
    batch: int, warmup: int, steps: int, root: Path, compile: bool
) -> tuple[float, float, dict]:
    """(median tokens/s over the measured steps, the whole run's wall seconds, the trial's record)."""
    from rayb.runner import run_study
    from rayb.study import parse_study

    total = warmup + steps
    data, tokenizer = write_data(root, int(total * batch * SEQ * 1.2))
    study = parse_study({
        "name": f"gpu-check{'-compiled' if compile else ''}", "models": [{"preset": "gpt2"}], "seeds": [0], "eval": ["lm"],
        "data": {"sources": [{"name": "random", "uri": str(data), "weight": 1.0}], "tokenizer": str(tokenizer),
                 "seq_len": SEQ, "token_budget": total * batch * SEQ, "val_share": 0.01},
        "train": {"lr": 1e-4, "warmup_steps": 5, "micro_batch": batch, "global_batch": batch, "eval_every": total,
                  "use_gpu": True, "allow_slow_kernels": True, "compile": compile},
    })  # fmt: skip
    began = time.perf_counter()
    outcome = run_study(study, root / "out", log=lambda msg: print(f"  rayb: {msg}"))
    wall = time.perf_counter() - began
    (trial,) = outcome.trials
    log = [json.loads(line) for line in (Path(trial.trial_dir) / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in log if r["kind"] == "train" and r["step"] > warmup]
    record = json.loads((Path(trial.trial_dir) / "train_result.json").read_text())
    return statistics.median(rates), wall, record


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
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: the GPU check runs on a GPU machine")
    peak = peak_flops(args.peak_tflops)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, peak {peak / 1e12:.0f} TFLOP/s (bf16)")
    print_kernels()

    preset = PRESETS["gpt2"]
    flops = model_cost("gpt2", preset.config, VOCAB, SEQ).train_flops_per_token
    batch = args.batch or largest_batch()
    print(f"\nGPT-2 124M, micro-batch {batch} × {SEQ}, {flops / 1e9:.3f} GFLOPs per trained token")
    rates = {
        "bare loop, eager": bare_tokens_per_s(batch, args.warmup, args.steps, compile=False),
        "bare loop, torch.compile": bare_tokens_per_s(batch, args.warmup, args.steps, compile=True),
    }
    for compile in (False, True):
        with tempfile.TemporaryDirectory(prefix="rayb-gpu-check-") as root:
            name = f"rayb, {'train.compile' if compile else 'eager'}"
            rates[name], wall, record = rayb_tokens_per_s(batch, args.warmup, args.steps, Path(root), compile)
    print(f"\n{'setup':<40}{'tokens/s':>12}{'MFU':>8}")
    for name, rate in rates.items():
        print(f"{name:<40}{rate:>12,.0f}{rate * flops / peak:>8.1%}")
    bare = max(rates["bare loop, eager"], rates["bare loop, torch.compile"])
    rayb = max(rates["rayb, eager"], rates["rayb, train.compile"])
    print(f"\nbare loop (best) MFU {bare * flops / peak:.1%} (target ≥ 40%)")
    print(f"rayb (best) / bare loop (best) tokens/s: {rayb / bare:.2f}× (target ≥ 0.9×)")
    print(f"rayb's last whole run, data preparation to report: {wall:.0f} s; precision {record['precision']}, "
          f"kernels {record['kernels']}")  # fmt: skip


if __name__ == "__main__":
    main()
