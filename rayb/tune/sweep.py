"""Ray Tune: every pack of trials (trials that share a worker group, see packs.py) is one Tune trial.

Each Tune trial runs its own TorchTrainer (Train V2 style: the trainable calls `.fit()`), which trains
the pack's trials one after another. Results are not taken from Tune: every trial writes its own files
(see `rayb.train.trial`), so a crashed sweep loses nothing and a rerun trains only unfinished trials.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from ray import tune

from rayb import runtime, storage
from rayb.files import digest
from rayb.report.status import write_cluster
from rayb.train.spec import TrainSpec
from rayb.train.trainer import fit_pack
from rayb.train.trial import TRIAL_ERROR, TrialPack, TrialSpec
from rayb.tune.packs import one_node, unfittable

# A trial's Tune actor only waits on its TorchTrainer: it holds no CPU, so a trial takes exactly its
# workers' resources and the slots computed from them (packs.trial_slots) are all usable. Tune refuses
# an actor that asks for nothing at all; what it does use is memory, about this much (a Python process
# with Ray, torch and rayb imported).
DRIVER_RESOURCES = {"CPU": 0, "memory": 512 * 2**20}


# A pack whose Tune actor is lost with its node is started again: its Train run resumes from its last
# checkpoint on storage, and the pack's finished trials are skipped.
PACK_RESTARTS = 3


class ClusterWatch(tune.Stopper):
    """Watches the cluster while trials wait and train (Tune asks it on every step of its loop; it looks
    every WATCH_S): what the autoscaler is starting goes to the study's `cluster.json` for the live view and
    `rayb status`, and a cluster that can no longer ever fit a trial (a fixed cluster that lost its nodes)
    stops the sweep, naming why, where the trials would otherwise wait forever."""

    WATCH_S = 5.0

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


def _trainable(config: dict) -> None:
    """Train a pack. No metrics are reported to Tune (each trial writes its own, and Tune's handling of
    every report cost seconds per pack), except a failed run's error: a failure Ray Train has already
    retried is final, so it ends the Tune trial normally instead of raising, which Tune would retry."""
    from ray import tune
    from ray.train import TrainingFailedError

    try:
        fit_pack(TrialPack.from_dict(config["pack"]), one_node=config["one_node"])
    except TrainingFailedError as exc:
        tune.report({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


def run_packs(
    packs: list[TrialPack], storage_path: Path | str, max_concurrent: int, study_dir: str | None = None
) -> dict[str, str]:
    """Train the packs' unfinished trials; return {trial key: error message} for those that failed, whose
    full traceback each failed trial's directory keeps (TRIAL_ERROR, for `rayb status` and the live view).
    What the cluster is doing while trials wait goes to `study_dir` (see ClusterWatch)."""
    import os

    from ray.tune.progress_reporter import TrialProgressCallback

    class NoProgress(TrialProgressCallback):
        """rayb reports each trial itself; Tune's progress lines say nothing about rayb's trials."""

        def _print(self, msg: str) -> None:
            pass

    # Tune's newer output prints an experiment block per sweep whatever its verbosity; the legacy one
    # prints only through its progress callback, which NoProgress silences.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

    train = packs[0].train
    watch = ClusterWatch(train, study_dir)
    tuner = tune.Tuner(
        tune.with_resources(_trainable, DRIVER_RESOURCES),
        param_space={
            "pack": tune.grid_search([p.to_dict() for p in packs]),
            "one_node": one_node(train, runtime.capacity()),
        },
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
        run_config=tune.RunConfig(
            # Named by the set of packs: a rerun with other pending trials never collides.
            name=f"sweep-{digest(sorted(t.key for p in packs for t in p.trials))}",
            storage_path=str(storage_path),
            verbose=0,
            stop=watch,
            callbacks=[NoProgress()],
            failure_config=tune.FailureConfig(max_failures=PACK_RESTARTS),
        ),
    )
    for trial in (t for p in packs for t in p.pending):  # an earlier run's failure no longer stands
        storage.remove(storage.join(trial.trial_dir, TRIAL_ERROR))
    errors: dict[str, str] = {}
    for result in tuner.fit():
        error, trace = (result.metrics or {}).get("error"), (result.metrics or {}).get("traceback")
        if result.error is not None:
            error = f"{type(result.error).__name__}: {result.error}"
            trace = "".join(traceback.format_exception(result.error))
        if error:  # the pack stopped: its unfinished trials failed with it
            errors |= _record(TrialPack.from_dict(result.config["pack"]).pending, error, trace)
    if watch.why is not None:  # trials the stopped sweep never finished, started or not
        errors |= _record(
            [t for p in packs for t in p.pending if t.key not in errors], f"the sweep stopped: {watch.why}"
        )
    return errors


def _record(trials: list[TrialSpec], error: str, trace: str | None = None) -> dict[str, str]:
    """Write each trial's failure where `rayb status` and the live view find it; {trial key: message}."""
    errors = {}
    for trial in trials:
        where = storage.join(trial.trial_dir, TRIAL_ERROR)
        storage.write_bytes(where, (trace or error).encode())
        errors[trial.key] = f"{error.splitlines()[0]} (traceback: {where})"
    return errors
