"""Model FLOPs utilisation (MFU) by model size: measured where `bench/gpu_check.py` measured it, assumed
otherwise, and always said which.

A small model leaves most of a big GPU idle: its matrix products are too small to fill the GPU, and the
launches, norms and the loss between them take as long as the products. Pricing a 3.5M-parameter trial
at a 1B model's MFU understates its GPU-hours several times over. So `rayb plan` prices each model at
its own MFU, looked up by its training FLOPs per token (a model's size as the GPU sees it: the matrix
products, the output head included, the embedding lookup not).

The measurements file (JSON), written by `bench/gpu_check.py` and read by `rayb plan --measured FILE`
(default: `default_path()` where it has measured the plan's GPU, else rayb's own, `SHIPPED`):

    {"format": "rayb-measured-mfu", "version": 1, "measurements": [
      {"gpu": "h100", "device": "NVIDIA H100 80GB HBM3", "date": "2025-06-01", "model": "gpt2-3.5m",
       "train_flops_per_token": 1.11e8, "trials_per_gpu": 1, "mfu": 0.12, "precision": "bf16"}, ...]}

- `gpu`: the `rayb plan --gpu` name the device matched (a100, h100, ...); `rayb plan` reads only the
  measurements of the GPU it prices.
- `trials_per_gpu`: 1 for a trial alone on a whole GPU (or one GPU per worker); k for k trials sharing
  one GPU (`train.gpus_per_trial: 1/k`), whose `mfu` is the whole GPU's: all k trials' FLOPs together.
- `mfu`: training FLOPs per second (rayb's accounting, models/accounting.py) over the GPU's bf16 peak,
  at the micro-batch gpu_check ran.

A model between two measured sizes takes their MFUs interpolated in log(FLOPs per token); one within
`NEAR`× of the smallest or largest measured size takes that measurement. Anything else is assumed
(`assumed_mfu`): that curve is an assumption, not a measurement.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rayb.files import write_atomic

FORMAT, VERSION = "rayb-measured-mfu", 1

# ASSUMED, not measured. Large dense models trained in bf16 with fused kernels reach 40-55% of a GPU's
# peak (PaLM reports 46% at 540B parameters, Megatron-LM 40-56% from 22B to 1T); rayb's eager DeepSpeed
# path is taken to reach 40% from 1B parameters up. Below that MFU falls with size: a model
# of N parameters does about 6N training FLOPs per token, and the anchors below give ~26% at GPT-2
# small (125M), ~14% at a 3.5M-non-embedding GPT-2 (whose 50K-token head is most of its FLOPs) and 4%
# at 1M. Each anchor is (training FLOPs per token, fraction of the ceiling); log-linear between them.
# Measured against it on an H200 (bench/gpu_check.py, 2026-11-27), eager through rayb: GPT-2 124M at 13%,
# half the 26% assumed (a bare loop reached 28% only under torch.compile); gpt2-3.5m at micro-batch 4
# at 2.8%, a fifth of the 14% assumed. Both are one GPU, whose bf16 peak is three times an A100's: the
# curve stays an assumption until gpu_check has run on the GPU a plan prices.
ASSUMED_CEILING = 0.4
ASSUMED_CURVE = ((6e6, 0.1), (6e7, 0.25), (6e8, 0.6), (6e9, 1.0))
# Measured at two points, assumed elsewhere: k small trials sharing a GPU together reach k**PACKING_EXPONENT
# times one alone's MFU (never more than ASSUMED_CEILING). Ten seeds of gpt2-3.5m at micro-batch 4,
# against one alone: on an H200 (2026-11-27) 362,115 tokens/s together against 247,188 (1.46×, 10**0.166);
# on an H100 (2026-11-28) 321,372 against 248,589 (1.29×, 10**0.112). The exponent is their geometric
# mean, far below the √k assumed here before. Whether CUDA MPS (the processes' kernels at once instead
# of in turns) raises it is not settled: on the H100 under MPS the first of the ten finished 91 s after
# its process group formed, against 106 s without, in one run cut short before the other nine finished.
# Packing still saves GPU-hours over a whole GPU per small trial, just fewer.
PACKING_EXPONENT = 0.139
NEAR = 1.5  # a measurement stands for sizes within this factor of it, beyond the measured range


@dataclass(frozen=True)
class Measurement:
    gpu: str
    device: str
    date: str
    model: str
    train_flops_per_token: float
    trials_per_gpu: int
    mfu: float
    precision: str


@dataclass(frozen=True)
class Mfu:
    """The MFU a model is priced at, and where that number comes from."""

    value: float
    source: str  # "measured", "assumed", "given (--mfu)", or how they combine

    def describe(self) -> str:
        return f"{self.value:.0%} {self.source}"


# rayb's own measurements, from bench/gpu_check.py's runs on the GPUs this project was lent (README's GPU
# section gives each run): a plan prices by them where the user has measured nothing on that GPU.
SHIPPED = Path(__file__).with_name("measured_mfu.json")


def default_path() -> Path:
    """Where gpu_check writes its measurements and `rayb plan` looks for them unless told."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "rayb" / "measured_mfu.json"


def find_measurements(path: Path | None, gpu: str) -> tuple[Path, list[Measurement]]:
    """(the file, its measurements of `gpu`) that a plan prices by: the given file; else the default one
    where it measured this GPU; else rayb's own. OSError or ValueError for a file that cannot be read."""
    if path is not None:
        return path, read_measurements(path, gpu)
    users = default_path()
    if users.is_file() and (measured := read_measurements(users, gpu)):
        return users, measured
    return SHIPPED, read_measurements(SHIPPED, gpu)


