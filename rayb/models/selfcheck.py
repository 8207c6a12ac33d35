"""Self-checks before compute is spent: each model's decoding equals its full forward, and each fast
path its plain reference, on the device and in the precision the study runs them.

A wrong number that raises no error is the worst kind: a transformers release that renames the cache
argument leaves Mamba decoding without its state; a user's recurrent model that returns the incoming
state instead of the new one still trains. Both give scores, and both are caught here in about a
second per model, before any trial trains:

* **decoding**: a short random prompt, then a few tokens one at a time through the decoder the speed
  suite uses (`rayb.eval.decoding.Decoder`: a cache, a recurrent state), each step's logits against one
  full forward pass over the same tokens;
* **fast path**: forward logits and every parameter's gradient with the fast path (the fused CPU scan,
  a chunked kernel, mamba-ssm or fla on a GPU) against `kernels.reference_paths()`, where every mixer
  runs the sequential recurrence as written or transformers' PyTorch path.

The models are built from the study's configs (built-in ones at most CHECK_LAYERS deep, every model with
at most CHECK_VOCAB tokens), with every weight matrix perturbed: RWKV's and GPT-2's
initialisations zero or shrink output projections, and a freshly built model whose outputs barely
depend on the context would let a lost state pass. Pure PyTorch, no Ray: the runner calls it on the
driver, or on a GPU worker for a GPU study.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from rayb import threads
from rayb.models import kernels
from rayb.models.registry import build_model, get_arch, is_import_path

if TYPE_CHECKING:
    from rayb.study import Study

DECODING, FAST_PATH = "decoding", "fast path"
# Relative error, max|Δ| / max|reference|, allowed per compute dtype. fp32 paths measured here agree to
# about 1e-6 (rayb's zoo, 2026-11); 1e-4 leaves room for longer sums on bigger models. bf16 keeps 8 bits
# of mantissa (2^-8 ≈ 4e-3 per rounding); a few roundings deep, 5e-2 still separates a lost state,
# which moves logits by their own size.
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2}
PROMPT_TOKENS, DECODED_TOKENS, BATCH = 40, 6, 2
# Built-in models are checked at their width but at most this deep, with at most this vocabulary: a path's
# numerics are the same in every layer, and a study's 1B-parameter model would otherwise cost gigabytes
# and minutes on the driver.
CHECK_LAYERS, CHECK_VOCAB = 2, 1024
FAST_PATH_TOKENS = 48


@dataclass(frozen=True)
class CheckResult:
    model: str  # the study's label
    check: str  # DECODING or FAST_PATH
    path: str  # what was compared with what
    device: str
    dtype: str
    error: float | None  # max relative error; None where there was nothing to compare
    tolerance: float | None
    seconds: float
    note: str = ""  # why nothing was compared

    @property
    def failed(self) -> bool:
        return self.error is not None and not self.error <= self.tolerance  # NaN fails

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.error is None:
            return f"{self.model}: {self.check} not checked ({self.note})"
        return (
            f"{self.model}: {self.check} ({self.path}, {self.device} {self.dtype}): relative error "
            f"{self.error:.2g} {'>' if self.failed else '≤'} tolerance {self.tolerance:.0e}"
        )


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max|got - want| / max|want| (NaN where either holds one). In float32: a difference of two float32
    values is exact to 6e-8 of itself, and the gradients of a wide model run to 1e8 elements, whose
    float64 copies and absolute values cost seconds and gigabytes on the driver."""
    got, want = got.float(), want.float()
    scale = _largest_magnitude(want)
    return _largest_magnitude(got - want) / (scale if scale > 0 else 1.0)


def _largest_magnitude(x: torch.Tensor) -> float:
    low, high = torch.aminmax(x)  # no |x| copy
    return max(-low.item(), high.item())


