"""Learning-rate schedule: linear warmup, then cosine decay to min_lr_ratio·lr (or constant)."""

from __future__ import annotations

import math


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str, min_ratio: float) -> float:
    """Multiplier of the peak learning rate for optimizer step `step` (0-based)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
