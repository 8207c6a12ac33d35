"""The per-worker training loop: DeepSpeed on a Ray Train worker, fed from the packed-token cache.

A worker group trains trials one after another: those it takes from the study's worker pool, or a fixed
pack of them (train/trial.py). Read top to bottom: per trial, set up (resuming if its checkpoint exists),
then for each optimizer step feed this worker's share of global batch `step`, log it, and at the step's
end measure validation loss and checkpoint when due.
Data position is the step number, so a resumed run feeds exactly the batches it had not. What all ranks
must agree on (the next trial, the checkpoint to resume from) rank 0 decides and broadcasts.
A trial's checkpoint is found wherever it was written: each trial records its latest checkpoint in its
own directory, so a relaunch that groups the trials differently (a cluster of another size) resumes them.
Precision follows `TrainSpec.resolved_precision`: bf16 runs the forward and backward under autocast with
fp32 parameters, gradients and optimizer state, as the reference implementations train.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayb import imports_frozen, storage
from rayb.data.cache import TokenCache, row_digest
from rayb.eval.lm import as_ids, logits_nll, next_token_nll
from rayb.files import write_json_atomic
from rayb.gpu_share import cap_gpu_memory
from rayb.models import build_model, count_params, hooks
from rayb.models.accounting import ParamCount
from rayb.models.checkpoint import save_weights
from rayb.models.kernels import describe
from rayb.models.pretrained import Checkpoint, initialise_from
from rayb.models.registry import get_arch
from rayb.train.collectives import HostCollectives
from rayb.train.deepspeed_imports import hidden, without_muon, without_shm_comm
from rayb.train.engine import deepspeed_config, make_optimizer, param_groups
from rayb.train.metrics_log import MetricsLog
from rayb.train.schedule import lr_multiplier
from rayb.train.spec import TrainSpec
from rayb.train.trial import (
    LATEST_CHECKPOINT,
    TRAIN_DONE,
    TrialPack,
    TrialSpec,
    checkpoint_record,
    checkpoint_tag,
    read_metrics,
    tag_step,
    tag_trial,
)

METRICS = "metrics.jsonl"


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Train a pack's unfinished trials, one after another, each resuming from its own checkpoint; in the
    worker pool, the trials this group takes from its queue (named by `config["queue"]`) until it is empty,
    and then the evaluation jobs the queue relays, if any (eval/actors.DrainedWorkers)."""
    entered, age = time.time(), process_age_s()
    pack = TrialPack.from_dict(config["pack"])
    began = time.perf_counter()
    _start_worker(pack)
    # Before the first deepspeed.initialize, so every rank creates its process groups in the same order.
    comm = HostCollectives()
    # What the worker group cost to start, charged to the first trial it trains.
    costs = _start_costs(config, entered, age) | {"imports_s": time.perf_counter() - began}
    for trial in trials_to_train(pack, comm, config.get("queue")):
        train_trial(trial, comm, costs)
        costs = {}
    reusable = config.get("reusable", False)
    if config.get("queue"):  # the queue lets it go at once unless an eval pool relays jobs (a CPU study's)
        from rayb.eval.actors import serve_drained

        reusable &= serve_drained(config["queue"])
    import ray
    from ray.train.v2._internal.execution.context import get_train_context

    controller = get_train_context().controller_actor
    if reusable:  # kept for the pool's next group, or the driver's next pool, if it was started ahead
        queue = ray.get_actor(config["queue"])
        ray.get(queue.keep.remote(controller._actor_id.hex(), ray.get_runtime_context().get_actor_id()))
    controller.hurry.remote()  # its poll sees the end now (trainer.EnvController)


