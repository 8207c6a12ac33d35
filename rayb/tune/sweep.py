"""Ray Tune: every pack of trials (trials that share a worker group, see packs.py) is one Tune trial.

Each Tune trial runs its own TorchTrainer (Train V2 style: the trainable calls `.fit()`), which trains
the pack's trials one after another. Results are not taken from Tune: every trial writes its own files
(see `rayb.train.trial`), so a crashed sweep loses nothing and a rerun trains only unfinished trials.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from rayb import storage
from rayb.files import digest
from rayb.train.trainer import fit_pack
from rayb.train.trial import TRIAL_ERROR, TrialPack

# A trial's Tune actor only waits on its TorchTrainer: it holds no CPU, so a trial takes exactly its
# workers' resources and the slots computed from them (packs.trial_slots) are all usable. Tune refuses
# an actor that asks for nothing at all; what it does use is memory, about this much (a Python process
# with Ray, torch and rayb imported).
DRIVER_RESOURCES = {"CPU": 0, "memory": 512 * 2**20}


# A pack whose Tune actor is lost with its node is started again: its Train run resumes from its last
# checkpoint on storage, and the pack's finished trials are skipped.
PACK_RESTARTS = 3


def _trainable(config: dict) -> None:
    """Train a pack. No metrics are reported to Tune (each trial writes its own, and Tune's handling of
    every report cost seconds per pack), except a failed run's error: a failure Ray Train has already
    retried is final, so it ends the Tune trial normally instead of raising, which Tune would retry."""
    from ray import tune
    from ray.train import TrainingFailedError

    try:
        fit_pack(TrialPack.from_dict(config["pack"]))
    except TrainingFailedError as exc:
        tune.report({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})


def run_packs(packs: list[TrialPack], storage_path: Path | str, max_concurrent: int) -> dict[str, str]:
    """Train the packs' unfinished trials; return {trial key: error message} for those that failed, whose
    full traceback each failed trial's directory keeps (TRIAL_ERROR, for `rayb status` and the live view)."""
    import os

    from ray import tune
    from ray.tune.progress_reporter import TrialProgressCallback

    class NoProgress(TrialProgressCallback):
        """rayb reports each trial itself; Tune's progress lines say nothing about rayb's trials."""

        def _print(self, msg: str) -> None:
            pass

    # Tune's newer output prints an experiment block per sweep whatever its verbosity; the legacy one
    # prints only through its progress callback, which NoProgress silences.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

    tuner = tune.Tuner(
        tune.with_resources(_trainable, DRIVER_RESOURCES),
        param_space={"pack": tune.grid_search([p.to_dict() for p in packs])},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
        run_config=tune.RunConfig(
            # Named by the set of packs: a rerun with other pending trials never collides.
            name=f"sweep-{digest(sorted(t.key for p in packs for t in p.trials))}",
            storage_path=str(storage_path),
            verbose=0,
            callbacks=[NoProgress()],
            failure_config=tune.FailureConfig(max_failures=PACK_RESTARTS),
        ),
    )
    for trial in (t for p in packs for t in p.pending):  # an earlier run's failure no longer stands
        storage.remove(storage.join(trial.trial_dir, TRIAL_ERROR))
    errors = {}
    for result in tuner.fit():
        error, trace = (result.metrics or {}).get("error"), (result.metrics or {}).get("traceback")
        if result.error is not None:
            error = f"{type(result.error).__name__}: {result.error}"
            trace = "".join(traceback.format_exception(result.error))
        if error:  # the pack stopped: its unfinished trials failed with it
            for trial in TrialPack.from_dict(result.config["pack"]).pending:
                where = storage.join(trial.trial_dir, TRIAL_ERROR)
                storage.write_bytes(where, (trace or error).encode())
                errors[trial.key] = f"{error.splitlines()[0]} (traceback: {where})"
    return errors
