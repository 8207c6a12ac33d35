"""The GPU path, checked on a CPU: collectives on the device the backend takes, the precision rule, pinned
device-dependent numerics, the CUDA random state in checkpoints, kernel paths, and the speed suite alone on
a GPU. (tests/gpu/ runs the same path on a real GPU.)"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import tiny_study_dict

from rayb.study import StudyError, parse_study


# ----- collectives ---------------------------------------------------------------------------------------
def test_which_backends_take_cpu_tensors():
    from rayb.train.collectives import takes_cpu_tensors

    assert takes_cpu_tensors("gloo") and takes_cpu_tensors("cpu:gloo,cuda:nccl")
    assert not takes_cpu_tensors("nccl") and not takes_cpu_tensors("cuda:nccl")


@pytest.fixture
def strict_world(tmp_path):
    """A one-process gloo world whose default group rejects rayb's CPU tensors, as NCCL does."""
    import strict_collectives

    saved = {name: getattr(dist, name) for name in (*strict_collectives.CHECKED, "get_backend")}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    strict_collectives.install()
    yield
    dist.destroy_process_group()
    for name, original in saved.items():
        setattr(dist, name, original)
    dist._strict_installed = False


def test_the_strict_world_rejects_a_cpu_tensor_from_rayb_on_the_default_group(strict_world):
    # A function that lives in a rayb module, calling as rayb's loop used to (and nccl refuses).
    namespace = {"__name__": "rayb.example", "dist": dist, "torch": torch}
    exec("def reduce():\n    dist.all_reduce(torch.ones(1))\n", namespace)
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        namespace["reduce"]()


def test_host_collectives_reduce_over_a_gloo_group_beside_nccl(strict_world):
    from rayb.train.collectives import HostCollectives

    comm = HostCollectives()
    assert comm.group is not None  # the default group "is" NCCL: host numbers get a gloo group of their own
    assert comm.sum([1.5, 2.0]) == [1.5, 2.0] and comm.mean([3.0]) == [3.0]
    assert comm.sum([2**45 + 1], dtype=torch.int64) == [2**45 + 1]  # digests stay exact


# ----- precision -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("precision", "use_gpu", "resolved"),
    [
        ("auto", False, "fp32"),
        ("auto", True, "bf16"),
        ("bf16", False, "bf16"),
        ("bf16-deepspeed", True, "bf16-deepspeed"),
    ],
)
def test_the_precision_rule(precision, use_gpu, resolved):
    from rayb.train.engine import deepspeed_config

    raw = tiny_study_dict()
    raw["train"] |= {"precision": precision, "use_gpu": use_gpu}
    train = parse_study(raw).train
    assert train.resolved_precision == resolved
    config = deepspeed_config(train)
    # bf16: autocast with fp32 parameters and fp32 gradient reduction; bf16 parameters only when asked for
    assert config["bf16"]["enabled"] == (resolved == "bf16-deepspeed")
    autocast = config.get("torch_autocast")
    assert (autocast is not None) == (resolved == "bf16")
    if autocast:
        assert autocast == {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}


# ----- numerics pinned on the driver ---------------------------------------------------------------------
def _mamba2_study(use_gpu: bool):
    raw = tiny_study_dict(models=[{"arch": "mamba2", "config": {"d_model": 64, "n_layer": 2, "d_state": 16}}])
    raw["data"]["seq_len"] = 512  # longer than either chunk, so the chunk changes the FLOPs
    raw["train"]["use_gpu"] = use_gpu
    return parse_study(raw)


def test_mamba2s_chunk_size_is_pinned_for_the_device_that_trains():
    from rayb.models import build_model
    from rayb.models.accounting import model_cost

    vocab = 512
    gpu, cpu = _mamba2_study(True), _mamba2_study(False)
    (gpu_config, gpu_cost, _), (cpu_config, cpu_cost, _) = (
        s.model_steps(s.models[0], vocab) for s in (gpu, cpu)
    )
    assert gpu_config["chunk_size"] == 256 and cpu_config["chunk_size"] == 64
    # FLOPs are those of the model that trains, counted on this (CPU) driver for a GPU study
    assert gpu_cost == model_cost("mamba2", {**cpu_config, "chunk_size": 256}, vocab, gpu.data.seq_len)
    assert gpu_cost.forward_flops_per_token != cpu_cost.forward_flops_per_token
    # and a worker on any machine builds the pinned value, whatever its own device
    assert build_model("mamba2", gpu_config, vocab, gpu.data.seq_len).config.chunk_size == 256


