"""The eval pool evaluates trials while others are still training: a job runs as soon as it is fed, and
no actor waits idle on resources that training may need; only CPUs no trial can use hold actors that wait."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rayb.eval.actors import EvalPool, evaluation_jobs, read_result
from rayb.models import build_model
from rayb.models.checkpoint import save_weights
from rayb.models.registry import get_arch
from rayb.train.spec import TrainSpec
from rayb.train.trial import TrialSpec

pytestmark = pytest.mark.ray


def _saved_trial(name: str, cache, root: Path) -> TrialSpec:
    config = get_arch("gpt2").shape(32, 2)
    trial_dir = root / name
    save_weights(
        build_model("gpt2", config, cache.manifest["vocab_size"], cache.seq_len), trial_dir / "model"
    )
    return TrialSpec(key=name, model="gpt2", arch="gpt2", model_config=config, lr=0.0, seed=0, train=TrainSpec(),
                     steps=0, cache_dir=str(cache.path), trial_dir=str(trial_dir), storage_path=str(root))  # fmt: skip


def test_a_fed_job_runs_before_the_feed_closes(ray_session, tiny_cache, tmp_path):
    """The feed hands over the first trial's job, and stays open ("still training") until that job's
    result is on disk and its actor is gone: a pool that waited for the end of training, or kept its
    idle actors, would never finish."""
    first, second = (_saved_trial(name, tiny_cache, tmp_path) for name in ("first", "second"))
    (first_job,), (second_job,) = (evaluation_jobs([t], ["lm"], {}) for t in (first, second))
    deadline, handed = time.time() + 120, []

    def feed():
        assert time.time() < deadline, "the first job never ran while training was still going on"
        if not handed:
            handed.append(first_job)
            return [first_job], True
        if not Path(first_job.out).exists():
            return [], True
        if _alive_eval_actors():  # with no job queued, the first job's actor is let go (ray.kill)
            return [], True
        handed.append(second_job)
        return [second_job], False

    errors = EvalPool(num_actors=1, use_gpu=False, log=lambda _: None).serve(feed)
    assert errors == {} and handed == [first_job, second_job]
    while _alive_eval_actors():  # nothing outlives the pool
        assert time.time() < deadline, "an eval actor outlived its pool"
        time.sleep(0.5)
    for trial in (first, second):
        assert read_result(Path(trial.trial_dir), "lm", {})["status"] == "ok"


def _alive_eval_actors() -> list[str]:
    from ray.util.state import list_actors

    return [
        a.actor_id for a in list_actors(filters=[("class_name", "=", "_EvalActor"), ("state", "!=", "DEAD")])
    ]


def test_an_actor_on_a_spare_cpu_starts_before_any_job_and_waits_for_the_next(
    ray_session, tiny_cache, tmp_path
):
    """With a CPU no trial can use (`spare_cpus`), an actor starts before the feed hands over any job, and
    the same actor is still there for the next job once the first has finished."""
    first, second = (_saved_trial(name, tiny_cache, tmp_path) for name in ("first", "second"))
    (first_job,), (second_job,) = (evaluation_jobs([t], ["lm"], {}) for t in (first, second))
    deadline, handed, standing = time.time() + 120, [], []

    def feed():
        assert time.time() < deadline, "no actor stood by, or it did not wait for the next job"
        alive = _alive_eval_actors()
        if not handed:
            if alive:  # started with nothing to do
                standing.extend(alive)
                handed.append(first_job)
                return [first_job], True
            return [], True
        if not Path(first_job.out).exists():
            return [], True
        assert alive == standing  # out of jobs, it waits instead of being let go
        handed.append(second_job)
        return [second_job], False

    pool = EvalPool(num_actors=1, use_gpu=False, log=lambda _: None, spare_cpus=lambda: 1.0)
    assert pool.serve(feed) == {} and handed == [first_job, second_job]
    while _alive_eval_actors():  # nothing outlives the pool
        assert time.time() < deadline, "an eval actor outlived its pool"
        time.sleep(0.5)
    assert read_result(Path(second.trial_dir), "lm", {})["status"] == "ok"
