"""Size matching: each architecture's shape family, and the member of it nearest a parameter target.

The family. Every registered architecture has shape rules, `shape(d_model, n_layer) -> config` (heads,
FFN width, state size follow from the two), a closed-form cost, and a preferred d_model/n_layer ratio,
its `aspect` (64 for the transformers, GPT-2 small's 768/12; 32 for Mamba, whose layers are half a
transformer block). Its family is one sequence of shapes grown from d_model 32 × 1 layer, one step at a
time: a layer more, or WIDTH_STEP more width, whichever leaves d_model/n_layer nearer the aspect (a tie
adds the layer). So widths are multiples of 32 (heads 32 or 64 wide, as the shape rules pick), the ratio
stays within one step of the aspect, and depth and width never shrink as the target grows: every size of
an architecture is the same model family, which is what a scaling-law fit over them assumes.

The match. A target gets the family member whose count is nearest it in ratio. Consecutive members differ
by about 1/n_layer in parameters (25% at 4 layers, 4% at 25), so below a few hundred million parameters
the nearest member can miss ±2%: the match then says so (`Match.note`, with both neighbours) instead of
leaving the family for a shape that hits the number. No rule can do both: a sequence whose width and
depth never shrink moves one step at a time, and one step is that large. Keys the caller pins (`fixed`,
e.g. {"d_state": 16} or {"n_layer": 6}) stay; pinning n_layer or d_model walks the other one alone.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from rayb.models.accounting import Cost
from rayb.models.registry import Architecture, configure, get_arch

By = Literal["total", "non-embedding"]
WIDTH_STEP = 32  # the smallest usual head size: widths stay multiples of it
MAX_WIDTH = 16384
MAX_LAYERS = 256
TOLERANCE = 0.02
# Models compared with each other differ by more than this and the comparison is flagged.
COMPARABLE_RATIO = {"total parameters": 1.25, "training FLOPs per token": 1.25, "depth": 2.0}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


class SizeError(ValueError):
    """A size that cannot be met; the message says why."""


def parse_size(size: str | int | float) -> int:
    """'30M' → 30_000_000, '3.5m' → 3_500_000, '1.3B', '760000', 760000."""
    if isinstance(size, int | float) and not isinstance(size, bool):
        value = int(size)
    else:
        found = _SIZE.match(str(size))
        if not found:
            raise SizeError(f"'{size}' is not a size; write a number with an optional K/M/B suffix, e.g. 30M")
        value = round(float(found.group(1)) * _SCALE[found.group(2).upper()])
    if value <= 0:
        raise SizeError(f"size must be positive, got {size}")
    return value


@dataclass(frozen=True)
class Match:
    arch: str
    config: dict[str, Any]
    cost: Cost
    target: int
    by: By
    note: str = ""  # set when no member of the family is within the tolerance: what the nearest miss by

    @property
    def params(self) -> int:
        return self.cost.total_params if self.by == "total" else self.cost.non_embedding_params

    @property
    def error(self) -> float:
        return self.params / self.target - 1

    @property
    def shape(self) -> str:
        return f"d_model {self.config['d_model']} × {self.config['n_layer']} layers"


def family(spec: Architecture, fixed: dict[str, Any]) -> Iterator[tuple[int, int]]:
    """The architecture's shapes (d_model, n_layer), smallest first; see the module docstring."""
    d, n_layer = fixed.get("d_model", WIDTH_STEP), fixed.get("n_layer", 1)
    while d <= MAX_WIDTH and n_layer <= MAX_LAYERS:
        yield d, n_layer
        if "d_model" in fixed and "n_layer" in fixed:
            return
        wider = abs(math.log((d + WIDTH_STEP) / n_layer / spec.aspect))
        deeper = abs(math.log(d / (n_layer + 1) / spec.aspect))
        if "n_layer" in fixed or ("d_model" not in fixed and wider < deeper):
            d += WIDTH_STEP
        else:
            n_layer += 1


def match(
    arch: str,
    target: int,
    by: By = "total",
    vocab_size: int = 50257,
    seq_len: int = 1024,
    fixed: dict[str, Any] | None = None,
    tolerance: float = TOLERANCE,
) -> Match:
    """The member of `arch`'s family nearest `target` parameters; its `note` says when it misses the
    tolerance. SizeError when the target lies outside the family."""
    spec = get_arch(arch)
    if spec.shape is None or spec.cost is None:
        raise SizeError(
            f"'{arch}' has no shape rules to solve a size with; give its config explicitly "
            "(register it with `shape=` and `cost=` to make it matchable)"
        )
    fixed = dict(fixed or {})
    below, above = _bracket(spec, target, by, vocab_size, seq_len, fixed)
    if below is None:
        _too_small(spec, above, fixed, vocab_size, tolerance)
    if above is None and below.error < -tolerance:
        raise SizeError(
            f"{target:,} {by} parameters is beyond {arch}'s family (d_model ≤ {MAX_WIDTH}, n_layer ≤ "
            f"{MAX_LAYERS}{', fixed ' + str(fixed) if fixed else ''}): its largest shape, {below.shape}, "
            f"has {below.params:,}"
        )
    nearest = min((m for m in (below, above) if m), key=lambda m: abs(math.log(m.params / target)))
    if abs(nearest.error) <= tolerance:
        return nearest
    neighbours = " and ".join(f"{m.shape} ({m.error:+.1%})" for m in (below, above) if m)
    return replace(
        nearest,
        note=f"no shape of {arch}'s family{' with ' + str(fixed) if fixed else ''} is within ±{tolerance:.0%} "
        f"of {target:,} {by} parameters; the nearest are {neighbours}. Pin d_model and n_layer in the "
        "config for another count",
    )


