"""The eval pool evaluates trials while others are still training: a job runs as soon as it is fed, and
no actor waits idle on resources that training may need; only CPUs no trial can use hold actors that wait."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import session_actors

from rayb.eval.actors import EvalPool, evaluate, evaluation_jobs, read_result
from rayb.eval.corpora import load_corpus
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


def test_short_jobs_share_one_actor_and_a_long_queue_starts_another(
    ray_session, tiny_cache, tmp_path, monkeypatch
):
    """A CPU actor's start (its process, torch's and transformers' imports) is paid only where it shortens
    the queue: two short jobs, with two actors allowed, run one after the other on one; MANY_JOBS waiting
    beside the first actor's start the second at once."""
    monkeypatch.setattr(EvalPool, "START_ALLOWANCE_S", 600.0)  # however slow a start here, the rule decides
    trials = [_saved_trial(f"t{i}", tiny_cache, tmp_path) for i in range(3 + EvalPool.MANY_JOBS)]

    def actors_started(trials: list[TrialSpec]) -> int:
        before = {a["ActorID"] for a in session_actors("_EvalActor")}
        assert evaluate(evaluation_jobs(trials, ["lm"], {}), num_actors=2, log=lambda _: None) == {}
        return len({a["ActorID"] for a in session_actors("_EvalActor")} - before)

    assert actors_started(trials[:2]) == 1
    assert actors_started(trials[2:]) == 2
    assert all(read_result(Path(t.trial_dir), "lm", {})["status"] == "ok" for t in trials)


def test_another_actor_starts_where_the_queued_work_outlasts_a_start():
    """The pool's rule (pure arithmetic on what it has measured): the queue's work, each suite's jobs at
    their own mean wall, shared by the live actors, against the last measured start; before anything is
    measured, the live actors' jobs must have run START_ALLOWANCE_S."""
    pool = EvalPool(num_actors=4, use_gpu=False, log=lambda _: None)
    lm, overfit = SimpleNamespace(suite="lm"), SimpleNamespace(suite="overfit")
    assert pool._worth_an_actor([lm])  # no actor live: the first always starts
    pool._live[0.0] = 1
    pool._running = {"ref": (None, 0.0, lm, time.perf_counter())}
    assert not pool._worth_an_actor([lm] * 3)  # nothing measured, the live job only just handed over
    pool._running = {"ref": (None, 0.0, lm, time.perf_counter() - EvalPool.START_ALLOWANCE_S)}
    assert pool._worth_an_actor([lm])
    assert pool._worth_an_actor([lm] * EvalPool.MANY_JOBS)
    pool._start_s, pool._job_s = 4.0, {"lm": [0.5, 0.7], "overfit": [3.0]}
    assert not pool._worth_an_actor([lm] * 6)  # 3.6 s of work: less than a start
    assert pool._worth_an_actor([lm] * 7)  # 4.2 s
    assert pool._worth_an_actor([overfit, overfit])  # 6 s
    speed = SimpleNamespace(suite="speed")  # not measured yet: every job's mean, 1.4 s
    assert pool._worth_an_actor([speed] * 3)
    pool._live[0.0] = 2
    assert not pool._worth_an_actor([overfit, overfit])  # 3 s each for two live actors


def test_cpu_jobs_start_only_on_the_cores_training_leaves_and_speed_once_none_trains():
    """The pool's rule (pure arithmetic on what `free_cores` said): with no limit of the feed's, the queue's
    first job; with training on, as many CPU jobs as free cores hold threads (those running, on actors or
    drained workers, counted), never a job that times its process; a GPU share's queue is not limited."""
    pool = EvalPool(num_actors=4, use_gpu=False, threads=1, log=lambda _: None)
    speed, lm = SimpleNamespace(suite="speed"), SimpleNamespace(suite="lm")
    pool._queues = {0.0: [speed, lm], 0.25: [speed]}
    assert pool._next_index(0.0) == 0 and pool._cpu_jobs_left() == math.inf  # free_cores said None
    pool._free = 0.0
    assert pool._next_index(0.0) is None and pool._next_index(0.25) == 0
    pool._free = 2.0
    assert pool._next_index(0.0) == 1  # speed waits, lm may start
    pool._running = {"actor's": (object(), 0.0, lm, 0.0), "a GPU's": (object(), 0.25, lm, 0.0)}
    assert pool._cpu_jobs_left() == 1 and pool._next_index(0.0) == 1
    pool._running["relayed"] = (None, 0.0, lm, 0.0)
    assert pool._cpu_jobs_left() == 0 and pool._next_index(0.0) is None
    pool._queues[0.0] = [speed]
    pool._running, pool._free = {}, 2.0
    assert pool._next_index(0.0) is None
    pool._free = None
    assert pool._next_index(0.0) == 0
    pool.threads = 2  # each job's threads count against the cores
    pool._free, pool._queues[0.0] = 3.0, [lm]
    assert pool._cpu_jobs_left() == 1
    pool._running = {"actor's": (object(), 0.0, lm, 0.0)}
    assert pool._next_index(0.0) is None


