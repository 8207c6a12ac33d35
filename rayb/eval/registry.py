"""The benchmark registry: every evaluation rayb runs is a named `Benchmark` (lm-eval's pattern).

A study lists suites as `name` or `name:argument` (`lm`, `lm:wikitext2`, `lm_eval:hellaswag`) and may
tune each family with `eval_options: {name: {...}}`, validated against the benchmark's options
dataclass before anything runs. A benchmark is a plain function of an `EvalContext` (a loaded model,
its tokenizer and the study's data), so it runs and is tested without Ray; eval actors (actors.py)
only fan them out. Bump a benchmark's `version` whenever what it measures changes: the version is
recorded with every result and is part of the result's file name, so old numbers are never reused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rayb.data.cache import TokenCache
from rayb.registry import Registry

if TYPE_CHECKING:
    from torch import nn


@dataclass
class EvalContext:
    model: nn.Module  # in eval mode; model(ids).logits
    tokenizer: Any  # the model's PreTrainedTokenizerFast: the study's, or a pretrained reference's own
    cache: TokenCache  # the study's packed data (held-out rows in cache.val)
    seed: int = 0  # the trial's seed, so generated probes differ across seeds but not across models
    # A freshly initialised copy of the model (same architecture and config, untrained), for
    # protocols that train from scratch inside an evaluation (the overfit smoke test).
    fresh_model: Callable[[], nn.Module] | None = None
    # False for a pretrained reference with its own tokenizer: the cache's token ids mean nothing to it,
    # so held-out data reaches it as text (held_out_text / held_out_stream).
    study_tokens: bool = True

    @property
    def seq_len(self) -> int:
        """The context length the model was trained at."""
        return self.cache.seq_len

    @property
    def vocab_size(self) -> int:
        return self.cache.manifest["vocab_size"] if self.study_tokens else len(self.tokenizer)

    def held_out_stream(self) -> np.ndarray:
        """The held-out tokens as one stream, in this model's own tokens (a reference's from the held-out
        text as the sources hold it, documents separated by blank lines)."""
        if self.study_tokens:
            return np.asarray(self.cache.val).reshape(-1)
        ids = self.tokenizer(self.cache.held_out.text(), add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int64)


@dataclass(frozen=True)
class Benchmark:
    name: str
    version: int
    run: Callable[[EvalContext, str | None, Any], dict[str, Any]]  # (ctx, argument, options) -> metrics
    options: type  # a dataclass of this family's knobs, all with defaults
    description: str
    argument: str | None = None  # what `name:argument` means, or None if the family takes none
    argument_required: bool = False
    # (argument, the study file's directory) -> the argument, a relative path made absolute; raises
    # ValueError for an argument that names nothing (a missing file, an unknown corpus)
    resolve_argument: Callable[[str, Path], str] | None = None
    # (a resolved argument) -> what jobs carry to their actors in its place, read on the driver as it
    # hands them out: the content of a file the argument names (an actor's node may not have the file)
    read_argument: Callable[[str], Any] | None = None
    exclusive_device: bool = False  # runs alone on its device (timings), never beside another evaluation
    # Feeds tokens one at a time through a model's cache or state (eval/decoding.py), so its scores are
    # right only if decoding equals the full forward: the study's self-check holds every model to that.
    decodes: bool = False


PRIMARY_SUITE = "lm"  # measures val_loss on the held-out rows: what every verdict compares

BENCHMARKS: Registry[Benchmark] = Registry(
    "eval suite",
    builtins=dict(
        babilong="rayb.eval.babilong",
        lm="rayb.eval.lm",
        lm_eval="rayb.eval.harness",
        long_context="rayb.eval.long_context",
        overfit="rayb.eval.overfit",
        recall="rayb.eval.recall",
        speed="rayb.eval.speed",
        statefulness="rayb.eval.probes",
    ),
)


def register_benchmark(benchmark: Benchmark) -> Benchmark:
    return BENCHMARKS.register(benchmark.name, benchmark)


def parse_suite(suite: str) -> tuple[Benchmark, str | None]:
    """`name[:argument]` -> (benchmark, argument); ValueError naming what is wrong. Only the suite's own
    module is imported (lm-eval only for lm_eval:TASK)."""
    name, _, argument = suite.partition(":")
    benchmark = BENCHMARKS.get(name)
    if argument and benchmark.argument is None:
        raise ValueError(f"eval suite '{name}' takes no argument (got '{suite}')")
    if not argument and benchmark.argument_required:
        raise ValueError(f"eval suite '{name}' needs an argument: '{name}:<{benchmark.argument}>'")
    return benchmark, argument or None


def check_suite_argument(suite: str, base_dir: Path | None = None) -> str | None:
    """A suite's argument checked against what it names (a corpus file must exist: I/O, so this runs when a
    study is resolved, not while its fields are parsed); returns it with a relative path made absolute."""
    benchmark, argument = parse_suite(suite)
    if argument is not None and benchmark.resolve_argument is not None:
        argument = benchmark.resolve_argument(argument, base_dir or Path.cwd())
    return argument


def job_argument(suite: str, base_dir: Path | None = None) -> Any:
    """What every job of a suite carries to its eval actor as the argument: the checked argument, or what
    the benchmark reads of it on this machine (the driver's) for actors on any node."""
    benchmark, _ = parse_suite(suite)
    argument = check_suite_argument(suite, base_dir)
    if argument is None or benchmark.read_argument is None:
        return argument
    return benchmark.read_argument(argument)


def make_options(benchmark: Benchmark, values: dict[str, Any] | None) -> Any:
    """The benchmark's options dataclass from a study's `eval_options` entry; ValueError names the key."""
    fields = {f.name: f for f in dataclasses.fields(benchmark.options)}
    unknown = sorted(set(values or {}) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for eval suite '{benchmark.name}'; known: {', '.join(fields)}"
        )
    options = benchmark.options(**(values or {}))
    if validate := getattr(options, "validate", None):
        validate()
    return options


def result_name(suite: str) -> str:
    """A file-system-safe name for a suite's results ('lm_eval:hellaswag' -> 'lm_eval-hellaswag')."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in suite.replace(":", "-"))
