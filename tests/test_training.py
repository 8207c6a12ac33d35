"""Ray Train + DeepSpeed on real workers: the identical-stream property, logging, checkpoints."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    actor_runtime_envs,
    controller_processes,
    job_actors,
    kept_worker_ids,
    loop_with_steps_held,
    ray_processes,
    registered_checkpoint_trial,
    restart_points,
    session_actors,
    tiny_study_dict,
    train_worker_processes,
)

from rayb import storage
from rayb.data.cache import row_digest
from rayb.runner import plan_trials
from rayb.study import Study, StudyError, parse_study
from rayb.train.kept import kept_controller_ids, release_kept_workers, take_controller
from rayb.train.loop import METRICS, wanted_by
from rayb.train.trainer import pack_trainer
from rayb.train.trial import TRAIN_DONE, TrialPack, TrialSpec, read_metrics
from rayb.tune.packs import worker_pool
from rayb.tune.sweep import run_pool

pytestmark = pytest.mark.ray

# The start of a fresh process's script that trains through DeepSpeed alone: a world of one, whose store
# binds a free port itself (MASTER_PORT 0; one picked ahead may be taken by another process meanwhile).
WORLD_OF_ONE = """import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
"""


def _on_cpu() -> dict[str, str]:
    """This process's environment, with DeepSpeed's accelerator set to its CPU one."""
    return os.environ | {"DS_ACCELERATOR": "cpu"}


def _trial(tiny_cache, out: Path, arch_index: int, num_workers: int, **train) -> tuple[Study, TrialSpec]:
    raw = tiny_study_dict(seeds=[0])
    raw["train"] |= {"num_workers": num_workers, **train}
    study = parse_study(raw)
    return study, next(
        t for t in plan_trials(study, tiny_cache, out) if t.arch == study.models[arch_index].arch
    )


def _alive_coordinators() -> int:
    return len([a for a in session_actors("_AutoscalingCoordinatorActor") if a["State"] == "ALIVE"])


@pytest.fixture(scope="module")
def trained(tiny_cache, tmp_path_factory):
    """The runs below, and how many of Ray Train's autoscaling coordinators were alive after each kind of
    run: one that asks an autoscaler for its workers, and one that does not."""
    import ray
    from strict_collectives import strict_train_loop

    from rayb.train.trainer import start_train_services

    out = tmp_path_factory.mktemp("train")
    one_worker = {
        ("gpt2", 1): _trial(tiny_cache, out / "w1", 0, 1),
        ("mamba", 1): _trial(tiny_cache, out / "w1", 1, 1),
        # ADOPT-atan2 through DeepSpeed's ZeRO-1 wrapper (a client optimizer, not DeepSpeed's own Adam)
        ("gpt2-adopt_atan2", 1): _trial(tiny_cache, out / "adopt", 0, 1, optimizer="adopt_atan2"),
        # Mixed precision runs on a CPU too: autocast to bfloat16, fp32 parameters and optimizer state.
        ("gpt2-bf16", 1): _trial(tiny_cache, out / "bf16", 0, 1, precision="bf16"),
    }
    # One worker group trains these one after another, as a study's pack does: each builds its own model,
    # optimizer and engine.
    engines_left = out / "engines-left"
    pack_trainer(
        TrialPack(tuple(trial for _, trial in one_worker.values())), loop=_counting_engines(engines_left)
    ).fit()
    # That run asked for its workers through the coordinator start_train_services starts early (or found).
    start_train_services()
    coordinators = {"after a run that asks": _alive_coordinators()}
    ray.kill(ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator"))
    # Two workers whose default group refuses rayb's CPU tensors, as NCCL does on a GPU node; a run that
    # asks no autoscaler, as on rayb's private instance.
    two_workers = _trial(tiny_cache, out / "w2", 0, 2)
    pack_trainer(TrialPack((two_workers[1],)), loop=strict_train_loop, requests_resources=False).fit()
    coordinators["after a run that does not"] = _alive_coordinators()
    runs = one_worker | {("gpt2", 2): two_workers}
    trained = {key: (study, Path(trial.trial_dir)) for key, (study, trial) in runs.items()}
    return trained, coordinators, int(engines_left.read_text())


def _counting_engines(report: Path):
    """rayb's loop, then how many DeepSpeed engines are left in the worker, into `report`."""

    def loop(config):
        import gc

        from deepspeed import DeepSpeedEngine

        from rayb.train.loop import train_loop_per_worker

        train_loop_per_worker(config)
        gc.collect()
        report.write_text(str(sum(isinstance(o, DeepSpeedEngine) for o in gc.get_objects())))

    return loop


@pytest.fixture(scope="module")
def runs(trained):
    return trained[0]


def test_ray_trains_controller_imports_no_torch(tiny_cache, tmp_path):
    """Ray Train's controller unpickles what a worker group's trainer hands it (its callbacks, the backend
    among them). It never trains: none of it, nor the training function until it runs on a worker, may
    import torch, whose import delays every group's start (train/backend.py)."""
    import subprocess
    import sys

    import cloudpickle

    _, trial = _trial(tiny_cache, tmp_path, 0, 2)
    trainer = pack_trainer(TrialPack((trial,)), queue="a-pools-queue")  # its callbacks: PoolCleaner too
    sent = cloudpickle.dumps(
        (trainer._create_default_callbacks(), trainer._get_train_func())
    )  # Ray's own hand-off
    probe = "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print(sorted(m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], input=sent, capture_output=True, check=True)
    assert done.stdout.decode().strip() == "[]", done.stderr.decode()[-2000:]