def trials_to_train(pack: TrialPack, comm: HostCollectives, queue: str | None) -> Iterator[TrialSpec]:
    """The trials this group trains, in order, as rank 0 takes them: the pack's unfinished ones, or with a
    `queue` (the name of the pool's TrialQueue actor), one at a time from it, each once the last is done."""
    if queue is None:
        remaining = comm.broadcast([t.key for t in pack.pending] if comm.rank == 0 else None)
        yield from (t for t in pack.trials if t.key in remaining)
        return
    by_key = {t.key: t for t in pack.trials}
    taker = _Taker(queue, pack, by_key) if comm.rank == 0 else None
    finished = None
    while (key := comm.broadcast(taker.take(finished) if taker else None)) is not None:
        yield by_key[key]
        finished = key


class _Taker:
    """Rank 0's end of the pool's queue: the next unfinished trial for this group. A group restarted after a
    failure is handed the trial it held again, to resume it; one that had finished by then is passed over."""

    def __init__(self, queue: str, pack: TrialPack, by_key: dict[str, TrialSpec]):
        import ray

        self.queue, self.pack, self.by_key = ray.get_actor(queue), pack, by_key

    def take(self, finished: str | None) -> str | None:
        import ray

        while (
            key := ray.get(self.queue.take.remote(self.pack.queue, self.pack.run_name, finished))
        ) is not None:
            if not self.by_key[key].done:
                return key
            finished = key
        return None


def _start_costs(config: dict[str, Any], entered: float, age_s: float) -> dict[str, float]:
    """How long the group took to start, from the driver's request to this worker's entry, and of that how
    long until this worker's process existed (the group's controller, its placement, the process's start)
    and how long it took to join the process group: the first two only where the two clocks are one
    machine's (a worker on another node would add the clocks' offset)."""
    import ray

    from rayb.train import backend

    costs = {} if backend.joined_in_s is None else {"process_group_s": backend.joined_in_s}
    if config.get("launched_on") != ray.get_runtime_context().get_node_id():
        return costs
    created = entered - age_s  # a process started before the request (reused) waited for none
    return costs | {"worker_start_s": entered - config["launched_at"],
                    "worker_process_s": max(0.0, created - config["launched_at"])}  # fmt: skip


def process_age_s() -> float:
    """How long ago this process started: from /proc to the clock tick on Linux (psutil's start time counts
    from a boot time in whole seconds), else psutil's start time."""
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: ticks since boot
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, AttributeError):  # no /proc, or no CLOCK_BOOTTIME (macOS)
        import psutil

        return time.time() - psutil.Process().create_time()


def train_trial(trial: TrialSpec, comm: HostCollectives, costs: dict[str, float]) -> None:
    """Train one trial to its end (or divergence) on this worker."""
    with without_muon():
        run = _set_up(trial, comm, costs)
        status, steps_done = "ok", run.trial.steps
        for step in range(run.start, run.trial.steps):
            if not math.isfinite(_train_step(run, step)):  # every rank sees the same global loss: all stop
                status, steps_done = "diverged", step + 1
                break
            _end_of_step(run, done=step + 1)
        _finish(run, status, steps_done)
        run.engine.destroy()  # DeepSpeed's optimizer holds the engine (model, state, buffers) until then
        del run
    _release_memory(compiled=trial.train.compile)  # the next trial builds its own model and engine


@dataclass
class _Run:
    """One trial on one worker: what every step needs."""

    trial: TrialSpec
    engine: Any  # deepspeed.DeepSpeedEngine
    scheduler: torch.optim.lr_scheduler.LRScheduler
    cache: TokenCache
    comm: HostCollectives
    log: MetricsLog
    params: ParamCount
    kernels: dict[str, str]  # {component: implementation} this worker's model runs
    start: int  # the first step to train (after a resume, the one after the checkpoint)
    timings: dict[str, float]  # seconds spent outside the steps: start-up, set-up, checkpoints, validation

    @property
    def train(self) -> TrainSpec:
        return self.trial.train

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world(self) -> int:
        return self.comm.world


# ----- set-up ------------------------------------------------------------------------------------------