def _bracket(spec, target, by, vocab_size, seq_len, fixed) -> tuple[Match | None, Match | None]:
    """The family's largest member at or below the target, and its smallest above (None: there is none)."""
    below = None
    for d, n_layer in family(spec, fixed):
        found = _evaluate(spec, d, n_layer, target, by, vocab_size, seq_len, fixed)
        if found is None:  # a shape the rules reject (a pinned key that does not fit this width)
            continue
        if found.params > target:
            return below, found
        below = found
    if below is None:
        raise SizeError(f"{spec.name} rejects every shape of its family with {fixed}; check the fixed keys")
    return below, None


def _too_small(spec, smallest: Match, fixed, vocab_size, tolerance) -> None:
    """The target lies below the smallest member: fine within the tolerance, else say what takes the room."""
    if smallest.error <= tolerance:
        return
    cost, target, by = smallest.cost, smallest.target, smallest.by
    why = (
        f"{cost.embedding_params:,} of them are the embedding (vocabulary {vocab_size:,} × d_model "
        f"{smallest.config['d_model']}); use a smaller vocabulary or --by non-embedding"
        if by == "total" and cost.embedding_params > target
        else "raise the target or unpin fixed keys"
    )
    raise SizeError(
        f"{target:,} {by} parameters is too small for {spec.name}: its smallest shape "
        f"({smallest.shape}{', fixed ' + str(fixed) if fixed else ''}) already has {smallest.params:,}; {why}"
    )


def _config(spec: Architecture, d: int, n_layer: int, fixed: dict[str, Any]) -> dict[str, Any]:
    return spec.shape(d, n_layer) | fixed


@functools.lru_cache(maxsize=1 << 16)
def _cost(arch: str, config: tuple, vocab_size: int, seq_len: int) -> Cost | None:
    try:
        cfg = configure(arch, dict(config), vocab_size, seq_len)
    except ValueError:  # a shape the architecture's own rules reject
        return None
    return get_arch(arch).cost(cfg, seq_len)


def _evaluate(spec, d, n_layer, target, by, vocab_size, seq_len, fixed) -> Match | None:
    config = _config(spec, d, n_layer, fixed)
    cost = _cost(spec.name, tuple(sorted(config.items())), vocab_size, seq_len)
    return None if cost is None else Match(spec.name, config, cost, target, by)


def comparability_warnings(
    models: Sequence[tuple[str, int | None, float | None, int | None]],
    matched_by: str,
    reference: str | None = None,
) -> list[str]:
    """What makes models compared with each other unlike in size, one line per pair: total parameters or
    training FLOPs per token apart by more than 25%, or depth by more than 2× (COMPARABLE_RATIO).

    `models` holds (label, params_total, train_flops_per_token, n_layer); a None (a pretrained reference,
    a user's model without n_layer) is not compared. Each model is compared with `reference`, or, without
    one, every pair. `matched_by` says which count the sizes were matched on ("non-embedding parameters"),
    so the warning reads as what the match left unequal."""
    counts = {label: dict(zip(COMPARABLE_RATIO, numbers, strict=True)) for label, *numbers in models}
    if reference in counts:
        pairs = [(reference, other) for other in counts if other != reference]
    else:
        pairs = [(a, b) for i, a in enumerate(counts) for b in list(counts)[i + 1 :]]
    warnings = []
    for first, second in pairs:
        differs = [
            line
            for name, limit in COMPARABLE_RATIO.items()
            if (line := _difference(name, counts[second][name], counts[first][name], limit))
        ]
        if differs:
            warnings.append(
                f"{second} vs {first}, matched by {matched_by}, still differ in " + "; ".join(differs)
            )
    return warnings


def _difference(name: str, value: float | None, other: float | None, limit: float) -> str | None:
    if value is None or other is None or min(value, other) <= 0:
        return None
    ratio = max(value, other) / min(value, other)
    if ratio <= limit:
        return None
    shown = f"{value:.3g} vs {other:.3g}" if "FLOPs" in name else f"{value:,} vs {other:,}"
    shown += " layers" if name == "depth" else ""
    return f"{name} {shown} ({ratio:.2f}×, more than {limit:g}×)"