def read_measurements(path: Path, gpu: str) -> list[Measurement]:
    """The measurements of `gpu` in a measurements file; ValueError for a file of another format."""
    return [m for m in _read_all(path) if m.gpu == gpu.lower()]


def record_measurements(path: Path, new: Iterable[Measurement]) -> None:
    """Add `new` to the file, each replacing an earlier measurement of the same GPU, model and packing."""
    new = list(new)
    replaced = {(m.gpu, m.model, m.trials_per_gpu) for m in new}
    kept = [
        m
        for m in (_read_all(path) if path.exists() else [])
        if (m.gpu, m.model, m.trials_per_gpu) not in replaced
    ]
    document = {"format": FORMAT, "version": VERSION, "measurements": [asdict(m) for m in kept + new]}
    write_atomic(path, (json.dumps(document, indent=2) + "\n").encode())


def _read_all(path: Path) -> list[Measurement]:
    document = json.loads(path.read_text())
    header = [document.get("format"), document.get("version")] if isinstance(document, dict) else None
    if header != [FORMAT, VERSION]:
        raise ValueError(
            f"{path} is not a {FORMAT} file of version {VERSION} (bench/gpu_check.py writes one)"
        )
    names = {f.name for f in fields(Measurement)}
    try:
        return [
            Measurement(**{k: v for k, v in entry.items() if k in names})
            for entry in document["measurements"]
        ]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: a measurement lacks a field ({exc})") from None


def assumed_mfu(train_flops_per_token: float) -> float:
    """ASSUMED_CURVE at this size, as an MFU: the assumption the module docstring states."""
    points = [(flops, fraction * ASSUMED_CEILING) for flops, fraction in ASSUMED_CURVE]
    nearest = min(max(train_flops_per_token, points[0][0]), points[-1][0])  # flat beyond the anchors
    return _interpolate(points, nearest)


def assumed_packing_gain(trials_per_gpu: float) -> float:
    """How much more k trials sharing a GPU do together than one alone, as PACKING_EXPONENT assumes."""
    return trials_per_gpu**PACKING_EXPONENT


def model_mfu(train_flops_per_token: float, trials_per_gpu: float, measured: Sequence[Measurement]) -> Mfu:
    """The MFU of a GPU training trials of this size, `trials_per_gpu` at once (1 for one or more GPUs per
    trial): measured at that packing where there is a measurement near this size; else the trial's MFU
    alone (measured or assumed) times the assumed packing gain."""
    if (value := _measured(train_flops_per_token, trials_per_gpu, measured)) is not None:
        return Mfu(value, "measured")
    alone = _measured(train_flops_per_token, 1, measured)
    base = alone if alone is not None else assumed_mfu(train_flops_per_token)
    if trials_per_gpu <= 1:
        return Mfu(base, "assumed")  # a measurement alone would have been found above
    gain = assumed_packing_gain(trials_per_gpu)
    packed = max(base, min(ASSUMED_CEILING, base * gain))
    return Mfu(packed, "assumed" if alone is None else f"measured alone, ×{gain:.1f} assumed")


def _measured(flops: float, trials_per_gpu: float, measured: Sequence[Measurement]) -> float | None:
    points = sorted((m.train_flops_per_token, m.mfu) for m in measured if m.trials_per_gpu == trials_per_gpu)
    if not points or not points[0][0] / NEAR <= flops <= points[-1][0] * NEAR:
        return None
    return _interpolate(points, min(max(flops, points[0][0]), points[-1][0]))


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """y at x, linear in log(x) between (x, y) points sorted by x; x within their range."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1 and x0 < x1:
            return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)
    return next(y for x0, y in points if x0 == x)  # x is a point: a single one, or two at one size


def describe_sources(measured: Sequence[Measurement], path: Path, gpu: str) -> list[str]:
    """What 'measured' and 'assumed' stand for in a plan."""
    shipped = path == SHIPPED
    if measured:
        where = f"rayb's own, {path}" if shipped else str(path)
        runs = sorted({f"{m.device} on {m.date}" for m in measured})
        sizes = ", ".join(f"{m.model} {m.mfu:.1%}" + (f" ({m.trials_per_gpu} to a GPU)" if m.trials_per_gpu > 1 else "")
                          for m in sorted(measured, key=lambda m: (m.trials_per_gpu, m.train_flops_per_token)))  # fmt: skip
        found = f"by bench/gpu_check.py on {'; '.join(runs)} ({where}): {sizes}"
    else:
        where = f"{default_path()} or rayb's own ({path})" if shipped else str(path)
        found = (
            f"none for {gpu} in {where}; `python bench/gpu_check.py` on one writes them to {default_path()}"
        )
    return [
        f"measured: {found}",
        f"assumed (rayb/mfu.py; an assumption, not a measurement): rising with training FLOPs per token from "
        f"{assumed_mfu(6e6):.0%} at 1M parameters to {ASSUMED_CEILING:.0%} from 1B up; k trials sharing a GPU "
        f"together k^{PACKING_EXPONENT:g}× one alone ({assumed_packing_gain(10):.1f}× for ten), up to {ASSUMED_CEILING:.0%}",
    ]
