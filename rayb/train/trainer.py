"""Ray Train: one TorchTrainer per trial, named after the trial so a relaunch resumes it."""

from __future__ import annotations

from collections.abc import Sequence

from rayb.train.loop import train_loop_per_worker
from rayb.train.trial import TrialSpec

MAX_WORKER_FAILURES = 2  # a killed worker restarts the group from the last checkpoint


def fit_trial(trial: TrialSpec, callbacks: Sequence = ()) -> None:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t = trial.train
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"trial": trial.to_dict()},
        torch_config=TorchConfig(backend="nccl" if t["use_gpu"] else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=t["num_workers"], use_gpu=t["use_gpu"], resources_per_worker={"CPU": 1}
        ),
        run_config=RunConfig(
            name=trial.run_name,
            storage_path=trial.storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=MAX_WORKER_FAILURES),
            callbacks=list(callbacks),
        ),
    )
    trainer.fit()
