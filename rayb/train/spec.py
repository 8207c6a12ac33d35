"""The `train:` part of a study: optimizer, schedule, batch shape, precision, workers and checkpoints.

A `TrainSpec` crosses the Ray boundary as itself (inside `TrialSpec`), so the training loop reads typed
fields, and the precision rule below is the only place that decides how a trial computes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from rayb.spec import Spec, added_field

Precision = Literal["fp32", "bf16", "bf16-deepspeed"]
# Where and how many trials run at once: these never change a trial's result, so no trial key holds them.
SCHEDULING_FIELDS = ("max_concurrent_trials", "gpus_per_trial")


class TrainSpec(Spec):
    optimizer: Literal["adamw", "adopt", "adopt_atan2"] = Field(
        default="adamw",
        description="adamw; adopt (Taniguchi et al. 2024); adopt_atan2 (ADOPT with Adam-atan2's update, no ε)",
    )
    lr: Annotated[list[float], Field(min_length=1)] = Field(
        default=[3e-3], description="one value, or a sweep"
    )
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(default=0.1, ge=0)
    warmup_steps: int = Field(default=10, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    grad_clip: float = Field(default=1.0, gt=0)
    epochs: int = Field(
        default=1,
        ge=1,
        description="passes over data.token_budget; each later epoch reorders the batches (the same order "
        "for every model), and validation loss is measured on all held-out rows at each epoch's end",
    )
    micro_batch: int = Field(default=8, ge=1, description="sequences per worker per forward pass")
    global_batch: int = Field(default=32, ge=1, description="sequences per optimizer step, all workers")
    precision: Literal["auto", "fp32", "bf16", "bf16-deepspeed"] = Field(
        default="auto",
        description="auto: bf16 on GPU, fp32 on CPU. bf16: forward and backward under torch.autocast(bfloat16), "
        "parameters and optimizer state in fp32 (as nanoGPT and the Mamba and fla recipes train). "
        "bf16-deepspeed: DeepSpeed's bf16 mode, bf16 parameters with an fp32 master copy; less memory, but "
        "SSM parameters (A_log, D, dt_bias) lose accuracy in the forward pass, so only by explicit choice",
    )
    zero_stage: int = Field(default=1, ge=0, le=2, description="DeepSpeed ZeRO stage (0, 1 or 2)")
    num_workers: int = Field(default=1, ge=1)
    use_gpu: bool = False
    allow_slow_kernels: bool = added_field(
        False,
        description="on GPU, train even where an architecture would fall back from its fused kernels "
        "(mamba-ssm, causal-conv1d, fla) to a slow PyTorch path; by default such a study stops before "
        "training and says what to install",
    )
    compile: bool = added_field(
        False,
        description="torch.compile the model (DeepSpeed's engine.compile, in place: parameter names and "
        "checkpoints unchanged); faster steps on GPU after a compile at each trial's start",
    )
    eval_every: int = Field(default=50, ge=1, description="steps between validation loss and checkpoint")
    eval_batches: int = Field(default=8, ge=1, description="validation micro-batches per interim evaluation")
    max_concurrent_trials: int | None = Field(
        default=None,
        ge=1,
        description="worker groups (packs of trials) training at once; default: as many as the cluster's "
        "GPUs (or cores) hold, so a cluster that scales up from zero needs this set to use its new nodes",
    )
    gpus_per_trial: float | None = added_field(
        None,
        gt=0,
        description="GPUs one trial holds (GPU only): default one per worker; a fraction such as 0.25 lets "
        "several small one-worker trials share a GPU through Ray's fractional resources",
    )
    flops_budget: float | None = Field(
        default=None,
        gt=0,
        description="matched compute: training FLOPs per trial; each model's token budget is this over its "
        "own training FLOPs per token (all within data.token_budget, same tokens in the same order)",
    )

    @field_validator("lr", mode="before")
    @classmethod
    def _lr_list(cls, value: Any) -> Any:
        return value if isinstance(value, list) else [value]

    @field_validator("lr")
    @classmethod
    def _lr_positive(cls, value: list[float]) -> list[float]:
        if any(not 0 < lr < 1 for lr in value):
            raise ValueError(f"learning rates must be in (0, 1), got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"learning rates must be distinct, got {value}")
        return value

    @model_validator(mode="after")
    def _batch_shape(self) -> TrainSpec:
        per_step = self.micro_batch * self.num_workers
        if self.global_batch % per_step:
            raise ValueError(
                f"global_batch ({self.global_batch}) must be a multiple of micro_batch × num_workers "
                f"({self.micro_batch} × {self.num_workers} = {per_step})"
            )
        return self

    @model_validator(mode="after")
    def _gpu_share(self) -> TrainSpec:
        share = self.gpus_per_trial
        if share is None:
            return self
        if not self.use_gpu:
            raise ValueError("gpus_per_trial applies to GPU training: set use_gpu: true, or remove it")
        if share < 1 and self.num_workers > 1:
            raise ValueError(
                f"gpus_per_trial {share} shares a GPU between trials, which needs num_workers: 1 (two ranks of "
                "one NCCL group cannot share a device)"
            )
        if share >= 1 and share != self.num_workers:
            raise ValueError(
                f"gpus_per_trial {share}: a trial holds one GPU per worker; set num_workers: {share:g} instead"
            )
        return self

    @property
    def gpus_per_worker(self) -> float:
        if not self.use_gpu:
            return 0.0
        return (self.gpus_per_trial or self.num_workers) / self.num_workers

    @property
    def device(self) -> str:
        return "cuda" if self.use_gpu else "cpu"

    @property
    def resolved_precision(self) -> Precision:
        """The precision rule, in one place: `auto` is bf16 autocast on GPU and fp32 on CPU."""
        if self.precision == "auto":
            return "bf16" if self.use_gpu else "fp32"
        return self.precision

    @property
    def accumulation(self) -> int:
        """Micro-steps per optimizer step on each worker."""
        return self.global_batch // (self.micro_batch * self.num_workers)