def _start_worker(pack: TrialPack) -> None:
    """Once per worker group: the accelerator DeepSpeed will use, torch threads, and the imports."""
    if pack.train.use_gpu:
        cap_gpu_memory(pack.train.gpus_per_worker)  # trials sharing a GPU cannot run each other out of memory
    torch.set_num_threads(pack.threads)
    import_worker_libraries(pack.train.use_gpu)


def import_worker_libraries(use_gpu: bool) -> None:
    """DeepSpeed, for the accelerator it is to use, and what every model class builds on (transformers'
    modeling_utils: 2.7 CPU-seconds, else paid in the first trial's set-up): most of a worker's start-up
    (timed as such), which a Train worker started ahead of its group has done (trainer.RayTrainWorker)."""
    if "deepspeed" not in sys.modules:
        if not use_gpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed picks an accelerator
        # Its autotuner, which rayb never runs, imports mlflow where it is installed: 0.7 s of each start.
        with imports_frozen(), hidden("mlflow"):
            import deepspeed  # noqa: F401
            import transformers.modeling_utils  # noqa: F401
    without_shm_comm()  # also where something else imported DeepSpeed first


def _set_up(trial: TrialSpec, comm: HostCollectives, costs: dict[str, float]) -> _Run:
    import deepspeed

    began = time.perf_counter()
    t = trial.train
    _seed_everything(trial.seed)
    cache = TokenCache(trial.cache_dir)
    model = build_model(trial.arch, trial.model_config, cache.manifest["vocab_size"], cache.seq_len)
    if trial.init_from:  # a finetuning arm: start from those weights (a resume then loads its own)
        model = initialise_from(model, Checkpoint(**trial.init_from))
    params = count_params(model)
    optimizer = make_optimizer(t.optimizer, param_groups(model, t.weight_decay), trial.lr, t.betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, trial.steps, t.warmup_steps, t.schedule, t.min_lr_ratio)
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(t)
    )
    if t.compile:
        engine.compile()  # compiles engine.module in place
    start = _resume(engine, trial, comm)
    kernels = describe(get_arch(trial.arch).kernels(engine.device.type))
    log = MetricsLog(storage.join(trial.trial_dir, METRICS), enabled=comm.rank == 0)
    if start:  # where the trial came back from a lost worker or node (rayb status shows it resumed)
        log.write(kind="resume", step=start)
    timings = costs | {"set_up_s": time.perf_counter() - began, "checkpoint_s": 0.0, "validation_s": 0.0}
    return _Run(trial, engine, scheduler, cache, comm, log, params, kernels, start, timings)


def _resume(engine, trial: TrialSpec, comm: HostCollectives) -> int:
    """Load this trial's latest checkpoint, chosen by rank 0, if it has one; the step to continue from."""
    latest = comm.broadcast(latest_checkpoint(trial) if comm.rank == 0 else None)
    if latest is None:
        return 0
    with _fetched(checkpoint_location(trial, latest), comm.rank) as ckpt_dir:
        _, client_state = engine.load_checkpoint(str(ckpt_dir), tag=latest["tag"])
        restore_rng(ckpt_dir, comm.rank)
    return client_state["step"]


def latest_checkpoint(trial: TrialSpec) -> dict[str, str] | None:
    """The newer of the trial's own record of its latest checkpoint (written in whichever run trained it)
    and this run's latest checkpoint if that is the trial's (in a pack, it may be an earlier trial's); as
    {"run", "checkpoint" (its directory in the run), "tag" (DeepSpeed's, `<trial key>-step<N>`)}."""
    candidates = [c for c in (_recorded_checkpoint(trial), _run_checkpoint(trial)) if c]
    return max(candidates, key=lambda record: tag_step(record["tag"])) if candidates else None


def _recorded_checkpoint(trial: TrialSpec) -> dict[str, str] | None:
    data = storage.read_bytes(storage.join(trial.trial_dir, LATEST_CHECKPOINT))
    if data is None:
        return None
    record = json.loads(data)
    # A record outliving its checkpoint (its run deleted it) is no checkpoint at all.
    return record if storage.exists(storage.join(checkpoint_location(trial, record), record["tag"])) else None


