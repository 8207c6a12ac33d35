"""Size matching: each architecture's shape family, and the member of it nearest a parameter target, with
its inner width tuned to land on the target.

The family. Every registered architecture has shape rules, `shape(d_model, n_layer) -> config` (heads,
FFN width, state size follow from the two), a closed-form cost, and a preferred d_model/n_layer ratio,
its `aspect` (64 for the transformers, GPT-2 small's 768/12; 32 for Mamba, whose layers are half a
transformer block). Its family is one sequence of shapes grown from d_model 32 × 1 layer, one step at a
time: a layer more, or WIDTH_STEP more width, whichever leaves d_model/n_layer nearer the aspect (a tie
adds the layer). So widths are multiples of 32 (heads 32 or 64 wide, as the shape rules pick), the ratio
stays within one step of the aspect, and depth and width never shrink as the target grows: every size of
an architecture is the same model family, which is what a scaling-law fit over them assumes.

The match, in two steps. Consecutive members differ by about 1/n_layer in parameters (25% at 4 layers,
4% at 25), too coarse for ±2% below a few hundred million parameters, so:
1. The member: of the two members around the target, the nearest at its default inner width; the other
   one only when the nearest cannot reach ±2% in step 2 and the other can. Both rules move to larger
   members as the target grows, so d_model and n_layer still never shrink.
2. The fine knob: if that member misses ±2%, its feed-forward (or inner) width, `Architecture.inner`
   (d_ff for GPT-2, Pythia, Llama and Gated DeltaNet, d_ffn for RWKV-6), is set to the multiple of 32
   within INNER_BAND (±30%) of its default whose count lands nearest the target. d_model, n_layer and
   the heads stay the family's. Within ±2% at the default, the default stays.
Where even the band cannot reach ±2% (one or two layers, where a layer is a third of the model), or the
architecture has no inner width to tune (transformers' Mamba and Mamba-2 take it only as an integer
`expand` × d_model, and a saved checkpoint is rebuilt from that), the match says so (`Match.note`, with
both neighbours) instead of leaving the family. Keys the caller pins (`fixed`, e.g. {"d_state": 16},
{"n_layer": 6} or {"d_ff": 1024}) stay; pinning n_layer or d_model walks the other one alone, and pinning
the inner width turns the knob off.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, NoReturn

from rayb.models.accounting import Cost
from rayb.models.registry import Architecture, configure, get_arch

By = Literal["total", "non-embedding"]
WIDTH_STEP = 32  # the smallest usual head size: widths stay multiples of it
MAX_WIDTH = 16384
MAX_LAYERS = 256
TOLERANCE = 0.02
INNER_BAND = 0.30  # how far size matching moves an inner width from its default, either way

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
        inner = get_arch(self.arch).inner
        width = f", {inner.key} {self.config[inner.key]}" if inner and inner.key in self.config else ""
        return f"d_model {self.config['d_model']} × {self.config['n_layer']} layers{width}"


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
    """The member of `arch`'s family nearest `target` parameters, its inner width tuned to meet the
    tolerance; its `note` says when even that misses. SizeError when the target lies outside the family."""
    spec = get_arch(arch)
    if spec.shape is None or spec.cost is None:
        raise SizeError(
            f"'{arch}' has no shape rules to solve a size with; give its config explicitly "
            "(register it with `shape=` and `cost=` to make it matchable)"
        )
    fixed = dict(fixed or {})
    below, above = _bracket(spec, target, by, vocab_size, seq_len, fixed)
    members = sorted((m for m in (below, above) if m), key=_distance)  # nearest at the default width first
    tuned = [_tune(spec, m, vocab_size, seq_len, fixed, tolerance) for m in members]
    hit = next((m for m in tuned if abs(m.error) <= tolerance), None)
    if hit is not None:
        return hit
    if below is None:
        _too_small(spec, tuned[0], fixed, vocab_size)
    if above is None:
        raise SizeError(
            f"{target:,} {by} parameters is beyond {arch}'s family (d_model ≤ {MAX_WIDTH}, n_layer ≤ "
            f"{MAX_LAYERS}{', fixed ' + str(fixed) if fixed else ''}): its largest shape, {below.shape}, "
            f"has {tuned[0].params:,}"
        )
    neighbours = " and ".join(f"{m.shape} ({m.error:+.1%})" for m in sorted(tuned, key=lambda m: m.params))
    within = _band_words(spec, fixed)
    return replace(
        min(tuned, key=_distance),
        note=f"no shape of {arch}'s family{' with ' + str(fixed) if fixed else ''} is within ±{tolerance:.0%} "
        f"of {target:,} {by} parameters{within}; the nearest are {neighbours}. Pin d_model and n_layer in "
        "the config for another count",
    )


def _distance(m: Match) -> float:
    return abs(math.log(m.params / m.target))


def _tune(spec: Architecture, member: Match, vocab_size, seq_len, fixed, tolerance) -> Match:
    """`member` as it is when within the tolerance (or without a knob to turn); otherwise with the inner
    width, a multiple of WIDTH_STEP within INNER_BAND of its default, that lands nearest the target."""
    if abs(member.error) <= tolerance or spec.inner is None or spec.inner.key in fixed:
        return member
    d, n_layer, key = member.config["d_model"], member.config["n_layer"], spec.inner.key
    default = spec.inner.default(d)
    low = math.ceil(default * (1 - INNER_BAND) / WIDTH_STEP) * WIDTH_STEP
    high = math.floor(default * (1 + INNER_BAND) / WIDTH_STEP) * WIDTH_STEP

    def at(width: int) -> Match | None:
        return _evaluate(
            spec, d, n_layer, member.target, member.by, vocab_size, seq_len, fixed | {key: width}
        )

    ends = at(low), at(high)
    if None in ends or ends[0].params == ends[1].params:
        return member
    # Counts are affine in the inner width: the two ends give the width nearest the target.
    slope = (ends[1].params - ends[0].params) / (high - low)
    best = low + round((member.target - ends[0].params) / slope / WIDTH_STEP) * WIDTH_STEP
    around = {min(max(w, low), high) for w in (best - WIDTH_STEP, best, best + WIDTH_STEP)} - {default}
    return min([member, *(m for m in map(at, around) if m)], key=_distance)


def _band_words(spec: Architecture, fixed: dict[str, Any]) -> str:
    if spec.inner is None:
        return f" ({spec.name} has no inner width to fine-tune a count with)"
    if spec.inner.key in fixed:
        return ""
    return f", even with {spec.inner.key} within ±{INNER_BAND:.0%} of its default"


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


def _too_small(spec, smallest: Match, fixed, vocab_size) -> NoReturn:
    """The target lies below the smallest member, even with its inner width narrowed: say what takes the room."""
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
