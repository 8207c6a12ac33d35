"""Size matching: solve an architecture's width and depth for a parameter target.

Every registered architecture has shape rules, `shape(d_model, n_layer) -> config` (heads, FFN width,
state size follow from the two), and a closed-form cost. Parameters are affine in depth at a fixed
width (a multiple of 16, 32 or 64 as it grows) two cost evaluations give the depth that lands nearest the
target; among the shapes within tolerance the one closest to the architecture's preferred
width/depth ratio wins. Keys the caller pins (`fixed`, e.g. {"d_state": 16} or {"n_layer": 6}) stay.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from rayb.models.accounting import Cost
from rayb.models.registry import Architecture, configure, get_arch

By = Literal["total", "non-embedding"]
MAX_WIDTH = 16384
MAX_LAYERS = 256
TOLERANCE = 0.02

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

    @property
    def params(self) -> int:
        return self.cost.total_params if self.by == "total" else self.cost.non_embedding_params

    @property
    def error(self) -> float:
        return self.params / self.target - 1


def match(
    arch: str,
    target: int,
    by: By = "total",
    vocab_size: int = 50257,
    seq_len: int = 1024,
    fixed: dict[str, Any] | None = None,
    tolerance: float = TOLERANCE,
) -> Match:
    spec = get_arch(arch)
    if spec.shape is None or spec.cost is None:
        raise SizeError(
            f"'{arch}' has no shape rules to solve a size with; give its config explicitly "
            "(register it with `shape=` and `cost=` to make it matchable)"
        )
    fixed = dict(fixed or {})
    widths = _widths(fixed)
    _check_reachable(spec, target, by, vocab_size, seq_len, fixed, widths[0])

    candidates: list[Match] = []
    closest: Match | None = None
    for d in widths:
        shallowest = _evaluate(spec, d, fixed.get("n_layer", 1), target, by, vocab_size, seq_len, fixed)
        if shallowest and shallowest.params > target * (1 + tolerance):
            break  # wider only grows
        for n_layer in _depths(spec, d, target, by, vocab_size, seq_len, fixed):
            found = _evaluate(spec, d, n_layer, target, by, vocab_size, seq_len, fixed)
            if found is None:
                continue
            if abs(found.error) <= tolerance:
                candidates.append(found)
            if closest is None or abs(found.error) < abs(closest.error):
                closest = found
    if not candidates:
        nearest = (
            f"; the closest is {closest.config} with {closest.params:,} ({closest.error:+.1%})"
            if closest
            else ""
        )
        raise SizeError(
            f"no {arch} shape under its shape rules (d_model a multiple of 16"
            f"{', fixed ' + str(fixed) if fixed else ''}) is within ±{tolerance:.0%} of {target:,} {by} "
            f"parameters{nearest}"
        )

    def score(m: Match) -> tuple[float, float]:
        ratio = m.config["d_model"] / m.config["n_layer"]
        return abs(math.log(ratio / spec.aspect)), abs(m.error)

    return min(candidates, key=score)


def _widths(fixed: dict[str, Any]) -> list[int]:
    if "d_model" in fixed:
        return [fixed["d_model"]]
    # Multiples of 16 for tiny models (enough shapes to hit ±2% at sensible depths), of 32 up to 512,
    # then of 64, so heads stay 64 wide where it matters.
    return [*range(32, 256, 16), *range(256, 512, 32), *range(512, MAX_WIDTH + 1, 64)]


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


def _depths(spec, d, target, by, vocab_size, seq_len, fixed) -> list[int]:
    """The depths around the one whose count lands nearest the target (counts are affine in depth)."""
    if "n_layer" in fixed:
        return [fixed["n_layer"]]
    one, two = (_evaluate(spec, d, n, target, by, vocab_size, seq_len, fixed) for n in (1, 2))
    if one is None or two is None or two.params <= one.params:
        return []
    best = round((target - one.params) / (two.params - one.params)) + 1
    return [n for n in (best - 1, best, best + 1) if 1 <= n <= MAX_LAYERS]


def _check_reachable(spec, target, by, vocab_size, seq_len, fixed, smallest_width) -> None:
    """The smallest model the rules allow; if even it is too big, say what takes the room."""
    n_layer = fixed.get("n_layer", 1)
    smallest = _evaluate(spec, smallest_width, n_layer, target, by, vocab_size, seq_len, fixed)
    if smallest is None:
        raise SizeError(f"{spec.name} rejects its own smallest shape with {fixed}; check the fixed keys")
    cost, config = smallest.cost, smallest.config
    if smallest.params > target * (1 + TOLERANCE):
        why = (
            f"{cost.embedding_params:,} of them are the embedding (vocabulary {vocab_size:,} × d_model "
            f"{config['d_model']}); use a smaller vocabulary or --by non-embedding"
            if by == "total" and cost.embedding_params > target
            else "raise the target or unpin fixed keys"
        )
        raise SizeError(
            f"{target:,} {by} parameters is too small for {spec.name}: its smallest shape "
            f"(d_model {config['d_model']}, {n_layer} layer(s)) already has {smallest.params:,}; {why}"
        )
