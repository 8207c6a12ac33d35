"""Ray Tune: every worker group of the study's pool (see packs.py) is one Tune trial.

Each Tune trial runs its own Ray Train trainer (train/trainer.py; Train V2 style: the trainable,
group.worker_group, calls `.fit()`), whose workers take the study's trials from a queue shared by every
group of their shape (group.TrialQueue) and train them one after another until it is empty. Results are not taken from
Tune: every trial writes its own files (see `rayb.train.trial`), so a crashed sweep loses nothing and a
rerun trains only unfinished trials.
"""

from __future__ import annotations

import time
import traceback
import uuid
from pathlib import Path

import ray
from ray import tune

from rayb import runtime, storage
from rayb.files import digest
from rayb.report.status import write_cluster
from rayb.train.spec import TrainSpec
from rayb.train.trial import TRIAL_ERROR, TrialPack, TrialSpec
from rayb.tune.group import TrialQueue, worker_group
from rayb.tune.packs import one_node, unfittable

# A trial's Tune actor only waits on its trainer: it holds no CPU, so a trial takes exactly its
# workers' resources and the slots computed from them (packs.trial_slots) are all usable. Tune refuses
# an actor that asks for nothing at all; what it does use is memory, about this much (a Python process
# with Ray, torch and rayb imported).
DRIVER_RESOURCES = {"CPU": 0, "memory": 512 * 2**20}


# A worker group whose Tune actor is lost with its node is started again: it takes the trial it held
# again and resumes it from its last checkpoint on storage.
PACK_RESTARTS = 3


class ClusterWatch(tune.Stopper):
    """Watches the cluster while trials wait and train (Tune asks it on every step of its loop; it looks
    every WATCH_S): what the autoscaler is starting goes to the study's `cluster.json` for the live view and
    `rayb status`, and a cluster that can no longer ever fit a trial (a fixed cluster that lost its nodes)
    stops the sweep, naming why, where the trials would otherwise wait forever."""

    WATCH_S = 1.0  # a node may boot within a few seconds: each look is a GCS read or two

    def __init__(self, train: TrainSpec, study_dir: str | None):
        self.train, self.study_dir = train, study_dir
        self.why: str | None = None
        self._said: str | None = None
        self._looked = 0.0

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        if self.why is None and time.monotonic() - self._looked >= self.WATCH_S:
            self._looked = time.monotonic()
            self.why = unfittable(self.train, runtime.capacity())
            self._say(f"stopped: {self.why}" if self.why else runtime.scaling_activity())
        return self.why is not None

    def _say(self, what: str | None) -> None:
        if self.study_dir is not None and what != self._said:
            write_cluster(self.study_dir, what)
            self._said = what


def run_pool(
    groups: list[TrialPack], storage_path: Path | str, max_concurrent: int, study_dir: str | None = None
) -> dict[str, str]:
    """Train the groups' trials, `max_concurrent` groups at once; return {trial key: error message} for those that failed
    or were left untrained, whose full traceback each one's directory keeps (TRIAL_ERROR, for `rayb status`
    and the live view). What the cluster is doing while trials wait goes to `study_dir` (see ClusterWatch)."""
    import os

    # Tune's newer output prints an experiment block per sweep whatever its verbosity; the legacy one, at
    # verbosity 0, prints only a trial that ends having reported nothing (worker_group always reports).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # rayb takes no results from Tune's files: each trial writes its own.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")

    shapes = {g.queue: g.trials for g in groups}
    trials = [t for queue in shapes.values() for t in queue]
    for trial in trials:  # an earlier run's failure no longer stands
        storage.remove(storage.join(trial.trial_dir, TRIAL_ERROR))
    name = f"rayb-trials-{uuid.uuid4().hex[:12]}"
    queue = (
        ray.remote(TrialQueue)
        .options(name=name, num_cpus=0, scheduling_strategy=_this_node())
        .remote({shape: [t.key for t in queue if not t.done] for shape, queue in shapes.items()})
    )
    train = groups[0].train
    watch = ClusterWatch(train, study_dir)
    tuner = tune.Tuner(
        tune.with_resources(worker_group, DRIVER_RESOURCES),
        param_space={
            "pack": tune.grid_search([g.to_dict() for g in groups]),
            "queue": name,
            "one_node": one_node(train, runtime.capacity()),
        },
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
        run_config=tune.RunConfig(
            # Named by the set of trials: a rerun with other pending trials never collides.
            name=f"sweep-{digest(sorted(t.key for t in trials))}",
            storage_path=str(storage_path),
            verbose=0,
            stop=watch,
            failure_config=tune.FailureConfig(max_failures=PACK_RESTARTS),
        ),
    )
    errors: dict[str, str] = {}
    try:
        for result in tuner.fit():
            errors |= _group_errors(result, queue, {t.key: t for t in trials})
    finally:
        ray.kill(queue)
    why = f"the sweep stopped: {watch.why}" if watch.why else "not trained: its worker pool ended without it"
    return errors | _record([t for t in trials if t.key not in errors and not t.done], why)


def _group_errors(result, queue, trials: dict[str, TrialSpec]) -> dict[str, str]:
    """The trials a failed group left untrained, with why: the one it held, its error, and its shape's
    waiting ones, which it took down with it."""
    metrics = result.metrics or {}
    error, trace = metrics.get("error"), metrics.get("traceback")
    held, waiting = metrics.get("held"), metrics.get("waiting", [])
    if result.error is not None:  # its Tune actor was lost more often than PACK_RESTARTS
        error = f"{type(result.error).__name__}: {result.error}"
        trace = "".join(traceback.format_exception(result.error))
        pack = TrialPack.from_dict(result.config["pack"])
        held, waiting = ray.get(queue.fail.remote(pack.queue, pack.run_name))
    if not error:
        return {}

    def untrained(keys: list[str]) -> list[TrialSpec]:
        return [trials[k] for k in keys if not trials[k].done]

    after = f"not trained: {held or 'a trial'} of its worker group failed first: {error}"
    return _record(untrained([held] if held else []), error, trace) | _record(
        untrained(waiting), after, trace
    )


def _this_node():
    """Pinned to the driver's node, which outlives the nodes a cluster may lose."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def _record(trials: list[TrialSpec], error: str, trace: str | None = None) -> dict[str, str]:
    """Write each trial's failure where `rayb status` and the live view find it; {trial key: message}."""
    errors = {}
    for trial in trials:
        where = storage.join(trial.trial_dir, TRIAL_ERROR)
        storage.write_bytes(where, (trace or error).encode())
        errors[trial.key] = f"{error.splitlines()[0]} (traceback: {where})"
    return errors
