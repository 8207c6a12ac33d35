"""The reverse test: retrain a finished rayb GPT-2 trial with a plain nanoGPT-style loop, and compare.

rayb trains through Ray Tune, Ray Train and DeepSpeed. This script trains the same model again in
one process with none of that: the same transformers GPT-2 built from the trial's recorded config,
initialised under the same seed, fed the same token rows in the same order, for the same steps, with
the same AdamW, weight decay, clipping and warmup + cosine schedule (written out again here, not
imported). It validates where the trial did (every `eval_every` steps, at the end and at each epoch's
end, on `eval_batches` micro-batches of evenly spaced validation rows), then scores all validation rows
the way rayb's `lm` suite does, and checks that rayb's validation losses, interim and final, lie within
±tolerance of the reference's.

Nothing from rayb's training stack is imported: the token files are read with np.memmap, the batch
order, schedule and parameter groups are written from their definitions, and every step's rows are
checked against the batch digest rayb logged, so "same tokens, same order" is verified, not assumed.

    python bench/reverse_test.py rayb_out/studies/smoke-7c19af44e8e1
    python bench/reverse_test.py STUDY_DIR --all-seeds --threads 2 --json /tmp/reverse.json

Exit status 0 when every compared trial passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

TAIL = 10  # "final train loss" = mean of the last TAIL steps' losses (as in rayb's train_result.json)


# ----- what rayb recorded ----------------------------------------------------------------------------
def load_trials(study_dir: Path, model: str, seeds: list[int] | str | None) -> list[dict[str, Any]]:
    """The study's finished trials of `model`: the lowest seed by default, a list of seeds, or "all"."""
    import pandas as pd

    df = pd.read_parquet(study_dir / "results.parquet")
    df = df[(df["model"] == model) & (df["status"] == "ok")]
    if df.empty:
        raise SystemExit(f"{study_dir}: no finished trial of model '{model}' in results.parquet")
    available = sorted(int(s) for s in df["seed"].unique())
    if seeds is None:
        seeds = available[:1]
    elif seeds == "all":
        seeds = available
    missing = sorted(set(seeds) - set(available))
    if missing:
        raise SystemExit(f"model '{model}' has no finished trial with seed {missing}; seeds: {available}")
    entry = _study_entry(study_dir, model)
    if entry.get("init_from") or entry.get("pretrained"):
        raise SystemExit(
            f"model '{model}' starts from trained weights; the reference retrains from scratch only"
        )
    trials = []
    for row in df[df["seed"].isin(seeds)].sort_values(["seed", "lr"]).to_dict("records"):
        if row["arch"] != "gpt2":
            raise SystemExit(f"model '{model}' is arch '{row['arch']}'; the reverse test retrains gpt2 only")
        trials.append(
            {
                "seed": int(row["seed"]),
                "lr": float(row["lr"]),
                "model_config": json.loads(row["model_config"]),
                "train": row["train"],  # a struct column: the trial's training settings
                "steps": int(row["steps"]),
                "trial_dir": Path(row["checkpoint"]).parent,
                "rayb_val_loss": float(row["val_loss"]),
            }
        )
    return trials


def _study_entry(study_dir: Path, model: str) -> dict[str, Any]:
    """The study file's entry for `model` (labelled by name, else arch), from provenance.json; {} if none."""
    path = study_dir / "provenance.json"
    models = json.loads(path.read_text())["study"]["models"] if path.exists() else []
    return next((m for m in models if (m.get("name") or m.get("arch")) == model), {})


