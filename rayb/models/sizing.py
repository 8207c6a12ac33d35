"""Size matching: each architecture's shape family, and the member of it nearest a parameter target, with
its inner width (or state size) tuned to land on the target.

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
1. The member: of the two members around the target, the nearest at its defaults; the other
   one only when the nearest cannot reach ±2% in step 2 and the other can. Both rules move to larger
   members as the target grows, so d_model and n_layer still never shrink.
2. The fine knobs: if that member misses ±2%, its `Architecture.knobs` turn, one at a time in order until
   the count is within ±2%, each to the value in its band, in its steps, whose count lands nearest the
   target. The feed-forward width (d_ff for GPT-2, Pythia, Llama and Gated DeltaNet, d_ffn for RWKV-6)
   moves in multiples of 32 within ±30% of its default. transformers' Mamba and Mamba-2 take their inner
   width only as an integer `expand` × d_model (and a saved checkpoint is rebuilt from that), so they turn
   the state size, d_state, from half to twice its default, and Mamba, whose d_state moves a layer little,
   then its Δ rank, time_step_rank, from half to twice its default. d_model, n_layer and the heads stay the
   family's. Within ±2% at the defaults, the defaults stay.
Where even the bands cannot reach ±2% (one or two layers, where a layer is a third of the model; Mamba and
Mamba-2 where the embedding is most of a small total), the match says so (`Match.note`, with both
neighbours) instead of leaving the family. Keys the caller pins (`fixed`, e.g. {"d_state": 16},
{"n_layer": 6} or {"d_ff": 1024}) stay; pinning n_layer or d_model walks the other one alone, and a pinned
knob does not turn.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, NoReturn

from rayb.models.accounting import Cost
from rayb.models.registry import Architecture, Knob, configure, get_arch

By = Literal["total", "non-embedding"]
WIDTH_STEP = 32  # the smallest usual head size: widths stay multiples of it
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
    note: str = ""  # set when no member of the family is within the tolerance: what the nearest miss by

    @property
    def params(self) -> int:
        return self.cost.total_params if self.by == "total" else self.cost.non_embedding_params

    @property
    def error(self) -> float:
        return self.params / self.target - 1

    @property
    def shape(self) -> str:
        knobs = [k.key for k in get_arch(self.arch).knobs if k.key in self.config]
        turned = "".join(f", {key} {self.config[key]}" for key in knobs)
        return f"d_model {self.config['d_model']} × {self.config['n_layer']} layers{turned}"


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
    """The member of `arch`'s family nearest `target` parameters, its knobs turned to meet the tolerance;
    its `note` says when even that misses. SizeError when the target lies outside the family."""
    spec = get_arch(arch)
    if spec.shape is None or spec.cost is None:
        raise SizeError(
            f"'{arch}' has no shape rules to solve a size with; give its config explicitly "
            "(register it with `shape=` and `cost=` to make it matchable)"
        )
    fixed = dict(fixed or {})
    below, above = _bracket(spec, target, by, vocab_size, seq_len, fixed)
    members = sorted((m for m in (below, above) if m), key=_distance)  # nearest at the defaults first
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
    """`member` as it is when within the tolerance; otherwise with its unpinned knobs turned in order, each
    held where it landed nearest the target, until one brings the count within the tolerance."""
    for knob in spec.knobs:
        if abs(member.error) <= tolerance:
            break
        if knob.key not in fixed:
            member = _turn(spec, member, knob, vocab_size, seq_len)
    return member


def _turn(spec: Architecture, member: Match, knob: Knob, vocab_size, seq_len) -> Match:
    """`member` with `knob` at the value, a multiple of its step within its band, whose count lands nearest
    the target; `member` itself where no value lands nearer."""
    d, n_layer = member.config["d_model"], member.config["n_layer"]
    default, step = knob.default(d), knob.step
    low = math.ceil(default * knob.band[0] / step) * step
    high = math.floor(default * knob.band[1] / step) * step

    def at(value: int) -> Match | None:
        config = member.config | {knob.key: value}  # the knobs turned before this one stay where they landed
        return _evaluate(spec, d, n_layer, member.target, member.by, vocab_size, seq_len, config)

    ends = at(low), at(high)
    if None in ends or ends[0].params == ends[1].params:
        return member
    # Counts are affine in each knob: the two ends give the value nearest the target.
    slope = (ends[1].params - ends[0].params) / (high - low)
    best = low + round((member.target - ends[0].params) / slope / step) * step
    around = {min(max(v, low), high) for v in (best - step, best, best + step)} - {default}
    return min([member, *(m for m in map(at, around) if m)], key=_distance)


def _band_words(spec: Architecture, fixed: dict[str, Any]) -> str:
    if not spec.knobs:
        return f" ({spec.name} has no inner width or state size to fine-tune a count with)"
    free = [knob for knob in spec.knobs if knob.key not in fixed]
    return ", even with " + " and ".join(map(_band, free)) if free else ""


def _band(knob: Knob) -> str:
    low, high = knob.band
    if math.isclose(1 - low, high - 1):
        return f"{knob.key} within ±{high - 1:.0%} of its default"
    return f"{knob.key} from {low:g}× to {high:g}× its default"


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
    """The target lies below the smallest member, even with its knobs turned down: say what takes the room."""
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
