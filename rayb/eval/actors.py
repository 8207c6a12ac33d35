"""Eval actors: a pool of Ray actors fans (checkpoint × benchmark) out in parallel.

This is the only eval module that knows about Ray; benchmarks are plain functions (registry.py).
Each job loads its checkpoint, runs one suite and writes `<trial>/eval/<suite>-<options hash>.json`
with the benchmark's version, its metrics or its error, and its wall time. A failing benchmark is
recorded with its message and does not stop the others; it is tried again on the next run, while
finished results are never recomputed. A job whose actor is lost under it (killed, out of memory, its node
gone) or left with a broken CUDA context runs again on a fresh actor, up to ATTEMPTS times in all; then it
is recorded as that evaluation's error, like a failing benchmark, and the study goes on. In a CPU study,
the Train workers of groups with no trial left to take run jobs too (DrainedWorkers).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rayb import imports_frozen, storage
from rayb.eval.registry import PRIMARY_SUITE, job_argument, make_options, parse_suite, result_name
from rayb.eval.scoring import describe_evaluation_precision, evaluation_autocast
from rayb.files import digest, read_json, write_json_atomic
from rayb.gpu_share import cap_gpu_memory
from rayb.train.trial import TrialSpec

EVAL_DIR = "eval"


@dataclass(frozen=True)
class EvalJob:
    trial: TrialSpec
    suite: str  # "lm", "lm:wikitext2", "lm_eval:hellaswag", ... as the study names it (and its results)
    options: dict[str, Any]  # the study's eval_options for this suite's family
    argument: Any = None  # the suite's argument as the driver read it (registry.job_argument)

    @property
    def out(self) -> str:
        return result_path(self.trial.trial_dir, self.suite, self.options)


def result_path(trial_dir: Path | str, suite: str, options: dict[str, Any]) -> str:
    """Keyed by suite, benchmark version and options, so a changed protocol never reuses old numbers."""
    benchmark, _ = parse_suite(suite)
    name = f"{result_name(suite)}-{digest([benchmark.version, options], length=8)}.json"
    return storage.join(trial_dir, EVAL_DIR, name)


def read_result(trial_dir: Path | str, suite: str, options: dict[str, Any]) -> dict[str, Any]:
    return read_json(result_path(trial_dir, suite, options))


def is_done(job: EvalJob) -> bool:
    return read_json(job.out).get("status") == "ok"


def run_job(job: EvalJob, threads: int) -> dict[str, Any]:
    """Load the checkpoint, run the suite, write its result file (ok or error); return the result."""
    import torch

    from rayb.data.cache import TokenCache
    from rayb.eval.registry import EvalContext

    benchmark, _ = parse_suite(job.suite)
    precision = job.trial.train.resolved_precision
    began = time.perf_counter()
    try:
        torch.set_num_threads(threads)
        cache = TokenCache(job.trial.cache_dir)
        model, tokenizer, fresh, study_tokens = _load(job.trial, cache)
        # fp32 weights for every architecture (transformers may load a checkpoint in the dtype it was
        # saved in); the study's evaluation autocast sets the precision the kernels compute in.
        model = model.float().eval()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = model.to(device)
        ctx = EvalContext(
            model, tokenizer, cache, job.trial.seed, fresh_model=fresh, study_tokens=study_tokens
        )
        dtype = evaluation_autocast(precision)
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            metrics = benchmark.run(ctx, job.argument, make_options(benchmark, job.options))
        outcome = {"status": "ok", "metrics": metrics, "precision": describe_evaluation_precision(precision)}
    except Exception as exc:  # recorded per job; one broken benchmark must not stop the rest
        outcome = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    return write_result(job, outcome, time.perf_counter() - began)


def write_result(job: EvalJob, outcome: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Write a job's result file, its outcome beside the benchmark's version and options; return it."""
    benchmark, _ = parse_suite(job.suite)
    result = {
        "suite": job.suite,
        "benchmark": benchmark.name,
        "version": benchmark.version,
        "options": job.options,
    }
    result |= outcome | {"wall_s": wall_s}
    write_json_atomic(job.out, result)
    return result


