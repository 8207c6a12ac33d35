"""What a study's eval pool is fed while its worker pool trains (runner.run_study): each trial's evaluation
jobs as soon as its training has finished, and which CPUs an eval actor may stand by on meanwhile."""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from typing import Any

from rayb import storage
from rayb.eval.actors import DrainedWorkers, EvalJob, EvalPool, relayable
from rayb.files import read_json
from rayb.study import Study
from rayb.train.trial import TRAIN_DONE, TrialPack, TrialSpec
from rayb.tune.packs import Capacity


class FinishedTrials:
    """An EvalPool's feed: each trial's evaluation jobs, handed over once, as soon as its training has
    finished (pretrained references and trials finished by an earlier run at once)."""

    def __init__(self, study: Study, trials: list[TrialSpec], capacity: Capacity):
        self.study, self.waiting, self.capacity = study, list(trials), capacity
        self.training_over = threading.Event()
        self.pool: list[TrialPack] = []  # the worker groups training now, run `slots` at a time
        self.slots = 0
        self.workers: DrainedWorkers | None = None  # theirs, in a CPU study
        # Whether the study's first worker pool is still to start (runner.run_study): its groups are about
        # to take the cores. (A study whose every trial to train another study is training starts none:
        # its jobs then wait until training is over.)
        self.pool_ahead = False

    def _one_cpu_node(self) -> bool:
        return not self.study.train.use_gpu and len(self.capacity.nodes) == 1

    def _groups_training(self) -> tuple[int, bool]:
        """How many of the pool's groups train now (each still has a trial, as many as run at once), and
        whether each of those trains its last."""
        waiting = {t.key for t in self.waiting}
        groups = Counter(group.queue for group in self.pool)  # each queue's groups
        queues = {group.queue: group.trials for group in self.pool}
        # A queue's groups go on while it has trials, but no more of them than it has unfinished trials.
        unfinished = {q: sum(t.key in waiting for t in queues[q]) for q in groups}
        busy = sum(min(count, unfinished[q]) for q, count in groups.items())
        last = len(self.pool) <= self.slots and all(unfinished[q] <= count for q, count in groups.items())
        return min(self.slots, busy), last

    def _cores_left(self, busy: int) -> float:
        """The node's cores that `busy` training groups' torch threads leave: a worker holds one Ray CPU but
        trains on as many threads as its share of the cores (worker_pool), so Ray counts cores as free that
        training uses."""
        in_use = busy * self.pool[0].threads * self.study.train.num_workers
        return max(0.0, self.capacity.nodes[0].get("CPU", 0.0) - in_use)

    def spare_cpus(self) -> float:
        """CPUs that no worker group of this round can use, now or later: the groups that still have a
        trial to train (as many as run at once) hold theirs, and their threads the cores they train on.
        Only for a CPU study on one node, where a count is exact: actors elsewhere could split a node's
        CPUs that a group needs together, or GPUs' shares."""
        if not self._one_cpu_node():
            return 0.0
        busy, last = self._groups_training()
        if not busy:  # between rounds and once training is over, no actor need wait
            return 0.0
        if last and all(relayable(suite) for suite in self.study.eval):
            return 0.0  # every group trains its last trial: each will evaluate once drained (DrainedWorkers)
        return self._cores_left(busy)  # never more than Ray counts free: each worker trains on >= 1 thread

    def free_cores(self) -> float | None:
        """Cores where evaluation jobs may run now without slowing a trial (or a contended core skewing
        speed's timings): those the training groups' threads leave on one CPU node; none while its first
        pool is still to start. None where Ray's count is the limit: a GPU study, one over several nodes, and
        whenever no worker pool trains or is to start (between rounds, after training).

        Before the first pool, the jobs of pretrained references and of trials an earlier run finished are
        there at once: an actor started for them took a core as the groups asked for theirs, and a group
        then waited for it to finish them, or it waited itself, and imported torch and transformers once
        the groups had ended, for jobs their drained workers could run."""
        if not self._one_cpu_node() or self.training_over.is_set():
            return None
        if self.pool_ahead:
            return 0.0
        if self.workers is None or not self.pool:
            return None
        busy, _ = self._groups_training()
        return self._cores_left(busy) if busy else None

    def __call__(self) -> tuple[list[EvalJob], bool]:
        from rayb.eval.actors import evaluation_jobs

        over = self.training_over.is_set()  # read first: a trial finishing during the scan is seen next time
        finished = [t for t in self.waiting if t.done]
        self.waiting = [t for t in self.waiting if t not in finished]
        ok = [t for t in finished if read_json(storage.join(t.trial_dir, TRAIN_DONE)).get("status") == "ok"]
        return evaluation_jobs(ok, self.study.eval, self.study.eval_options, self.study.base_dir), not over


@contextmanager
def evaluating_beside(pool: EvalPool, feed: FinishedTrials):
    """Serve the eval pool in a thread while the body trains. Yields a dict that holds, once the block
    ends, the pool's {(trial key, suite): error}, or the "failure" that stopped the pool itself."""
    evaluated: dict[str, Any] = {}

    def serve() -> None:
        try:
            evaluated["errors"] = pool.serve(feed)
        except Exception as exc:  # noqa: BLE001  (re-raised by the caller, after training has ended)
            evaluated["failure"] = exc

    thread = threading.Thread(target=serve, name="rayb-eval", daemon=True)
    thread.start()
    try:
        yield evaluated
    except BaseException:
        pool.stopping.set()  # the study is ending (an error, Ctrl-C): finished results are all on disk
        raise
    finally:
        feed.training_over.set()
        thread.join()
