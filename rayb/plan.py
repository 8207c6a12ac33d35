"""What a study would run, before it runs: trials, GPUs, training FLOPs and GPU-hours at a stated MFU.

Pure arithmetic over the validated study and each model's analytic cost (models/accounting.py), so
`rayb plan` answers on a laptop, for a cluster-sized study, in a second. Training only: evaluation is
a forward pass over far fewer tokens and is left out of the estimate (the plan says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from rayb.study import Study
from rayb.tune.packs import Capacity, group_of, split_groups, trial_slots

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
    def gpus_per_trial(self) -> float:
        train = self.study.train
        return train.num_workers * train.gpus_per_worker

    @property
    def flops(self) -> float:
        return sum(m.flops for m in self.models)

    def gpu_hours(self, flops: float) -> float:
        return flops / (self.peak_flops * self.mfu) / 3600

    def packing(self, gpus: int) -> Packing:
        """How the trials run on a cluster of `gpus` GPUs: packed into worker groups as `rayb run` packs
        them (a user's model in groups of its own; split only to fill idle slots), and how many groups
        train at once."""
        slots = trial_slots(self.study.train.model_copy(update={"use_gpu": True}), Capacity.of_gpus(gpus))
        groups: dict[str, list[str]] = {}
        for m in self.models:
            if m.steps:
                groups.setdefault(group_of(m.label, m.arch, self.study.train), []).extend(
                    [m.label] * m.trials
                )
        return Packing(gpus, slots, split_groups(list(groups.values()), slots))

    def wall_hours(self, gpus: int) -> float:
        """Wall-clock on `gpus` GPUs: the worker groups, longest first, each on the next free slot (a
        group's trials run one after another, each on num_workers GPUs)."""
        packing = self.packing(gpus)
        per_trial = {m.label: self.gpu_hours(m.flops_per_trial) / max(1, self.study.train.num_workers)
                     for m in self.models if m.steps}  # fmt: skip
        durations = sorted(
            (sum(per_trial[label] for label in group) for group in packing.groups), reverse=True
        )
        slots = [0.0] * min(packing.slots, max(1, len(durations)))
        for duration in durations:
            slots[slots.index(min(slots))] += duration
        return max(slots, default=0.0)


@dataclass(frozen=True)
class Packing:
    gpus: int
    slots: int  # worker groups training at once
    groups: list[list[str]]  # each worker group's trials, as model labels, in the order they train

    def describe(self) -> str:
        """'(gpt2 ×2, llama ×1) (llama ×1, mamba ×2)': each group's trials, model by model."""
        return " ".join(
            "(" + ", ".join(f"{label} ×{len(list(run))}" for label, run in groupby(group)) + ")"
            for group in self.groups
        )


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
