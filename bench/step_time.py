"""CPU forward+backward step time of every architecture, relative to gpt2 at equal parameters.

Each architecture is sized by `rayb match` to the same total parameter count, then timed on the same
batch: warm-up steps first, then the median of repeated forward+backward passes. Target: no
architecture slower than 3× gpt2 on CPU.

    python bench/step_time.py                       # 8M parameters, batch 8 × 256 tokens
    python bench/step_time.py --target 30M --seq-len 512 --archs gpt2,mamba2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rayb.models import build_model
from rayb.models.sizing import match, parse_size

ZOO = "gpt2,nanogpt,pythia,llama,mamba,mamba2,gated_deltanet,rwkv6"


def step_time(model: torch.nn.Module, ids: torch.Tensor, warmup: int, repeats: int) -> float:
    times = []
    for i in range(warmup + repeats):
        began = time.perf_counter()
        logits = model(ids).logits
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
        model.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="8M", help="total parameters every architecture is matched to")
    parser.add_argument("--archs", default=ZOO)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len))

    archs = args.archs.split(",")
    if "gpt2" not in archs:
        archs.insert(0, "gpt2")
    print(f"forward+backward, batch {args.batch}×{args.seq_len}, {args.threads} threads, "
          f"{args.warmup} warm-up + median of {args.repeats}, all at {args.target} total parameters")  # fmt: skip
    print(f"{'arch':<16}{'params':>12}{'config':>48}{'step ms':>10}{'vs gpt2':>9}")
    results = {}
    for arch in archs:
        sized = match(arch, parse_size(args.target), "total", args.vocab, args.seq_len)
        model = build_model(arch, sized.config, args.vocab, args.seq_len)
        results[arch] = step_time(model, ids, args.warmup, args.repeats)
        ratio = results[arch] / results["gpt2"]
        config = ", ".join(f"{k}={v}" for k, v in sized.config.items())
        print(
            f"{arch:<16}{sized.cost.total_params:>12,}{config:>48}{results[arch] * 1e3:>10.1f}{ratio:>8.2f}×"
        )
    worst = max(results, key=results.get)
    print(f"slowest: {worst} at {results[worst] / results['gpt2']:.2f}× gpt2 (target ≤ 3×)")


if __name__ == "__main__":
    main()
