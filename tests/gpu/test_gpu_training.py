"""The GPU acceptance suite (`pytest -m gpu` on a machine with a CUDA device; skipped elsewhere).

Every built-in architecture trains through `rayb run` on one GPU in bf16 with a falling loss, starting
from the loss the same model and batch give in fp32 on the CPU; a worker killed mid-trial resumes onto
the uninterrupted curve; and each architecture's kernel path is printed (`-s` shows it).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import loop_with_steps_held, registered_checkpoint_step, tiny_study_dict, train_worker_processes
from typer.testing import CliRunner

from rayb.cli import app
from rayb.data.cache import TokenCache
from rayb.eval.lm import as_ids, logits_nll
from rayb.results import read_results
from rayb.train.loop import METRICS
from rayb.train.trial import TRAIN_DONE, read_metrics

pytestmark = [pytest.mark.gpu, pytest.mark.ray]

STEPS, MICRO, GLOBAL, SEQ = 30, 8, 16, 256
ARCHS = {
    "gpt2": {"d_model": 128, "n_layer": 2, "n_head": 2},
    "nanogpt": {"d_model": 128, "n_layer": 2, "n_head": 2},
    "pythia": {"d_model": 128, "n_layer": 2, "n_head": 2},
    "llama": {"d_model": 128, "n_layer": 2, "n_head": 2},
    "mamba": {"d_model": 128, "n_layer": 2, "d_state": 16},
    "mamba2": {"d_model": 128, "n_layer": 2, "d_state": 64, "head_dim": 32},
    "gated_deltanet": {"d_model": 128, "n_layer": 2, "head_dim": 32},
    "rwkv6": {"d_model": 128, "n_layer": 2, "head_size": 32},
}


def gpu_study(**train) -> dict:
    study = tiny_study_dict(
        name="gpu-acceptance",
        models=[{"arch": arch, "config": config} for arch, config in ARCHS.items()],
        # allow_slow_kernels: the suite trains every architecture on whatever this machine has, and prints
        # the path each one took (a study without the flag stops where a fused kernel is missing).
        train={"lr": 3e-3, "warmup_steps": 5, "micro_batch": MICRO, "global_batch": GLOBAL, "eval_every": 10,
               "use_gpu": True, "allow_slow_kernels": True} | train,
        seeds=[0],
        verdict={"reference": "gpt2"},
    )  # fmt: skip
    study["data"] |= {
        "tokenizer": "bpe:2048",
        "seq_len": SEQ,
        "token_budget": STEPS * GLOBAL * SEQ,
        "val_share": 0.05,
    }
    for source in study["data"]["sources"]:
        source["uri"] = source["uri"].replace("docs=300", "docs=2000")
    return study


def _run(out: Path, study: dict):
    study_file = out / f"{study['name']}.yaml"
    study_file.write_text(yaml.safe_dump(study))
    result = CliRunner().invoke(app, ["run", str(study_file), "--output", str(out)])
    assert result.exit_code == 0, result.output
    (study_dir,) = (out / "studies").glob(f"{study['name']}-*")
    return out, read_results(study_dir / "results.parquet").set_index("model")


@pytest.fixture(scope="module")
def gpu_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gpu")


@pytest.fixture(scope="module")
def gpt2_run(gpu_out):
    """GPT-2 alone: the uninterrupted reference of the resume and compile tests (which need no other model)."""
    study = gpu_study()
    study["name"] = "gpt2-reference"
    study["models"] = [m for m in study["models"] if m["arch"] == "gpt2"]
    return _run(gpu_out, study)


@pytest.fixture(scope="module")
def gpu_run(gpu_out, gpt2_run):
    """Every architecture, in the same output: the cache and GPT-2's finished trial are reused."""
    return _run(gpu_out, gpu_study())


def test_every_architecture_trains_in_bf16_on_the_gpu_and_prints_its_kernels(gpu_run):
    _, table = gpu_run
    for arch in ARCHS:
        row = table.loc[arch]
        print(f"{arch}: {dict(row.kernels)}")  # noqa: T201 (the suite's report of the kernel paths)
        assert row.status == "ok", (arch, row.error)
        assert row.precision == "bf16"
        assert row.curve_train_loss[-1] < row.curve_train_loss[0] - 0.5, arch


def test_step_one_matches_fp32_on_the_cpu_for_the_same_batch(gpu_run):
    out, table = gpu_run
    (cache_dir,) = (out / "cache" / "data").iterdir()
    cache = TokenCache(cache_dir)
    for arch in ARCHS:
        row = table.loc[arch]
        gpu_step1 = row.curve_train_loss[0]
        cpu_step1 = _cpu_fp32_step_one(arch, json.loads(row.model_config), cache)
        assert abs(gpu_step1 - cpu_step1) < 2e-2, (arch, gpu_step1, cpu_step1)


