"""Ray Train: one TorchTrainer per trial, named after the trial so a relaunch resumes it; and the kernel
probe a GPU study runs on a GPU worker before it trains."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rayb.models.kernels import KernelPath
from rayb.train.loop import train_loop_per_worker
from rayb.train.trial import TrialSpec

MAX_WORKER_FAILURES = 2  # a killed worker restarts the group from the last checkpoint


def fit_trial(
    trial: TrialSpec, callbacks: Sequence = (), loop: Callable[[dict[str, Any]], None] = train_loop_per_worker
) -> None:
    """Train one trial. `loop` is the per-worker function (rayb's; a test may wrap it)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t = trial.train
    trainer = TorchTrainer(
        loop,
        train_loop_config={"trial": trial.to_dict()},
        torch_config=TorchConfig(backend="nccl" if t.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=t.num_workers, use_gpu=t.use_gpu, resources_per_worker={"CPU": 1}
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


def probe_kernels(archs: list[str]) -> dict[str, list[KernelPath]]:
    """Each architecture's kernel paths as a GPU worker would run them: probed in a Ray task on a GPU,
    since the packages that decide (mamba-ssm, causal-conv1d, fla) are the workers', not the driver's."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    def probe(names: list[str]) -> dict[str, list[KernelPath]]:
        from rayb.models.registry import get_arch

        return {name: get_arch(name).kernels("cuda") for name in names}

    return ray.get(probe.remote(archs))
