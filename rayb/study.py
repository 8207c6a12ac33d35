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
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from rayb.models.accounting import Cost

STUDY_FORMAT_VERSION = 1
BYTES_TOKENIZER, BYTE_VOCAB = "bytes", 257  # 256 byte tokens and the end-of-text token
PRETRAINED_ARCH = "pretrained"  # a `pretrained:` reference's architecture: whatever its checkpoint holds


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
    text_column: str = Field(
        default="text",
        pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
        description="the text column; a dotted path reads a struct field (Europarl: translation.fr)",
    )

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
        description="'bpe:<vocab>' trains a byte-level BPE on the mix; 'bytes' is byte-level with no merges "
        "(256 bytes + end of text); otherwise a local tokenizer dir or hub id",
    )
    vocab_size: int | None = Field(
        default=None,
        ge=2,
        description="a hub tokenizer's vocabulary size, so models are sized and planned before it is fetched "
        "(checked against the tokenizer once it is)",
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
                    f"'{value}': use bpe:<vocab size>, a whole number from 260 up, e.g. bpe:2048 "
                    "(or bytes for a byte-level vocabulary)"
                )
        return value

    @property
    def trained_vocab(self) -> int | None:
        """The size of a vocabulary rayb trains on the mix ('bytes' is a BPE with no merges), else None."""
        if self.tokenizer == BYTES_TOKENIZER:
            return BYTE_VOCAB
        return int(self.tokenizer[4:]) if self.tokenizer.startswith("bpe:") else None

    @model_validator(mode="after")
    def _mix(self) -> DataSpec:
        total = sum(s.weight for s in self.sources)
        if abs(total - 1.0) > 1e-6:
            weights = ", ".join(f"{s.name}={s.weight:g}" for s in self.sources)
            raise ValueError(f"source weights must sum to 1, got {total:g} ({weights})")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        known = self.trained_vocab or self._local_vocab()
        if self.vocab_size is not None and known is not None and self.vocab_size != known:
            raise ValueError(
                f"vocab_size {self.vocab_size} contradicts tokenizer '{self.tokenizer}' ({known} tokens); "
                "drop vocab_size, which is only for hub tokenizers"
            )
        return self

    def _local_vocab(self) -> int | None:
        tokenizer_file = Path(self.tokenizer) / "tokenizer.json"
        if tokenizer_file.is_file():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(with_added_tokens=True)
        return None

    @property
    def nominal_vocab(self) -> int | None:
        """The vocabulary size known before any data work: bpe:N's N, a local tokenizer's size, or a hub
        tokenizer's declared vocab_size (None: known once the data step has fetched it)."""
        return self.trained_vocab or self._local_vocab() or self.vocab_size

    @property
    def train_rows(self) -> int:
        return self.token_budget // self.seq_len

    @property
    def val_rows(self) -> int:
        return max(1, round(self.train_rows * self.val_share))


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
STUDY_REF = re.compile(r"^study:(?P<file>[^#]+)#(?P<model>[A-Za-z0-9_.-]+)$")
_REFERENCING: list[str] = []  # study files being validated through a study: reference (cycle guard)


def check_checkpoint(source: str) -> str:
    """A checkpoint reference: a local `save_pretrained` directory (checked now), a hub id (fetched when
    the hub is reachable, or from the local hub cache after `rayb data prepare`), or
    `study:FILE#MODEL`, the final weights of MODEL in another study, which rayb runs first."""
    if ref := STUDY_REF.match(source):
        return _check_study_ref(source, Path(ref["file"]), ref["model"])
    path = Path(source).expanduser()
    if path.exists() or source.startswith(("/", ".", "~")):
        if not (path / "config.json").is_file():
            raise ValueError(
                f"'{source}' is not a save_pretrained directory (no config.json there); give such a "
                "directory, a hub id like EleutherAI/pythia-160m, or study:FILE#MODEL"
            )
        return source
    if not HUB_ID.match(source):
        raise ValueError(
            f"'{source}' is neither an existing directory, a hub id like EleutherAI/pythia-160m, "
            "nor study:FILE#MODEL"
        )
    return source