def _run_checkpoint(trial: TrialSpec) -> dict[str, str] | None:
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if not checkpoint:
        return None
    # Read from the `latest` file on storage, without fetching the checkpoint.
    with checkpoint.filesystem.open_input_stream(f"{checkpoint.path}/latest") as f:
        tag = f.read().decode().strip()
    return checkpoint_record(_this_run(), checkpoint.path, tag) if tag_trial(tag) == trial.key else None


def _this_run() -> str:
    import ray.train

    return ray.train.get_context().get_experiment_name()


def checkpoint_location(trial: TrialSpec, record: dict[str, str]) -> str:
    return storage.join(trial.storage_path, record["run"], record["checkpoint"])


# What DeepSpeed's save_checkpoint copies into every ZeRO checkpoint beside the states: its conversion
# scripts (40 KB, two objects more per checkpoint on object storage), which ship with DeepSpeed itself.
DEEPSPEED_RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")

# A file of one rank's in a checkpoint: DeepSpeed's ZeRO shards (optimizer states; model states under ZeRO-3)
# and rayb's random state. Any other file (`latest`, the model states) every rank reads.
_RANK_FILE = re.compile(r"(?:^|/)(?:bf16_)?(?:zero_pp_rank_|rng_rank)(\d+)[_.]")


def wanted_by(rank: int, relative: str) -> bool:
    """Whether a rank resuming reads this file of a checkpoint: DeepSpeed's load_checkpoint (ZeRO 0-3, not
    elastic) opens the model states, and of the ZeRO shards only its own data-parallel rank's."""
    match = _RANK_FILE.search(relative)
    return match is None or int(match[1]) == rank


@contextmanager
def _fetched(location: str, rank: int) -> Iterator[Path]:
    """A checkpoint as a local directory holding what this rank reads of it: the directory itself on a
    shared file system, else this rank's files downloaded into a temporary one."""
    if not storage.is_remote(location):
        yield Path(location)
        return
    with tempfile.TemporaryDirectory() as tmp:
        yield storage.fetch_tree(location, wanted=lambda relative: wanted_by(rank, relative), into=Path(tmp))


def _release_memory(compiled: bool) -> None:
    if compiled:  # dynamo's caches hold the last trial's graphs, guarded on its modules
        torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----- one optimizer step ------------------------------------------------------------------------------


def _train_step(run: _Run, step: int) -> float:
    """Train optimizer step `step` (0-based) on this worker's share of its global batch; log it; return
    the loss over the whole global batch (the same on every rank)."""
    t, engine = run.train, run.engine
    began = time.perf_counter()
    lr = run.scheduler.get_last_lr()[0]  # the rate this step uses (the scheduler moves on inside it)
    engine.train()
    loss_sum, digest = torch.zeros((), device=engine.device), 0
    data_s = 0.0  # waiting for rows: a node's first read of a cache on object storage fetches it
    for micro in range(t.accumulation):
        fetched = time.perf_counter()
        rows = run.cache.micro_batch(step, micro, run.rank, run.world, t.global_batch, t.micro_batch)
        data_s += time.perf_counter() - fetched
        digest += row_digest(rows)
        ids = as_ids(rows, engine.device)
        out = engine(ids)
        # The compared loss: fp32 cross-entropy over the logits (bf16 ones under autocast, upcast).
        loss = logits_nll(out.logits, ids) / ids[:, 1:].numel()
        aux = hooks.aux_loss(out)  # a training-only term (an MoE's load balancing), never logged as the loss
        engine.backward(loss if aux is None else loss + aux)
        engine.step()
        loss_sum += loss.detach()
    step_loss = run.comm.mean([loss_sum.item() / t.accumulation])[0]  # one host sync per step
    (global_digest,) = run.comm.sum([digest], dtype=torch.int64)
    grad_norm, extra = _float(engine.get_global_grad_norm()), _extra_metrics(run)
    # Everything the step waited for, its collectives included (the log's upload runs on a thread).
    elapsed = time.perf_counter() - began
    tokens_per_step = t.global_batch * run.cache.seq_len
    run.log.write(
        kind="train", step=step + 1, loss=step_loss, lr=lr, grad_norm=grad_norm,
        tokens=(step + 1) * tokens_per_step, tokens_per_s=tokens_per_step / elapsed, step_s=elapsed,
        data_s=round(data_s, 6), batch_digest=int(global_digest), **{f"extra.{k}": v for k, v in extra.items()},
    )  # fmt: skip
    return step_loss