def perturb(model: nn.Module, seed: int) -> nn.Module:
    """Every weight matrix plus noise of its fan-in's scale, so every path carries signal."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.is_floating_point():
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype) / math.sqrt(p.shape[-1])
                p.add_(noise.to(p.device))
    return model


@contextmanager
def _timed() -> Iterator[list[float]]:
    box = [time.perf_counter()]
    yield box
    box[0] = time.perf_counter() - box[0]


def _autocast(device: str, dtype: torch.dtype):
    return torch.autocast(device, dtype=dtype) if dtype != torch.float32 else nullcontext()


def check_decoding(
    label: str, model: nn.Module, vocab_size: int, seq_len: int, device: str, dtype=torch.float32
) -> CheckResult:
    """Decoder.prefill + Decoder.step against one forward pass over the same tokens."""
    from rayb.eval.decoding import Decoder

    decoder = Decoder(model)
    dtype_name = str(dtype).removeprefix("torch.")
    if decoder.memory == "recompute":  # it runs the full forward itself: nothing to disagree with
        return CheckResult(label, DECODING, "recompute", device, dtype_name, None, None, 0.0,
                           "decoding recomputes the whole prefix")  # fmt: skip
    steps = min(DECODED_TOKENS, seq_len - 1)
    prompt = min(PROMPT_TOKENS, seq_len - steps)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (BATCH, prompt + steps), generator=generator).to(device)
    with _timed() as seconds, torch.no_grad(), _autocast(device, dtype):
        full = model(ids).logits[:, prompt - 1 :].float()
        decoded = [decoder.prefill(ids[:, :prompt])]
        decoded += [decoder.step(ids[:, t]) for t in range(prompt, prompt + steps)]
    error = relative_error(torch.stack(decoded[: full.shape[1]], dim=1), full)
    path = f"{decoder.memory} ({type(decoder._carry).__name__}) vs full forward"
    return CheckResult(label, DECODING, path, device, dtype_name, error, TOLERANCE[dtype_name], seconds[0])


def check_fast_path(
    label: str, model: nn.Module, arch: str, vocab_size: int, seq_len: int, device: str, dtype=torch.float32
) -> CheckResult:
    """Logits and gradients with the architecture's fast path against its reference path."""
    spec = get_arch(arch)
    dtype_name = str(dtype).removeprefix("torch.")
    if not spec.reference:
        return CheckResult(label, FAST_PATH, "", device, dtype_name, None, None, 0.0,
                           "the architecture declares no fast path")  # fmt: skip
    fast = kernels.describe(spec.kernels("cuda" if device.startswith("cuda") else "cpu"))
    path = f"{'; '.join(fast.values())} vs {spec.reference}"
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab_size, (BATCH, min(FAST_PATH_TOKENS, seq_len)), generator=generator).to(
        device
    )

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with _autocast(device, dtype):
            logits = model(ids).logits.float()
        logits.logsumexp(-1).mean().backward()  # a loss that reaches every logit
        grads = [p.grad.flatten().float() for p in model.parameters() if p.grad is not None]
        return logits.detach(), torch.cat(grads)

    with _timed() as seconds:
        logits, grads = run()
        with kernels.reference_paths():
            ref_logits, ref_grads = run()
    model.zero_grad(set_to_none=True)
    error = max(relative_error(logits, ref_logits), relative_error(grads, ref_grads))
    return CheckResult(label, FAST_PATH, path, device, dtype_name, error, TOLERANCE[dtype_name], seconds[0])


@dataclass(frozen=True)
class ModelToCheck:
    label: str
    arch: str
    config: dict


def import_in_background() -> threading.Thread:
    """Start importing what the checks build models with (transformers' model classes: 3.5 s on 2 cores)
    in a thread: the driver does it while it waits on Ray's start, which leaves a core free, and its
    first trial starts 2 s sooner. Join the thread before importing anything else (threads.py says why)."""
    return threads.import_in_background("transformers.modeling_utils", name="rayb-selfcheck-imports")


def check_models(
    models: list[ModelToCheck],
    vocab_size: int,
    seq_len: int,
    device: str = "cpu",
    train_dtype=torch.float32,
    eval_dtype=torch.float32,
    decoding: bool = True,
) -> list[CheckResult]:
    """Every model's checks: the fast path in the training precision, decoding in the evaluation one
    (`decoding=False` where no suite of the study decodes)."""
    vocab_size = min(vocab_size, CHECK_VOCAB)
    with _transformers_errors_only():
        return [
            result
            for i, m in enumerate(models)
            for result in _check_model(i, m, vocab_size, seq_len, device, train_dtype, eval_dtype, decoding)
        ]