def _check_study_ref(source: str, path: Path, model: str) -> str:
    key = str(path.resolve())
    if key in _REFERENCING:
        raise ValueError(f"'{source}': study files refer to each other in a cycle")
    _REFERENCING.append(key)
    try:
        study = load_study(path)
    except StudyError as exc:
        raise ValueError(f"'{source}' names an invalid study: {exc}") from None
    finally:
        _REFERENCING.pop()
    labels = [m.label for m in study.trained_models]
    if model not in labels:
        raise ValueError(f"'{source}': study {study.name} trains no model '{model}'; it trains {labels}")
    return source


class ModelSpec(_Strict):
    pretrained: str | None = Field(
        default=None,
        description="evaluate this checkpoint as a reference point and never train it, with its own "
        "tokenizer: a local save_pretrained directory, a hub id, or study:FILE#MODEL (MODEL's final "
        "weights in that study, which rayb runs first)",
    )
    preset: str | None = Field(default=None, description="a named configuration (`rayb params --list`)")
    arch: str | None = Field(
        default=None,
        validate_default=True,
        description="a registered architecture name or an import path 'pkg.module:build'",
    )
    size: str | int | None = Field(
        default=None, description="solve the shape for this many parameters, e.g. 30M (instead of a config)"
    )
    size_by: Literal["total", "non-embedding"] = "total"
    name: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]+$", description="label in reports; defaults to the arch name"
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="architecture keyword arguments (with size: the keys to keep fixed)"
    )
    init_from: str | None = Field(
        default=None,
        description="start training from these weights instead of a fresh initialisation (a finetuning "
        "arm): a save_pretrained directory, a hub id or study:FILE#MODEL, of the same architecture and shape",
    )

    @field_validator("pretrained", "init_from")
    @classmethod
    def _checkpoint(cls, source: str | None) -> str | None:
        return None if source is None else check_checkpoint(source)

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str | None) -> str | None:
        from rayb.models.presets import get_preset

        if preset is not None:
            get_preset(preset)
        return preset

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, arch: str | None, info: ValidationInfo) -> str | None:
        from rayb.models import check_arch

        if "preset" not in info.data or "pretrained" not in info.data:  # invalid, and already reported
            return arch
        if info.data["pretrained"] is not None:
            if arch is not None or info.data["preset"] is not None:
                raise ValueError("a pretrained model brings its own architecture; drop arch and preset")
            return arch
        if arch is None and info.data["preset"] is None:
            raise ValueError("required field is missing (or give preset: NAME instead)")
        if arch is not None and info.data["preset"] is not None:
            raise ValueError("give arch or preset, not both")
        if arch is not None:
            check_arch(arch)
        return arch

    @field_validator("size")
    @classmethod
    def _size_form(cls, size: str | int | None) -> str | int | None:
        from rayb.models.sizing import parse_size

        if size is not None:
            parse_size(size)
        return size

    @model_validator(mode="after")
    def _size_needs_arch(self) -> ModelSpec:
        if self.preset and self.size is not None:
            raise ValueError(f"preset '{self.preset}' fixes the size; drop size, or use arch with size")
        if self.pretrained and (self.size is not None or self.config or self.init_from):
            raise ValueError("a pretrained model is evaluated as it is; drop size, config and init_from")
        return self

    @property
    def architecture(self) -> str:
        from rayb.models.presets import get_preset

        if self.pretrained:
            return PRETRAINED_ARCH
        return self.arch or get_preset(self.preset).arch

    @property
    def label(self) -> str:
        # Labels name trial directories, so an import path's ':' becomes '.'.
        if self.pretrained:
            ref = STUDY_REF.match(self.pretrained)
            return self.name or (ref["model"] if ref else Path(self.pretrained.rstrip("/")).name)
        return self.name or self.preset or self.arch.replace(":", ".")

    def resolve(self, vocab_size: int, seq_len: int) -> dict[str, Any]:
        """The architecture config this entry stands for, with the study's vocabulary and context."""
        from rayb.models.presets import get_preset
        from rayb.models.sizing import match, parse_size

        if self.preset:
            return get_preset(self.preset).config | self.config
        if self.size is None:
            return dict(self.config)
        return match(self.arch, parse_size(self.size), self.size_by, vocab_size, seq_len, self.config).config