def _extra_metrics(run: _Run) -> dict[str, float]:
    """A model's own metrics since the last call (models/hooks.py), averaged over the workers. Rank 0's
    names are reduced on every rank (each rank's own could differ in number: a mismatched all-reduce);
    a name a rank lacks counts as NaN there."""
    metrics = hooks.extra_metrics(run.engine.module)
    if metrics is None:  # the same model on every rank: all skip the collectives alike
        return {}
    names = run.comm.broadcast(sorted(metrics) if run.rank == 0 else None)
    values = run.comm.mean([float(metrics.get(n, math.nan)) for n in names])
    return dict(zip(names, values, strict=True))


# ----- the end of a step: epochs, validation, checkpoints ----------------------------------------------


def _end_of_step(run: _Run, done: int) -> None:
    """After `done` steps: at an epoch's end, validation on all held-out rows (and the model's own metrics
    over them); every eval_every steps, at the end, and at an epoch's end, interim validation and a
    checkpoint."""
    t, steps = run.train, run.trial.steps
    per_epoch = run.cache.batches_per_epoch(t.global_batch)
    epoch_end = t.epochs > 1 and (done % per_epoch == 0 or done == steps)
    if epoch_end:
        val_loss = _validation_loss(run, rows=len(run.cache.val))
        epoch = math.ceil(done / per_epoch)
        run.log.write(kind="epoch", step=done, epoch=epoch, val_loss=val_loss, extra=_extra_metrics(run))
    if done % t.eval_every == 0 or done == steps or epoch_end:
        val_loss = _validation_loss(run)
        run.log.write(kind="val", step=done, val_loss=val_loss)
        began = time.perf_counter()
        # The log reaches the store before the checkpoint does: a resume from it, anywhere, continues the
        # log from its step (a worker lost between the two would otherwise leave a gap in the curve).
        run.log.push()
        _checkpoint(run, done, {"step": done, "val_loss": val_loss})
        run.timings["checkpoint_s"] += time.perf_counter() - began


@torch.no_grad()
def _validation_loss(run: _Run, rows: int | None = None) -> float:
    """Loss on `rows` validation rows (default eval_batches micro-batches), split across ranks and summed."""
    began = time.perf_counter()
    t, engine, val = run.train, run.engine, run.cache.val
    engine.eval()
    chosen = validation_rows(len(val), min(len(val), rows or t.eval_batches * t.micro_batch))
    nll, count = 0.0, 0
    for start in range(run.rank * t.micro_batch, len(chosen), run.world * t.micro_batch):
        ids = as_ids(val[chosen[start : start + t.micro_batch]], engine.device)
        nll += next_token_nll(engine, ids).item()
        count += ids[:, 1:].numel()
    total_nll, total_count = run.comm.sum([nll, count])
    run.timings["validation_s"] += time.perf_counter() - began
    return total_nll / total_count


def validation_rows(total: int, n: int) -> np.ndarray:
    """`n` of the `total` validation rows, evenly spaced: the rows lie source after source in the mix's
    proportions, so an even stride reads every source in its share (the first n rows would read only the
    first source), and every trial reads the same rows."""
    return np.linspace(0, total - 1, n).round().astype(np.int64) if n < total else np.arange(total)


