"""Gated DeltaNet: the chunked kernel against the recurrence, decoding with state, and the accounting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rayb.models import gated_deltanet as gdn
from rayb.models.accounting import count_params, measured_forward_flops


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from a thread pool, and on a busy machine each parallel region waits for
    a descheduled thread (milliseconds per op); one thread keeps these tests fast and steady."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_cfg(**overrides) -> gdn.GatedDeltaNetConfig:
    base = dict(vocab_size=50, d_model=32, n_layer=2, n_head=2, head_dim=8, chunk_size=4)
    return gdn.GatedDeltaNetConfig(**(base | overrides))


def tiny_model(seed: int = 0, **overrides) -> gdn.GatedDeltaNetLM:
    """Weights far from the 0.02 init, so conv taps, decays and the state move the logits visibly."""
    torch.manual_seed(seed)
    model = gdn.GatedDeltaNetLM(tiny_cfg(**overrides))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.3)
    return model.eval()


def naive_gated_delta_rule(q, k, v, g, beta, state=None):
    """The recurrence exactly as the paper writes it, one token and one head at a time (float64)."""
    B, T, H, K = k.shape
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    states, outs = [], []
    for b in range(B):
        for h in range(H):
            S = torch.zeros(K, v.shape[-1], dtype=torch.float64) if state is None else state[b, h].double()
            for t in range(T):
                S = torch.exp(g[b, t, h]) * S
                S = S + beta[b, t, h] * torch.outer(k[b, t, h], v[b, t, h] - S.T @ k[b, t, h])
                outs.append(S.T @ q[b, t, h])
            states.append(S)
    o = torch.stack(outs).view(B, H, T, -1).transpose(1, 2)
    return o, torch.stack(states).view(B, H, K, -1)


def random_inputs(regime: str, B=2, T=13, H=2, K=4, V=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1) * K**-0.5
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = -torch.rand(B, T, H, generator=gen) * 2
    beta = torch.rand(B, T, H, generator=gen)
    if regime == "no_decay_full_write":  # pure delta rule, every write overwrites
        g, beta = torch.zeros_like(g), torch.ones_like(beta)
    elif regime == "same_key":  # one key rewritten again and again: the triangular system is at its worst
        k = k[:, :1].expand_as(k).contiguous()
        beta = torch.ones_like(beta)
    elif regime == "no_write":
        beta = torch.zeros_like(beta)
    elif regime == "forget_all":  # decay exp(-30): each token starts from an (almost) empty memory
        g = torch.full_like(g, -30.0)
    elif regime == "mixed_extremes":
        g = torch.where(torch.rand(g.shape, generator=gen) < 0.5, -30.0, 0.0)
        beta = torch.where(torch.rand(beta.shape, generator=gen) < 0.5, 0.0, 1.0)
    state = torch.randn(B, H, K, V, generator=gen)
    return q, k, v, g, beta, state


REGIMES = ["random", "no_decay_full_write", "same_key", "no_write", "forget_all", "mixed_extremes"]


@pytest.mark.parity
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 64])
def test_chunked_kernel_matches_naive_recurrence(regime, chunk_size):
    q, k, v, g, beta, state = random_inputs(regime)
    want_o, want_S = naive_gated_delta_rule(q, k, v, g, beta, state)
    o, S = gdn.chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size=chunk_size)
    torch.testing.assert_close(o.double(), want_o, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(S.double(), want_S, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernel", [gdn.chunk_gated_delta_rule, gdn.sequential_gated_delta_rule])
def test_kernels_compute_in_fp32_under_bf16_autocast(kernel):
    """As fla's kernels do: a model trained under bf16 autocast must not get bf16 matmuls inside the
    recurrence (on an H100 they put the chunked form 10% away from the sequential one)."""
    inputs = random_inputs("random", T=40, K=16, V=16)
    want_o, want_S = kernel(*inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, S = kernel(*inputs)
    assert o.dtype == S.dtype == torch.float32
    torch.testing.assert_close((o, S), (want_o, want_S), atol=0, rtol=0)


@pytest.mark.parity
def test_chunked_kernel_matches_transformers_fla_reference():
    """transformers' pure-PyTorch copy of fla's chunk kernel (same signature and state layout [B,H,K,V]);
    it normalises q and k and scales q itself, so it gets them raw."""
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    q, k, v, g, beta, state = random_inputs("random", T=21)
    want_o, want_S = qwen3_next.torch_chunk_gated_delta_rule(
        q * 3.0, k * 0.5, v, g, beta, chunk_size=8, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    o, S = gdn.chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size=8)
    torch.testing.assert_close(o, want_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, want_S, atol=1e-5, rtol=1e-5)


@pytest.mark.parity
@pytest.mark.parametrize("regime", ["random", "mixed_extremes"])
def test_recurrent_step_matches_naive_recurrence(regime):
    q, k, v, g, beta, S = random_inputs(regime)
    want_o, want_S = naive_gated_delta_rule(q, k, v, g, beta, S)
    outs = []
    for t in range(q.shape[1]):
        o, S = gdn.recurrent_gated_delta_rule(*(x[:, t : t + 1] for x in (q, k, v, g, beta)), S)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1).double(), want_o, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(S.double(), want_S, atol=1e-4, rtol=1e-4)


@pytest.mark.parity
def test_chunked_kernel_gradients_match_naive_recurrence():
    inputs = random_inputs("random", B=1, T=9, H=2)
    gen = torch.Generator().manual_seed(2)
    weights = [torch.randn(x.shape, generator=gen) for x in (inputs[2], inputs[5])]

    def grads(kernel, dtype):
        xs = [x.detach().to(dtype).requires_grad_() for x in inputs]
        o, S = kernel(*xs)
        ((o * weights[0].to(dtype)).sum() + (S * weights[1].to(dtype)).sum()).backward()
        return [x.grad.double() for x in xs]

    chunked = grads(lambda *xs: gdn.chunk_gated_delta_rule(*xs, chunk_size=4), torch.float32)
    for got, want in zip(chunked, grads(naive_gated_delta_rule, torch.float64), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parity
@pytest.mark.parametrize("chunk_size", [4, 64])
def test_full_sequence_equals_token_by_token_decoding(chunk_size):
    model = tiny_model(chunk_size=chunk_size)
    ids = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(1))  # 11: not a multiple of 4
    with torch.no_grad():
        full = model(ids).logits
        state, steps = None, []
        for t in range(ids.shape[1]):
            out = model(ids[:, t : t + 1], state=state, return_state=True)
            state = out.state
            steps.append(out.logits)
        # a prefill of 6 tokens (two chunks, one partial), then the rest as a second chunked call
        head = model(ids[:, :6], return_state=True)
        tail = model(ids[:, 6:], state=head.state).logits
        stateless = model(ids[:, 6:]).logits
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat([head.logits, tail], 1), full, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(stateless, full[:, 6:], atol=1e-2)  # the state carries real information


PARAM_CONFIGS = [
    dict(vocab_size=100, d_model=64, n_layer=2),
    dict(vocab_size=100, d_model=96, n_layer=3, n_head=2, head_dim=16, tie_embeddings=False),
    dict(vocab_size=77, d_model=32, n_layer=1, head_dim=8, expand_v=1, conv_size=3, d_ff=40),
]


@pytest.mark.parametrize("config", PARAM_CONFIGS)
def test_analytic_params_equal_counted(config):
    cfg = gdn.GatedDeltaNetConfig(**config)
    with torch.device("meta"):
        model = gdn.GatedDeltaNetLM(cfg)
    counted, analytic = count_params(model), gdn.cost(cfg, 64)
    assert counted.total == analytic.total_params
    assert counted.embedding == analytic.embedding_params
    tied = cfg.tie_embeddings
    assert counted.embedding == cfg.vocab_size * cfg.d_model * (1 if tied else 2)


def test_flop_counter_counts_triangular_solves():
    """torch's FlopCounterMode has no formula for linalg.solve_triangular (the chunked kernel's WY solve);
    gated_deltanet registers the standard one: n(n−1)/2 multiply-adds per right-hand column for a unit
    triangle, n(n+1)/2 for a general one."""
    from torch.utils.flop_counter import FlopCounterMode

    A, B = torch.randn(3, 5, 5), torch.randn(3, 5, 7)
    for unit, per_column in ((True, 10), (False, 15)):
        with FlopCounterMode(display=False) as counter:
            torch.linalg.solve_triangular(A, B, upper=False, unitriangular=unit)
        assert counter.get_total_flops() == 2 * 3 * 7 * per_column


@pytest.mark.parametrize(
    "config, seq_len",
    [
        (dict(vocab_size=100, d_model=64, n_layer=2, chunk_size=16), 64),  # several whole chunks
        (dict(vocab_size=100, d_model=64, n_layer=2, chunk_size=16), 50),  # a padded last chunk
        (dict(vocab_size=100, d_model=96, n_layer=3, n_head=2, head_dim=16, tie_embeddings=False), 40),
        (dict(vocab_size=500, d_model=256, n_layer=2), 128),  # default chunk_size 64
        (dict(vocab_size=500, d_model=256, n_layer=2), 1),  # one token: the recurrent step
        # small and conv-heavy, so that leaving out the short convs' taps shows
        (dict(vocab_size=64, d_model=32, n_layer=2, n_head=2, head_dim=16, expand_v=1, conv_size=8), 24),
    ],
)
def test_analytic_flops_match_measured(config, seq_len):
    cfg = gdn.GatedDeltaNetConfig(**config)
    with torch.device("meta"):
        model = gdn.GatedDeltaNetLM(cfg)
    measured = measured_forward_flops(model, seq_len)
    # The spec asks for 2%; the closed form is in fact exact (each of its matmuls is one the counter sees).
    assert gdn.cost(cfg, seq_len).forward_flops_per_token == pytest.approx(measured, rel=1e-6)


def test_state_size():
    cfg = tiny_cfg()
    model = tiny_model()
    with torch.no_grad():
        state = model(torch.zeros(1, 3, dtype=torch.long), return_state=True).state
    elements = sum(t.numel() for (convs, S) in state for t in (*convs, S))
    assert gdn.cost(cfg, 3).state_size == elements
    assert gdn.cost(cfg, 3).kv_cache_per_token == 0


def test_it_learns():
    torch.manual_seed(0)
    model = gdn.GatedDeltaNetLM(tiny_cfg(d_model=64, n_head=2, head_dim=16, chunk_size=8))  # 3 chunks
    ids = torch.randint(0, 50, (4, 24), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        logits = model(ids[:, :-1]).logits
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0], losses  # memorising one batch


def test_tied_and_untied_head():
    tied, untied = gdn.GatedDeltaNetLM(tiny_cfg()), gdn.GatedDeltaNetLM(tiny_cfg(tie_embeddings=False))
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    assert untied.get_output_embeddings().weight is not untied.get_input_embeddings().weight


def test_configure_rejects_unknown_key():
    assert gdn.configure({"d_model": 64}, 100, 32).d_model == 64
    with pytest.raises(TypeError):
        gdn.configure({"d_model": 64, "n_heads": 2}, 100, 32)


@pytest.mark.parametrize("d_model", [32, 96, 256, 768])
def test_shape_gives_buildable_configs(d_model):
    cfg = gdn.configure(gdn.shape(d_model, 2), 100, 32)
    assert cfg.n_head >= 1 and cfg.n_head * cfg.head_dim <= max(64, d_model)
    with torch.device("meta"):
        model = gdn.GatedDeltaNetLM(cfg)
        logits = model(torch.zeros(1, 8, dtype=torch.long)).logits
    assert logits.shape == (1, 8, 100)
    assert count_params(model).total == gdn.cost(cfg, 32).total_params


class FlaContract:
    """fla's gated delta rule kernels as far as their inputs go (no triton or GPU here): the dtype checks
    fla's `chunk_gated_delta_rule` asserts, then rayb's chunked path computes the answer."""

    def __init__(self):
        self.dtypes = []

    def chunk_gated_delta_rule(self, q, k, v, g, beta, scale, initial_state, output_final_state):
        assert q.dtype == k.dtype == v.dtype, "fla: q, k and v must share a dtype"
        assert q.dtype != torch.float32, "fla: the chunked kernels take no fp32"
        self.dtypes.append(q.dtype)
        return gdn.chunk_gated_delta_rule(q.float(), k.float(), v.float(), g, beta, initial_state)

    fused_recurrent_gated_delta_rule = chunk_gated_delta_rule


@pytest.fixture
def fla_on_a_gpu(monkeypatch):
    fla = FlaContract()
    monkeypatch.setattr(gdn, "on_gpu", lambda x: True)
    monkeypatch.setattr(gdn, "_fla_ops", lambda: fla)
    return fla


def test_fla_gets_one_16_bit_dtype_under_autocast_and_fp32_evaluation_stays_off_it(fla_on_a_gpu):
    q, k, v, g, beta, state = random_inputs("random")
    # Under CUDA autocast l2norm hands fla fp32 q and k beside a bf16 v: cast to the autocast dtype.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, _ = gdn.gated_delta_rule(q, k, v.bfloat16(), g, beta, state, chunk_size=4)
    assert fla_on_a_gpu.dtypes == [torch.bfloat16]
    reference, _ = naive_gated_delta_rule(q, k, v, g, beta, state)
    assert (o.double() - reference).abs().max() < 0.1  # bf16 inputs
    # A whole model under autocast, as training runs it, reaches fla the same way.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tiny_model()(torch.randint(0, 50, (2, 9)))
    assert fla_on_a_gpu.dtypes[1:] and set(fla_on_a_gpu.dtypes) == {torch.bfloat16}
    # In fp32 (evaluation without autocast) fla's kernels refuse the inputs: rayb's chunked path runs.
    calls = len(fla_on_a_gpu.dtypes)
    o32, _ = gdn.gated_delta_rule(q, k, v, g, beta, state, chunk_size=4)
    assert len(fla_on_a_gpu.dtypes) == calls
    assert (o32.double() - reference).abs().max() < 1e-5