class TrainSpec(_Strict):
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
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto", description="auto: bf16 on GPU, fp32 on CPU"
    )
    zero_stage: int = Field(default=1, ge=0, le=2, description="DeepSpeed ZeRO stage (0, 1 or 2)")
    num_workers: int = Field(default=1, ge=1)
    use_gpu: bool = False
    eval_every: int = Field(default=50, ge=1, description="steps between validation loss and checkpoint")
    eval_batches: int = Field(default=8, ge=1, description="validation micro-batches per interim evaluation")
    max_concurrent_trials: int | None = Field(default=None, ge=1)
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
        if self.precision == "bf16" and not self.use_gpu:
            # bf16 runs on CPU, but slowly and with no benefit; refuse the likely mistake.
            raise ValueError("precision bf16 needs use_gpu: true (CPU training runs in fp32; use auto)")
        return self

    @property
    def dtype(self) -> str:
        if self.precision == "auto":
            return "bf16" if self.use_gpu else "fp32"
        return self.precision


THRESHOLD = re.compile(r"^\s*(<=|<|>=|>)\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*$")


def parse_threshold(text: str) -> tuple[str, float]:
    """'<= 1.15' -> ('<=', 1.15): a condition on the candidate / baseline ratio of a metric's mean."""
    match = THRESHOLD.match(text)
    if not match:
        raise ValueError(f"'{text}' is not a ratio condition; write e.g. '<= 1.15' or '>= 2'")
    return match.group(1), float(match.group(2))


def check_results_column(column: str) -> str:
    """A column the results table can have: a core one, or <suite>.<metric> of a registered suite."""
    from rayb.eval.registry import benchmarks

    family = column.split(".", 1)[0].split(":", 1)[0]
    if column not in GATE_CORE_COLUMNS and ("." not in column or family not in benchmarks()):
        raise ValueError(
            f"'{column}' is not a results column: use one of {', '.join(GATE_CORE_COLUMNS)} "
            "or <suite>.<metric> from an eval suite (e.g. statefulness.accuracy)"
        )
    return column


class MetricRule(_Strict):
    """How the gate classes one metric: conditions on the ratio candidate mean / baseline mean.
    `<`/`<=` mean lower is better (loss, memory), `>`/`>=` higher is better (accuracy, speed)."""

    column: str = Field(description="results-table column, e.g. val_loss or speed.gen_tokens_per_s")
    good: str = Field(description="'good enough', e.g. '<= 1.15'")
    promising: str
    excellent: str
    conditions: list[str] = Field(
        default=[], description="columns that must be equal for both models, or the ratio is not comparable"
    )

    @field_validator("column")
    @classmethod
    def _known_column(cls, column: str) -> str:
        return check_results_column(column)

    @field_validator("conditions")
    @classmethod
    def _known_conditions(cls, columns: list[str]) -> list[str]:
        return [check_results_column(c) for c in columns]

    @model_validator(mode="after")
    def _ordered(self) -> MetricRule:
        conditions = [parse_threshold(t) for t in (self.good, self.promising, self.excellent)]
        if len({op[0] for op, _ in conditions}) != 1:
            raise ValueError(
                f"good, promising and excellent must all say lower is better (<, <=) or all higher (>, >=); "
                f"got {self.good!r}, {self.promising!r}, {self.excellent!r}"
            )
        limits = [value for _, value in conditions]
        lower = conditions[0][0][0] == "<"
        if limits != sorted(limits, reverse=lower):
            raise ValueError(
                f"excellent must be at least as strict as promising, and promising as good; "
                f"got good {self.good!r}, promising {self.promising!r}, excellent {self.excellent!r}"
            )
        return self

    @property
    def lower_is_better(self) -> bool:
        return self.good.strip().startswith("<")


