"""The study file: a validated, versioned value that says everything a comparison depends on.

A study composes one schema per component, each kept beside its code: `data:` (rayb/data/spec.py),
`models:` (rayb/models/spec.py), `train:` (rayb/train/spec.py) and `verdict:` (rayb/analysis/spec.py).
Loading one takes two steps, both before any cluster work, so a typo costs a second, not a cluster hour:
the fields are validated (their form only), then `Study.resolve()` checks what needs the disk or a built
model (local paths, read from the study file's directory; checkpoints; a user's model; every model's
size). Every derived output path is keyed by a hash of the fields that determine it (`fingerprint`,
`trial_key`), which is what makes reruns skip finished work and keeps studies apart.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from rayb import storage
from rayb.analysis.spec import SeedRoundsSpec, VerdictSpec, significance_rule
from rayb.data.spec import DataSpec
from rayb.eval.registry import BENCHMARKS, PRIMARY_SUITE, check_suite_argument, make_options, parse_suite
from rayb.files import digest
from rayb.models.spec import ChecksSpec, ModelSpec
from rayb.spec import Spec, added_field
from rayb.track.spec import TrackingSpec
from rayb.train.spec import SCHEDULING_FIELDS, TrainSpec

if TYPE_CHECKING:
    from rayb.models.accounting import Cost

STUDY_FORMAT_VERSION = 1


class StudyError(ValueError):
    """An invalid study file; the message names each bad field and what is allowed."""


class StudyFailed(StudyError):
    """A study that failed once its trials had run (in evaluation or the verdict): the message says why and
    where the traceback is; every finished result is kept, and a rerun redoes none of it."""


_REFERENCING: list[str] = []  # study files being resolved through a study: reference (cycle guard)


class Study(Spec):
    version: Literal[1] = STUDY_FORMAT_VERSION
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    data: DataSpec
    models: list[ModelSpec] = Field(min_length=1)
    train: TrainSpec = TrainSpec()
    seeds: list[int] = Field(
        default=[0, 1], min_length=1,
        description="a number (seeds 0..n-1), a list, or {min, max} for adaptive seeds (then seeds 0..max-1)",
    )  # fmt: skip
    seed_rounds: SeedRoundsSpec | None = added_field(
        None, description="set by `seeds: {min, max}`: the rounds in which seeds are added"
    )
    eval: list[str] = Field(
        default=[PRIMARY_SUITE], min_length=1,
        description="suites to run on every checkpoint: lm (required: it measures the loss every verdict "
        "compares), lm:CORPUS, lm_eval:TASK, statefulness, recall, long_context, speed",
    )  # fmt: skip
    eval_options: dict[str, dict[str, Any]] = Field(
        default={}, description="per suite family, e.g. {recall: {kv_counts: [4, 8]}, speed: {repeats: 5}}"
    )
    verdict: VerdictSpec = VerdictSpec()
    tracking: TrackingSpec = added_field(
        TrackingSpec(), description="experiment trackers that mirror every trial: tensorboard, mlflow, wandb"
    )
    checks: ChecksSpec = added_field(
        ChecksSpec(), description="self-checks whose failure a study may override (the report marks it)"
    )
    output_dir: str = Field(
        default="rayb_out",
        description="where outputs go: a path (relative to the directory rayb runs in), or s3://, gs://... "
        "(or --output)",
    )

    @model_validator(mode="before")
    @classmethod
    def _adaptive_seeds(cls, value: Any) -> Any:
        # `seeds: {min: 3, max: 10}` may run seeds 0..9, in rounds; the rounds' settings live in seed_rounds.
        if isinstance(value, dict) and isinstance(value.get("seeds"), dict):
            rounds = value["seeds"]
            maximum = rounds.get("max")
            seeds = (
                list(range(maximum)) if isinstance(maximum, int) and not isinstance(maximum, bool) else None
            )
            value = value | {"seeds": seeds or [0], "seed_rounds": rounds}
        return value

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
        for suite in value:
            parse_suite(suite)
        if len(set(value)) != len(value):
            raise ValueError(f"eval suites must be distinct, got {value}")
        if PRIMARY_SUITE not in value:
            raise ValueError(
                f"add {PRIMARY_SUITE} to eval: the verdict compares every model's held-out loss (val_loss), "
                f"which only the {PRIMARY_SUITE} suite measures (got {value})"
            )
        return value

    @field_validator("eval_options")
    @classmethod
    def _known_options(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, options in value.items():
            if name not in BENCHMARKS:
                raise ValueError(f"eval_options: {BENCHMARKS.unknown(name)}")
            try:
                make_options(BENCHMARKS.get(name), options)
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
        if not self.trained_models:
            raise ValueError("every model is pretrained: a study trains at least one model")
        for field in ("allow_decoding_mismatch", "allow_fast_path_mismatch"):
            if unknown := sorted(set(getattr(self.checks, field)) - set(labels)):
                raise ValueError(f"checks.{field}: {unknown} are not model labels; one of {labels}")
        if (reference := self.verdict.reference) is not None:
            if reference not in labels:
                raise ValueError(f"verdict.reference '{reference}' is not a model label; one of {labels}")
            if self.models[labels.index(reference)].pretrained:
                trained = [m.label for m in self.trained_models]
                raise ValueError(
                    f"verdict.reference '{reference}' is a pretrained model, scored in its own tokens: it has no "
                    f"val_loss to compare the others with; name a trained model ({', '.join(trained)})"
                )
        if self.seed_rounds is not None:
            if len(self.seeds) != self.seed_rounds.max:
                raise ValueError(
                    f"seeds: adaptive seeds run seeds 0..max-1; write `seeds: {{min: {self.seed_rounds.min}, "
                    f"max: {self.seed_rounds.max}}}` alone, without a list of seeds"
                )
            if self.verdict.gate.significance == "none":
                raise ValueError(
                    "seeds: {min, max} adds seeds until each comparison is significant or parity, and "
                    "verdict.gate.significance: none judges none; set a significance rule or fixed seeds"
                )
        for name in self.verdict.gate.candidates or []:
            if name not in labels:
                raise ValueError(f"verdict.gate.candidates: '{name}' is not a model label; one of {labels}")
        if self.data.train_rows < self.train.global_batch:
            raise ValueError(
                f"data.token_budget ({self.data.token_budget}) is less than one optimizer step "
                f"(train.global_batch × data.seq_len = {self.train.global_batch * self.data.seq_len} tokens)"
            )
        return self

    # ----- resolution: what needs the disk or a built model ----------------------------------------------
    def resolve(self, source: str = "study") -> Study:
        """Check what the fields' form cannot tell, reading relative paths from the study file's directory:
        local data and tokenizers, checkpoints (a study reference's file and model), a user's model by
        import path, every trained model's size and steps, and corpus files named by eval suites. Raises
        StudyError naming every problem; returns the study."""
        problems = [(f"data.{where}", message) for where, message in self.data.problems()]
        for i, model in enumerate(self.models):
            found = [(f"models.{i}.{where}", message) for where, message in model.problems()]
            problems += found
            if not found and (ref := model.checkpoint) is not None and ref.kind == "study":
                if message := _check_study_ref(ref):
                    problems.append(
                        (f"models.{i}.{'pretrained' if model.pretrained else 'init_from'}", message)
                    )
        problems += [(f"tracking.{where}", message) for where, message in self.tracking.problems()]
        for i, suite in enumerate(self.eval):
            try:
                check_suite_argument(suite, self.base_dir)
            except ValueError as exc:
                problems.append((f"eval.{i}", str(exc)))
        vocab = self.data.nominal_vocab
        if not problems and vocab is not None:  # otherwise sizes are solved once the tokenizer is fetched
            for i, model in enumerate(self.models):
                try:
                    if not model.pretrained:
                        self.model_steps(model, vocab)
                except ValueError as exc:
                    problems.append((f"models.{i}", str(exc)))
        if problems:
            raise StudyError(format_problems(problems, source))
        return self

    # ----- derived values ---------------------------------------------------------------------------------
    @property
    def reference(self) -> str:
        """The model the others are compared with: verdict.reference, or the first trained model."""
        return self.verdict.reference or self.trained_models[0].label

    @property
    def steps_per_epoch(self) -> int:
        from rayb.data.cache import batches_per_epoch

        return batches_per_epoch(self.data.train_rows, self.train.global_batch)

    @property
    def steps(self) -> int:
        """Optimizer steps over all epochs (every trial's, unless a FLOPs budget sets fewer)."""
        return self.steps_per_epoch * self.train.epochs

    @property
    def significance(self):
        """The verdict's and gate's significance rule (rayb/analysis/stats.py), with the study's rounds."""
        return significance_rule(self.verdict.gate, self.seed_rounds)

    @property
    def decoding_suites(self) -> list[str]:
        """The suites whose scores come from token-by-token decoding (a model's cache or state)."""
        return [suite for suite in self.eval if parse_suite(suite)[0].decodes]

    @property
    def trained_models(self) -> list[ModelSpec]:
        return [m for m in self.models if not m.pretrained]

    def model_steps(self, model: ModelSpec, vocab_size: int) -> tuple[dict[str, Any], Cost, int]:
        """A model's resolved config (as it trains on the study's device), its cost (of that config), and
        its steps (fewer under a matched FLOPs budget). ValueError says what is wrong."""
        from rayb.models.accounting import model_cost

        seq_len = self.data.seq_len
        config = model.resolve(vocab_size, seq_len, self.train.device)
        cost = model_cost(model.architecture, config, vocab_size, seq_len)
        if self.train.flops_budget is None:
            return config, cost, self.steps
        tokens_per_step = self.train.global_batch * seq_len
        steps = int(self.train.flops_budget // (cost.train_flops_per_token * tokens_per_step))
        if not 1 <= steps <= self.steps:
            need = self.train.flops_budget / cost.train_flops_per_token
            raise ValueError(
                f"train.flops_budget {self.train.flops_budget:.3g} buys {model.label} "
                f"{need:,.0f} tokens ({cost.train_flops_per_token:.3g} training FLOPs/token), "
                + (f"more than data.token_budget × train.epochs ({self.data.token_budget * self.train.epochs:,}); raise it"
                   if steps > self.steps else f"less than one step ({tokens_per_step:,} tokens); raise the budget")
            )  # fmt: skip
        return config, cost, steps

    def fingerprint(self) -> str:
        # Trackers only mirror results, and a check's override only marks them: turning either on keeps
        # the study's directory and finished work.
        return digest({k: v for k, v in self.hashed().items() if k not in ("tracking", "checks")})

    def trial_key(
        self, model: ModelSpec, lr: float, seed: int, data_key: str, weights: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> str:  # fmt: skip
        """Hash of everything that determines a trial's result; `data_key` identifies the token cache,
        `weights` the checkpoint a pretrained or init_from model loads (another study's trial key),
        `config` the resolved shape of a model given by size or preset."""
        # Scheduling knobs do not change a trial's result, so they stay out of its key.
        train = {k: v for k, v in self.train.hashed().items() if k not in ("lr", *SCHEDULING_FIELDS)}
        key = {"data": data_key, "model": model.hashed(), "train": train, "lr": lr, "seed": seed}
        # `size: 8M` or `preset:` names a shape that rayb's solver or preset table resolves; when either
        # changes, the trial is another model, and must not reuse the old one's results.
        shape = {"shape": config} if config is not None and (model.size is not None or model.preset) else {}
        return digest(key | shape | ({"weights": weights} if weights else {}))


def _check_study_ref(ref) -> str | None:
    """Why a `study:FILE#MODEL` reference cannot be used (the file, a cycle, the model), or None."""
    key = str(Path(ref.location).resolve())
    if key in _REFERENCING:
        return f"'{ref.source}': study files refer to each other in a cycle"
    _REFERENCING.append(key)
    try:
        study = load_study(ref.location)
    except StudyError as exc:
        return f"'{ref.source}' names an invalid study: {exc}"
    finally:
        _REFERENCING.pop()
    labels = [m.label for m in study.trained_models]
    if ref.model not in labels:
        return f"'{ref.source}': study {study.name} trains no model '{ref.model}'; it trains {labels}"
    return None


RAY_LOG = "logs/ray-driver.log"  # Ray's driver-side log records, when they are kept off the terminal


def study_directory(study: Study, output: Path | str | None = None) -> str:
    """Where a study's results, report and logs go: named by its hash, under the output directory (a
    local path or a URI)."""
    return storage.join(
        storage.resolve(output or study.output_dir), "studies", f"{study.name}-{study.fingerprint()}"
    )


def check_output_dir(path: str) -> None:
    """A local path, or a URI of a filesystem pyarrow or fsspec knows (s3://bucket/prefix, gs://...)."""
    from fsspec.registry import known_implementations

    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]+):(/*)(.*)", str(path))
    if not match or len(match.group(1)) == 1:  # a local path (a drive letter is not a scheme)
        return
    scheme, slashes, rest = match.groups()
    if slashes != "//" or not rest.split("/")[0]:  # also 's3:/bucket', what pathlib makes of 's3://bucket'
        raise ValueError(f"'{path}': write an object-storage output as {scheme}://bucket/prefix")
    if scheme not in known_implementations:
        raise ValueError(
            f"'{path}': unknown storage scheme '{scheme}://'; use a local path, s3://, gs://, or another "
            "scheme fsspec knows"
        )


def load_study(path: str | Path) -> Study:
    """Read, validate and resolve a study file; raise StudyError naming every bad field. Relative paths in
    it are read from its own directory."""
    path = Path(path)
    if not path.is_file():
        raise StudyError(f"{path}: no such study file")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise StudyError(f"{path}: not valid UTF-8 YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise StudyError(f"{path}: a study file is a YAML mapping with at least name, data and models")
    return parse_study(raw, source=str(path), base_dir=path.parent)


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


def parse_study(raw: dict[str, Any], source: str = "study", base_dir: Path | None = None) -> Study:
    """Validate a study's fields, then resolve it (`Study.resolve`); relative paths in it are read from
    `base_dir` (the study file's directory; the current directory when None)."""
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
        study = Study.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise StudyError(format_errors(exc, source)) from None
    return study.resolve(source)


def format_errors(exc: ValidationError, source: str) -> str:
    problems = []
    for err in exc.errors():
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field; remove it or check its spelling"
        elif err["type"] == "missing":
            message = "required field is missing"
        loc = ["seeds" if p == "seed_rounds" else str(p) for p in err["loc"]]  # as the file writes it
        problems.append((".".join(loc), message))
    return format_problems(problems, source)


def format_problems(problems: list[tuple[str, str]], source: str) -> str:
    """One line per (field, message), under a line that counts them: every invalid field at once."""
    lines = [f"{source}: {len(problems)} invalid field(s)"]
    lines += [f"  {where or '(top level)'}: {message}" for where, message in problems]
    return "\n".join(lines)