def test_a_users_explicit_setting_wins_over_the_pinned_default():
    raw = tiny_study_dict(
        models=[{"arch": "mamba2", "config": {"d_model": 64, "n_layer": 2, "chunk_size": 32}}]
    )
    raw["train"]["use_gpu"] = True
    study = parse_study(raw)
    assert study.model_steps(study.models[0], 512)[0]["chunk_size"] == 32


# ----- random state across a resume ----------------------------------------------------------------------
class _FakeCuda:
    """Stands in for torch.cuda on a machine without one: a node's devices, each with its generator state,
    and the device this process uses (its local rank's). Indexing past the node's devices raises, as
    torch.cuda does."""

    def __init__(self, devices: int, current: int):
        self.states = [torch.tensor([10 * current + d], dtype=torch.uint8) for d in range(devices)]
        self.current = current

    def is_available(self):
        return True

    def device_count(self):
        return len(self.states)

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def get_rng_state_all(self):
        return [self.get_rng_state(d) for d in range(self.device_count())]

    def set_rng_state_all(self, states):
        for device, state in enumerate(states):
            self.set_rng_state(state, device)

    def _index(self, device):
        index = self.current if device == "cuda" else int(device)
        if index >= len(self.states):
            raise IndexError(f"device {index} of {len(self.states)}")
        return index


def test_checkpoints_carry_the_workers_own_cuda_state_to_a_node_of_any_size(monkeypatch):
    """12 workers placed 8 + 4: local rank 5 of an 8-GPU node resumes as local rank 0 of a 4-GPU node. Its
    device's generator state (only its own) goes with it; the new node's other devices are left alone."""
    from rayb.train import loop

    monkeypatch.setattr(loop.torch, "cuda", _FakeCuda(devices=8, current=5))
    saved = loop.rng_state()
    own = loop.torch.cuda.get_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1))
    smaller = _FakeCuda(devices=4, current=0)
    others = [int(s) for s in smaller.states[1:]]
    monkeypatch.setattr(loop.torch, "cuda", smaller)
    loop.set_rng_state(saved)
    assert int(smaller.states[0]) == int(own) == 55  # the state of device 5 on the first node
    assert [int(s) for s in smaller.states[1:]] == others
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


def test_each_rank_restores_its_own_random_state_from_a_checkpoint(tmp_path):
    """Every rank writes its own file into the checkpoint; a rank restores its own, not rank 0's."""
    from rayb.train.loop import restore_rng, save_rng

    streams = {}
    for rank in (0, 1):
        torch.manual_seed(rank)  # ranks whose streams differ (dropout, sampling)
        random.seed(rank)
        np.random.seed(rank)
        save_rng(tmp_path, rank)
        streams[rank] = (random.random(), np.random.rand(), torch.rand(1))
    assert streams[0] != streams[1]
    for rank in (1, 0):
        restore_rng(tmp_path, rank)
        assert (random.random(), np.random.rand(), torch.rand(1)) == streams[rank]


def test_cpu_checkpoints_have_no_cuda_state():
    from rayb.train.loop import rng_state

    assert "cuda" not in rng_state()


# ----- kernels -------------------------------------------------------------------------------------------
BUILT_IN = ("gpt2", "pythia", "llama", "nanogpt", "mamba", "mamba2", "gated_deltanet", "rwkv6")


def test_every_architecture_declares_its_kernel_paths():
    from rayb.models.registry import get_arch

    for arch in BUILT_IN:
        cpu = get_arch(arch).kernels("cpu")
        assert cpu and not any(p.slow for p in cpu), arch
    assert get_arch("mamba").kernels("cpu")[0].path == "rayb fused CPU scan"