class RedLine(_Strict):
    """A ratio that stops the gate whatever else holds, e.g. {metric: loss, above: 1.3}."""

    metric: str = Field(description="a name under gate.metrics")
    above: float | None = Field(default=None, gt=0)
    below: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_bound(self) -> RedLine:
        if (self.above is None) == (self.below is None):
            raise ValueError(f"red line on '{self.metric}': give exactly one of above or below")
        return self


class ScaleRule(_Strict):
    """should_scale: loss ratio ≤ max_loss_ratio with ≥ `advantages` advantages on the other metrics,
    or one advantage with loss ratio < single_advantage_loss_ratio."""

    max_loss_ratio: float = Field(default=1.15, gt=0)
    advantages: int = Field(default=2, ge=1)
    single_advantage_loss_ratio: float = Field(default=1.05, gt=0)
    advantage_class: Literal["good", "promising", "excellent"] = Field(
        default="good",
        description="the class a non-loss metric must reach to count (or the next one up whose threshold beats "
        "the baseline: memory's 'good enough' is 'equal', so a memory advantage needs 'promising')",
    )


GATE_CORE_COLUMNS = ("val_loss", "val_ppl", "val_bpb", "tokens_per_s", "params_total", "train_flops")

# model_construct: the defaults are known good, and validating them here would import every eval suite.
DEFAULT_GATE_METRICS = {
    name: MetricRule.model_construct(
        column=column, good=good, promising=promising, excellent=excellent, conditions=conditions
    )
    for name, column, good, promising, excellent, conditions in [
        ("loss", "val_loss", "<= 1.15", "<= 1.05", "< 1.0", []),  # within 15% / within 5% / better
        (
            "statefulness",
            "statefulness.accuracy",
            ">= 1.1",
            ">= 1.25",
            ">= 1.5",
            [],
        ),  # 10% / 25% / 50% better
        # 20% / 50% faster / 2×, and equal / 20% / 50% less: both over the same number of generated
        # tokens (a model with a short position table generates fewer).
        ("speed", "speed.gen_tokens_per_s", ">= 1.2", ">= 1.5", ">= 2.0", ["speed.gen_tokens"]),
        ("memory", "speed.gen_peak_bytes", "<= 1.0", "<= 0.8", "<= 0.5", ["speed.gen_tokens"]),
    ]
}


