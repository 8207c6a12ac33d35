"""What idle Ray actor processes cost the training steps beside them: the smoke study's gpt2, timed in this
process (a driver of a local Ray) with 0, 4 and 8 idle actors alive on the machine, each count in turn
and again, so that a drift of the machine shows as a spread rather than as an effect. The ratio is each
count's median step time against none's, measured in the same run.

An idle actor is not idle to the kernel: its process's main thread wakes about a hundred times a second.
On few cores those wake-ups land between the training threads' parallel regions; rayb keeps the number
of processes beside a study's steps down for this reason (trainer.UnservedScalingPolicy).

    python bench/idle_actors.py                  # 0, 4 and 8 actors, three times each
    python bench/idle_actors.py --counts 0 8 16 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from step_time import step_time

from rayb.models import build_model
from rayb.runtime import init_ray

VOCAB, SEQ_LEN, BATCH = 2048, 128, 16  # the smoke study's tokenizer, context and micro-batch
SMOKE_GPT2 = {"d_model": 128, "n_head": 4, "n_layer": 4}


class Idle:
    def ready(self) -> bool:
        return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 4, 8], help="idle actors to time beside")
    parser.add_argument("--rounds", type=int, default=3, help="times each count is timed, in turn")
    parser.add_argument("--repeats", type=int, default=40, help="timed steps per measurement")
    args = parser.parse_args()

    import ray

    init_ray()
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    model = build_model("gpt2", SMOKE_GPT2, VOCAB, SEQ_LEN)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ_LEN))
    idle = ray.remote(num_cpus=0)(Idle)
    actors: list = []
    times: dict[int, list[float]] = {n: [] for n in args.counts}
    for _ in range(args.rounds):
        for n in args.counts:
            while len(actors) > n:
                ray.kill(actors.pop())
            actors += [idle.remote() for _ in range(n - len(actors))]
            ray.get([a.ready.remote() for a in actors])
            time.sleep(2.0)  # the killed actors' processes gone, the new ones' start over
            times[n].append(step_time(model, ids, warmup=5, repeats=args.repeats))
    base = statistics.median(times[args.counts[0]])
    print(f"gpt2 {SMOKE_GPT2}, batch {BATCH}×{SEQ_LEN}, {torch.get_num_threads()} torch threads, "
          f"{os.cpu_count()} cores; forward+backward step, median of {args.repeats}")  # fmt: skip
    for n, runs in times.items():
        spread = ", ".join(f"{1000 * t:.1f}" for t in runs)
        print(f"{n:3d} idle actors: {1000 * statistics.median(runs):6.1f} ms ({spread}): "
              f"{statistics.median(runs) / base:.3f}× the step beside {args.counts[0]}")  # fmt: skip


if __name__ == "__main__":
    main()
