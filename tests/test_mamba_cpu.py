"""rayb's CPU forward for Mamba and Mamba-2 computes exactly what transformers' modules compute."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers.models.mamba.modeling_mamba import MambaMixer
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

from rayb.models import build_model
from rayb.models.mamba_cpu import ChunkedSSDMamba2Mixer, FusedScanMambaMixer, SelectiveScan, chunked_ssd

TRANSFORMERS_MIXER = {FusedScanMambaMixer: MambaMixer, ChunkedSSDMamba2Mixer: Mamba2Mixer}


pytestmark = pytest.mark.parity  # every test here holds a fast path to a reference


def naive_selective_scan(u, delta, A, B, C):
    """Token by token: h_t = exp(δ_t·A)·h_{t−1} + δ_t·u_t·B_t, y_t = C_t·h_t."""
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=u.dtype)
    ys = []
    for t in range(u.shape[2]):
        h = torch.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, t]
        ys.append((h * C[:, None, t]).sum(-1))
    return torch.stack(ys, -1)


@pytest.mark.parametrize("threads", [1, 3])  # one block of rows, and blocks each with B and C's of its own
def test_fused_scan_and_its_gradients_match_the_recurrence(threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.manual_seed(0)
    batch, d, t, n = 3, 5, 40, 6
    u, B, C = torch.randn(batch, d, t), torch.randn(batch, t, n), torch.randn(batch, t, n)
    delta = torch.nn.functional.softplus(torch.randn(batch, d, t) * 3)  # long and short memories
    A = -torch.exp(torch.randn(d, n))
    exact = [x.double().requires_grad_() for x in (u, delta, A, B, C)]
    fused = [x.clone().requires_grad_() for x in (u, delta, A, B, C)]
    expected, got = naive_selective_scan(*exact), SelectiveScan.apply(*fused)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(got)
    expected.backward(grad.double())
    got.backward(grad)
    for name, x, ref in zip("u delta A B C".split(), fused, exact, strict=True):
        torch.testing.assert_close(x.grad.double(), ref.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_the_fused_scan_refuses_tensors_its_buffers_do_not_fit():
    from rayb.models.mamba_cpu import kernel

    scan = kernel()
    u, A, B = torch.randn(2, 3, 5), torch.randn(3, 4), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"\(2, 4, 4\) tensor where float32 \(2, 5, 4\)"):
        scan.forward(u, u, A, B[:, :4].contiguous(), B)
    with pytest.raises(ValueError, match="float64"):
        scan.forward(u.double(), u, A, B, B)
    with pytest.raises(ValueError, match="contiguous"):
        scan.backward(u, u, A, B, B, torch.randn(2, 5, 3).transpose(1, 2))


def test_building_and_loading_the_fused_scan_leaves_subnormal_floats_to_the_process(tmp_path):
    """A shared library linked with -ffast-math (by GCC before 13) sets the CPU, as it loads, to flush
    subnormal floats to zero in the whole process: torch's arithmetic would change with it."""
    probe = (
        "import torch\n"
        "from rayb.models.mamba_cpu import kernel\n"
        "assert kernel() is not None\n"
        "print(float(torch.tensor(1e-40) * 1.0))\n"
    )
    env = os.environ | {"TORCH_EXTENSIONS_DIR": str(tmp_path)}  # a fresh build, then loaded
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) > 0.0  # 1e-40: subnormal in float32, flushed to zero


def test_chunked_ssd_matches_the_recurrence_across_chunks():
    torch.manual_seed(0)
    b, t, h, p, g, n = 2, 37, 4, 3, 2, 5  # 37 tokens: several chunks of 8 plus a ragged one
    x, B, C = torch.randn(b, t, h, p), torch.randn(b, t, g, n), torch.randn(b, t, g, n)
    dt, A = torch.nn.functional.softplus(torch.randn(b, t, h)), -torch.rand(h) * 4
    state, expected = torch.zeros(b, h, p, n), []
    for i in range(t):  # head k reads group k // (h/g)
        Bh, Ch = (v[:, i].repeat_interleave(h // g, dim=1) for v in (B, C))
        decay = torch.exp(dt[:, i] * A)[..., None, None]
        state = decay * state + (dt[:, i, :, None] * x[:, i])[..., None] * Bh[:, :, None]
        expected.append((state * Ch[:, :, None]).sum(-1))
    torch.testing.assert_close(chunked_ssd(x, dt, A, B, C, chunk=8), torch.stack(expected, 1))


CONFIGS = [
    # A Δ rank off its default (⌈64/16⌉ = 4), as size matching may set it: the fused path splits x_proj by it.
    ("mamba", {"d_model": 64, "n_layer": 2, "d_state": 8, "time_step_rank": 7}),
    ("mamba2", {"d_model": 64, "n_layer": 2, "head_dim": 16, "d_state": 16, "n_groups": 2, "chunk_size": 16}),
]


@pytest.mark.parametrize(("arch", "config"), CONFIGS)
def test_cpu_forward_equals_transformers_forward(arch, config):
    torch.manual_seed(0)
    model = build_model(arch, config, 256, 64)
    mixers = [layer.mixer for layer in model.backbone.layers]
    assert all(type(m) in TRANSFORMERS_MIXER for m in mixers)
    ids = torch.randint(0, 256, (3, 45))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # left padding goes through the same masking as transformers'

    def logits_and_grads():
        model.zero_grad()
        logits = model(ids, attention_mask=mask).logits
        logits.pow(2).mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ours, our_grads = logits_and_grads()
    for mixer in mixers:
        mixer.__class__ = TRANSFORMERS_MIXER[type(mixer)]
    theirs, their_grads = logits_and_grads()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(("arch", "config"), CONFIGS)
def test_cached_generation_matches_the_full_sequence(arch, config):
    """Generation runs transformers' recurrent step with a cache; its scores must equal the logits of
    rayb's full-sequence forward over the generated text."""
    torch.manual_seed(0)
    model = build_model(arch, config, 256, 64).eval()
    prompt = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True
        )
        full = model(out.sequences).logits[:, prompt.shape[1] - 1 : -1]
    torch.testing.assert_close(torch.stack(out.scores, 1), full, rtol=1e-4, atol=1e-4)


def test_without_a_compiler_mamba_warns_and_runs_transformers_scan(monkeypatch, tmp_path):
    from rayb.models import mamba_cpu

    monkeypatch.setattr(mamba_cpu, "SOURCE", tmp_path / "missing.cpp")
    mamba_cpu.kernel.cache_clear()
    try:
        with pytest.warns(UserWarning, match="could not compile"):
            assert mamba_cpu.kernel() is None
        model = build_model("mamba", {"d_model": 32, "n_layer": 1, "d_state": 4}, 64, 16)
        assert model(torch.randint(0, 64, (1, 16))).logits.isfinite().all()
    finally:
        mamba_cpu.kernel.cache_clear()


@pytest.mark.parametrize(("arch", "config"), CONFIGS)
def test_a_saved_model_loads_with_the_cpu_forward_and_scores_without_a_cache(arch, config, tmp_path):
    from rayb.models.checkpoint import load_trained

    build_model(arch, config, 256, 64).save_pretrained(tmp_path)
    model = load_trained(tmp_path, arch, config, 256, 64).eval()
    assert all(type(layer.mixer) in TRANSFORMERS_MIXER for layer in model.backbone.layers)
    assert model(torch.randint(0, 256, (1, 20))).cache_params is None  # the fast path, not the cached one
