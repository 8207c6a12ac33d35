"""Whether the models a study compares are alike in size, said before training and again in the report.

Size matching (rayb/models/sizing.py) makes one count equal, total or non-embedding parameters; the others
can still differ (an untied output head, a FLOP-heavy mixer, a deep stack of thin layers). Two checks,
one function (`size_warnings`) for `rayb validate`, which counts the planned models, and the report,
which reads the results table:
- a model given by `size:` whose count is more than TOLERANCE from it (its shape family has no shape
  that close: rayb/models/sizing.py says why);
- models compared with each other (the reference and each gate candidate, or every model when the gate
  names none) more than 25% apart in total parameters or training FLOPs per token, or more than 2× in
  depth. Depth is counted in blocks (`Architecture.layers_per_block`): a Mamba layer is one mixer without
  an MLP, about half a transformer block, so Mamba at twice a transformer's layers is equally deep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rayb.models.registry import get_arch
from rayb.models.sizing import TOLERANCE, parse_size
from rayb.models.spec import ModelSpec

# Models compared with each other differ by more than this and the comparison is flagged.
COMPARABLE_RATIO = {"total parameters": 1.25, "training FLOPs per token": 1.25, "depth": 2.0}


@dataclass(frozen=True)
class Counted:
    """One model's counts, from the plan or the results table; None where not known (a pretrained model)."""

    arch: str
    config: dict[str, Any]
    params_total: int | None
    params_non_embedding: int | None
    train_flops_per_token: float | None

    @property
    def layers_per_block(self) -> int:
        try:
            return get_arch(self.arch).layers_per_block
        except ValueError:  # pretrained, or a user's model no longer importable: a layer is a block
            return 1

    def measures(self) -> dict[str, tuple[float, str] | None]:
        """Each of COMPARABLE_RATIO's measures: its value and how it reads; None where not known."""
        total, flops, n_layer = self.params_total, self.train_flops_per_token, self.config.get("n_layer")
        depth = None
        if isinstance(n_layer, int) and not isinstance(n_layer, bool):  # a user's model may have none
            per = self.layers_per_block
            depth = n_layer / per, f"{n_layer} layers" + (f" ({n_layer / per:g} blocks)" if per > 1 else "")
        return {
            "total parameters": (total, f"{total:,}") if total else None,
            "training FLOPs per token": (flops, f"{flops:.3g}") if flops else None,
            "depth": depth,
        }


def size_warnings(
    models: Sequence[ModelSpec],
    counts: Mapping[str, Counted],
    reference: str,
    candidates: Sequence[str] | None,
    flops_budget: float | None,
) -> list[str]:
    """Sized models that miss their size, then compared models unlike in size (see the module docstring).
    `counts` holds each trained model's counts by label."""
    misses = [line for m in models if m.size is not None and (line := _miss(m, counts.get(m.label)))]
    compared = [label for label in dict.fromkeys([reference, *(candidates or counts)]) if label in counts]
    matched_by = _matched_by([m for m in models if m.label in compared], flops_budget)
    return misses + comparability_warnings(
        {label: counts[label] for label in compared}, matched_by, reference
    )


def _miss(model: ModelSpec, counted: Counted | None) -> str | None:
    count = None
    if counted is not None:
        count = counted.params_total if model.size_by == "total" else counted.params_non_embedding
    if not count:
        return None
    target = parse_size(model.size)
    error = count / target - 1
    if abs(error) <= TOLERANCE:
        return None
    return (
        f"{model.label}: {count:,} {model.size_by} parameters, {error:+.1%} from the {model.size} it was sized "
        f"to; {counted.arch}'s shape family has no shape within ±{TOLERANCE:.0%} of it (`rayb match` names "
        "the nearest)"
    )


def _matched_by(models: Sequence[ModelSpec], flops_budget: float | None) -> str:
    """The count the sizes of these models were matched on, in words."""
    from rayb.models.presets import get_preset

    ways = set()
    for m in models:
        preset = get_preset(m.preset) if m.preset else None
        if m.size is not None:
            ways.add(f"{m.size_by} parameters")
        elif preset and preset.named_size:
            ways.add(f"{preset.sized_by} parameters")
        else:
            ways.add("explicit shapes")
    budget = f", under a {flops_budget:.3g} training FLOPs budget" if flops_budget else ""
    return " and ".join(sorted(ways)) + budget


def comparability_warnings(
    counts: Mapping[str, Counted], matched_by: str, reference: str | None = None
) -> list[str]:
    """What makes models compared with each other unlike in size, one line per pair: total parameters or
    training FLOPs per token apart by more than 25%, or depth in blocks by more than 2× (COMPARABLE_RATIO).

    Each model is compared with `reference`, or, without one, every pair. A count that is None is not
    compared. `matched_by` says which count the sizes were matched on ("non-embedding parameters"), so
    the warning reads as what the match left unequal."""
    labels = list(counts)
    if reference in counts:
        pairs = [(reference, other) for other in labels if other != reference]
    else:
        pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1 :]]
    warnings = []
    for first, second in pairs:
        differs = [
            line
            for name, limit in COMPARABLE_RATIO.items()
            if (
                line := _difference(
                    name, counts[second].measures()[name], counts[first].measures()[name], limit
                )
            )
        ]
        if differs:
            warnings.append(
                f"{second} vs {first}, matched by {matched_by}, still differ in " + "; ".join(differs)
            )
    return warnings


def _difference(
    name: str, one: tuple[float, str] | None, other: tuple[float, str] | None, limit: float
) -> str | None:
    if one is None or other is None or min(one[0], other[0]) <= 0:
        return None
    ratio = max(one[0], other[0]) / min(one[0], other[0])
    if ratio <= limit:
        return None
    return f"{name} {one[1]} vs {other[1]} ({ratio:.2f}×, more than {limit:g}×)"
