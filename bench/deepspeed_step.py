"""What DeepSpeed's engine costs an optimizer step: the smoke study's gpt2 trained in this process by a
plain AdamW loop and by DeepSpeed's engine at ZeRO stages 0 and 1, as a one-worker rayb trial runs it
(fp32 on CPU, a gloo process group of one, rayb's DeepSpeed config, parameter groups and loss). All
start from the same weights and take their steps in turn, one step each, rotating which goes first, so
that a drift of the machine falls on all alike; the ratio is each one's median step against the
plain loop's, measured in the same run.

At one worker ZeRO shards nothing, yet its stage-1 optimizer (flat fp32 partitions, gradient hooks and
buckets) costs time on every step. rayb still runs the stage a study names: the script also prints how
far stage 0's weights end from stage 1's. They are equal while clipping never acts, and part once it
does, each stage summing the gradient norm its own way (`--grad-clip 0.3`: 1e-5 after 20 steps in one
run), so running stage 0 for one worker would change its trials' numbers. What rayb does leave out on
one CPU worker is stage 1's copy of each gradient into a contiguous bucket as the backward pass makes it
(train/engine.py); the last row is stage 1 with DeepSpeed's default, which must end on the same weights.

    python bench/deepspeed_step.py                    # 120 steps each after 10 of warm-up
    python bench/deepspeed_step.py --steps 300 --grad-clip 0.3
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch

from rayb.eval.lm import logits_nll
from rayb.models import build_model
from rayb.train.deepspeed_imports import without_shm_comm
from rayb.train.engine import deepspeed_config, make_optimizer, param_groups
from rayb.train.spec import TrainSpec

VOCAB, SEQ_LEN, BATCH = 2048, 128, 16  # the smoke study's tokenizer, context and micro-batch
SMOKE_GPT2 = {"d_model": 128, "n_head": 4, "n_layer": 4}
LR = 0.003  # the smoke study's


def model_and_optimizer(train: TrainSpec):
    """The smoke gpt2 from the same initial weights, and its optimizer as rayb's trial builds it."""
    torch.manual_seed(0)
    model = build_model("gpt2", SMOKE_GPT2, VOCAB, SEQ_LEN)
    return model, make_optimizer(train.optimizer, param_groups(model, train.weight_decay), LR, train.betas)


def plain_step(train: TrainSpec):
    """The reverse test's loop (bench/reverse_test.py): AdamW, global-norm clipping, nothing else."""
    model, optimizer = model_and_optimizer(train)

    def step(ids: torch.Tensor) -> None:
        (logits_nll(model(ids).logits, ids) / ids[:, 1:].numel()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def engine_step(train: TrainSpec, zero: dict | None = None):
    """rayb's: DeepSpeed's engine over the same model and optimizer (train/loop.py's set-up and step), with
    `zero` over rayb's ZeRO settings."""
    import deepspeed

    without_shm_comm()  # as rayb's workers start
    model, optimizer = model_and_optimizer(train)
    config = deepspeed_config(train)
    config["zero_optimization"] |= zero or {}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def step(ids: torch.Tensor) -> None:
        engine.backward(logits_nll(engine(ids).logits, ids) / ids[:, 1:].numel())
        engine.step()

    return step, engine.module


def join_process_group_of_one() -> None:
    """DeepSpeed's engine needs a process group: gloo, this process alone, on a free local port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    torch.distributed.init_process_group("gloo")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=120, help="timed steps of each loop")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps of each loop first")
    parser.add_argument("--grad-clip", type=float, default=1.0, help="global-norm clipping (rayb's default)")
    args = parser.parse_args()

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed picks an accelerator
    torch.set_num_threads(os.cpu_count() or 1)  # as a one-seed trial on this machine trains
    join_process_group_of_one()
    spec = {"global_batch": BATCH, "micro_batch": BATCH, "grad_clip": args.grad_clip}
    loops = {
        "plain AdamW loop": plain_step(TrainSpec(**spec)),
        "DeepSpeed, ZeRO stage 0": engine_step(TrainSpec(**spec, zero_stage=0)),
        "DeepSpeed, ZeRO stage 1": engine_step(TrainSpec(**spec, zero_stage=1)),
        "stage 1, DeepSpeed's buckets": engine_step(
            TrainSpec(**spec, zero_stage=1), zero={"contiguous_gradients": True}
        ),
    }
    batches = torch.Generator().manual_seed(0)
    times: dict[str, list[float]] = {name: [] for name in loops}
    for i in range(args.warmup + args.steps):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=batches)
        names = list(loops)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            began = time.perf_counter()
            loops[name][0](ids)
            if i >= args.warmup:
                times[name].append(time.perf_counter() - began)

    base = statistics.median(times["plain AdamW loop"])
    print(f"gpt2 {SMOKE_GPT2}, batch {BATCH}×{SEQ_LEN}, fp32, {torch.get_num_threads()} torch threads, "
          f"{os.cpu_count()} cores; median of {args.steps} steps each, taken in turn")  # fmt: skip
    for name, runs in times.items():
        print(f"{name:<30}{1000 * statistics.median(runs):7.1f} ms  {statistics.median(runs) / base:.3f}×")
    zero0, zero1, buckets = (loops[name][1].state_dict() for name in list(loops)[1:])

    def apart(a: dict, b: dict) -> float:
        return max((a[k] - b[k]).abs().max().item() for k in a)

    print(f"after {args.warmup + args.steps} steps, stage 0's weights lie up to {apart(zero0, zero1):.1e} from "
          f"stage 1's, and stage 1's with DeepSpeed's buckets up to {apart(buckets, zero1):.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