def test_drained_workers_are_let_go_only_for_a_group_waiting_now(ray_session):
    """The pool lets its drained Train workers go where a worker group waits for resources now, asked afresh:
    not for one seen up to LOOK_S before (its own groups' placement groups, pending as they started)."""
    import ray

    class Workers:
        released = False

        def evaluate(self, job, threads):
            return f"ref of {job.suite}"

        def release(self):
            self.released = True

    lines = []
    pool, workers = EvalPool(num_actors=2, use_gpu=False, log=lines.append), Workers()
    pool._queues = {0.0: [SimpleNamespace(suite="lm"), SimpleNamespace(suite="speed")]}
    pool._looked, pool._waiting = time.monotonic(), True  # a pending placement group, seen just now
    state = {"released": False, "drained": True, "finished": False, "groups": 2, "free": 1}
    assert pool._relay(workers, state) == [] and not workers.released  # no group waits on this Ray
    assert [job.suite for _, _, job, _ in pool._running.values()] == ["lm"]  # speed keeps to an actor
    assert [job.suite for job in pool._queues[0.0]] == ["speed"]
    # A group that waits now: the workers go, their queued jobs stay for actors.
    waiting = ray.util.placement_group([{"CPU": 1000}])  # more than this Ray will ever have
    try:
        pool._queues[0.0].append(SimpleNamespace(suite="lm"))
        pool._looked, pool._waiting = time.monotonic(), True
        assert pool._relay(workers, state) == [] and workers.released
        assert [job.suite for job in pool._queues[0.0]] == ["speed", "lm"]
        assert lines == ["  eval: a worker group waits for resources: the drained Train workers go; 2 queued jobs "
                         "wait for eval actors"]  # fmt: skip
    finally:
        ray.util.remove_placement_group(waiting)


def test_jobs_for_drained_workers_wait_while_the_pools_queue_does_not_answer():
    """While a pool trains and its queue does not answer (not started yet, or a call to it failed), the jobs
    a drained Train worker may run wait for the next answer rather than start an eval actor; the rest stay
    queued for actors, as every job does once no pool trains, or once training is over (the queue, killed
    as its pool ends, no longer answers before the feed drops it)."""
    lm, speed = SimpleNamespace(suite="lm"), SimpleNamespace(suite="speed")
    pool = EvalPool(num_actors=2, use_gpu=False, log=lambda _: None)
    pool._queues = {0.0: [lm, speed]}
    assert pool._relay(object(), None, training=True) == [lm] and pool._queues[0.0] == [speed]
    for workers, training in [(None, True), (object(), False)]:
        pool._queues = {0.0: [lm, speed]}
        assert pool._relay(workers, None, training=training) == [] and pool._queues[0.0] == [lm, speed]


def test_a_job_waits_for_a_core_free_of_training(ray_session, tiny_cache, tmp_path):
    """A fed job starts no actor and runs nowhere while training's threads fill the cores (`free_cores`
    says 0), though Ray has CPUs free; it runs as soon as a core is free."""
    (job,) = evaluation_jobs([_saved_trial("held", tiny_cache, tmp_path)], ["lm"], {})
    free, handed = [0.0], []
    deadline, held_until = time.time() + 120, time.time() + 3 * EvalPool.POLL_S

    def feed():
        assert time.time() < deadline, "the job never ran once a core was free"
        if free[0] == 0.0:
            assert not Path(job.out).exists() and not _alive_eval_actors(), "it ran beside training"
            if time.time() > held_until:
                free[0] = 1.0
        jobs = [] if handed else [job]
        handed.extend(jobs)
        return jobs, not Path(job.out).exists()

    pool = EvalPool(num_actors=2, use_gpu=False, log=lambda _: None, free_cores=lambda: free[0])
    assert pool.serve(feed) == {}
    assert read_result(Path(job.trial.trial_dir), "lm", {})["status"] == "ok"


def _alive_eval_actors() -> dict[str, int]:
    """This session's eval actors not dead: {actor id: pid}."""
    return {a["ActorID"]: a["Pid"] for a in session_actors("_EvalActor") if a["State"] != "DEAD"}


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
        assert list(alive) == standing  # out of jobs, it waits instead of being let go
        handed.append(second_job)
        return [second_job], False

    pool = EvalPool(num_actors=1, use_gpu=False, log=lambda _: None, spare_cpus=lambda: 1.0)
    assert pool.serve(feed) == {} and handed == [first_job, second_job]
    while _alive_eval_actors():  # nothing outlives the pool
        assert time.time() < deadline, "an eval actor outlived its pool"
        time.sleep(0.5)
    assert read_result(Path(second.trial_dir), "lm", {})["status"] == "ok"


def _kill_running_evaluations(killed: list[int]) -> None:
    """SIGKILL the process of every eval actor that is running a job (Ray titles it `ray::_EvalActor.run`
    while it does), as an OOM kill or a lost node ends it; `killed` collects their pids."""
    import psutil

    for pid in _alive_eval_actors().values():
        try:
            running = psutil.Process(pid).cmdline()[:1] == ["ray::_EvalActor.run"]
        except psutil.Error:  # gone, or not started yet (pid 0)
            continue
        if running and pid not in killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)