def read_metrics(trial_dir: Path, kind: str = "train") -> list[dict[str, Any]]:
    """rayb's records of one kind ("train": one per step; "val": each interim validation), in step order;
    a step logged twice (around a resume) keeps its last line."""
    latest: dict[int, dict[str, Any]] = {}
    for line in (trial_dir / "metrics.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
        if record["kind"] == kind:
            latest[record["step"]] = record
    return [latest[s] for s in sorted(latest)]


# ----- the token files -------------------------------------------------------------------------------
def open_split(cache_dir: Path, split: str) -> np.ndarray:
    """(rows, seq_len) tokens of train.bin or val.bin, memory-mapped."""
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    shape = (manifest[f"{split}_rows"], manifest["seq_len"])
    return np.memmap(cache_dir / f"{split}.bin", dtype=manifest["dtype"], mode="r", shape=shape)


def batch_rows(step: int, global_batch: int, batches_per_epoch: int | None = None, data_seed: int = 0):
    """Rows of train.bin that optimizer step `step` (0-based) trains on: global batch b is rows
    [b·G, (b+1)·G). The first epoch takes b = step; a later epoch e takes the batches in the order of a
    permutation drawn from numpy's default_rng([data_seed, e]), data_seed being the cache key's first 8
    hex digits, the same for every model of a study."""
    epoch, b = divmod(step, batches_per_epoch or step + 1)
    if epoch > 0:
        b = int(np.random.default_rng([data_seed, epoch]).permutation(batches_per_epoch)[b])
    return np.arange(b * global_batch, (b + 1) * global_batch)


def batch_digest(rows: np.ndarray) -> int:
    """Sum over rows of a 5-byte BLAKE2b of each row's tokens as int64: what rayb logs per step."""
    return sum(
        int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=5).digest(), "little")
        for row in np.ascontiguousarray(rows, dtype=np.int64)
    )


def find_cache(study_dir: Path, global_batch: int, first_digest: int) -> Path:
    """The token cache beside the study (<out>/cache/data/*) whose first batch is the one rayb trained on."""
    out = study_dir.resolve().parent.parent
    for cache_dir in sorted((out / "cache" / "data").glob("*")):
        if (cache_dir / "manifest.json").is_file():
            train = open_split(cache_dir, "train")
            if (
                len(train) >= global_batch
                and batch_digest(train[batch_rows(0, global_batch)]) == first_digest
            ):
                return cache_dir
    raise SystemExit(f"no token cache under {out / 'cache' / 'data'} holds the trial's batches; pass --cache")


# ----- the model, its parameter groups and its schedule ----------------------------------------------
def build_gpt2(model_config: dict[str, Any], vocab_size: int, seq_len: int):
    """transformers' GPT-2 from rayb's size names (d_model, n_layer, n_head, d_ff); dropout off."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = dict(model_config)
    cfg = GPT2Config(
        vocab_size=vocab_size,
        n_positions=config.pop("n_positions", seq_len),
        n_embd=config.pop("d_model", 768),
        n_layer=config.pop("n_layer", 12),
        n_head=config.pop("n_head", 12),
        n_inner=config.pop("d_ff", None),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=config.pop("bos_token_id", None),
        eos_token_id=config.pop("eos_token_id", None),
        **config,
    )
    return GPT2LMHeadModel(cfg)


def check_against_saved(model, trial_dir: Path) -> None:
    """The shape-defining fields of our GPT-2 must equal those rayb saved with the trained model."""
    saved = json.loads((trial_dir / "model" / "config.json").read_text())
    fields = ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
              "layer_norm_epsilon", "initializer_range", "tie_word_embeddings"]  # fmt: skip
    ours = model.config.to_dict()
    differ = {f: (ours.get(f), saved.get(f)) for f in fields if ours.get(f) != saved.get(f)}
    if differ:
        raise SystemExit(f"reference GPT-2 config differs from rayb's saved one (ours, rayb's): {differ}")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices (every parameter with ≥ 2 dims, embeddings included), none on biases
    and LayerNorm gains, as in nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def learning_rate(step: int, peak: float, steps: int, warmup: int, schedule: str, min_ratio: float) -> float:
    """The rate optimizer step `step` (0-based) uses. Warmup: peak·(step+1)/warmup for the first
    `warmup` steps, so the first step already moves. Then half a cosine from peak (at step = warmup)
    down to min_ratio·peak at step = steps, one past the last step; or constant at peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant":
        return peak
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    floor = min_ratio * peak
    return floor + (peak - floor) * (1 + math.cos(math.pi * progress)) / 2


