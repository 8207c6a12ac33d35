"""What a study would run, before it runs: trials, GPUs, training FLOPs and GPU-hours at a stated MFU.

Pure arithmetic over the validated study and each model's analytic cost (models/accounting.py), so
`rayb plan` answers on a laptop, for a cluster-sized study, in a second. Training only: evaluation is
a forward pass over far fewer tokens and is left out of the estimate (the plan says so).
"""

from __future__ import annotations

from dataclasses import dataclass

from rayb.study import Study

# Dense bf16 peak throughput per GPU (FLOP/s), from the vendors' datasheets.
PEAK_FLOPS = {"a100": 312e12, "h100": 989e12, "h200": 989e12, "a10g": 125e12, "l4": 121e12}


@dataclass(frozen=True)
class ModelPlan:
    label: str
    arch: str
    config: dict
    params_total: int | None  # None for a pretrained reference (counted when it is loaded)
    params_non_embedding: int | None
    trials: int
    steps: int
    tokens_per_trial: int
    flops_per_trial: float

    @property
    def flops(self) -> float:
        return self.trials * self.flops_per_trial


@dataclass(frozen=True)
class StudyPlan:
    study: Study
    models: list[ModelPlan]
    peak_flops: float
    mfu: float

    @property
    def trials(self) -> int:
        return sum(m.trials for m in self.models if m.steps)

    @property
    def gpus_per_trial(self) -> int:
        return self.study.train.num_workers if self.study.train.use_gpu else 0

    @property
    def flops(self) -> float:
        return sum(m.flops for m in self.models)

    def gpu_hours(self, flops: float) -> float:
        return flops / (self.peak_flops * self.mfu) / 3600

    @property
    def wall_hours(self) -> float:
        """Wall-clock with as many trials in flight as train.max_concurrent_trials allows (default all),
        each on its num_workers GPUs: the sum over waves of the longest trial in each."""
        concurrent = self.study.train.max_concurrent_trials or self.trials
        durations = sorted(
            (self.gpu_hours(m.flops_per_trial) / max(1, self.study.train.num_workers)
             for m in self.models for _ in range(m.trials) if m.steps),
            reverse=True,
        )  # fmt: skip
        return sum(durations[i] for i in range(0, len(durations), concurrent))


def plan_study(study: Study, peak_flops: float, mfu: float) -> StudyPlan:
    if not 0 < mfu <= 1:
        raise ValueError(f"MFU must be in (0, 1], got {mfu}")
    vocab = study.data.nominal_vocab
    if vocab is None:
        raise ValueError(
            f"tokenizer '{study.data.tokenizer}' is fetched at run time; set data.vocab_size to its size "
            "so the models can be sized and planned now"
        )
    tokens_per_step = study.train.global_batch * study.data.seq_len
    models = []
    for model in study.models:
        if model.pretrained:
            models.append(ModelPlan(model.label, model.architecture, {}, None, None, 1, 0, 0, 0.0))
            continue
        config, cost, steps = study.model_steps(model, vocab)
        tokens = steps * tokens_per_step
        models.append(
            ModelPlan(
                model.label, model.architecture, config, cost.total_params, cost.non_embedding_params,
                len(study.train.lr) * len(study.seeds), steps, tokens, tokens * cost.train_flops_per_token,
            )
        )  # fmt: skip
    return StudyPlan(study, models, peak_flops, mfu)