@contextmanager
def _transformers_errors_only() -> Iterator[None]:
    """transformers warns on CPU that mamba-ssm is missing, though rayb runs its own scan there: keep the
    console to what the checks find."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _check_model(seed: int, m: ModelToCheck, vocab_size: int, seq_len: int, device: str, train_dtype,
                 eval_dtype, decoding: bool) -> list[CheckResult]:  # fmt: skip
    try:
        torch.manual_seed(seed)
        model = perturb(build_model(m.arch, m.config, vocab_size, seq_len), seed=seed).to(device)
        model.train()  # the mode trials train in (transformers' Mamba picks its training kernel by it)
        results = [check_fast_path(m.label, model, m.arch, vocab_size, seq_len, device, train_dtype)]
        if decoding:
            results.append(check_decoding(m.label, model.eval(), vocab_size, seq_len, device, eval_dtype))
        return results
    except Exception as exc:  # noqa: BLE001  a model that cannot run fails its own trials, not the study
        note = f"the check raised {type(exc).__name__}: {exc}"
        return [CheckResult(m.label, "build", "", device, "", None, None, 0.0, note)]


def study_models(study: Study, vocab_size: int) -> list[ModelToCheck]:
    """The study's trained models, each with its config as it trains on the study's device (built-in
    architectures at most CHECK_LAYERS deep)."""
    seq_len, device = study.data.seq_len, study.train.device
    models = []
    for m in study.trained_models:
        config = m.resolve(vocab_size, seq_len, device)
        if not is_import_path(m.architecture):
            config = config | {"n_layer": min(config.get("n_layer", CHECK_LAYERS), CHECK_LAYERS)}
        models.append(ModelToCheck(m.label, m.architecture, config))
    return models


def study_dtypes(study: Study) -> tuple[torch.dtype, torch.dtype]:
    """(training, evaluation) compute dtypes: bf16 autocast where the study trains in bf16; evaluation
    runs in fp32 on every device."""
    return (torch.float32 if study.train.resolved_precision == "fp32" else torch.bfloat16), torch.float32


def check_study(study: Study, vocab_size: int, dtypes: tuple[torch.dtype, torch.dtype] | None = None,
                check: Callable[..., list[CheckResult]] | None = None) -> list[CheckResult]:  # fmt: skip
    """The checks of every model the study trains: on this CPU by default, in fp32 unless `dtypes` says
    otherwise; `check` runs them elsewhere (a GPU worker) with check_models' arguments after `device`."""
    models, seq_len, decoding = (
        study_models(study, vocab_size),
        study.data.seq_len,
        bool(study.decoding_suites),
    )
    train_dtype, eval_dtype = dtypes or (torch.float32, torch.float32)
    if check is None:
        return check_models(models, vocab_size, seq_len, "cpu", train_dtype, eval_dtype, decoding)
    return check(models, vocab_size, seq_len, train_dtype, eval_dtype, decoding)


def stop_reason(study: Study, results: list[CheckResult], versions: dict[str, str]) -> str | None:
    """Why the study must stop: the failed checks the study file does not override, or None."""
    failed = [r for r in results if r.failed and not study.checks.allowed(r.model, r.check)]
    return failure_message(failed, versions) if failed else None


def records(results: list[CheckResult]) -> list[dict]:
    """The checks as provenance and results.json keep them; `overridden` marks a failure run anyway."""
    return [r.to_dict() | {"overridden": r.failed} for r in results]


def failure_message(failed: list[CheckResult], versions: dict[str, str]) -> str:
    """Why a study stops: each failed check, the installed versions, and the override."""
    lines = [r.describe() for r in failed]
    installed = ", ".join(f"{k} {versions[k]}" for k in ("torch", "transformers", "rayb") if k in versions)
    overrides = sorted({f"checks.allow_{r.check.replace(' ', '_')}_mismatch: [{r.model}]" for r in failed})
    return (
        "self-checks failed before training: "
        + "; ".join(lines)
        + f" (installed: {installed}). A decoder that disagrees with the forward pass gives wrong speed "
        "and generation scores; a fast path that disagrees with its reference trains a different model. "
        "Fix the model or install rayb's tested set (rayb/constraints.txt); to run anyway, set "
        + " and ".join(overrides)
        + " in the study file (the report then marks every affected score)"
    )
