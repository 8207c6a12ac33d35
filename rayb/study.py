"""The study file: a validated, versioned value that says everything a comparison depends on.

A study is loaded and fully validated before any cluster work starts, so a typo costs a second, not a
cluster hour. Every derived output path is keyed by a hash of the fields that determine it
(`data_key`, `trial_key`), which is what makes reruns skip finished work and keeps studies apart.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

STUDY_FORMAT_VERSION = 1


class StudyError(ValueError):
    """An invalid study file; the message names each bad field and what is allowed."""


class _Strict(BaseModel):
    # Unknown keys are errors: a misspelt field silently ignored is a wrong experiment.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    uri: str = Field(
        description="embedded://<source>, a local parquet file/dir/glob, hf://..., s3://..., gs://..."
    )
    weight: float = Field(gt=0, le=1)
    text_column: str = "text"

    @field_validator("uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        from rayb.data.sources import check_uri

        check_uri(uri)
        return uri


class DataSpec(_Strict):
    sources: list[SourceSpec] = Field(min_length=1)
    tokenizer: str = Field(
        default="bpe:2048",
        description="'bpe:<vocab>' trains a byte-level BPE on the mix; otherwise a local tokenizer dir or hub id",
    )
    seq_len: int = Field(default=128, ge=8, le=1 << 20)
    token_budget: int = Field(gt=0, description="training tokens every model sees")
    val_share: float = Field(default=0.05, gt=0, lt=0.5, description="held-out tokens / training tokens")
    seed: int = 0

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_form(cls, value: str) -> str:
        if value.startswith("bpe:"):
            vocab = value[4:]
            if not vocab.isdigit() or not 260 <= int(vocab) <= 1 << 20:
                raise ValueError(
                    f"'{value}': use bpe:<vocab size>, a whole number from 260 up, e.g. bpe:2048"
                )
        return value

    @model_validator(mode="after")
    def _mix(self) -> DataSpec:
        total = sum(s.weight for s in self.sources)
        if abs(total - 1.0) > 1e-6:
            weights = ", ".join(f"{s.name}={s.weight:g}" for s in self.sources)
            raise ValueError(f"source weights must sum to 1, got {total:g} ({weights})")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        return self

    @property
    def train_rows(self) -> int:
        return self.token_budget // self.seq_len

    @property
    def val_rows(self) -> int:
        return max(1, round(self.train_rows * self.val_share))


class ModelSpec(_Strict):
    arch: str = Field(description="a registered architecture name or an import path 'pkg.module:build'")
    name: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]+$", description="label in reports; defaults to the arch name"
    )
    config: dict[str, Any] = Field(default_factory=dict, description="architecture keyword arguments")

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, arch: str) -> str:
        from rayb.models import check_arch

        check_arch(arch)
        return arch

    @property
    def label(self) -> str:
        # Labels name trial directories, so an import path's ':' becomes '.'.
        return self.name or self.arch.replace(":", ".")


class TrainSpec(_Strict):
    optimizer: Literal["adamw"] = "adamw"
    lr: Annotated[list[float], Field(min_length=1)] = Field(
        default=[3e-3], description="one value, or a sweep"
    )
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(default=0.1, ge=0)
    warmup_steps: int = Field(default=10, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    grad_clip: float = Field(default=1.0, gt=0)
    micro_batch: int = Field(default=8, ge=1, description="sequences per worker per forward pass")
    global_batch: int = Field(default=32, ge=1, description="sequences per optimizer step, all workers")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto", description="auto: bf16 on GPU, fp32 on CPU"
    )
    zero_stage: int = Field(default=1, ge=0, le=2, description="DeepSpeed ZeRO stage (0, 1 or 2)")
    num_workers: int = Field(default=1, ge=1)
    use_gpu: bool = False
    eval_every: int = Field(default=50, ge=1, description="steps between validation loss and checkpoint")
    eval_batches: int = Field(default=8, ge=1, description="validation micro-batches per interim evaluation")
    max_concurrent_trials: int | None = Field(default=None, ge=1)

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
        if self.precision == "bf16" and not self.use_gpu:
            # bf16 runs on CPU, but slowly and with no benefit; refuse the likely mistake.
            raise ValueError("precision bf16 needs use_gpu: true (CPU training runs in fp32; use auto)")
        return self

    @property
    def dtype(self) -> str:
        if self.precision == "auto":
            return "bf16" if self.use_gpu else "fp32"
        return self.precision


EVAL_SUITES = ("lm",)


class VerdictSpec(_Strict):
    reference: str | None = Field(default=None, description="model label the others are compared against")


class Study(_Strict):
    version: Literal[1] = STUDY_FORMAT_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    data: DataSpec
    models: list[ModelSpec] = Field(min_length=1)
    train: TrainSpec = TrainSpec()
    seeds: list[int] = Field(default=[0, 1], min_length=1)
    eval: list[str] = Field(default=["lm"], min_length=1)
    verdict: VerdictSpec = VerdictSpec()
    output_dir: str = "rayb_out"

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_count(cls, value: Any) -> Any:
        # `seeds: 10` means seeds 0..9; a list pins them exactly.
        return list(range(value)) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"seeds must be distinct, got {value}")
        return value

    @field_validator("eval")
    @classmethod
    def _known_suites(cls, value: list[str]) -> list[str]:
        unknown = [s for s in value if s not in EVAL_SUITES]
        if unknown:
            raise ValueError(f"unknown eval suite(s) {unknown}; available: {', '.join(EVAL_SUITES)}")
        return value

    @field_validator("output_dir")
    @classmethod
    def _local_output(cls, value: str) -> str:
        check_output_dir(value)
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Study:
        labels = [m.label for m in self.models]
        if len(set(labels)) != len(labels):
            raise ValueError(f"model labels must be unique (set `name` to tell them apart), got {labels}")
        if self.verdict.reference is not None and self.verdict.reference not in labels:
            raise ValueError(
                f"verdict.reference '{self.verdict.reference}' is not a model label; one of {labels}"
            )
        if self.data.train_rows < self.train.global_batch:
            raise ValueError(
                f"data.token_budget ({self.data.token_budget}) is less than one optimizer step "
                f"(train.global_batch × data.seq_len = {self.train.global_batch * self.data.seq_len} tokens)"
            )
        return self

    # ----- derived values -------------------------------------------------------------------------
    @property
    def reference(self) -> str:
        return self.verdict.reference or self.models[0].label

    @property
    def steps(self) -> int:
        return self.data.train_rows // self.train.global_batch

    def fingerprint(self) -> str:
        return digest(self.model_dump(mode="json"))

    def trial_key(self, model: ModelSpec, lr: float, seed: int, data_key: str) -> str:
        """Hash of everything that determines a trial's result; `data_key` identifies the token cache."""
        # Scheduling knobs do not change a trial's result, so they stay out of its key.
        train = self.train.model_dump(mode="json", exclude={"lr", "max_concurrent_trials"})
        return digest(
            {"data": data_key, "model": model.model_dump(mode="json"), "train": train, "lr": lr, "seed": seed}
        )


def check_output_dir(path: str) -> None:
    # Also catches 's3:/bucket', which is what pathlib makes of 's3://bucket'.
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/", str(path)):
        raise ValueError(
            f"'{path}': the output must be a filesystem path that every node shares (e.g. an NFS/EFS mount "
            "such as /mnt/rayb/out); object-store URLs are not supported as output yet"
        )


def digest(value: Any, length: int = 12) -> str:
    """A short, stable hash of a JSON-able value (key order does not matter)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def load_study(path: str | Path) -> Study:
    """Read and validate a study file; raise StudyError naming every bad field."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: no such study file")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise StudyError(f"{path}: not valid UTF-8 YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study file is a YAML mapping with at least name, data and models")
    return parse_study(raw, source=str(path))


def parse_study(raw: dict[str, Any], source: str = "study") -> Study:
    try:
        return Study.model_validate(raw)
    except ValidationError as exc:
        raise StudyError(format_errors(exc, source)) from None


def format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: {exc.error_count()} invalid field(s)"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field; remove it or check its spelling"
        elif err["type"] == "missing":
            message = "required field is missing"
        lines.append(f"  {where}: {message}")
    return "\n".join(lines)