# ----- train, then score -----------------------------------------------------------------------------
def next_token_nll(model, ids: torch.Tensor) -> torch.Tensor:
    """Summed NLL (nats) of tokens 1..T-1 of each row given their prefixes."""
    logits = model(ids).logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="sum")


def train_reference(
    trial: dict[str, Any], train_rows: np.ndarray, val_rows: np.ndarray, manifest: dict[str, Any],
    log_every: int = 0,
):  # fmt: skip
    """Train GPT-2 as rayb's trial did; returns the model and per-step loss, lr, grad norm, digest, and the
    interim validation losses ("val": {step: loss}) where rayb's trial validated."""
    t, steps = trial["train"], trial["steps"]
    if t["optimizer"] != "adamw":
        raise SystemExit(f"the reference trains with AdamW only; the trial used {t['optimizer']}")
    global_batch, micro_batch = t["global_batch"], t["micro_batch"]
    batches_per_epoch = len(train_rows) // global_batch
    if steps > batches_per_epoch * t.get("epochs", 1):
        raise SystemExit(f"{steps} steps exceed {t.get('epochs', 1)} epoch(s) of {batches_per_epoch} batches")
    seq_len = train_rows.shape[1]

    torch.manual_seed(trial["seed"])  # the init rayb's worker draws right after seeding
    model = build_gpt2(trial["model_config"], manifest["vocab_size"], seq_len)
    check_against_saved(model, trial["trial_dir"])
    optimizer = torch.optim.AdamW(
        param_groups(model, t["weight_decay"]), lr=trial["lr"], betas=tuple(t["betas"]), eps=1e-8
    )
    history: dict[str, Any] = {"loss": [], "lr": [], "grad_norm": [], "digest": [], "step_s": [], "val": {}}
    interim = val_rows[interim_rows(len(val_rows), t["eval_batches"] * micro_batch)]
    model.train()
    for step in range(steps):
        began = time.perf_counter()
        lr = learning_rate(step, trial["lr"], steps, t["warmup_steps"], t["schedule"], t["min_lr_ratio"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        rows = train_rows[batch_rows(step, global_batch, batches_per_epoch, int(manifest["key"][:8], 16))]
        # Gradient accumulation over micro-batches: each micro-batch's mean loss, averaged, which is the
        # mean over the whole global batch (the micro-batches are equally large).
        n_micro = global_batch // micro_batch
        loss_sum = 0.0
        for micro in range(n_micro):
            ids = torch.from_numpy(rows[micro * micro_batch : (micro + 1) * micro_batch].astype(np.int64))
            loss = next_token_nll(model, ids) / ids[:, 1:].numel()
            (loss / n_micro).backward()
            loss_sum += loss.item()
        clip = t["grad_clip"] or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        history["loss"].append(loss_sum / n_micro)
        history["lr"].append(lr)
        history["grad_norm"].append(grad_norm)
        history["digest"].append(batch_digest(rows))
        history["step_s"].append(time.perf_counter() - began)  # as rayb's step_s: no validation in it
        epoch_end = t.get("epochs", 1) > 1 and (step + 1) % batches_per_epoch == 0
        if (step + 1) % t["eval_every"] == 0 or step + 1 == steps or epoch_end:
            history["val"][step + 1] = validation_loss(model, interim, micro_batch)
            model.train()
        if log_every and (step + 1) % log_every == 0:
            print(f"  step {step + 1}/{steps}  loss {loss_sum / n_micro:.4f}  lr {lr:.3g}", flush=True)
    return model, history


def interim_rows(total: int, n: int) -> np.ndarray:
    """The validation rows an interim validation scores: `n` of the `total`, evenly spaced from the first
    to the last and rounded to the nearest row (every row where n ≥ total)."""
    return np.linspace(0, total - 1, n).round().astype(np.int64) if n < total else np.arange(total)


@torch.no_grad()
def validation_loss(model, val_rows: np.ndarray, batch_size: int = 16) -> float:
    """Summed next-token NLL over positions 1..T-1 of every validation row / number of those tokens."""
    model.eval()
    nll = 0.0
    for start in range(0, len(val_rows), batch_size):
        nll += next_token_nll(model, torch.from_numpy(val_rows[start : start + batch_size].astype(np.int64)))
    return float(nll) / (len(val_rows) * (val_rows.shape[1] - 1))


# ----- the comparison --------------------------------------------------------------------------------
def compare(trial: dict[str, Any], cache_dir: Path, tolerance: float, log_every: int = 0) -> dict[str, Any]:
    rayb_log = read_metrics(trial["trial_dir"])
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    began = time.perf_counter()
    val_rows = open_split(cache_dir, "val")
    model, ref = train_reference(trial, open_split(cache_dir, "train"), val_rows, manifest, log_every)
    ref_val = validation_loss(model, val_rows)
    rayb_interim = {r["step"]: r["val_loss"] for r in read_metrics(trial["trial_dir"], "val")}
    same_validations = sorted(rayb_interim) == sorted(ref["val"])
    interim_gap = max((abs(rayb_interim[s] / ref["val"][s] - 1) for s in rayb_interim if s in ref["val"]),
                      default=math.nan)  # fmt: skip

    n = min(len(rayb_log), len(ref["loss"]))
    rayb_loss = [r["loss"] for r in rayb_log]
    ratio = trial["rayb_val_loss"] / ref_val
    same_batches = len(rayb_log) == trial["steps"] and all(
        r.get("batch_digest") == d for r, d in zip(rayb_log, ref["digest"], strict=False)
    )
    passed = abs(ratio - 1) <= tolerance and same_batches and same_validations and interim_gap <= tolerance
    return {
        "seed": trial["seed"],
        "lr": trial["lr"],
        "steps": trial["steps"],
        "trial_dir": str(trial["trial_dir"]),
        "cache_dir": str(cache_dir),
        "rayb_val_loss": trial["rayb_val_loss"],
        "ref_val_loss": ref_val,
        "ratio": ratio,
        "tolerance": tolerance,
        "passed": passed,
        "same_batches": same_batches,
        "same_validations": same_validations,  # rayb validated at the steps its settings name
        "max_val_loss_rel_diff": interim_gap,  # over the interim validations
        "rayb_final_train_loss": float(np.mean(rayb_loss[-TAIL:])),
        "ref_final_train_loss": float(np.mean(ref["loss"][-TAIL:])),
        # Diagnostics: where along the run the two agree, step by step.
        "max_lr_abs_diff": max(abs(r["lr"] - lr) for r, lr in zip(rayb_log, ref["lr"], strict=False)),
        "first_step_loss": [rayb_loss[0], ref["loss"][0]],
        "first_step_grad_norm": [rayb_log[0].get("grad_norm"), ref["grad_norm"][0]],
        "max_train_loss_rel_diff": max(
            abs(a / b - 1) for a, b in zip(rayb_loss[:n], ref["loss"][:n], strict=True)
        ),
        "ref_train_loss": ref["loss"],
        "ref_wall_s": time.perf_counter() - began,
        # Each loop's median optimizer step, in its own run (rayb's from its metrics log).
        "rayb_median_step_s": float(np.median([r["step_s"] for r in rayb_log])),
        "ref_median_step_s": float(np.median(ref["step_s"])),
    }


def reverse_test(
    study_dir: str | Path,
    model: str = "gpt2",
    seeds: list[int] | str | None = None,
    tolerance: float = 0.05,
    threads: int | None = None,
    cache: str | Path | None = None,
    log_every: int = 0,
) -> list[dict[str, Any]]:
    """Retrain the study's `model` trials (the lowest seed by default; a list of seeds, or "all"; every
    learning rate of those seeds) with the reference loop; one result per trial, each with `passed`:
    |rayb val loss / reference − 1| ≤ tolerance, the final one and each interim one (at the same steps),
    and identical batch digests at every step."""
    if threads:
        torch.set_num_threads(threads)
    study_dir = Path(study_dir)
    results = []
    for trial in load_trials(study_dir, model, seeds):
        first = read_metrics(trial["trial_dir"])[0]["batch_digest"]
        cache_dir = Path(cache) if cache else find_cache(study_dir, trial["train"]["global_batch"], first)
        results.append(compare(trial, cache_dir, tolerance, log_every))
    return results


def print_table(results: list[dict[str, Any]], model: str) -> None:
    tol = results[0]["tolerance"]
    print(f"\nreverse test: {model}, rayb vs the single-process reference, tolerance ±{tol:.0%} on val loss")
    print(f"token cache: {results[0]['cache_dir']}")
    header = (f"{'seed':>4} {'lr':>8} {'steps':>6} {'rayb val':>9} {'ref val':>9} {'ratio':>7} "
              f"{'rayb train':>11} {'ref train':>10} {'batches':>8} {'max|Δlr|':>9}  verdict")  # fmt: skip
    print(header)
    for r in results:
        print(
            f"{r['seed']:>4} {r['lr']:>8.3g} {r['steps']:>6} {r['rayb_val_loss']:>9.4f} {r['ref_val_loss']:>9.4f} "
            f"{r['ratio']:>7.4f} {r['rayb_final_train_loss']:>11.4f} {r['ref_final_train_loss']:>10.4f} "
            f"{'same' if r['same_batches'] else 'DIFFER':>8} {r['max_lr_abs_diff']:>9.2g}  "
            f"{'PASS' if r['passed'] else 'FAIL'}"
        )
    for r in results:
        loss0, norm0 = r["first_step_loss"], r["first_step_grad_norm"]
        print(f"seed {r['seed']}: step-1 loss {loss0[0]:.6f} vs {loss0[1]:.6f}, grad norm "
              f"{norm0[0]:.6f} vs {norm0[1]:.6f}; largest per-step train-loss gap "
              f"{r['max_train_loss_rel_diff']:.2%}; interim validations at "
              f"{'the same steps' if r['same_validations'] else 'DIFFERENT steps'}, largest val-loss gap "
              f"{r['max_val_loss_rel_diff']:.2%}; reference trained in {r['ref_wall_s']:.0f}s; median step "
              f"{r['rayb_median_step_s']:.3f} s vs {r['ref_median_step_s']:.3f} s")  # fmt: skip
    print("(train = mean loss of the last 10 steps)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("study_dir", type=Path, help="rayb_out/studies/<name>-<hash>")
    parser.add_argument("--model", default="gpt2", help="the model label in results.parquet (arch gpt2)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--seed", type=int, action="append", help="a seed to compare (repeatable)")
    group.add_argument("--all-seeds", action="store_true", help="compare every seed (default: the lowest)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed |rayb/reference − 1|")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--cache", type=Path, default=None, help="token cache dir (default: found by digest)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--log-every", type=int, default=0, help="print the reference's loss every N steps")
    args = parser.parse_args(argv)

    seeds = "all" if args.all_seeds else args.seed
    results = reverse_test(args.study_dir, args.model, seeds, args.tolerance, args.threads, args.cache,
                           args.log_every)  # fmt: skip
    print_table(results, args.model)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"study_dir": str(args.study_dir), "model": args.model,
                                         "results": results}, indent=2))  # fmt: skip
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