def test_a_gpu_study_without_the_fused_kernels_stops_before_training(monkeypatch):
    """What a GPU node lacking mamba-ssm and fla would report (this machine has neither): the study stops,
    naming the architectures and what to install. The probe itself needs a GPU worker, so here it runs
    in this process."""
    from rayb import runner
    from rayb.models.registry import get_arch
    from rayb.train import trainer

    monkeypatch.setattr(
        trainer, "probe_kernels", lambda archs: {a: get_arch(a).kernels("cuda") for a in archs}
    )
    runner.check_kernels(["gpt2"])  # attention needs nothing more
    with pytest.raises(StudyError) as caught:
        runner.check_kernels(["gpt2", "mamba", "gated_deltanet"])
    message = str(caught.value)
    assert "mamba: selective scan would run transformers' PyTorch reference scan" in message
    assert "gated_deltanet: delta rule would run rayb chunked delta rule (PyTorch)" in message
    assert "mamba-ssm, causal-conv1d, flash-linear-attention" in message and "allow_slow_kernels" in message


@pytest.mark.parametrize(
    ("capability", "triton", "tilelang", "gdn_fla", "rwkv6_fla"),
    [
        ((9, 0), "3.6.0", False, False, False),  # an H200 as lent here: fla #640
        ((9, 0), "3.6.0", True, True, False),  # fla swaps in tilelang's kernel for Gated DeltaNet only
        ((9, 0), "3.7.1", False, True, True),  # the fixed Triton
        ((9, 0), "3.3.1", False, True, True),  # before the regression
        ((8, 0), "3.6.0", False, True, True),  # an A100
    ],
)
def test_fla_kernels_are_refused_where_triton_miscompiles_them(
    monkeypatch, capability, triton, tilelang, gdn_fla, rwkv6_fla
):
    """On a Hopper GPU under Triton 3.4.0 to 3.7.0, fla's gated chunk kernels are wrong (fla issue #640;
    RWKV-6's disagreed with the recurrence by 0.34 on an H200): Gated DeltaNet and RWKV-6 run rayb's chunked
    PyTorch path there, reported as a slow fallback with the fix, and the mixers never load fla."""
    import importlib.metadata

    from rayb.models import kernels
    from rayb.models.registry import get_arch

    version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: triton if name == "triton" else version(name)
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(
        kernels, "importable", lambda m: m.startswith("fla.ops") or (m == "tilelang" and tilelang)
    )
    kernels.fla_refusal.cache_clear()
    try:
        for arch, module, trusted in [
            ("gated_deltanet", "fla.ops.gated_delta_rule", gdn_fla),
            ("rwkv6", "fla.ops.rwkv6", rwkv6_fla),
        ]:
            (path,) = get_arch(arch).kernels("cuda")
            assert path.slow is not trusted, (arch, path)
            if trusted:
                assert path.path.startswith("fla "), path
            else:
                assert "miscompiles fla's gated chunk kernels on Hopper" in path.path
                assert "Triton >= 3.7.1" in path.install and ("tilelang" in path.install) is (arch != "rwkv6")
                assert kernels.fla_module(module, tilelang_fixes=arch != "rwkv6") is None
    finally:
        kernels.fla_refusal.cache_clear()


# ----- evaluation on a GPU -------------------------------------------------------------------------------
def test_the_speed_suite_gets_a_whole_gpu_and_the_others_share(tiny_trial):
    from rayb.eval.actors import EvalJob, gpus_for

    speed, lm = EvalJob(tiny_trial, "speed", {}), EvalJob(tiny_trial, "lm", {})
    assert gpus_for(speed, use_gpu=True) == 1.0 and gpus_for(lm, use_gpu=True) == 0.25
    assert gpus_for(speed, use_gpu=False) == gpus_for(lm, use_gpu=False) == 0.0


@pytest.fixture
def tiny_trial(tmp_path):
    from rayb.train.trial import TrialSpec

    study = parse_study(tiny_study_dict())
    return TrialSpec(
        key="k", model="gpt2", arch="gpt2", model_config={}, lr=1e-3, seed=0, train=study.train, steps=1,
        cache_dir=str(tmp_path), trial_dir=str(tmp_path / "t"), storage_path=str(tmp_path / "ray"),
    )  # fmt: skip
