"""Ray Tune: every (model × learning rate × seed) trial of a study is one Tune trial.

Each Tune trial runs its own TorchTrainer (Train V2 style: the trainable calls `.fit()`). Results are
not taken from Tune: every trial writes its own files (see `rayb.train.trial`), so a crashed sweep
loses nothing and a rerun launches only the trials that have not finished.
"""

from __future__ import annotations

from pathlib import Path

from rayb.files import digest
from rayb.train.trainer import fit_trial
from rayb.train.trial import TrialSpec


def _trainable(config: dict) -> None:
    from ray.tune.integration.ray_train import TuneReportCallback

    fit_trial(TrialSpec.from_dict(config["trial"]), callbacks=[TuneReportCallback()])


def run_trials(trials: list[TrialSpec], storage_path: Path, max_concurrent: int) -> dict[str, str]:
    """Run the trials; return {trial key: error message} for those that failed."""
    from ray import tune

    tuner = tune.Tuner(
        _trainable,
        param_space={"trial": tune.grid_search([t.to_dict() for t in trials])},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
        run_config=tune.RunConfig(
            # Named by the set of pending trials: a rerun with other pending trials never collides.
            name=f"sweep-{digest(sorted(t.key for t in trials))}",
            storage_path=str(storage_path),
            verbose=0,
        ),
    )
    errors = {}
    for result in tuner.fit():
        if result.error is not None:
            errors[result.config["trial"]["key"]] = f"{type(result.error).__name__}: {result.error}"
    return errors
