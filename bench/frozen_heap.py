"""What freezing a worker's imports saves (rayb.imports_frozen): the CPU a Train worker spends starting
(trainer.RayTrainWorker: torch, DeepSpeed, transformers), then training small trials, each ended by the
collection rayb runs between trials (train/loop._release_memory), with its imports frozen (as rayb
starts a worker) against the same process with Python's collector left as it is. Each variant runs in a
fresh process, alternating, and the medians are compared.

    python bench/frozen_heap.py                 # 3 pairs of 4 trials of 60 steps
    python bench/frozen_heap.py --pairs 5 --trials 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

WORKER = """
import contextlib, gc, json, sys, time
import rayb
frozen = sys.argv[1] == "frozen"
if not frozen:
    rayb.imports_frozen = contextlib.nullcontext
in_gc, started = [0.0], [0.0]
def timed(phase, info):
    if phase == "start":
        started[0] = time.process_time()
    else:
        in_gc[0] += time.process_time() - started[0]
gc.callbacks.append(timed)
from rayb.train.loop import _release_memory
from rayb.train.trainer import RayTrainWorker
RayTrainWorker()  # what a worker the pool starts ahead runs as it starts, outside Ray
imported, imports_gc = time.process_time(), in_gc[0]
import torch
from rayb.models import build_model
torch.set_num_threads(1)
for trial in range(int(sys.argv[2])):
    model = build_model("gpt2", {"d_model": 64, "n_layer": 4, "n_head": 4}, 512, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    for step in range(60):
        ids = torch.randint(0, 512, (8, 64))
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    del model, optimizer
    _release_memory(compiled=False)
print(json.dumps({"imports_s": imported, "imports_gc_s": imports_gc,
                  "trials_s": time.process_time() - imported, "trials_gc_s": in_gc[0] - imports_gc}))
"""


def run(variant: str, trials: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER, variant, str(trials)], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--trials", type=int, default=4)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "frozen": []}
    for _ in range(args.pairs):
        for variant in runs:
            runs[variant].append(run(variant, args.trials))
    print(
        f"CPU seconds of one worker process, medians of {args.pairs} runs ({args.trials} trials of 60 steps)"
    )
    print(f"{'':28}{'collector as is':>16}{'imports frozen':>16}{'frozen/as is':>14}")
    for key, label in [("imports_s", "starting the worker"), ("imports_gc_s", "  of which collecting"),
                       ("trials_s", "training the trials"), ("trials_gc_s", "  of which collecting")]:  # fmt: skip
        plain, frozen = (statistics.median(r[key] for r in runs[v]) for v in ("plain", "frozen"))
        print(f"{label:28}{plain:16.2f}{frozen:16.2f}{frozen / plain if plain else float('nan'):13.2f}x")


if __name__ == "__main__":
    main()
