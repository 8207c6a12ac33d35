"""The DeepSpeed engine a trial trains with (train/loop.py sets it up): its config, its optimizer and the
optimizer's parameter groups."""

from __future__ import annotations

from typing import Any

import torch

from rayb.models import hooks
from rayb.train.spec import TrainSpec


def deepspeed_config(t: TrainSpec) -> dict[str, Any]:
    precision = t.resolved_precision
    config = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.accumulation,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": {"stage": t.zero_stage},
        # ZeRO shards any optimizer whose update is elementwise, as ADOPT's is; DeepSpeed only vouches
        # for its own list, and asks for this flag for the rest.
        "zero_allow_untested_optimizer": t.optimizer != "adamw",
        "bf16": {"enabled": precision == "bf16-deepspeed"},  # bf16 parameters: only by explicit choice
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        # DeepSpeed runs the forward under torch.autocast (it switches off an autocast opened around it).
        # No module is "lower-precision safe": every gradient is reduced in fp32, as DDP does under autocast.
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    if (t.zero_stage, t.num_workers, t.use_gpu) == (1, 1, False):
        # ZeRO-1 on one CPU worker reduces nothing, yet by default DeepSpeed copies each gradient into a
        # contiguous bucket as the backward pass makes it, through a hook on every parameter: 2-3% of the
        # smoke gpt2's step on 2 cores, for weights equal to the bit (bench/deepspeed_step.py). Not on a GPU,
        # where no run has measured it, nor for several workers, whose reduction fills those buckets.
        config["zero_optimization"]["contiguous_gradients"] = False
    return config


def make_optimizer(name: str, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float]):
    """AdamW, or ADOPT / ADOPT-atan2 from the maintained adam-atan2-pytorch package. All three decay
    weights the AdamW way, p ← p·(1 − lr·wd), so one weight_decay means the same for each."""
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8)
    from adam_atan2_pytorch.adopt import Adopt
    from adam_atan2_pytorch.adopt_atan2 import AdoptAtan2

    # decoupled_wd=False: the package's default divides the decay by the initial lr instead.
    return {"adopt": Adopt, "adopt_atan2": AdoptAtan2}[name](groups, lr=lr, betas=betas, decoupled_wd=False)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices only (as in nanoGPT and most LM recipes); never biases, norms or scalars, nor
    what the model names in a `no_weight_decay()` method (see models/hooks.py)."""
    exempt = hooks.no_weight_decay(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decayed = [p.dim() >= 2 and n not in exempt for n, p in named]
    return [
        {"params": [p for (_, p), d in zip(named, decayed, strict=True) if d], "weight_decay": weight_decay},
        {"params": [p for (_, p), d in zip(named, decayed, strict=True) if not d], "weight_decay": 0.0},
    ]
