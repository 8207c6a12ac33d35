"""Eval fan-out speed-up: k evaluation jobs on k eval actors against the same jobs on one actor.

Builds a small token cache from rayb's embedded corpus and k copies of one checkpoint (an untrained
model: evaluation time does not depend on the weights), then runs the same suite on each copy through
`rayb.eval.actors.evaluate`, first with one actor (one after another), then with k actors. Each actor
uses one thread, so on an idle machine with k ≤ cores the ideal speed-up is k; the target is ≥ 0.8·k.
Two figures: end to end (what a study sees, including starting the actors, which import torch and
rayb), and the evaluations alone (the jobs' own wall times: serial sum against the slowest parallel job).

    python bench/eval_fanout.py                  # k = number of cores, long_context on a llama
    python bench/eval_fanout.py --k 2 --suite statefulness --arch mamba2
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from rayb import runtime
from rayb.data.pipeline import prepare_data
from rayb.data.spec import DataSpec
from rayb.eval.actors import evaluate, evaluation_jobs
from rayb.files import read_json
from rayb.models import build_model
from rayb.models.checkpoint import save_weights
from rayb.models.registry import get_arch
from rayb.train.spec import TrainSpec
from rayb.train.trial import TrialSpec

OPTIONS = {  # sized so that one job takes several seconds on one core
    "long_context": {"multiples": [1, 2, 4, 8], "max_windows": 32},
    "statefulness": {"distances": [5, 10, 20], "examples": 10},
    "lm": {},
    "speed": {"lengths": [128, 256, 512], "repeats": 2},
}


def make_trials(k: int, arch: str, root: Path) -> list[TrialSpec]:
    data = DataSpec(
        sources=[{"name": "edu", "uri": "embedded://edu?docs=2000", "weight": 1.0}],
        tokenizer="bpe:2048", seq_len=256, token_budget=256 * 1024, val_share=0.25,
    )  # fmt: skip
    cache = prepare_data(data, root / "cache")
    config = get_arch(arch).shape(256, 4)
    model = build_model(arch, config, cache.manifest["vocab_size"], cache.seq_len)
    trials = []
    for i in range(k):
        trial_dir = root / "trials" / f"copy{i}"
        save_weights(model, trial_dir / "model")
        trials.append(
            TrialSpec(
                key=f"copy{i}", model=arch, arch=arch, model_config=config, lr=0.0, seed=i, train=TrainSpec(), steps=0,
                cache_dir=str(cache.path), trial_dir=str(trial_dir), storage_path=str(root / "ray"),
            )
        )  # fmt: skip
    return trials


def timed_run(trials: list[TrialSpec], suite: str, actors: int) -> tuple[float, list[float]]:
    """(end-to-end seconds, each job's own wall seconds)."""
    for trial in trials:  # start from nothing each time
        shutil.rmtree(Path(trial.trial_dir) / "eval", ignore_errors=True)
    jobs = evaluation_jobs(trials, [suite], {suite: OPTIONS.get(suite, {})})
    began = time.perf_counter()
    errors = evaluate(jobs, num_actors=actors, threads=1, log=lambda _: None)
    if errors:
        raise RuntimeError(f"evaluation failed: {errors}")
    return time.perf_counter() - began, [read_json(job.out)["wall_s"] for job in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--k", type=int, default=os.cpu_count())
    parser.add_argument("--suite", default="long_context", choices=sorted(OPTIONS))
    parser.add_argument("--arch", default="llama")
    args = parser.parse_args()
    runtime.init_ray()
    with tempfile.TemporaryDirectory(prefix="rayb-fanout-") as root:
        trials = make_trials(args.k, args.arch, Path(root))
        timed_run(trials[:1], args.suite, 1)  # warm-up: worker start, imports, page cache
        serial, serial_jobs = timed_run(trials, args.suite, 1)
        parallel, parallel_jobs = timed_run(trials, args.suite, args.k)
    target = 0.8 * args.k
    print(
        f"{args.k} × {args.suite} on {args.arch}, one actor vs {args.k} actors (ideal {args.k}×, target ≥ {target:.1f}×)"
    )
    for what, one, many in (
        ("end to end", serial, parallel),
        ("evaluations alone", sum(serial_jobs), max(parallel_jobs)),
    ):
        speedup = one / many
        print(
            f"  {what:<18} {one:6.1f}s vs {many:6.1f}s: {speedup:.2f}× ({'met' if speedup >= target else 'missed'})"
        )


if __name__ == "__main__":
    main()
