"""rayb's fast paths against independent implementations: fla-core's naive references (Gated DeltaNet,
RWKV-6) and transformers' own Mamba / Mamba-2. mamba-ssm does not install on CPU; the fused scan is held
to the paper's recurrence in tests/test_mamba_cpu.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rayb.models import gated_deltanet as gdn
from rayb.models.rwkv6 import chunked_wkv, recurrent_wkv
from rayb.models.selfcheck import relative_error

pytestmark = pytest.mark.parity


def fla_file(relative: str):
    """A module of fla-core loaded from its file: `import fla...` runs fla/__init__, which needs triton
    (and with triton on a CPU machine transformers would pick fla's kernels and crash)."""
    spec = importlib.util.find_spec("fla")
    if spec is None:
        pytest.skip("fla-core is not installed (it comes with rayb's dev extra)")
    path = Path(spec.submodule_search_locations[0]) / relative
    module_spec = importlib.util.spec_from_file_location(f"fla_naive_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def gdn_inputs(B=2, T=50, H=3, K=16, V=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g), dim=-1) * K**-0.5
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    v = torch.randn(B, T, H, V, generator=g)
    decay = -torch.rand(B, T, H, generator=g) * 2  # log decays from 0 to −2 per token
    beta = torch.rand(B, T, H, generator=g)
    state = torch.randn(B, H, K, V, generator=g)
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_gated_deltanet_matches_fla_naive_recurrence(chunk_size):
    naive = fla_file("ops/gated_delta_rule/naive.py")
    q, k, v, g, beta, state = gdn_inputs()
    want_o, want_S = naive.naive_recurrent_gated_delta_rule(
        q, k, v, beta, g, scale=1.0, initial_state=state, output_final_state=True
    )
    for o, S in (gdn.chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size),
                 gdn.sequential_gated_delta_rule(q, k, v, g, beta, state)):  # fmt: skip
        assert relative_error(o, want_o) < 1e-5
        assert relative_error(S, want_S) < 1e-5


def test_gated_deltanet_gradients_match_fla_naive_chunk_form():
    naive = fla_file("ops/gated_delta_rule/naive.py")
    inputs = gdn_inputs(T=40)

    def grads(fn):
        leaves = [x.clone().requires_grad_() for x in inputs]
        o, S = fn(*leaves)
        (o.square().sum() + S.sum()).backward()
        return [x.grad for x in leaves]

    ours = grads(lambda q, k, v, g, beta, s: gdn.chunk_gated_delta_rule(q, k, v, g, beta, s, 16))
    theirs = grads(
        lambda q, k, v, g, beta, s: naive.naive_chunk_gated_delta_rule(
            q, k, v, g, beta, chunk_size=16, scale=1.0, initial_state=s, output_final_state=True
        )
    )
    for got, want in zip(ours, theirs, strict=True):
        assert relative_error(got, want) < 1e-4


def rwkv_inputs(B=2, T=53, H=3, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    r, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    # Per-channel decays from total forgetting (e^-60, rayb's floor) to almost none, and random.
    log_w = torch.cat(
        [torch.full((B, T, H, D // 4), -60.0), torch.full((B, T, H, D // 4), -1e-6),
         -torch.exp(torch.empty(B, T, H, D // 2).uniform_(-8, 4, generator=g))], dim=-1,
    )  # fmt: skip
    return r, k, v, log_w, torch.randn(H, D, generator=g), torch.randn(B, H, D, D, generator=g)


@pytest.mark.parametrize("fn", [chunked_wkv, recurrent_wkv], ids=["chunked", "recurrent"])
def test_rwkv6_matches_fla_naive_recurrence(fn):
    naive = fla_file("ops/rwkv6/recurrent_naive.py")
    r, k, v, log_w, u, state = rwkv_inputs()
    head_first = [x.transpose(1, 2) for x in (r, k, v, log_w)]  # fla's naive form is [B, H, T, D]
    want_o, want_S = naive.naive_recurrent_rwkv6(*head_first, u, scale=1.0, initial_state=state,
                                                 output_final_state=True)  # fmt: skip
    o, S = fn(r, k, v, log_w, u, state)
    assert relative_error(o, want_o.transpose(1, 2)) < 1e-5
    assert relative_error(S, want_S) < 1e-5


def test_rwkv6_chunked_form_keeps_fp32_precision_under_strong_decays():
    """rwkv6.py's claim: every decay exponent is summed over its own tokens, so the chunked form is as
    precise in fp32 as the recurrence (it once lost ~1e-5 to differences of cumulative sums)."""
    inputs = rwkv_inputs(T=64)
    exact_o, exact_S = recurrent_wkv(*(x.double() for x in inputs))
    chunk_o, chunk_S = chunked_wkv(*inputs)
    step_o, _ = recurrent_wkv(*inputs)
    assert relative_error(chunk_o, exact_o) < 5e-7
    assert relative_error(chunk_S, exact_S) < 5e-7
    assert relative_error(chunk_o, exact_o) <= 2 * relative_error(step_o, exact_o)