# What CUDA reports once a kernel has faulted: the context stays broken for the life of the process
# ("the process must be terminated and relaunched", CUDA's runtime API), so every later job on that
# actor would fail too. Matched in the error's text, as PyTorch and Triton word it ("CUDA error: ...").
STICKY_CUDA_ERRORS = (
    "an illegal memory access was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "misaligned address",
    "an illegal instruction was encountered",
    "the launch timed out and was terminated",
    "hardware stack error",
    "uncorrectable ecc error encountered",
)


def sticky_cuda_error(error: str) -> bool:
    """Whether an evaluation's error leaves its process's CUDA context unusable (not, e.g., out of memory)."""
    text = error.lower()
    return any(message in text for message in STICKY_CUDA_ERRORS)


def _load(trial: TrialSpec, cache):
    """(model, its tokenizer, a fresh-model factory, whether it reads the study's token ids) for a
    trained trial or a pretrained reference."""
    from rayb.data.tokenizer import load_tokenizer
    from rayb.models import build_model
    from rayb.models.checkpoint import load_trained
    from rayb.models.pretrained import Checkpoint, fresh_model, load_model
    from rayb.models.spec import PRETRAINED_ARCH

    if trial.arch == PRETRAINED_ARCH:
        checkpoint = Checkpoint(**trial.model_config["checkpoint"])
        tokenizer = load_tokenizer(checkpoint.tokenizer_files)
        same = tokenizer.get_vocab() == load_tokenizer(cache.tokenizer_dir).get_vocab()
        return load_model(checkpoint), tokenizer, lambda: fresh_model(checkpoint), same
    vocab, seq_len = cache.manifest["vocab_size"], cache.seq_len
    model_dir = storage.fetch_tree(storage.join(trial.trial_dir, "model"))
    model = load_trained(model_dir, trial.arch, trial.model_config, vocab, seq_len)
    fresh = lambda: build_model(trial.arch, trial.model_config, vocab, seq_len)  # noqa: E731
    return model, load_tokenizer(cache.tokenizer_dir), fresh, True


def evaluation_jobs(
    trials: list[TrialSpec], suites: list[str], options: dict[str, dict], base_dir: Path | None = None
) -> list[EvalJob]:
    """Every (trial × suite) without a finished result. Each suite's argument is read here, once, on the
    driver (relative paths from `base_dir`): a file it names reaches the actors with the jobs."""
    jobs = [EvalJob(t, s, options.get(parse_suite(s)[0].name, {})) for t in trials for s in suites]
    jobs = [job for job in jobs if not is_done(job)]
    arguments = {suite: job_argument(suite, base_dir) for suite in {job.suite for job in jobs}}
    return [replace(job, argument=arguments[job.suite]) for job in jobs]


SHARED_GPU = 0.25  # a GPU fraction per eval actor: most suites are light enough to share a device


def gpus_for(job: EvalJob, use_gpu: bool) -> float:
    """A suite that times or measures the device (speed) runs alone on a whole GPU; others share one."""
    if not use_gpu:
        return 0.0
    return 1.0 if parse_suite(job.suite)[0].exclusive_device else SHARED_GPU


# Jobs as they arrive, and whether more may come (False once the last trial has finished training).
Feed = Callable[[], tuple[list[EvalJob], bool]]


def relayable(suite: str) -> bool:
    """Whether a suite's jobs may run on a drained Train worker: all but those that measure the process
    they run in (speed's timings and resident memory), which keep to eval actors."""
    return not parse_suite(suite)[0].exclusive_device