def _checkpoint(run: _Run, step: int, metrics: dict[str, float]) -> None:
    """Every rank saves its DeepSpeed shard and its random state and reports them. Ray Train uploads each
    rank's files from a thread of its own while training goes on, and registers the checkpoint once every
    rank's are stored; the run's controller then records it as the trial's latest (trainer.
    CheckpointRecorder), so a relaunch in any other run finds it. One upload in flight per rank: the next
    checkpoint waits for the last one's to be registered (its local copy deleted), so a store slower than
    the checkpoints cannot fill a worker's disk."""
    import ray.train
    from ray.train import CheckpointConsistencyMode, CheckpointUploadMode

    ray.train.get_all_reported_checkpoints(consistency_mode=CheckpointConsistencyMode.COMMITTED)
    tag = checkpoint_tag(run.trial.key, step)
    local = Path(tempfile.mkdtemp(prefix="rayb-checkpoint-"))  # Ray Train deletes it once uploaded
    run.engine.save_checkpoint(str(local), tag=tag, client_state={"step": step})
    for script in DEEPSPEED_RECOVERY_SCRIPTS:  # rank 0's copies of DeepSpeed's tools: no resume reads them
        (local / script).unlink(missing_ok=True)
    save_rng(local, run.rank)
    ray.train.report(
        metrics | {"tag": tag},
        checkpoint=ray.train.Checkpoint.from_directory(local),
        checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
    )


# ----- the end of the trial ----------------------------------------------------------------------------


def _finish(run: _Run, status: str, steps_done: int) -> None:
    """Rank 0 saves the model and pushes it and the metrics log, then writes train_result.json: last, so
    its presence means everything else of the trial is in place."""
    if run.rank != 0:
        return
    trial_dir = run.trial.trial_dir
    began = time.perf_counter()
    if status == "ok":
        model_dir = storage.join(trial_dir, "model")
        _save_model(run.engine.module, storage.writable(model_dir))
        storage.push(model_dir)
    run.log.push(final=True)
    run.timings["save_model_s"] = time.perf_counter() - began
    train_log = [r for r in read_metrics(storage.join(trial_dir, METRICS)) if r["kind"] == "train"]
    tail = [r["loss"] for r in train_log[-10:]]
    train_tokens = steps_done * run.train.global_batch * run.cache.seq_len
    write_json_atomic(
        storage.join(trial_dir, TRAIN_DONE),
        {
            "status": status,
            "steps": steps_done,
            "final_train_loss": float(np.mean(tail)) if tail else float("nan"),
            "params_total": run.params.total,
            "params_non_embedding": run.params.non_embedding,
            "train_tokens": train_tokens,
            "train_flops": train_tokens * run.trial.train_flops_per_token,
            "wall_s": sum(r["step_s"] for r in train_log),
            "tokens_per_s": float(np.mean([r["tokens_per_s"] for r in train_log])) if train_log else 0.0,
            "precision": run.train.resolved_precision,
            "device": run.engine.device.type,
            "kernels": run.kernels,
            "worker_group": _this_run(),  # the Ray Train run that trained it (its last, after a resume)
            "timings": run.timings,
        },
    )


def _save_model(module: torch.nn.Module, out: Path) -> None:
    if hasattr(module, "save_pretrained"):  # a transformers model: its own format, config included
        out.mkdir(parents=True, exist_ok=True)
        module.save_pretrained(out)
    else:
        save_weights(module, out)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# ----- random state, saved with every checkpoint so a resumed trial continues the same streams ----------


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device as well


def save_rng(directory: Path, rank: int) -> None:
    """This rank's random state, in a file of its own: each rank's streams are its own."""
    torch.save(rng_state(), directory / f"rng_rank{rank}.pt")


def restore_rng(directory: Path, rank: int) -> None:
    set_rng_state(torch.load(directory / f"rng_rank{rank}.pt", weights_only=False))  # rayb's own file


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        # The device this worker trains on (its local rank's), not every device the node has: the rank
        # may resume on a node with fewer, as another local rank.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # onto the device this worker trains on now
