"""What a study would run, before it runs: trials, GPUs, training FLOPs and GPU-hours at each model's MFU.

Pure arithmetic over the validated study, each model's analytic cost (models/accounting.py) and its MFU
(rayb/mfu.py: measured by bench/gpu_check.py, or a stated assumption; or one MFU the user gives), so
`rayb plan` answers on a laptop, for a cluster-sized study, in a second. Training only: evaluation is
a forward pass over far fewer tokens and is left out of the estimate (the plan says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from rayb.mfu import Measurement, Mfu, model_mfu
from rayb.study import Study
from rayb.train.spec import TrainSpec
from rayb.tune.packs import Capacity, group_of, groups_per_queue, makespan, trial_slots

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
    mfu: Mfu | None  # None for a pretrained reference (not trained)

    @property
    def flops(self) -> float:
        return self.trials * self.flops_per_trial


@dataclass(frozen=True)
class StudyPlan:
    study: Study
    models: list[ModelPlan]
    peak_flops: float

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

    def trial_gpu_hours(self, model: ModelPlan) -> float:
        """The GPU time one trial of `model` uses: its training FLOPs at its MFU of the peak (for trials
        sharing a GPU, its share of the GPU's time)."""
        return model.flops_per_trial / (self.peak_flops * model.mfu.value) / 3600 if model.steps else 0.0

    @property
    def gpu_hours(self) -> float:
        return sum(m.trials * self.trial_gpu_hours(m) for m in self.models)

    def packing(self, gpus: int) -> Packing:
        """How the trials run on a cluster of `gpus` GPUs, as `rayb run`'s worker pool runs them: a queue per
        group shape (a user's model has its own), costliest trials first, each served by its groups, and
        how many groups train at once."""
        slots = trial_slots(on_gpus(self.study.train), Capacity.of_gpus(gpus))
        queues: dict[str, list[ModelPlan]] = {}
        for m in self.models:
            if m.steps:
                queues.setdefault(group_of(m.label, m.arch, self.study.train), []).extend([m] * m.trials)
        ordered = [sorted(q, key=lambda m: -m.flops_per_trial) for q in queues.values()]
        return Packing(gpus, slots, ordered, groups_per_queue([len(q) for q in ordered], slots))

    def wall_hours(self, gpus: int) -> float:
        """Wall-clock on `gpus` GPUs: the pool's groups taking their queues' trials as they free up, each
        trial holding its GPUs or share of one (tune/packs.makespan)."""
        packing = self.packing(gpus)
        share = gpu_share(self.study.train)
        durations = [[self.trial_gpu_hours(m) / share for m in queue] for queue in packing.queues]
        return makespan(durations, packing.groups, packing.slots)


@dataclass(frozen=True)
class Packing:
    gpus: int
    slots: int  # worker groups training at once
    queues: list[list[ModelPlan]]  # each queue's trials, in the order its groups take them
    groups: list[int]  # the worker groups serving each queue

    def describe(self) -> str:
        """'(gpt2 ×10, mamba ×10) by 4 groups; (mine ×10) by 1 group': each queue's trials, model by model,
        and its groups."""
        return "; ".join(
            "("
            + ", ".join(f"{label} ×{len(list(run))}" for label, run in groupby(m.label for m in queue))
            + f") by {count} group{'s' if count != 1 else ''}"
            for queue, count in zip(self.queues, self.groups, strict=True)
        )


def on_gpus(train: TrainSpec) -> TrainSpec:
    """The study's training as it would run on GPUs (a CPU study is planned for GPUs too)."""
    return train.model_copy(update={"use_gpu": True})


def gpu_share(train: TrainSpec) -> float:
    """GPUs one trial holds on GPUs: one per worker, or its fraction of one."""
    gpu = on_gpus(train)
    return gpu.num_workers * gpu.gpus_per_worker


def trials_per_gpu(train: TrainSpec) -> float:
    """Trials training on one GPU at once: several where a trial holds a fraction of one, else 1."""
    share = gpu_share(train)
    return round(1 / share, 6) if share < 1 else 1


def plan_study(
    study: Study, peak_flops: float, mfu: float | None = None, measured: Sequence[Measurement] = ()
) -> StudyPlan:
    """The study's plan, each model priced at `mfu` where given, else at its own (rayb/mfu.py) from the
    `measured` MFUs of the GPU priced."""
    if mfu is not None and not 0 < mfu <= 1:
        raise ValueError(f"MFU must be in (0, 1], got {mfu}")
    vocab = study.data.nominal_vocab
    if vocab is None:
        raise ValueError(
            f"tokenizer '{study.data.tokenizer}' is fetched at run time; set data.vocab_size to its size "
            "so the models can be sized and planned now"
        )
    tokens_per_step = study.train.global_batch * study.data.seq_len
    packed = trials_per_gpu(study.train)
    models = []
    for model in study.models:
        if model.pretrained:
            models.append(ModelPlan(model.label, model.architecture, {}, None, None, 1, 0, 0, 0.0, None))
            continue
        config, cost, steps = study.model_steps(model, vocab)
        tokens = steps * tokens_per_step
        flops = cost.train_flops_per_token
        priced = Mfu(mfu, "given (--mfu)") if mfu is not None else model_mfu(flops, packed, measured)
        models.append(
            ModelPlan(
                model.label, model.architecture, config, cost.total_params, cost.non_embedding_params,
                len(study.train.lr) * len(study.seeds), steps, tokens, tokens * flops, priced,
            )
        )  # fmt: skip
    return StudyPlan(study, models, peak_flops)
