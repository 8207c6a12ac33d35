"""What OpenMP's wait policy costs torch processes that share cores: a gpt2's training step timed in one
process alone and in processes side by side whose threads number twice the cores, under OpenMP's default
wait policy and under OMP_WAIT_POLICY=PASSIVE. Each measurement is a fresh set of processes (libgomp reads
the policy when torch loads it) that time their steps over one window of wall time, opened once all have
built their model; the ratios are against the same size's step alone under the default, in the same run.

OpenMP's threads spin for a while at the end of each parallel region before they sleep. A core that
another process needs then goes to spinning: the test suite runs two pytest processes side by side, each
with a Ray that sees every core, so tests/conftest.py sets PASSIVE. A study's worker groups never share
cores (the pool divides them as torch threads), and on one node its eval pool runs CPU jobs only on the
cores their threads leave (eval/feed.py's free_cores), so rayb leaves the default, which alone is the
faster. Over several nodes Ray places the eval actors, and one may share a node's cores with a group.

    python bench/shared_cores.py                    # the test suite's tiny gpt2 and the smoke study's
    python bench/shared_cores.py --sizes smoke --seconds 20 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {  # gpt2 config, vocabulary, context, micro-batch
    "tests": ({"d_model": 32, "n_layer": 2, "n_head": 2}, 512, 32, 4),  # tests/conftest.py's tiny study
    "smoke": ({"d_model": 128, "n_layer": 4, "n_head": 4}, 2048, 128, 16),  # configs/smoke.yaml's gpt2
}
POLICIES = {"default": {}, "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}  # the environment each adds


def time_steps(size: str, seconds: float) -> float:
    """The median training step of `size`'s gpt2 in this process, over a window of `seconds` that opens at
    the time the parent writes to stdin once every process has said it is ready."""
    import torch

    from rayb.models import build_model

    config, vocab, seq_len, batch = SIZES[size]
    torch.manual_seed(0)
    model = build_model("gpt2", config, vocab, seq_len)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (batch, seq_len))

    def step() -> None:
        logits = model(ids).logits
        torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    times = []
    while time.time() < start_at + seconds:
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def measure(size: str, policy: str, processes: int, threads: int, seconds: float) -> list[float]:
    """Each of `processes` side-by-side processes' median step, in seconds."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env |= {"OMP_NUM_THREADS": str(threads)} | POLICIES[policy]
    argv = [sys.executable, __file__, "--child", size, str(seconds)]
    children = [
        subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    ready = [child.stdout.readline().strip() == "ready" for child in children]
    start_at = f"{time.time() + 0.5}\n" if all(ready) else "0\n"
    for child in children:  # every window opens at once
        child.stdin.write(start_at)
        child.stdin.flush()
    out = [child.stdout.read() for child in children]
    for child in children:
        child.wait()
    if any(child.returncode for child in children):
        raise SystemExit(f"a timing process failed: {out}")
    return [json.loads(o)["step_s"] for o in out]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps({"step_s": time_steps(sys.argv[2], float(sys.argv[3]))}))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["tests", "smoke"])
    parser.add_argument("--seconds", type=float, default=10.0, help="each measurement's timed window")
    parser.add_argument("--rounds", type=int, default=2, help="times each measurement is taken, in turn")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads per process")
    args = parser.parse_args()
    beside = max(2, 2 * (os.cpu_count() or 1) // args.threads)  # their threads twice the cores
    print(f"{os.cpu_count()} cores, {args.threads} torch threads per process; alone and {beside} side by "
          f"side; median step over {args.seconds:.0f} s, median of {args.rounds} rounds")  # fmt: skip
    for size in args.sizes:
        steps: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for policy in POLICIES:
                for processes in (1, beside):
                    steps.setdefault((policy, processes), []).extend(
                        measure(size, policy, processes, args.threads, args.seconds)
                    )
        alone = statistics.median(steps[("default", 1)])
        print(f"{size} gpt2 {SIZES[size][0]}, batch {SIZES[size][3]}×{SIZES[size][2]}:")
        for (policy, processes), runs in steps.items():
            where = "alone" if processes == 1 else f"{processes} side by side"
            step = statistics.median(runs)
            ratio = f"{step / alone:5.2f}× the default alone"
            print(f"  {policy:<8} {where:<16} {1000 * step:7.1f} ms a step: {ratio}")
        ratio = statistics.median(steps[("default", beside)]) / statistics.median(steps[("PASSIVE", beside)])
        print(f"  side by side, the default's step is {ratio:.2f}× PASSIVE's")


if __name__ == "__main__":
    main()
