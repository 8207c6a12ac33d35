"""Eval actors: a pool of Ray actors fans (checkpoint × benchmark) out in parallel.

This is the only eval module that knows about Ray; the benchmarks themselves are plain functions.
A failing evaluation is recorded with its message and does not stop the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayb.files import write_json_atomic
from rayb.train.trial import TrialSpec

EVAL_LM_FILE = "eval_lm.json"


@dataclass(frozen=True)
class EvalJob:
    trial: TrialSpec

    @property
    def out(self) -> Path:
        return Path(self.trial.trial_dir) / EVAL_LM_FILE


def _evaluate(job: EvalJob, threads: int) -> dict[str, Any]:
    import torch

    from rayb.data.cache import TokenCache
    from rayb.eval.lm import evaluate_lm, load_trained

    torch.set_num_threads(threads)
    cache = TokenCache(Path(job.trial.cache_dir))
    model = load_trained(
        Path(job.trial.trial_dir) / "model", job.trial.arch, job.trial.model_config,
        cache.manifest["vocab_size"], cache.seq_len,
    )  # fmt: skip
    metrics = evaluate_lm(model, cache)
    write_json_atomic(job.out, metrics)
    return metrics


def evaluate_trials(trials: list[TrialSpec], num_actors: int, threads: int = 1) -> dict[str, str]:
    """Evaluate every trial that has no result yet; return {trial key: error message} for failures."""
    import ray
    from ray.util import ActorPool

    jobs = [EvalJob(t) for t in trials if not EvalJob(t).out.exists()]
    if not jobs:
        return {}
    actor = ray.remote(num_cpus=1)(_EvalActor)
    pool = ActorPool([actor.remote(threads) for _ in range(min(num_actors, len(jobs)))])
    for job in jobs:
        pool.submit(lambda a, j: a.run.remote(j), job)
    errors = {}
    while pool.has_next():
        key, error = pool.get_next_unordered()
        if error:
            errors[key] = error
    return errors


class _EvalActor:
    def __init__(self, threads: int):
        self.threads = threads

    def run(self, job: EvalJob) -> tuple[str, str | None]:
        try:
            _evaluate(job, self.threads)
            return job.trial.key, None
        except Exception as exc:  # recorded per job; one broken checkpoint must not stop the rest
            return job.trial.key, f"{type(exc).__name__}: {exc}"