class GateSpec(_Strict):
    """The go/no-go gate. The default is one team's written gate: pass on ≥ 1 excellent or ≥ 2 promising
    metrics, stopped by the red lines (loss > 1.3× baseline, statefulness below it, loss spikes)."""

    metrics: dict[str, MetricRule] = Field(
        default_factory=lambda: dict(DEFAULT_GATE_METRICS),
        description="merged over the defaults (loss, statefulness, speed, memory); `name: null` drops one",
    )
    loss_metric: str = Field(default="loss", description="the metric should_scale weighs the others against")
    candidates: list[str] | None = Field(
        default=None, description="models gated; default all but the reference"
    )
    pass_excellent: int = Field(default=1, ge=1, description="pass with this many excellent metrics")
    pass_promising: int = Field(default=2, ge=1, description="... or this many promising (or better)")
    red_lines: list[RedLine] = Field(
        default_factory=lambda: [
            RedLine.model_construct(metric="loss", above=1.3, below=None),
            RedLine.model_construct(metric="statefulness", above=None, below=1.0),
        ]
    )
    max_loss_spike: float | None = Field(
        default=2.0,
        gt=1,
        description="red line: a training loss above this × its running average (null: off)",
    )
    spike_window: int = Field(default=20, ge=2, description="steps in the running average of the spike check")
    significance_alpha: float | None = Field(
        default=None, gt=0, lt=1,
        description="grade a difference that is not significant (Welch p ≥ this over seeds) as parity; "
        "null (the default, as the written gate) grades the ratio of means as it is",
    )  # fmt: skip
    should_scale: ScaleRule = ScaleRule()

    @field_validator("metrics", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        merged = {name: rule.model_dump() for name, rule in DEFAULT_GATE_METRICS.items()} | value
        return {name: rule for name, rule in merged.items() if rule is not None}

    @model_validator(mode="after")
    def _names(self) -> GateSpec:
        names = set(self.metrics)
        for where, name in [("loss_metric", self.loss_metric)] + [
            (f"red_lines.{i}.metric", line.metric) for i, line in enumerate(self.red_lines)
        ]:
            if name not in names:
                raise ValueError(f"{where} '{name}' is not under gate.metrics ({', '.join(sorted(names))})")
        return self


class VerdictSpec(_Strict):
    reference: str | None = Field(default=None, description="model label the others are compared against")
    gate: GateSpec = GateSpec()
    extrapolate_to: list[str | int] = Field(
        default=["125M", "350M", "1.3B"], description="sizes the scaling-law fits predict the loss at"
    )

    @field_validator("extrapolate_to")
    @classmethod
    def _sizes(cls, value: list[str | int]) -> list[str | int]:
        from rayb.models.sizing import parse_size

        for size in value:
            parse_size(size)
        return value


class Study(_Strict):
    version: Literal[1] = STUDY_FORMAT_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    data: DataSpec
    models: list[ModelSpec] = Field(min_length=1)
    train: TrainSpec = TrainSpec()
    seeds: list[int] = Field(default=[0, 1], min_length=1)
    eval: list[str] = Field(
        default=["lm"], min_length=1,
        description="suites to run on every checkpoint: lm, lm:CORPUS, lm_eval:TASK, statefulness, recall, long_context, speed",
    )  # fmt: skip
    eval_options: dict[str, dict[str, Any]] = Field(
        default={}, description="per suite family, e.g. {recall: {kv_counts: [4, 8]}, speed: {repeats: 5}}"
    )
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
        from rayb.eval.registry import parse_suite

        for suite in value:
            parse_suite(suite)
        if len(set(value)) != len(value):
            raise ValueError(f"eval suites must be distinct, got {value}")
        return value

    @field_validator("eval_options")
    @classmethod
    def _known_options(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from rayb.eval.registry import benchmarks, make_options

        known = benchmarks()
        for name, options in value.items():
            if name not in known:
                raise ValueError(
                    f"eval_options names an unknown suite '{name}'; available: {', '.join(sorted(known))}"
                )
            try:
                make_options(known[name], options)
            except TypeError as exc:  # a wrong value type inside the options dataclass
                raise ValueError(f"eval_options.{name}: {exc}") from None
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
        for name in self.verdict.gate.candidates or []:
            if name not in labels:
                raise ValueError(f"verdict.gate.candidates: '{name}' is not a model label; one of {labels}")
        if self.data.train_rows < self.train.global_batch:
            raise ValueError(
                f"data.token_budget ({self.data.token_budget}) is less than one optimizer step "
                f"(train.global_batch × data.seq_len = {self.train.global_batch * self.data.seq_len} tokens)"
            )
        if not self.trained_models:
            raise ValueError("every model is pretrained: a study trains at least one model")
        vocab = self.data.nominal_vocab
        if vocab is not None:  # otherwise sizes are solved once the tokenizer is fetched
            for i, model in enumerate(self.models):
                if not model.pretrained:
                    self.model_steps(model, vocab, where=f"models.{i}")
        return self

    # ----- derived values -------------------------------------------------------------------------
    @property
    def reference(self) -> str:
        return self.verdict.reference or self.models[0].label

    @property
    def steps_per_epoch(self) -> int:
        return self.data.train_rows // self.train.global_batch

    @property
    def steps(self) -> int:
        """Optimizer steps over all epochs (every trial's, unless a FLOPs budget sets fewer)."""
        return self.steps_per_epoch * self.train.epochs

    @property
    def trained_models(self) -> list[ModelSpec]:
        return [m for m in self.models if not m.pretrained]

    def model_steps(
        self, model: ModelSpec, vocab_size: int, where: str = "model"
    ) -> tuple[dict[str, Any], Cost, int]:
        """A model's resolved config, its cost, and its steps (fewer under a matched FLOPs budget)."""
        from rayb.models.accounting import model_cost

        seq_len = self.data.seq_len
        try:
            config = model.resolve(vocab_size, seq_len)
            cost = model_cost(model.architecture, config, vocab_size, seq_len)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if self.train.flops_budget is None:
            return config, cost, self.steps
        tokens_per_step = self.train.global_batch * seq_len
        steps = int(self.train.flops_budget // (cost.train_flops_per_token * tokens_per_step))
        if not 1 <= steps <= self.steps:
            need = self.train.flops_budget / cost.train_flops_per_token
            raise ValueError(
                f"{where}: train.flops_budget {self.train.flops_budget:.3g} buys {model.label} "
                f"{need:,.0f} tokens ({cost.train_flops_per_token:.3g} training FLOPs/token), "
                + (f"more than data.token_budget × train.epochs ({self.data.token_budget * self.train.epochs:,}); raise it"
                   if steps > self.steps else f"less than one step ({tokens_per_step:,} tokens); raise the budget")
            )  # fmt: skip
        return config, cost, steps

    def fingerprint(self) -> str:
        return digest(self.model_dump(mode="json"))

    def trial_key(
        self, model: ModelSpec, lr: float, seed: int, data_key: str, weights: str | None = None
    ) -> str:
        """Hash of everything that determines a trial's result; `data_key` identifies the token cache,
        `weights` the checkpoint a pretrained or init_from model loads (another study's trial key)."""
        # Scheduling knobs do not change a trial's result, so they stay out of its key.
        train = self.train.model_dump(mode="json", exclude={"lr", "max_concurrent_trials"})
        key = {
            "data": data_key,
            "model": model.model_dump(mode="json"),
            "train": train,
            "lr": lr,
            "seed": seed,
        }
        return digest(key | ({"weights": weights} if weights else {}))


def check_output_dir(path: str) -> None:
    # Also catches 's3:/bucket', which is what pathlib makes of 's3://bucket'.
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/", str(path)):
        raise ValueError(
            f"'{path}': the output must be a filesystem path that every node shares (e.g. an NFS/EFS mount "
            "such as /mnt/rayb/out); for a copy on object storage, add `rayb run --archive s3://bucket/prefix`"
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


SECRET_PATTERNS = {
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
    "an AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "a password in a URL": re.compile(r"://[^/\s:@]+:[^/\s@]+@"),
    "a private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
}


def find_secrets(value: Any, where: str = "") -> list[str]:
    """'field: what' for every string in a study that looks like a credential. Study files are hashed,
    copied into every output (provenance.json, the report) and uploaded with `ray job submit`."""
    if isinstance(value, dict):
        return [
            hit for key, item in value.items() for hit in find_secrets(item, f"{where}.{key}".lstrip("."))
        ]
    if isinstance(value, list):
        return [hit for i, item in enumerate(value) for hit in find_secrets(item, f"{where}.{i}")]
    if isinstance(value, str):
        return [
            f"{where}: looks like {what}"
            for what, pattern in SECRET_PATTERNS.items()
            if pattern.search(value)
        ]
    return []


def parse_study(raw: dict[str, Any], source: str = "study") -> Study:
    secrets = find_secrets(raw)
    if secrets:
        raise StudyError(
            "\n".join(
                [f"{source}: {len(secrets)} field(s) hold a credential; study files are copied into every "
                 "output and uploaded with the job. Remove it and pass credentials through the environment "
                 "(HF_TOKEN; AWS/GCP roles or profiles), as docs/clusters.md describes"]
                + [f"  {hit}" for hit in secrets]
            )
        )  # fmt: skip
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