class DrainedWorkers:
    """The Train workers of a CPU study's worker pool whose groups have no trial left to take, reached through
    the pool's queue (tune/group.TrialQueue, by name): once no trial waits for a group, each such worker
    runs the evaluation jobs relayed to it (`serve_drained`) instead of ending its group, until `release`d.
    It holds CPUs that no queued trial needs and has imported torch, transformers and the model code, which
    an eval actor started for those jobs would import again (3-4 s of a core each on a laptop)."""

    def __init__(self, queue: str):
        self.queue = queue
        self._handle = None

    def state(self) -> dict[str, Any] | None:
        """TrialQueue.relay_state, or None where the queue is not (or no longer) there."""
        import ray

        try:
            if self._handle is None:
                self._handle = ray.get_actor(self.queue)
            return ray.get(self._handle.relay_state.remote())
        except (ValueError, ray.exceptions.RayActorError):  # not started yet, or the pool has ended
            return None

    def changed(self, version: int, timeout_s: float):
        """A ref that is ready once the queue's state has moved on from `version` (TrialQueue.changed)."""
        return self._handle.changed.remote(version, timeout_s)

    def evaluate(self, job: EvalJob, threads: int):
        """A ref to the job's result (None if no worker was free after all)."""
        import ray

        return self._handle.evaluate.remote(ray.cloudpickle.dumps((job, threads)))

    def release(self) -> None:
        self._handle.release.remote()


def serve_drained(queue: str) -> bool:
    """On a Train worker whose group has no trial left (train/loop.py): run the jobs the pool's queue relays
    to it until let go; a pool that has ended lets it go too. Whether it ran only rayb's own models (none
    named by import path, whose module may patch what this process has imported)."""
    import ray

    from rayb.registry import is_import_path
    from rayb.tune.group import WAIT

    handle, worker = ray.get_actor(queue), ray.get_runtime_context().get_actor_id()
    own_models_only = True
    try:
        while (given := ray.get(handle.job_for.remote(worker))) is not None:
            if given == WAIT:  # asked again at once: the queue's answer waits for a job
                continue
            job, threads = ray.cloudpickle.loads(given)
            own_models_only &= not is_import_path(job.trial.arch)
            ray.get(handle.done.remote(worker, _summary(run_job(job, threads))))
    except ray.exceptions.RayActorError:
        return False
    return own_models_only


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """What the pool takes back from a job (the rest is in its result file)."""
    return {k: result[k] for k in ("status", "wall_s")} | {"error": result.get("error", "")}


def evaluate(
    jobs: list[EvalJob], num_actors: int, use_gpu: bool = False, threads: int = 1,
    log: Callable[[str], None] = print,
) -> dict[tuple[str, str], str]:  # fmt: skip
    """Run the jobs on eval actors, up to `num_actors` of each GPU share; return {(trial key, suite): error}
    for the failures."""
    return EvalPool(num_actors, use_gpu, threads, log).serve(lambda: (jobs, False))


