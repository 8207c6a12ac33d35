"""The per-worker training loop: DeepSpeed on a Ray Train worker, fed from the packed-token cache.

Read top to bottom: set up, resume if a checkpoint exists, then for each optimizer step feed this
worker's share of global batch `step`, log, and every `eval_every` steps measure validation loss and
checkpoint. Data position is the step number, so a resumed run feeds exactly the batches it had not.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayb.data.cache import TokenCache, row_digest
from rayb.eval.lm import as_ids, logits_nll, next_token_nll
from rayb.files import write_json_atomic
from rayb.models import build_model, count_params
from rayb.models.checkpoint import save_weights
from rayb.models.pretrained import Checkpoint, initialise_from
from rayb.train.schedule import lr_multiplier
from rayb.train.trial import TRAIN_DONE, TrialSpec, read_metrics

METRICS = "metrics.jsonl"


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train

    trial = TrialSpec(**config["trial"])
    t = trial.train
    if not t["use_gpu"]:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed picks an accelerator
    import deepspeed
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(trial.threads)
    _seed_everything(trial.seed)

    cache = TokenCache(Path(trial.cache_dir))
    model = build_model(trial.arch, trial.model_config, cache.manifest["vocab_size"], cache.seq_len)
    if trial.init_from:  # a finetuning arm: start from those weights (a resume then loads its own)
        model = initialise_from(model, Checkpoint(**trial.init_from))
    params = count_params(model)
    optimizer = make_optimizer(
        t["optimizer"], param_groups(model, t["weight_decay"]), trial.lr, tuple(t["betas"])
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_multiplier(s, trial.steps, t["warmup_steps"], t["schedule"], t["min_lr_ratio"]),
    )
    accum = t["global_batch"] // (t["micro_batch"] * world)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=_deepspeed_config(t, accum)
    )

    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            _, client_state = engine.load_checkpoint(ckpt_dir)
        start = client_state["step"]
        _set_rng_state(client_state["rng"])

    trial_dir = Path(trial.trial_dir)
    log = _MetricsLog(trial_dir / METRICS, enabled=rank == 0)
    tokens_per_step = t["global_batch"] * cache.seq_len
    steps_per_epoch = cache.manifest["train_rows"] // t["global_batch"]
    status, step = "ok", start
    for step in range(start, trial.steps):
        began = time.perf_counter()
        lr = scheduler.get_last_lr()[0]  # the rate this step uses (the scheduler moves on inside it)
        engine.train()
        loss_sum, digest = 0.0, 0
        for micro in range(accum):
            rows = cache.micro_batch(step, micro, rank, world, t["global_batch"], t["micro_batch"])
            digest += row_digest(rows)
            ids = as_ids(rows, engine.device)
            out = engine(ids)
            loss = logits_nll(out.logits, ids) / ids[:, 1:].numel()
            # A model may add its own training-only term (e.g. an MoE load-balancing loss); the
            # logged loss stays the language-modelling loss every model is compared on.
            aux = getattr(out, "aux_loss", None)
            engine.backward(loss if aux is None else loss + aux)
            engine.step()
            loss_sum += loss.item()
        # Every rank learns the global loss, so all of them agree on divergence and stop together.
        loss_t = torch.tensor([loss_sum / accum], dtype=torch.float64)
        digest_t = torch.tensor([digest], dtype=torch.int64)
        dist.all_reduce(loss_t)
        dist.all_reduce(digest_t)
        step_loss = loss_t.item() / world
        elapsed = time.perf_counter() - began
        log.write(
            kind="train", step=step + 1, loss=step_loss, lr=lr,
            grad_norm=_float(engine.get_global_grad_norm()), tokens=(step + 1) * tokens_per_step,
            tokens_per_s=tokens_per_step / elapsed, step_s=elapsed, batch_digest=int(digest_t.item()),
            **_extra_metrics(engine.module, world, dist),
        )  # fmt: skip
        if not math.isfinite(step_loss):
            status = "diverged"
            break
        epoch_end = t["epochs"] > 1 and ((step + 1) % steps_per_epoch == 0 or step + 1 == trial.steps)
        if epoch_end:  # all held-out rows, and the model's own metrics over them (e.g. expert load)
            val_loss = _interim_val_loss(engine, cache, rank, world, t, dist, rows=len(cache.val))
            extra = {
                k.removeprefix("extra."): v for k, v in _extra_metrics(engine.module, world, dist).items()
            }
            epoch = math.ceil((step + 1) / steps_per_epoch)
            log.write(kind="epoch", step=step + 1, epoch=epoch, val_loss=val_loss, extra=extra)
        if (step + 1) % t["eval_every"] == 0 or step + 1 == trial.steps or epoch_end:
            val_loss = _interim_val_loss(engine, cache, rank, world, t, dist)
            log.write(kind="val", step=step + 1, val_loss=val_loss)
            _checkpoint(engine, step + 1, {"step": step + 1, "loss": step_loss, "val_loss": val_loss})

    if rank == 0:
        if status == "ok":
            _save_model(engine.module, trial_dir / "model")
        _write_result(
            trial, trial_dir, status, step + 1 if status != "ok" else trial.steps, params, cache.seq_len
        )


def _extra_metrics(module: torch.nn.Module, world: int, dist) -> dict[str, float]:
    """A model's own per-step metrics (`extra_metrics()`), averaged over the workers."""
    if not hasattr(module, "extra_metrics"):
        return {}
    metrics = module.extra_metrics()
    names = sorted(metrics)
    values = torch.tensor([float(metrics[n]) for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return {f"extra.{n}": v / world for n, v in zip(names, values.tolist(), strict=True)}


def _deepspeed_config(t: dict[str, Any], accum: int) -> dict[str, Any]:
    bf16 = t["precision"] == "bf16" or (t["precision"] == "auto" and t["use_gpu"])
    return {
        "train_batch_size": t["global_batch"],
        "train_micro_batch_size_per_gpu": t["micro_batch"],
        "gradient_accumulation_steps": accum,
        "gradient_clipping": t["grad_clip"],
        "zero_optimization": {"stage": t["zero_stage"]},
        # ZeRO shards any optimizer whose update is elementwise, as ADOPT's is; DeepSpeed only vouches
        # for its own list, and asks for this flag for the rest.
        "zero_allow_untested_optimizer": t["optimizer"] != "adamw",
        "bf16": {"enabled": bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


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
    what the model names in a `no_weight_decay()` method (timm's convention; RWKV-6 uses it)."""
    exempt = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decayed = [p.dim() >= 2 and n not in exempt for n, p in named]
    return [
        {"params": [p for (_, p), d in zip(named, decayed, strict=True) if d], "weight_decay": weight_decay},
        {"params": [p for (_, p), d in zip(named, decayed, strict=True) if not d], "weight_decay": 0.0},
    ]


@torch.no_grad()
def _interim_val_loss(
    engine, cache: TokenCache, rank: int, world: int, t: dict[str, Any], dist, rows: int | None = None
) -> float:
    """Loss on a fixed slice of the validation rows (the first `rows`, default eval_batches micro-batches),
    split across ranks and summed."""
    engine.eval()
    n = min(len(cache.val), rows or t["eval_batches"] * t["micro_batch"])
    nll, count = 0.0, 0
    for start in range(rank * t["micro_batch"], n, world * t["micro_batch"]):
        ids = as_ids(cache.val[start : min(n, start + t["micro_batch"])], engine.device)
        nll += next_token_nll(engine, ids).item()
        count += ids[:, 1:].numel()
    totals = torch.tensor([nll, count], dtype=torch.float64)
    dist.all_reduce(totals)
    return totals[0].item() / totals[1].item()


def _checkpoint(engine, step: int, metrics: dict[str, float]) -> None:
    """Every rank saves its DeepSpeed shard and reports it; Ray Train merges the shards in storage."""
    import ray.train

    with tempfile.TemporaryDirectory() as tmp:
        engine.save_checkpoint(tmp, tag=f"step{step}", client_state={"step": step, "rng": _rng_state()})
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def _save_model(module: torch.nn.Module, out: Path) -> None:
    if hasattr(module, "save_pretrained"):
        out.mkdir(parents=True, exist_ok=True)
        module.save_pretrained(out)
    else:
        save_weights(module, out)


def _write_result(
    trial: TrialSpec, trial_dir: Path, status: str, steps_done: int, params, seq_len: int
) -> None:
    train_log = [r for r in read_metrics(trial_dir / METRICS) if r["kind"] == "train"]
    tail = [r["loss"] for r in train_log[-10:]]
    wall = sum(r["step_s"] for r in train_log)
    train_tokens = steps_done * trial.train["global_batch"] * seq_len
    write_json_atomic(
        trial_dir / TRAIN_DONE,
        {
            "status": status,
            "steps": steps_done,
            "final_train_loss": float(np.mean(tail)) if tail else float("nan"),
            "params_total": params.total,
            "params_non_embedding": params.non_embedding,
            "train_tokens": train_tokens,
            "train_flops": train_tokens * trial.train_flops_per_token,
            "wall_s": wall,
            "tokens_per_s": float(np.mean([r["tokens_per_s"] for r in train_log])) if train_log else 0.0,
        },
    )


class _MetricsLog:
    """Rank 0's own append-only JSONL log (Ray keeps only metrics reported with checkpoints)."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record: Any) -> None:
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