def _cpu_fp32_step_one(arch: str, config: dict, cache: TokenCache) -> float:
    """The loss of step 1 as the trial computes it, on the CPU in fp32: the same seeded initialisation
    (the worker seeds, then builds on the host) and the same global batch."""
    from rayb.models import build_model
    from rayb.train.loop import _seed_everything

    _seed_everything(0)
    model = build_model(arch, config, cache.manifest["vocab_size"], cache.seq_len)
    losses = []
    with torch.no_grad():
        for micro in range(GLOBAL // MICRO):
            ids = as_ids(cache.micro_batch(0, micro, 0, 1, GLOBAL, MICRO))
            losses.append((logits_nll(model(ids).logits, ids) / ids[:, 1:].numel()).item())
    return sum(losses) / len(losses)


def test_a_compiled_trial_trains_the_same_model(gpt2_run, tmp_path):
    """train.compile: the same trial under torch.compile starts from the same loss and ends close to it
    (bf16 rounding differs between the fused and eager kernels)."""
    from rayb.runner import plan_trials
    from rayb.study import parse_study
    from rayb.train.trainer import pack_trainer
    from rayb.train.trial import TrialPack

    out, table = gpt2_run
    raw = gpu_study(compile=True)
    raw["models"] = [m for m in raw["models"] if m["arch"] == "gpt2"]
    (cache_dir,) = (out / "cache" / "data").iterdir()
    (trial,) = plan_trials(parse_study(raw), TokenCache(cache_dir), tmp_path)
    pack_trainer(TrialPack((trial,))).fit()
    compiled = [r["loss"] for r in read_metrics(Path(trial.trial_dir) / METRICS) if r["kind"] == "train"]
    eager = list(table.loc["gpt2"].curve_train_loss)
    assert abs(compiled[0] - eager[0]) < 1e-2 and abs(compiled[-1] - eager[-1]) < 5e-2


def test_a_killed_worker_resumes_onto_the_uninterrupted_curve(gpt2_run, tmp_path):
    """SIGKILL the training worker once the step-10 checkpoint is registered: Ray Train restarts it from
    that checkpoint, or from step 20's (weights, optimizer, schedule, data position, CPU and CUDA random
    state). CUDA kernels with atomics (embedding backward) are not bitwise reproducible, so the curves are
    held to 1e-2 rather than to the last bit."""
    from rayb.runner import plan_trials
    from rayb.study import parse_study
    from rayb.train.trainer import pack_trainer
    from rayb.train.trial import TrialPack

    out, table = gpt2_run
    raw = gpu_study()
    raw["models"] = [m for m in raw["models"] if m["arch"] == "gpt2"]
    (cache_dir,) = (out / "cache" / "data").iterdir()
    (trial,) = plan_trials(parse_study(raw), TokenCache(cache_dir), tmp_path)
    thread = threading.Thread(
        target=pack_trainer(TrialPack((trial,)), loop=loop_with_steps_held(10, 0.3)).fit
    )
    thread.start()
    log, run_dir = Path(trial.trial_dir) / METRICS, Path(trial.storage_path) / trial.run_name
    deadline = time.time() + 600
    while not (log.exists() and read_metrics(log)[-1:] and read_metrics(log)[-1]["step"] > 10
               and registered_checkpoint_step(run_dir) >= 10):  # fmt: skip
        assert time.time() < deadline and thread.is_alive(), "training never passed its step-10 checkpoint"
        time.sleep(0.05)
    killed_at = read_metrics(log)[-1]["step"]
    workers = train_worker_processes()
    assert workers, "no Ray Train worker process found"
    for process in workers:
        process.send_signal(signal.SIGKILL)
    thread.join(timeout=600)
    # Where it resumed, as the resumed run logged it (a kill just after a checkpoint re-logs no step).
    (resumed_after,) = [r["step"] for r in read_metrics(log) if r["kind"] == "resume"]
    assert resumed_after in (10, 20), f"killed after step {killed_at}, resumed after step {resumed_after}"
    resumed = [r["loss"] for r in read_metrics(log) if r["kind"] == "train"]
    reference = list(table.loc["gpt2"].curve_train_loss)
    assert len(resumed) == len(reference) == STEPS
    assert max(abs(a - b) for a, b in zip(resumed, reference, strict=True)) < 1e-2
    assert json.loads((Path(trial.trial_dir) / TRAIN_DONE).read_text())["status"] == "ok"
