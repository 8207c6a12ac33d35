"""What the actors a driver keeps save: its pools one after another (a study's rounds of seeds, the studies
of a notebook or a sweep script), each group on the Train worker, synchronization actor and Train
controller the last pool kept, against each on new ones.

On rayb's private Ray a pool starts its groups' Train workers and synchronization actors ahead and a group
adopts them; a worker whose group ends cleanly, after rayb's own models only, is kept for the driver's
next pool (kept.keep_warm_workers), which then starts no process and imports nothing; so are the group's
synchronization actor and its run's controller (kept.keep_controller). Here one driver runs one-trial
pools of the smoke study's gpt2, alternately on the kept actors and, with them released first, on new
ones; for each it prints the pool's wall and the group's time from the driver's request to the end of its
trial's set-up, medians over the pools, and their ratio (kept / new).

    python bench/kept_workers.py               # 4 pools each way (about 2 minutes on 2 cores)
    python bench/kept_workers.py --pools 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "configs" / "smoke.yaml"


def study(seeds: int):
    from rayb.study import parse_study

    raw = yaml.safe_load(SMOKE.read_text())
    raw |= {"name": "kept-workers", "seeds": seeds, "eval": ["lm"], "models": raw["models"][:1]}
    train, data = raw["train"], raw["data"]
    data["token_budget"] = 32 * train["global_batch"] * data["seq_len"]  # 32 steps: the start is what differs
    raw.pop("eval_options", None)
    return parse_study(raw)


def pool(trial) -> dict[str, float]:
    """Train `trial` in a pool of its own: the pool's wall, and its group's start to the end of set-up."""
    from rayb.train.trial import TRAIN_DONE
    from rayb.tune.packs import worker_pool
    from rayb.tune.sweep import run_pool

    began = time.perf_counter()
    assert run_pool(worker_pool([trial], slots=1, cores=1), 1) == {}
    wall = time.perf_counter() - began
    timings = json.loads((Path(trial.trial_dir) / TRAIN_DONE).read_text())["timings"]
    start = sum(timings.get(part, 0.0) for part in ("worker_start_s", "imports_s", "set_up_s"))
    return {"pool wall": wall, "group start to set-up end": start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", type=int, default=4, help="pools each way")
    args = parser.parse_args(argv)

    from rayb import runtime
    from rayb.data.pipeline import prepare_data
    from rayb.runner import plan_trials
    from rayb.train.kept import release_kept_workers

    with tempfile.TemporaryDirectory() as work:
        runtime.init_ray(ray_logs=Path(work) / "ray.log")  # the workers' output to Ray's log files
        spec = study(2 * args.pools + 1)
        cache = prepare_data(spec.data, Path(work) / "cache")
        trials = plan_trials(spec, cache, Path(work))
        pool(trials[0])  # DeepSpeed's one-time op build, and a worker to keep
        runs: dict[str, list[dict[str, float]]] = {"new": [], "kept": []}
        for i, trial in enumerate(trials[1:]):
            kind = "new" if i % 2 else "kept"
            if kind == "new":
                release_kept_workers()
            runs[kind].append(pool(trial))
            print(
                f"pool {i + 1} ({kind} actors): "
                + ", ".join(f"{k} {v:.1f} s" for k, v in runs[kind][-1].items())
            )
    print(f"\nmedians over {args.pools} pools each (s)        new   kept  kept/new")
    for part in runs["new"][0]:
        new, kept = (statistics.median(r[part] for r in runs[kind]) for kind in ("new", "kept"))
        print(f"  {part:<32} {new:6.1f} {kept:6.1f}  {kept / new:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