def _serve_killing(job, kills: int, deadline: float) -> tuple[dict, list[int], list[str]]:
    """Serve one job, killing the actor that runs it mid-job, `kills` times; the feed stays open until
    then. Returns the pool's errors, the pids killed and the pool's log."""
    killed, handed, lines = [], [], []

    def feed():
        assert time.time() < deadline, f"killed {len(killed)} of {kills} eval actors mid-job in time"
        if len(killed) < kills:
            _kill_running_evaluations(killed)
        jobs = [] if handed else [job]
        handed.extend(jobs)
        return jobs, len(killed) < kills

    errors = EvalPool(num_actors=1, use_gpu=False, log=lines.append).serve(feed)
    return errors, killed, lines


LONG_OVERFIT = {"overfit": {"steps": 600}}  # a job that runs for seconds: long enough to be killed in


def test_a_job_whose_actor_dies_runs_again_on_a_fresh_actor(ray_session, tiny_cache, tmp_path):
    """The actor running a job is killed mid-job (SIGKILL, as the OOM killer or a lost node would): the job
    runs again on a fresh actor and its result is written, rather than the pool, and with it the study,
    failing after training."""
    trial = _saved_trial("killed", tiny_cache, tmp_path)
    (job,) = evaluation_jobs([trial], ["overfit"], LONG_OVERFIT)
    errors, killed, lines = _serve_killing(job, kills=1, deadline=time.time() + 240)
    assert errors == {} and len(killed) == 1
    assert any("attempt 1 of 3 failed" in line and "running it again" in line for line in lines), lines
    assert read_result(Path(trial.trial_dir), "overfit", LONG_OVERFIT["overfit"])["status"] == "ok"


def test_a_job_whose_actors_keep_dying_is_recorded_as_its_error(ray_session, tiny_cache, tmp_path):
    """Every actor that runs the job is killed: after three attempts the job is that evaluation's error, in
    its result file and in what the pool returns, and the pool ends normally."""
    trial = _saved_trial("doomed", tiny_cache, tmp_path)
    (job,) = evaluation_jobs([trial], ["overfit"], LONG_OVERFIT)
    errors, killed, lines = _serve_killing(job, kills=3, deadline=time.time() + 360)
    assert len(killed) == 3 and list(errors) == [("doomed", "overfit")]
    assert "the eval actor was lost" in errors[("doomed", "overfit")]
    result = read_result(Path(trial.trial_dir), "overfit", LONG_OVERFIT["overfit"])
    assert result["status"] == "error" and result["error"] == errors[("doomed", "overfit")]
    assert [line for line in lines if "running it again" in line][-1].count("attempt 2 of 3") == 1


def test_a_corpus_file_is_scored_on_a_node_that_does_not_have_it(ray_session, tiny_cache, tmp_path):
    """`lm:FILE` names a file on the driver's disk, relative to the study file; the eval actor may run on a
    node without it. The driver reads the file as it hands the job out, so the job scores its text even
    though the file is gone (as on that node) when the actor runs: the same scores as the same text made
    on the actor's own node."""
    generated = "embedded://web?docs=6&seed=3"
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    (study_dir / "eval.txt").write_text(load_corpus(generated), encoding="utf-8")
    trial = _saved_trial("corpus", tiny_cache, tmp_path)
    jobs = evaluation_jobs([trial], ["lm:eval.txt", f"lm:{generated}"], {}, base_dir=study_dir)
    (study_dir / "eval.txt").unlink()
    assert evaluate(jobs, num_actors=1, log=lambda _: None) == {}
    from_file, made = (
        read_result(trial.trial_dir, suite, {}) for suite in ("lm:eval.txt", f"lm:{generated}")
    )
    assert from_file["status"] == "ok" and from_file["metrics"] == made["metrics"]


def test_an_eval_actors_start_imports_neither_the_study_model_nor_scipys_statistics():
    """An eval actor's process imports its module and what every job needs as it starts, on the critical
    path of the evaluations left after training: not rayb's study model (pydantic, the verdict's
    statistics, scipy.stats), which only the driver uses (about 0.5 s of each actor's start on 2 cores)."""
    import subprocess
    import sys

    probe = (
        "import sys; from rayb.eval.actors import _EvalActor; _EvalActor(threads=1); "
        "print(sorted(m for m in ('rayb.study', 'rayb.analysis', 'scipy.stats') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


def test_the_feed_is_asked_often_on_local_disk_and_once_a_second_on_object_storage(tmp_path):
    """Each ask of the feed checks every training trial's files: a stat on local disk, where the last trial's
    evaluation (which ends the study) should start soon after its training; a request per trial on object
    storage, where asking five times a second would cost a big study hundreds of requests a second."""
    assert EvalPool.poll_for(tmp_path) < EvalPool.POLL_S == EvalPool.poll_for("s3://bucket/out") == 1.0