def test_deepspeed_trains_without_importing_muon_or_torchs_compiler_and_to_the_same_weights():
    """DeepSpeed imports its Muon optimizer in ZeRO's optimizer check and in every step's gradient
    reduction, and Muon compiles its kernels at import: 2-3.5 s of each worker's first step. Within
    rayb's training (train/deepspeed_imports.without_muon) neither Muon nor torch's compiler is imported,
    for every ZeRO stage rayb allows, and the weights after two steps are those of DeepSpeed with the real
    Muon modules; after, Muon imports as ever."""
    import subprocess
    import sys

    probe = (
        WORLD_OF_ONE
        + """
import sys
import deepspeed, torch
from rayb.train.deepspeed_imports import DEEPSPEED_MUON, DEEPSPEED_MUON_KERNELS, without_muon, without_shm_comm

without_shm_comm()  # as rayb's workers train

def trained(stage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    config = {"train_batch_size": 2, "zero_optimization": {"stage": stage}}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    for step in range(2):
        engine.backward(engine(torch.randn(2, 8)).square().mean())
        engine.step()
    return [p.detach().clone() for p in model.parameters()]

stages = (0, 1, 2)
with without_muon():
    stand_in = [trained(stage) for stage in stages]
    print(sorted(m for m in ("torch._inductor.compile_fx", "torch._inductor.lowering") if m in sys.modules))
print(sorted(m for m in (DEEPSPEED_MUON, DEEPSPEED_MUON_KERNELS) if m in sys.modules))
from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
assert issubclass(MuonWithAuxAdam, torch.optim.Optimizer)
real = [trained(stage) for stage in stages]
print(all(torch.equal(a, b) for s, r in zip(stand_in, real) for a, b in zip(s, r)))
"""
    )
    done = subprocess.run([sys.executable, "-c", probe], env=_on_cpu(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-3:] == ["[]", "[]", "True"], done.stdout[-3000:]


def test_one_cpu_worker_leaves_out_zero_1s_gradient_buckets_for_the_same_weights():
    """On one CPU worker rayb's ZeRO-1 leaves out the copy of each gradient into a contiguous bucket
    (train/engine.py); the weights after three steps of gradient accumulation, with clipping acting, are
    DeepSpeed's default's to the bit, in fp32 and under bf16 autocast. Several workers or a GPU keep it."""
    from rayb.train.engine import deepspeed_config
    from rayb.train.spec import TrainSpec

    def buckets(**spec) -> bool | None:
        return deepspeed_config(TrainSpec(global_batch=4, micro_batch=2, **spec))["zero_optimization"].get(
            "contiguous_gradients"
        )

    assert buckets(zero_stage=1) is False
    assert (
        buckets(zero_stage=1, num_workers=2)
        is buckets(zero_stage=1, use_gpu=True)
        is buckets(zero_stage=2)
        is None
    )
    probe = (
        WORLD_OF_ONE
        + """
from rayb.train.loop import import_worker_libraries
import_worker_libraries(use_gpu=False)
import deepspeed, torch
from rayb.eval.lm import logits_nll
from rayb.models import build_model
from rayb.train.engine import deepspeed_config, make_optimizer, param_groups
from rayb.train.spec import TrainSpec

def trained(precision, zero):
    train = TrainSpec(global_batch=4, micro_batch=2, grad_clip=0.01, zero_stage=1, precision=precision)
    torch.manual_seed(0)
    model = build_model("gpt2", {"d_model": 32, "n_layer": 2, "n_head": 2}, 64, 16)
    optimizer = make_optimizer("adamw", param_groups(model, 0.1), 0.01, (0.9, 0.95))
    config = deepspeed_config(train)
    config["zero_optimization"] |= zero
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    batches = torch.Generator().manual_seed(1)
    for _ in range(3 * train.accumulation):
        ids = torch.randint(0, 64, (2, 16), generator=batches)
        engine.backward(logits_nll(engine(ids).logits, ids) / ids[:, 1:].numel())
        engine.step()
    return [p.detach().clone() for p in model.parameters()]

for precision in ("fp32", "bf16"):
    rayb, default = trained(precision, {}), trained(precision, {"contiguous_gradients": True})
    print(precision, all(torch.equal(a, b) for a, b in zip(rayb, default, strict=True)))
"""
    )
    done = subprocess.run([sys.executable, "-c", probe], env=_on_cpu(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-2:] == ["fp32 True", "bf16 True"], done.stdout[-3000:]


def test_a_worker_neither_compiles_nor_loads_deepspeeds_shared_memory_all_reduce(tmp_path):
    """DeepSpeed's CPU backend compiles a C++ all-reduce as it starts where no build is cached (87 CPU-seconds
    on 2 cores, in the first worker of a fresh machine) for tensor-parallel inference alone: a worker's
    imports (train/loop.import_worker_libraries) tell it not to, also where DeepSpeed was imported before
    them, and its ZeRO steps reduce as ever."""
    probe = (
        WORLD_OF_ONE
        + """
import deepspeed, torch  # before the worker's imports, as a test's wrapper of the loop does
from rayb.train.loop import import_worker_libraries
import_worker_libraries(use_gpu=False)
model = torch.nn.Linear(4, 4)
config = {"train_batch_size": 2, "zero_optimization": {"stage": 1}}
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config)
engine.backward(engine(torch.randn(2, 4)).square().mean())
engine.step()
print(deepspeed.comm.comm.cdb.shm_comm_op)
"""
    )
    builds = tmp_path / "torch_extensions"
    env = os.environ | {"TORCH_EXTENSIONS_DIR": str(builds)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "None", done.stdout[-3000:]
    assert not builds.exists() or not any(builds.iterdir())


def test_a_gpu_worker_probes_no_deepspeed_ops_for_the_shared_memory_all_reduce():
    """Only DeepSpeed's CPU accelerator has the shared-memory all-reduce: under CUDA's, telling DeepSpeed not
    to build it must not make it probe which ops the machine can build (compilers, GPU queries) either."""
    probe = """
from rayb.train.deepspeed_imports import without_shm_comm
without_shm_comm()
import deepspeed.ops
print("__compatible_ops__" in vars(deepspeed.ops))
"""
    env = os.environ | {"DS_ACCELERATOR": "cuda"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "False", done.stderr[-3000:]


def test_worker_groups_start_no_ray_data_machinery_nor_a_cleaner_actor(runs):
    """rayb passes Ray Train no datasets: its runs start no DatasetManager actor; nor does any run start
    Ray Train's placement-group cleaner actor, which without a dashboard cannot work (trainer.PackTrainer)."""
    started = {actor["ActorClassName"] for actor in session_actors()}
    assert "EnvController" in started, sorted(started)
    assert not started & {"DatasetManager", "PlacementGroupCleaner"}, sorted(started)


def test_a_run_on_the_main_thread_leaves_neither_its_ctrl_c_handler_nor_its_controller(runs):
    """Ray Train sets a Ctrl-C handler for a run fit() on the main thread (the fixture's), which holds the
    run's controller: once the run ends the handler before it is back, and the controller, neither kept (a
    run outside the pool) nor running, is gone, not left idle until another run's handler replaces it."""
    assert getattr(signal.getsignal(signal.SIGINT), "__name__", None) != "sigint_handler"
    deadline = time.monotonic() + 10
    while idle := controller_processes():  # the live ones this driver does not keep
        assert time.monotonic() < deadline, idle
        time.sleep(0.2)


def test_ray_trains_controller_starts_with_no_runtime_env_of_its_own_yet_passes_its_settings_on(runs):
    """Ray starts an actor that has a runtime_env of its own in a new process, never on one of its idle
    workers, and so each actor that actor starts (2.2-2.7 s each on 2 cores): Ray Train's controller
    (trainer.EnvController) and its synchronization actor have none. The controller still has Ray Train's
    settings, and hands them to its workers: in a runtime env where a run may reach other nodes (the
    fixture's run that asks an autoscaler), and on rayb's private instance (the other run) by the
    environment every process of the instance inherits, with no runtime env (trainer.InheritingWorkerGroup)."""
    import os

    import ray

    from rayb.runtime import TRAIN_SETTINGS

    controllers, sync_actors = actor_runtime_envs("EnvController"), actor_runtime_envs("SynchronizationActor")
    assert controllers and sync_actors
    assert not [env for env in controllers + sync_actors if env.get("env_vars")]
    settings = {name: os.environ.get(name, value) for name, value in TRAIN_SETTINGS}
    workers = actor_runtime_envs("RayTrainWorker")
    handed = [env for env in workers if env]
    assert handed and all(env["env_vars"].items() >= settings.items() for env in handed), workers
    assert len(handed) < len(workers), workers  # the private instance's run: workers with none
    inherited = ray.get(ray.remote(num_cpus=0)(lambda: {n: os.environ.get(n) for n in settings}).remote())
    assert inherited == settings


def test_the_coordinator_rayb_starts_early_is_the_one_ray_trains_runs_use(trained):
    """trainer.start_train_services starts Ray Train's autoscaling coordinator before any run needs it: after
    a run that asked for its workers, the cluster has that one coordinator, not a second one of Ray Train's
    own."""
    assert trained[1]["after a run that asks"] == 1


def test_a_run_that_asks_no_autoscaler_starts_no_coordinator(trained):
    """On rayb's private instance no autoscaler serves resource requests (runtime.private_instance): its
    runs send none, and Ray Train's coordinator, one more process beside the training steps, never
    starts."""
    from rayb import runtime

    assert runtime.private_instance()  # the suite's Ray is one rayb started
    assert trained[1]["after a run that does not"] == 0


def test_a_worker_keeps_no_engine_of_the_trials_it_has_trained(trained):
    """A worker that trains a pack's trials one after another leaves none of their DeepSpeed engines (and so
    none of their models, optimizer states or buffers) behind: DeepSpeed's optimizer holds an engine until it
    is destroyed, and a worker kept every trial it had trained, memory a GPU's later trials needed."""
    assert trained[2] == 0


def _digests(trial_dir: Path) -> list[int]:
    return [r["batch_digest"] for r in read_metrics(trial_dir / METRICS) if r["kind"] == "train"]


def test_every_model_and_worker_count_sees_the_same_batches(runs, tiny_cache):
    study, _ = runs[("gpt2", 1)]
    global_batch = study.train.global_batch
    expected = [
        row_digest(tiny_cache.train[s * global_batch : (s + 1) * global_batch]) for s in range(study.steps)
    ]
    for key, (_, trial_dir) in runs.items():
        assert _digests(trial_dir) == expected, key


def test_training_learns_and_logs(runs, tiny_cache):
    for key, (study, trial_dir) in runs.items():
        log = read_metrics(trial_dir / METRICS)
        train = [r for r in log if r["kind"] == "train"]
        assert [r["step"] for r in train] == list(range(1, study.steps + 1)), key
        assert all(r["grad_norm"] is not None and r["tokens_per_s"] > 0 for r in train)
        # 24 steps of a 2-layer d32 model: the tiny Mamba learns least (0.47 nats on the current data).
        assert train[-1]["loss"] < train[0]["loss"] - 0.3, key
        assert train[0]["lr"] < train[study.train.warmup_steps]["lr"]  # warmup
        val = [r for r in log if r["kind"] == "val"]
        assert [r["step"] for r in val] == [8, 16, 24]
        assert val[0]["val_loss"] > val[1]["val_loss"] > val[2]["val_loss"], key  # and it generalises
        result = json.loads((trial_dir / TRAIN_DONE).read_text())
        assert result["status"] == "ok" and result["steps"] == study.steps
        assert result["train_tokens"] == study.steps * study.train.global_batch * tiny_cache.seq_len
        assert (trial_dir / "model" / "model.safetensors").exists()
        assert (trial_dir / "model" / "config.json").exists()


def test_rayb_sends_collectives_only_where_the_backend_takes_them(runs):
    """The two-worker run's default group refused every CPU tensor rayb sent it (strict_collectives.py):
    the run still finished, every host-side number having gone over the gloo group beside it."""
    _, trial_dir = runs[("gpt2", 2)]
    assert json.loads((trial_dir / TRAIN_DONE).read_text())["status"] == "ok"


def test_bf16_trains_like_fp32_from_the_same_start(runs):
    fp32 = [r["loss"] for r in read_metrics(runs[("gpt2", 1)][1] / METRICS) if r["kind"] == "train"]
    bf16 = [r["loss"] for r in read_metrics(runs[("gpt2-bf16", 1)][1] / METRICS) if r["kind"] == "train"]
    assert abs(bf16[0] - fp32[0]) < 1e-2  # step 1: the same weights and batch, rounded activations
    assert bf16[0] != fp32[0]  # and the forward really ran in bfloat16
    assert bf16[-1] < bf16[0] - 0.5
    from safetensors.torch import load_file

    weights = load_file(str(runs[("gpt2-bf16", 1)][1] / "model" / "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.float32}  # parameters stay fp32


def test_every_trial_records_its_precision_and_kernel_paths(runs):
    results = {key: json.loads((trial_dir / TRAIN_DONE).read_text()) for key, (_, trial_dir) in runs.items()}
    assert results[("gpt2", 1)]["precision"] == "fp32" and results[("gpt2-bf16", 1)]["precision"] == "bf16"
    assert results[("gpt2", 1)]["kernels"] == {"attention": "PyTorch scaled_dot_product_attention (cpu)"}
    assert results[("mamba", 1)]["kernels"] == {"selective scan": "rayb fused CPU scan"}
    assert all(r["device"] == "cpu" for r in results.values())


def test_one_and_two_workers_train_the_same_model(runs):
    """Same data, same init, same global batches: only float summation order may differ."""
    one = [r["loss"] for r in read_metrics(runs[("gpt2", 1)][1] / METRICS) if r["kind"] == "train"]
    two = [r["loss"] for r in read_metrics(runs[("gpt2", 2)][1] / METRICS) if r["kind"] == "train"]
    np.testing.assert_allclose(one, two, rtol=2e-3)


def test_a_checkpoint_holds_only_what_a_resume_reads(runs):
    """A two-rank checkpoint as the training loop reports it: the files DeepSpeed's load_checkpoint and
    rayb's random state read, each shared or one rank's (loop.wanted_by), and not DeepSpeed's conversion
    scripts, which it copies into every checkpoint."""
    _, trial_dir = runs[("gpt2", 2)]
    checkpoints = [p for p in trial_dir.parent.parent.glob("ray/train/*/checkpoint_*") if p.is_dir()]
    assert checkpoints
    for checkpoint in checkpoints:
        tag = (checkpoint / "latest").read_text().strip()
        files = sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file())
        own = [
            [f"{tag}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", f"rng_rank{rank}.pt"] for rank in (0, 1)
        ]
        assert files == sorted(["latest", f"{tag}/mp_rank_00_model_states.pt", *own[0], *own[1]])
        assert [f for f in files if not wanted_by(0, f)] == own[1]


def test_killed_worker_resumes_its_pack_to_the_identical_result(runs, tiny_cache, tmp_path):
    """Two seeds in one worker group of a study's pool. SIGKILL a worker during the second: Ray Train
    restarts the group, which takes its trial from the pool's queue again and resumes it from its last
    checkpoint (weights, optimizer, schedule, data position, RNG), leaving the finished one alone. Each ends
    exactly where a lone, uninterrupted trial of its seed ends."""
    kill_at = random.randint(9, 20)  # once a checkpoint (step 8 or 16) of the second trial is registered
    study, reference_dir = runs[("gpt2", 1)]
    raw = tiny_study_dict(seeds=[1, 0])
    gpt2 = {t.seed: t for t in plan_trials(parse_study(raw), tiny_cache, tmp_path) if t.arch == "gpt2"}
    (pack,) = worker_pool([gpt2[1], gpt2[0]], slots=1, cores=1)  # one thread, as the reference trained
    thread = threading.Thread(target=run_pool, args=([pack], 1))
    thread.start()
    log = Path(gpt2[0].trial_dir) / METRICS
    deadline = time.time() + 300
    run_dir = Path(pack.storage_path) / pack.run_name
    while not (
        log.exists() and read_metrics(log)[-1:] and read_metrics(log)[-1]["step"] >= kill_at
        and registered_checkpoint_trial(run_dir) == gpt2[0].key  # the second trial's, at step 8 or 16
    ):  # fmt: skip
        assert time.time() < deadline and thread.is_alive(), "training never reached the kill step"
        time.sleep(0.05)
    victims = train_worker_processes()
    assert victims, "no Ray Train worker process found"
    for process in victims:
        process.send_signal(signal.SIGKILL)
    thread.join(timeout=300)

    assert restart_points(Path(gpt2[1].trial_dir) / METRICS) == []  # finished before the kill: not rerun
    # Where it resumed, as the resumed run logged it: a kill that lands between the step-16 checkpoint and
    # step 17's line leaves no step logged twice.
    (restart,) = [r["step"] for r in read_metrics(log) if r["kind"] == "resume"]
    assert restart in (8, 16), f"killed at step {kill_at}, resumed after step {restart}"
    resumed = [r["loss"] for r in read_metrics(log) if r["kind"] == "train"]
    reference = [r["loss"] for r in read_metrics(reference_dir / METRICS) if r["kind"] == "train"]
    assert resumed == reference, f"killed at step {kill_at}"
    # Each worker group's start-up is charged to the first trial it trains: here the first seed, and the
    # second, which the restarted group resumed.
    for trial in pack.trials:
        result = json.loads((Path(trial.trial_dir) / TRAIN_DONE).read_text())
        assert result["status"] == "ok"
        parts = ("worker_start_s", "process_group_s", "set_up_s", "checkpoint_s")
        assert all(result["timings"][part] > 0 for part in parts)
        assert result["timings"]["worker_process_s"] >= 0  # 0 where Ray gave the worker a started process
        assert (
            result["timings"]["worker_process_s"] + result["timings"]["process_group_s"]
            < result["timings"]["worker_start_s"]
        )


def test_a_killed_controller_leaves_no_placement_group_holding_its_cpus(runs, tiny_cache, tmp_path):
    """SIGKILL the Ray Train controller of a pool's worker group mid-trial. Its workers die with it, but its
    placement group belongs to the job and would hold their CPUs until the study ends: the pool's queue
    removes it (trainer.PoolCleaner, in place of Ray Train's cleaner actor per run). Started again, as the
    pool starts a lost group, the run resumes its trial to the uninterrupted result."""
    import ray
    from ray.util import placement_group_table

    from rayb.tune.group import TrialQueue, queue_actor

    def held() -> set[str]:
        return {pg for pg, group in placement_group_table().items() if group["state"] != "REMOVED"}

    _, reference_dir = runs[("gpt2", 1)]
    trial = next(t for t in plan_trials(parse_study(tiny_study_dict(seeds=[0])), tiny_cache, tmp_path)
                 if t.arch == "gpt2")  # fmt: skip
    (pack,) = worker_pool([trial], slots=1, cores=1)  # one thread, as the reference trained
    name, earlier = f"queue-{tmp_path.name}", held()
    queue = queue_actor(relay=4).options(name=name, num_cpus=0).remote({pack.queue: [trial.key]})
    died: list[Exception] = []
    release_kept_workers()  # the run's controller is then a new one, not one this driver kept
    ended = {p.pid for p in ray_processes("EnvController")}  # earlier runs' controllers, on their way out

    def fit() -> None:
        try:
            pack_trainer(pack, loop=loop_with_steps_held(8, 0.2), queue=name).fit()
        except Exception as exc:  # the run's controller is gone
            died.append(exc)

    thread = threading.Thread(target=fit)
    thread.start()
    log, run_dir = Path(trial.trial_dir) / METRICS, Path(pack.storage_path) / pack.run_name
    deadline = time.time() + 300
    while not (log.exists() and registered_checkpoint_trial(run_dir) == trial.key):
        assert time.time() < deadline and thread.is_alive(), "no checkpoint registered in time"
        time.sleep(0.05)
    assert held() - earlier, "the run holds no placement group"
    (controller,) = [p for p in ray_processes("EnvController") if p.pid not in ended]  # the running run's
    controller.send_signal(signal.SIGKILL)
    thread.join(timeout=120)
    assert died and not thread.is_alive()
    deadline = time.time() + 10 * TrialQueue.CHECK_S
    while held() - earlier:
        assert time.time() < deadline, "the killed run's placement group still holds its CPUs"
        time.sleep(0.2)

    pack_trainer(pack, queue=name).fit()
    ray.kill(queue)
    assert json.loads((Path(trial.trial_dir) / TRAIN_DONE).read_text())["status"] == "ok"
    # From its step-8 checkpoint (or step 16's, on a machine so loaded that the kill came 8 held steps late).
    assert [r["step"] for r in read_metrics(log) if r["kind"] == "resume"] in ([8], [16])
    resumed = [r["loss"] for r in read_metrics(log) if r["kind"] == "train"]
    assert resumed == [r["loss"] for r in read_metrics(reference_dir / METRICS) if r["kind"] == "train"]


def _started_ahead(before: set[bytes]) -> tuple[list, list]:
    """This job's Train workers started since `before` (their actor ids): those this driver owns (the pool's
    warm workers, kept.start_warm_workers) and those a Train controller started and owns."""
    import ray

    driver = ray.get_runtime_context().get_worker_id()
    new = [a for a in job_actors("RayTrainWorker") if a.actor_id not in before]
    ours = [a for a in new if a.owner_address.worker_id.hex() == driver]
    return ours, [a for a in new if a not in ours]


def test_a_pools_warm_worker_trains_the_next_pools_group_and_no_other_outlives_its_pool(
    runs, tiny_cache, tmp_path, monkeypatch
):
    """On rayb's private instance the pool starts its first groups' Train workers before their controllers,
    which then adopt them (trainer.InheritingWorkerGroup): the group starts no worker of its own. A worker
    whose group ends cleanly is kept by the driver, and the next pool's group adopts it: the same process
    trains there, from a model of another architecture to its trial's uninterrupted numbers. A group that
    cannot adopt it (its workers need a runtime env: here a Ray Train setting changed after Ray started)
    starts its own, which does not outlive it, and the kept worker waits on; a worker that trained a user's
    model (named by import path, whose module may patch what the process has imported) is not kept."""
    from ray.core.generated import gcs_pb2

    dead = gcs_pb2.ActorTableData.DEAD
    release_kept_workers()
    _, reference_dir = runs[("gpt2", 1)]

    def trial(seed: int, like: str, **model):
        """The tiny study's trial of model `like` for `seed`, with `model`'s fields changed."""
        raw = tiny_study_dict(seeds=[seed])
        raw["models"] = [m | model for m in raw["models"] if m["arch"] == like]
        return plan_trials(parse_study(raw), tiny_cache, tmp_path)[0]

    def pool(trained: TrialSpec) -> tuple[list, list]:
        """Train it in a pool of its own: the Train workers started meanwhile, the driver's and the rest."""
        before = {a.actor_id for a in job_actors("RayTrainWorker")}
        assert run_pool(worker_pool([trained], slots=1, cores=1), 1) == {} and trained.done
        return _started_ahead(before)

    (warm,), own = pool(trial(0, "mamba"))
    assert not own and kept_worker_ids() == {warm.actor_id.hex()}
    gpt2 = trial(0, "gpt2")
    assert pool(gpt2) == ([], [])  # trained on the kept worker: no worker started
    assert kept_worker_ids() == {warm.actor_id.hex()}
    assert json.loads((Path(gpt2.trial_dir) / TRAIN_DONE).read_text())["timings"]["worker_process_s"] == 0
    trained = [r["loss"] for r in read_metrics(Path(gpt2.trial_dir) / METRICS) if r["kind"] == "train"]
    assert trained == [r["loss"] for r in read_metrics(reference_dir / METRICS) if r["kind"] == "train"]

    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.4")
    warm_now, own = pool(trial(1, "gpt2"))
    assert not warm_now and len(own) == 1 and own[0].state == dead
    assert kept_worker_ids() == {warm.actor_id.hex()}
    monkeypatch.undo()

    user = trial(1, "gpt2", arch="faulty_models:nan_after", name="user",
                 config={"d_model": 32, "n_layer": 2, "n_head": 2, "nan_at": 10**6})  # fmt: skip
    assert pool(user) == ([], [])  # trained on the kept worker, which is then not kept
    assert not kept_worker_ids()
    assert [a.state for a in job_actors("RayTrainWorker") if a.actor_id == warm.actor_id] == [dead]


def test_a_studys_first_worker_and_controller_start_before_its_data_is_prepared_and_a_finished_study_starts_none(
    ray_session, tmp_path, monkeypatch
):
    """A study that has trials to train starts its pool's first Train worker and its first run's controller
    as soon as Ray is up, ahead of its data, self-checks and planning (sweep.start_first_group_ahead): the
    pool's group adopts that worker and trains on it, under that controller. Run again, with every trial
    finished, it starts neither."""
    import rayb.data.pipeline
    from rayb.runner import run_study

    prepare, seen = rayb.data.pipeline.prepare_data, []

    def preparing(*args, **kwargs):
        seen.append((kept_worker_ids(), kept_controller_ids()))
        return prepare(*args, **kwargs)

    monkeypatch.setattr(rayb.data.pipeline, "prepare_data", preparing)
    raw = tiny_study_dict(seeds=[0])
    raw["models"] = [m for m in raw["models"] if m["arch"] == "gpt2"]
    study = parse_study(raw)
    release_kept_workers()
    before = {a.actor_id for a in job_actors("RayTrainWorker")}
    controllers_before = {a["ActorID"] for a in session_actors("EnvController")}
    assert run_study(study, tmp_path, log=lambda _: None, ray_logs=False).trained == 1
    (ahead,), (controller,) = seen.pop()  # started before the data
    # The only Train worker and controller the study started, kept once its group of one ended cleanly.
    assert [a.actor_id.hex() for a in job_actors("RayTrainWorker") if a.actor_id not in before] == [ahead]
    assert kept_worker_ids() == {ahead}
    assert [
        a["ActorID"] for a in session_actors("EnvController") if a["ActorID"] not in controllers_before
    ] == [controller]
    assert kept_controller_ids() == {controller}

    release_kept_workers()
    assert run_study(study, tmp_path, log=lambda _: None, ray_logs=False).trained == 0
    assert seen == [(set(), set())] and not kept_worker_ids() and not kept_controller_ids()


def test_a_study_whose_trial_can_never_fit_starts_no_worker_nor_controller(ray_session, tmp_path):
    """A trial wider than rayb's private instance (one node of this machine's cores, no autoscaler) stops
    the study as soon as Ray is up, before its first Train worker and controller would start ahead."""
    from rayb.runner import run_study

    workers = (os.cpu_count() or 1) + 1  # micro-batches of 1 make any worker count divide the global batch
    raw = tiny_study_dict(seeds=[0])
    raw["train"] |= {"num_workers": workers, "micro_batch": 1, "global_batch": workers}
    release_kept_workers()

    def started() -> set[str]:
        return {a["ActorID"] for kind in ("RayTrainWorker", "EnvController") for a in session_actors(kind)}

    before = started()
    with pytest.raises(StudyError, match=f"train: a trial needs {workers} CPU"):
        run_study(parse_study(raw), tmp_path, log=lambda _: None, ray_logs=False)
    assert started() == before and not kept_worker_ids() and not kept_controller_ids()


def test_worker_groups_adopt_the_drivers_synchronization_actor_pool_after_pool(tiny_cache, tmp_path):
    """Ray Train starts a synchronization actor per worker group, a process of its own. On rayb's private
    instance the pool's groups adopt the driver's instead (trainer.InheritingWorkerGroup): a group that ends
    cleanly leaves it alive, and the pool's next group, then the next pool's, adopts the same actor."""
    import ray
    from ray.core.generated import gcs_pb2

    release_kept_workers()
    trials = plan_trials(parse_study(tiny_study_dict(seeds=[3, 4])), tiny_cache, tmp_path)
    gpt2, mamba = [t for t in trials if t.arch == "gpt2"], [t for t in trials if t.arch == "mamba"]
    before = {a.actor_id for a in job_actors("SynchronizationActor")}
    assert run_pool(worker_pool(gpt2, slots=2, cores=1), 1) == {}  # two groups, one after the other
    assert run_pool(worker_pool(mamba[:1], slots=1, cores=1), 1) == {}  # the next pool
    assert all(t.done for t in gpt2 + mamba[:1])
    started = [a for a in job_actors("SynchronizationActor") if a.actor_id not in before]
    assert len(started) == 1  # none started by a group's controller
    assert started[0].owner_address.worker_id.hex() == ray.get_runtime_context().get_worker_id()
    assert started[0].state == gcs_pb2.ActorTableData.ALIVE  # kept for this driver's next pool
    release_kept_workers()  # which ends it too
    deadline = time.time() + 30
    while [a.state for a in job_actors("SynchronizationActor") if a.actor_id == started[0].actor_id] != [
        gcs_pb2.ActorTableData.DEAD
    ]:
        assert time.time() < deadline, "release_kept_workers left the kept synchronization actor alive"
        time.sleep(0.2)


def test_a_pools_run_is_controlled_by_the_controller_the_drivers_last_clean_run_left(
    tiny_cache, tmp_path, monkeypatch
):
    """Ray Train starts a controller per run, a process that imports Ray Train. A run of the pool that ends
    cleanly leaves its controller to the driver, and the next run, of the next pool here, is controlled by
    the same process (trainer.EnvController.reset), from the environment that process started with: a Ray
    Train setting the earlier run was handed is not the next run's."""
    import os

    import ray
    from ray.train.v2._internal.constants import (
        DEFAULT_HEALTH_CHECK_INTERVAL_S,
        HEALTH_CHECK_INTERVAL_S_ENV_VAR,
    )

    setting = HEALTH_CHECK_INTERVAL_S_ENV_VAR
    release_kept_workers()
    trials = plan_trials(parse_study(tiny_study_dict(seeds=[5, 6])), tiny_cache, tmp_path)
    first, second = [t for t in trials if t.arch == "gpt2"]
    before = {a["ActorID"] for a in session_actors("EnvController")}
    monkeypatch.setenv(setting, "0.4")
    assert run_pool(worker_pool([first], slots=1, cores=1), 1) == {} and first.done
    (controller,) = kept_controller_ids()
    monkeypatch.undo()
    assert run_pool(worker_pool([second], slots=1, cores=1), 1) == {} and second.done
    assert [a["ActorID"] for a in session_actors("EnvController") if a["ActorID"] not in before] == [
        controller
    ]
    handle = take_controller()
    try:
        seen = ray.get(
            handle.__ray_call__.remote(lambda c: (os.environ.get(setting), c._health_check_interval_s))
        )
    finally:
        ray.kill(handle)
    assert seen == (None, DEFAULT_HEALTH_CHECK_INTERVAL_S)  # not the earlier run's interval


def test_a_trials_checkpoints_and_its_groups_end_wait_for_no_poll_of_ray_trains(
    tiny_cache, tmp_path, monkeypatch
):
    """Ray Train's controller takes a worker's checkpoint report, and sees its train function end, only as it
    polls its workers (every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S); each checkpoint after the first waits for
    the last one's registration. rayb's controller polls at once where a worker waits on it (trainer.
    EnvController.hurry), until the poll sees what the worker waits for: with polls two minutes apart, a
    trial with three checkpoints still trains, and its group ends, within one minute (8 s alone on 2 cores,
    26-31 s beside the suite's other worker), where a single missed poll would take two."""
    interval_s = 120.0
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(interval_s))
    trial = next(t for t in plan_trials(parse_study(tiny_study_dict(seeds=[2])), tiny_cache, tmp_path)
                 if t.arch == "gpt2")  # fmt: skip
    began = time.monotonic()
    assert run_pool(worker_pool([trial], slots=1, cores=1), 1) == {} and trial.done
    assert len([r for r in read_metrics(Path(trial.trial_dir) / METRICS) if r["kind"] == "val"]) == 3
    assert time.monotonic() - began < interval_s / 2


def test_a_pool_resumes_the_trial_of_a_lost_controller_once_the_worker_it_adopted_is_dead(
    runs, tiny_cache, tmp_path
):
    """A warm worker is the driver's actor, not its group's controller's, so it does not die with the
    controller as Ray Train's own workers do. SIGKILL the controller mid-trial: the pool starts the run
    again, and its queue kills the adopted worker before it hands the trial to the new group, which resumes
    it to the uninterrupted result."""
    kill_at = random.randint(9, 20)  # once a checkpoint (step 8 or 16) is registered
    _, reference_dir = runs[("gpt2", 1)]
    trial = next(t for t in plan_trials(parse_study(tiny_study_dict(seeds=[0])), tiny_cache, tmp_path)
                 if t.arch == "gpt2")  # fmt: skip
    (pack,) = worker_pool([trial], slots=1, cores=1)  # one thread, as the reference trained
    release_kept_workers()  # the pool's warm worker is then the one started since `before`
    before = {a.actor_id for a in job_actors("RayTrainWorker")}
    ended = {p.pid for p in ray_processes("EnvController")}  # earlier runs' controllers, on their way out
    thread = threading.Thread(target=run_pool, args=([pack], 1))
    thread.start()
    log, run_dir = Path(trial.trial_dir) / METRICS, Path(pack.storage_path) / pack.run_name
    deadline = time.time() + 300
    while not (
        log.exists() and read_metrics(log)[-1:] and read_metrics(log)[-1]["step"] >= kill_at
        and registered_checkpoint_trial(run_dir) == trial.key
    ):  # fmt: skip
        assert time.time() < deadline and thread.is_alive(), "training never reached the kill step"
        time.sleep(0.05)
    (controller,) = [p for p in ray_processes("EnvController") if p.pid not in ended]
    controller.send_signal(signal.SIGKILL)
    while not any(r["kind"] == "resume" for r in read_metrics(log)):
        assert time.time() < deadline and thread.is_alive(), "the trial never resumed"
        time.sleep(0.05)
    resumed_by = time.time()  # the new group has taken the trial
    thread.join(timeout=300)
    assert not thread.is_alive() and trial.done
    (warm,), _ = _started_ahead(before)
    assert 0 < warm.end_time / 1000 <= resumed_by  # dead before its trial went to another worker
    (restart,) = [r["step"] for r in read_metrics(log) if r["kind"] == "resume"]
    assert restart in (8, 16), f"killed at step {kill_at}, resumed after step {restart}"
    resumed = [r["loss"] for r in read_metrics(log) if r["kind"] == "train"]
    assert resumed == [r["loss"] for r in read_metrics(reference_dir / METRICS) if r["kind"] == "train"]


def test_a_run_registers_with_the_pools_queue_without_the_queue_importing_ray_train(ray_session):
    """Each group's run registers its controller with the pool's queue as it starts, and waits for it
    (trainer.PoolCleaner). An actor handle, unpickled, imports its class's module: the controller's would
    bring Ray Train, Ray Data and pandas into the queue's process (0.3 s or more of every pool's first group
    start). The handle goes pickled, and the queue unpickles it only to end the run. Here the cleaner itself
    stands in for the controller: its module, rayb.train.trainer, imports Ray Train."""
    import psutil
    import ray

    from rayb.train.trainer import PoolCleaner
    from rayb.tune.group import queue_actor

    name = f"queue-{uuid.uuid4().hex[:8]}"
    queue = queue_actor(relay=4).options(name=name, num_cpus=0).remote({})
    controller = ray.remote(PoolCleaner).options(num_cpus=0).remote(name)
    ray.get(controller.after_controller_start.remote(None))
    (pid,) = [a["Pid"] for a in session_actors("TrialQueue") if a["ActorID"] == queue._actor_id.hex()]
    process = psutil.Process(pid)
    assert not [m.path for m in process.memory_maps() if "/pandas/" in m.path]
    ray.get(queue.stop.remote())  # ends the registered run: the handle, unpickled, still kills
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(controller.after_controller_finish.remote(None))
    ray.kill(queue)


class _Stopped(Exception):
    pass


def _stop_after_step_8(config):
    """rayb's loop on a worker that goes down once step 8 is checkpointed (as a cluster shut down, or a
    relaunch of the study, would leave it): the run ends with the trial unfinished."""
    from rayb.train import loop

    real_step = loop._train_step

    def train_step(run, step):
        if step == 8:
            raise _Stopped
        return real_step(run, step)

    loop._train_step = train_step
    try:
        loop.train_loop_per_worker(config)
    except _Stopped:
        pass


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_trial_resumes_in_whichever_run_a_relaunch_packs_it(runs, tiny_cache, tmp_path, request, where):
    """A relaunch on a cluster of another size packs the trials differently, so the trial's Ray Train run
    has another name and no checkpoint of its own: the trial still resumes from where it was, at step 9
    (its own record names its checkpoint), and ends exactly where an uninterrupted run ends. On object
    storage the resuming worker reads its own files of the checkpoint from the store."""
    _, reference_dir = runs[("gpt2", 1)]
    out = tmp_path if where == "local" else f"s3://{request.getfixturevalue('s3_bucket')}/out"
    raw = tiny_study_dict(seeds=[0])
    trial = next(t for t in plan_trials(parse_study(raw), tiny_cache, out) if t.arch == "gpt2")
    pack_trainer(TrialPack((trial,)), loop=_stop_after_step_8).fit()
    log = storage.join(trial.trial_dir, METRICS)
    assert read_metrics(log)[-1]["step"] == 8 and not storage.exists(
        storage.join(trial.trial_dir, TRAIN_DONE)
    )
    # Relaunched in a pack beside a trial that finished earlier: a run of another name.
    finished = dataclasses.replace(trial, key="finished", trial_dir=storage.join(out, "finished"))
    storage.write_bytes(storage.join(finished.trial_dir, TRAIN_DONE), b"{}")
    relaunch = TrialPack((finished, trial))
    assert relaunch.run_name != TrialPack((trial,)).run_name
    pack_trainer(relaunch).fit()
    assert restart_points(storage.fetch(log)) == []
    # From its step-8 checkpoint (or step 16's, on a machine so loaded that the kill came 8 held steps late).
    assert [r["step"] for r in read_metrics(log) if r["kind"] == "resume"] in ([8], [16])
    resumed = [r["loss"] for r in read_metrics(log) if r["kind"] == "train"]
    reference = [r["loss"] for r in read_metrics(reference_dir / METRICS) if r["kind"] == "train"]
    assert resumed == reference
    assert json.loads(storage.read_bytes(storage.join(trial.trial_dir, TRAIN_DONE)))["status"] == "ok"


def _lost_once_step_8_is_reported(config):
    """rayb's loop on a worker lost the moment it has reported its step-8 checkpoint (which Ray Train goes
    on to store and register), before the next line of rayb's code, and long after its log's last timed
    upload (none comes within the run)."""
    import ray.train

    from rayb.train import loop
    from rayb.train.metrics_log import MetricsLog

    MetricsLog.PUSH_EVERY_S = float("inf")
    real_report = ray.train.report

    def report(metrics, **kwargs):
        real_report(metrics, **kwargs)
        if metrics["step"] == 8:
            raise _Stopped

    ray.train.report = report
    try:
        loop.train_loop_per_worker(config)
    except _Stopped:
        pass
    finally:
        ray.train.report = real_report


def test_a_trial_lost_just_after_a_checkpoint_resumes_its_whole_log(runs, tiny_cache, s3_bucket):
    """On object storage the metrics log is uploaded, not appended: it reaches the store before each
    checkpoint, so a worker lost once the checkpoint is stored (a node lost on a cluster) resumes from it
    with every step before it logged, and the curve is the uninterrupted one."""
    _, reference_dir = runs[("gpt2", 1)]
    study = parse_study(tiny_study_dict(seeds=[0]))
    (trial,) = [t for t in plan_trials(study, tiny_cache, f"s3://{s3_bucket}/out") if t.arch == "gpt2"]
    pack_trainer(TrialPack((trial,)), loop=_lost_once_step_8_is_reported).fit()
    assert not storage.exists(storage.join(trial.trial_dir, TRAIN_DONE))
    # The same run again: Ray Train's own latest checkpoint is step 8's.
    pack_trainer(TrialPack((trial,))).fit()
    log = read_metrics(storage.join(trial.trial_dir, METRICS))
    assert [r["step"] for r in log if r["kind"] == "resume"] == [8]
    reference = read_metrics(reference_dir / METRICS)
    assert [(r["step"], r["loss"]) for r in log if r["kind"] == "train"] == [
        (r["step"], r["loss"]) for r in reference if r["kind"] == "train"
    ]


@pytest.mark.parametrize("n", [1, 8, 13, 40])
def test_interim_validation_reads_every_source_in_its_share(tiny_cache, n):
    """Validation rows lie source after source; the interim slice must not be the first source alone."""
    from rayb.train.loop import validation_rows

    shares = [tiny_cache.manifest["sources"][name]["val_rows"] for name in ("edu", "web")]
    total = sum(shares)
    chosen = validation_rows(total, n)
    assert len(set(chosen.tolist())) == len(chosen) == min(n, total) and chosen.max() < total
    from_first = int((chosen < shares[0]).sum())
    assert abs(from_first - len(chosen) * shares[0] / total) <= 1  # each source in its share, to a row
    assert (validation_rows(total, total) == np.arange(total)).all()


def test_the_next_trial_in_a_pack_compiles_afresh():
    """Between compiled trials of one pack, dynamo forgets the last trial's graphs (its caches would
    otherwise hold them, and its recompile limit count them against the next model)."""
    from torch._dynamo.utils import counters

    from rayb.train.loop import _release_memory

    model = torch.compile(torch.nn.Linear(2, 2), backend="eager")
    model(torch.ones(1, 2))
    compiled = counters["stats"]["unique_graphs"]
    _release_memory(compiled=True)
    model(torch.ones(1, 2))
    assert counters["stats"]["unique_graphs"] == compiled + 1


def test_worker_start_is_timed_only_against_a_clock_on_the_same_node(ray_session):
    """The driver's clock and the worker's: subtracted only where they are one machine's. A process older
    than the request (one Ray reused) waited for no process to start."""
    import ray

    from rayb.train.loop import _start_costs

    here = ray.get_runtime_context().get_node_id()
    started = _start_costs({"launched_at": 100.0, "launched_on": here}, entered=102.5, age_s=1.5)
    assert started == {"worker_start_s": 2.5, "worker_process_s": 1.0}
    reused = _start_costs({"launched_at": 100.0, "launched_on": here}, entered=102.5, age_s=9.0)
    assert reused["worker_process_s"] == 0.0
    assert _start_costs({"launched_at": 100.0, "launched_on": "f" * 56}, entered=102.5, age_s=1.5) == {}


def test_a_process_knows_how_long_ago_it_started():
    """The age the training loop subtracts from its entry time places the process's start between the
    parent's clock read before it spawned the child and the child's own first statement, on any load (a
    busy machine can delay the spawn by seconds; /proc counts in ticks of 10 ms, rounded down)."""
    code = (
        "import time; first = time.time()\n"
        "from rayb.train.loop import process_age_s; age = process_age_s(); print(first, time.time(), age)"
    )
    began = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    first, now, age = (float(x) for x in out.split())
    assert began - 0.02 <= now - age <= first