class EvalPool:
    """Eval actors fed while training goes on: a trial's jobs start as soon as the feed hands them over,
    on actors beside the trials still training. `serve` returns once the feed is closed and every job
    it gave has finished.

    By default an actor lives only while jobs wait for it: an idle one would hold CPUs or GPUs that a
    trial still to start may be waiting for, and that trial's end is what closes the feed. CPUs that no
    worker group can use (`spare_cpus`, asked at each poll) hold actors that start before any job (their
    imports then overlap the trials' start-up) and wait for the next job instead of each job's actor
    starting anew.

    A CPU actor's start (its process and imports: seconds of a core) pays only for work that the live actors
    would take longer over: another actor is started for a queued job only where the jobs queued would
    keep the live actors busy longer than a start takes (both measured as jobs come back), or where many
    wait (`_worth_an_actor`). On a laptop after training, two short jobs then run one after the other on
    one actor, in about the same time as on two, and without importing torch and transformers twice. GPU
    actors start as before.

    While a CPU study's worker pool drains (`drained`), the jobs a Train worker may run go to the workers
    whose groups have no trial left (DrainedWorkers), and no actor starts for them.

    Where training's torch threads fill cores that Ray counts as free (`free_cores`, asked at each poll:
    one CPU node), CPU jobs, on actors and drained workers alike, run only on the cores those threads
    leave; a job that measures its process (speed) waits until no group trains. A job run beside a trial's
    threads slowed both 2-5x on 2 cores (bench/shared_cores.py), and would have timed a contended core."""

    POLL_S = 1.0  # how often the feed is asked for new jobs while others run, by default (see poll_for)
    ATTEMPTS = 3  # runs of one job in all, each after the last lost its actor, before it counts as failed
    LOOK_S = 5.0  # how often the pool asks whether worker groups wait for resources
    # Before any job has come back, how long the live CPU actors' jobs may run before another actor starts
    # (a start took 3-4 s on 2 idle cores, 5-8 s beside training), and a queue long enough for one anyway.
    START_ALLOWANCE_S = 10.0
    MANY_JOBS = 8

    def __init__(
        self, num_actors: int, use_gpu: bool, threads: int = 1, log: Callable[[str], None] = print,
        spare_cpus: Callable[[], float] = lambda: 0.0, poll_s: float = POLL_S,
        drained: Callable[[], DrainedWorkers | None] = lambda: None,
        free_cores: Callable[[], float | None] = lambda: None,
    ):  # fmt: skip
        self.num_actors, self.use_gpu, self.threads, self.log = num_actors, use_gpu, threads, log
        self.poll_s = poll_s
        self.spare_cpus = spare_cpus
        self.drained = drained  # the training pool's drained workers, while a pool trains
        self.free_cores = free_cores
        self._free: float | None = None  # what free_cores said at the last poll (None: no limit of its own)
        self.stopping = threading.Event()  # set from another thread to abandon the queued jobs
        self.submitted = 0
        self._queues: dict[float, list[EvalJob]] = {}  # per GPU share: jobs waiting for an actor
        self._live: dict[float, int] = {}  # per GPU share: actors alive
        self._idle: list = []  # CPU actors waiting for a job (GPU ones never wait)
        # result ref -> (actor, or None for a drained Train worker's job; GPU share, job, when handed over)
        self._running: dict = {}
        self._attempts: dict[str, int] = {}  # job's result file -> runs that lost their actor
        self._standing = 0  # CPU actors that may live without a job
        self._spare_before = False  # whether the last poll found spare CPUs
        self._looked, self._waiting = -math.inf, False  # when the pool last asked, and whether groups waited
        self._cold: set = set()  # CPU actors started for a job that has not come back yet: still starting
        self._start_s: float | None = None  # the last measured start of a CPU actor, to its first job
        self._job_s: dict[str, list[float]] = {}  # per suite: the CPU jobs' walls so far
        self._change = None  # while a pool trains: a ref ready once its queue's state moves (_wait)

    @classmethod
    def poll_for(cls, trials_at: Path | str) -> float:
        """How often to ask a feed that checks each training trial's TRAIN_DONE under `trials_at`. On local
        disk that is a stat per trial, and the last trial's evaluation, which ends the study, starts up to
        one ask after its training: 0.2 s. On object storage each check is a request, and a study of a
        hundred trials asked that often would send 500 a second: POLL_S."""
        return cls.POLL_S if storage.is_remote(trials_at) else 0.2

    def serve(self, feed: Feed) -> dict[tuple[str, str], str]:
        import ray

        errors, done, more = {}, 0, True
        try:
            while not self.stopping.is_set():
                # Asked before the feed: a trial the queue no longer holds has its TRAIN_DONE written.
                state = workers.state() if (workers := self.drained()) else None
                if more:
                    jobs, more = feed()
                    self.submitted += len(jobs)
                    for job in jobs:
                        self._queues.setdefault(gpus_for(job, self.use_gpu), []).append(job)
                    for queue in self._queues.values():  # held-out loss first: adaptive seeds wait on it
                        queue.sort(key=lambda job: job.suite != PRIMARY_SUITE)
                self._free = self.free_cores()
                spare = 0 if self._groups_wait() else int(self.spare_cpus() // self.threads)
                # Standing actors start a poll after spare CPUs first show, once the worker groups that
                # leave them spare have asked Ray for their processes. Asked for first, an actor took one
                # of the few idle processes Ray keeps (as many as cores) and imported while the group's
                # processes started: on 2 cores the group started about 0.5 s later.
                self._standing = max(0, min(spare if self._spare_before else 0, self.num_actors))
                self._spare_before = spare > 0
                kept = self._relay(workers, state, training=more)
                self._start_actors(more)
                if kept:
                    self._queues[0.0][:0] = kept
                if not self._running and not more:
                    break
                for ref in self._wait(workers, state):
                    relayed = self._running[ref][0] is None
                    job, result = self._collect(ref)
                    if result is None:  # queued again, for a fresh actor
                        continue
                    done += 1
                    status = result["status"] if result["status"] == "ok" else f"ERROR {result['error']}"
                    where = " on a drained Train worker" if relayed else ""
                    self.log(
                        f"  eval {done}/{self.submitted}: {job.trial.key} × {job.suite} "
                        f"in {result['wall_s']:.1f}s{where}: {status}"
                    )
                    if result["status"] != "ok":
                        errors[(job.trial.key, job.suite)] = result["error"]
        finally:  # idle actors go; running jobs are left only when stopped early (results are on disk)
            for handle in [running[0] for running in self._running.values()] + self._idle:
                if handle is not None:  # a drained worker's job ends with its worker group
                    ray.kill(handle)
        return errors

    def _wait(self, workers: DrainedWorkers | None, state: dict[str, Any] | None) -> list:
        """The running jobs' refs that are ready, after waiting for one of them, or poll_s for the feed. While
        a CPU study's pool trains, what may bring jobs is its queue's state moving (a trial finished, a
        drained worker free): the wait is for that instead, or LOOK_S. Asked every poll_s, the queue and
        this process woke five times a second beside the training steps."""
        import ray

        if state is None:  # no pool trains (a GPU study, between rounds, after training): the feed is asked
            self._change = None
        elif self._change is None:
            self._change = workers.changed(state["version"], self.LOOK_S)
        refs = list(self._running) + ([self._change] if self._change is not None else [])
        if not refs:
            time.sleep(self.poll_s)
            return []
        timeout_s = self.LOOK_S if self._change is not None else self.poll_s
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if self._change is not None and self._change in ready:
            self._change = None
        return [ref for ref in ready if ref in self._running]

    def _collect(self, ref) -> tuple[EvalJob, dict[str, Any] | None]:
        """A finished job and its result, its actor given the next job. A job whose actor died under it, or
        whose error left the actor's CUDA context broken, is queued again for a fresh actor (result None)
        until its last attempt; that attempt's error is its result."""
        import ray

        handle, gpus, job, began = self._running.pop(ref)
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as exc:
            # Its actor or drained worker is gone (killed, out of memory, its node lost), or the call failed
            # outside the benchmark.
            where = "eval actor" if handle is not None else "drained Train worker"
            error = f"the {where} was lost: {type(exc).__name__}: {exc}"
            result = write_result(job, {"status": "error", "error": error}, time.perf_counter() - began)
            lost = True
            self._cold.discard(handle)
        else:
            if result is None:  # no drained worker was free after all: queued again, no attempt spent
                self._queues[gpus].insert(0, job)
                return job, None
            lost = result["status"] != "ok" and sticky_cuda_error(result["error"])
            if gpus == 0.0:
                self._job_s.setdefault(job.suite, []).append(result["wall_s"])
                if handle in self._cold:  # its first job: what is left of the wait is the actor's start
                    self._cold.discard(handle)
                    self._start_s = max(0.0, time.perf_counter() - began - result["wall_s"])
        if not lost:
            if handle is not None:
                self._next_job(handle, gpus)
            return job, result
        if handle is not None:
            self._stop(handle, gpus)  # a dead actor, or one no later job could use
        self._attempts[job.out] = attempts = self._attempts.get(job.out, 0) + 1
        if attempts >= self.ATTEMPTS:
            return job, result
        self.log(
            f"  eval {job.trial.key} × {job.suite}: attempt {attempts} of {self.ATTEMPTS} failed "
            f"({result['error'][:200]}); running it again on a fresh actor"
        )
        self._queues[gpus].insert(0, job)
        return job, None

    def _groups_wait(self, max_age_s: float = LOOK_S) -> bool:
        """Whether a worker group on the cluster waits for resources (a placement group pending): then no
        actor stands by idle. The spare CPUs are counted for this study alone; another study on the same
        cluster, or a group that lost a node, may need them, and an idle actor would hold them forever.
        Asked again where the last answer is older than `max_age_s`."""
        import ray

        if time.monotonic() - self._looked >= max_age_s:
            self._looked = time.monotonic()
            table = ray.util.placement_group_table().values()
            self._waiting = any(group["state"] == "PENDING" for group in table)
        return self._waiting

    def _relay(
        self, workers: DrainedWorkers | None, state: dict[str, Any] | None, training: bool = True
    ) -> list[EvalJob]:
        """Hand the queued CPU jobs a drained Train worker may run to the free ones. Once the pool has drained
        (no trial waits for a group) and while groups still run, take the rest out of the queue for the
        workers about to be free rather than start actors for them; returned, to go back once actors have
        had their turn. The workers are let go once every trial has finished training and no such job is
        left, or as soon as a worker group waits for resources (maybe theirs). While the queue does not
        answer (not started yet, or its call failed) and training may go on, they wait for its next answer;
        once training is over (`training` false: the feed's last answer) actors take them."""
        queue = self._queues.get(0.0, [])
        theirs = [job for job in queue if relayable(job.suite)]
        others = [job for job in queue if not relayable(job.suite)]
        if state is None:
            if workers is None or not training:
                return []
            queue[:] = others
            return theirs
        if state["released"] or not state["drained"]:
            return []
        # A group seen waiting is asked about afresh: an answer from before the pool drained may have seen its
        # own groups' placement groups pending as they started, and on 2 cores a tiny study's groups drain
        # within LOOK_S of their start. Letting the workers go for that left their jobs to actors, which
        # waited for the groups to end and then imported torch and transformers anew: 10 s of a study's
        # evaluation, not 4. (Only then: with 200 placement groups in the GCS's table, each ask takes 11 ms.)
        if state["finished"] and not theirs:
            workers.release()
            return []
        if self._groups_wait() and self._groups_wait(max_age_s=0.0):
            self.log(f"  eval: a worker group waits for resources: the drained Train workers go; {len(queue)} "
                     "queued jobs wait for eval actors")  # fmt: skip
            workers.release()
            return []
        if not state["groups"]:  # no drained worker can come any more: actors take them
            return []
        given = max(0, int(min(state["free"], self._cpu_jobs_left())))
        for job in theirs[:given]:
            self._running[workers.evaluate(job, self.threads)] = (None, 0.0, job, time.perf_counter())
        queue[:] = others
        return theirs[given:]

    def _start_actors(self, more: bool) -> None:
        """Give each queued job an idle actor, or start one (a CPU one where it pays: `_worth_an_actor`), up
        to `num_actors` per GPU share; then stop the idle actors beyond those standing by, and while jobs may
        still come, start the rest of them."""
        for gpus, queue in self._queues.items():
            idle = self._idle if gpus == 0.0 else []
            while self._next_index(gpus) is not None and (idle or self._live.get(gpus, 0) < self.num_actors):
                if idle:
                    self._next_job(idle.pop(), gpus)
                elif gpus == 0.0 and not self._worth_an_actor(queue):
                    break
                else:
                    handle = self._actor(gpus)
                    if gpus == 0.0:
                        self._cold.add(handle)
                    self._next_job(handle, gpus)
        while self._idle and self._live.get(0.0, 0) > self._standing:
            self._stop(self._idle.pop(), 0.0)
        while more and self._live.get(0.0, 0) < self._standing:
            self._idle.append(self._actor(0.0))

    def _worth_an_actor(self, queue: list[EvalJob]) -> bool:
        """Whether the queued CPU jobs get another actor: the first always; another where the queue is long
        (MANY_JOBS), or where its work, shared by the live actors, outlasts an actor's start (both as measured
        so far; each suite's jobs by their own walls). Before any job has come back, where every live actor's
        job has run START_ALLOWANCE_S."""
        live = self._live.get(0.0, 0)
        if not live or len(queue) >= self.MANY_JOBS:
            return True
        if self._start_s is None:
            now = time.perf_counter()
            return all(now - began >= self.START_ALLOWANCE_S for _, gpus, _, began in self._running.values()
                       if gpus == 0.0)  # fmt: skip
        walls = [wall for walls in self._job_s.values() for wall in walls]
        queued_s = sum(statistics.fmean(self._job_s.get(job.suite, walls)) for job in queue)
        return queued_s / live > self._start_s

    def _cpu_jobs_left(self) -> float:
        """How many more CPU jobs may run now on the cores training leaves free (`free_cores`)."""
        if self._free is None:
            return math.inf
        running = sum(gpus == 0.0 for _, gpus, _, _ in self._running.values())
        return self._free // self.threads - running

    def _next_index(self, gpus: float) -> int | None:
        """Where in its GPU share's queue the next job that may start now is (None: none may)."""
        queue = self._queues.get(gpus, [])
        if gpus != 0.0 or self._free is None:
            return 0 if queue else None
        if self._cpu_jobs_left() < 1:
            return None
        # With training on: not a job that times its process (exclusive_device); it waits for the cores.
        return next(
            (i for i, job in enumerate(queue) if not parse_suite(job.suite)[0].exclusive_device), None
        )

    def _next_job(self, handle, gpus: float) -> None:
        """Give an actor the next job of its GPU share; with none, let it wait if spare CPUs hold it, else
        stop it."""
        if (index := self._next_index(gpus)) is not None:
            job = self._queues[gpus].pop(index)
            self._running[handle.run.remote(job)] = (handle, gpus, job, time.perf_counter())
        elif gpus == 0.0 and self._live.get(0.0, 0) <= self._standing:
            self._idle.append(handle)
        else:
            self._stop(handle, gpus)

    def _actor(self, gpus: float):
        import ray

        self._live[gpus] = self._live.get(gpus, 0) + 1
        return ray.remote(_EvalActor).options(num_cpus=self.threads, num_gpus=gpus).remote(self.threads, gpus)

    def _stop(self, handle, gpus: float) -> None:
        import ray

        ray.kill(handle)
        self._live[gpus] -= 1


class _EvalActor:
    def __init__(self, threads: int, gpus: float = 0.0):
        self.threads = threads
        cap_gpu_memory(gpus)  # actors sharing a GPU cannot run each other out of memory
        # What every job imports, imported as the actor starts: an actor on a spare CPU (EvalPool) does it
        # while the trials are still starting.
        with imports_frozen():
            import transformers.modeling_utils  # noqa: F401  (the baselines' model classes build on it)

            import rayb.data.tokenizer  # noqa: F401
            import rayb.eval.lm  # noqa: F401
            import rayb.models.checkpoint  # noqa: F401
            import rayb.models.pretrained  # noqa: F401

    def run(self, job: EvalJob) -> dict[str, Any]:
        return _summary(run_job(job, self.threads))
