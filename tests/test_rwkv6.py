"""RWKV-6: the chunked kernel against the plain recurrence, decoding with state against full sequences,
analytic accounting against the built model, and a few training steps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rayb.models import rwkv6
from rayb.models.accounting import count_params, measured_forward_flops
from rayb.models.rwkv6 import CHUNK, RWKV6LM, chunked_wkv


def naive_wkv(r, k, v, log_w, u, state):
    """The recurrence one token at a time: o_t = r_t·(S + diag(u)·k_tᵀv_t); S ← diag(w_t)·S + k_tᵀv_t."""
    S, out = state.clone(), []
    for t in range(r.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]  # [B, H, D, D]
        out.append(torch.einsum("bhk,bhkv->bhv", r[:, t], S + u[..., None] * kv))
        S = log_w[:, t].exp()[..., None] * S + kv
    return torch.stack(out, dim=1), S


def random_model(seed: int = 0, **overrides) -> RWKV6LM:
    """A tiny model with every weight random: RWKV's init zeroes the output projections, which would let
    a broken recurrence or state go unnoticed."""
    torch.manual_seed(seed)
    cfg = rwkv6.configure({"d_model": 64, "n_layer": 2, "head_size": 32} | overrides, 97, 64)
    model = RWKV6LM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(std=0.3 if "_w" in name else 0.1)  # LoRAs and projections
    return model.eval()


@pytest.mark.parity
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-9), (torch.float32, 1e-4)])
def test_decoding_with_state_matches_full_sequence(dtype, tol):
    model = random_model().to(dtype)
    ids = torch.randint(0, 97, (2, 2 * CHUNK + 5))  # several chunks, not a multiple of the chunk
    with torch.no_grad():
        full = model(ids).logits
        state, steps = None, []
        for t in range(ids.shape[1]):
            out = model(ids[:, t : t + 1], state=state, return_state=True)
            state, steps = out.state, steps + [out.logits]
        # The same in two uneven pieces: the second continues from the first's state.
        head = model(ids[:, :19], return_state=True)
        tail = model(ids[:, 19:], state=head.state).logits
    assert full.abs().max() > 1  # logits that actually depend on the weights
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=tol, rtol=10 * tol)
    torch.testing.assert_close(torch.cat([head.logits, tail], dim=1), full, atol=tol, rtol=10 * tol)
    # Without the state the continuation is a different computation.
    assert not torch.allclose(model(ids[:, 19:]).logits, tail, atol=1e-3)


@pytest.mark.parity
@pytest.mark.parametrize("T", [1, 7, CHUNK, 3 * CHUNK + 3])
def test_chunked_kernel_matches_naive_recurrence(T):
    torch.manual_seed(T)
    B, H, D = 2, 3, 8
    r, k, v = (torch.randn(B, T, H, D, dtype=torch.float64) for _ in range(3))
    # Per-channel decays from total forgetting (w = e^-60) to almost none (w = 1 - 1e-6), and random.
    strong = torch.full((B, T, H, D // 4), -60.0, dtype=torch.float64)
    weak = torch.full((B, T, H, D // 4), -1e-6, dtype=torch.float64)
    mixed = -torch.exp(torch.empty(B, T, H, D // 2, dtype=torch.float64).uniform_(-8, 4))
    log_w = torch.cat([strong, weak, mixed], dim=-1)
    u = torch.randn(H, D, dtype=torch.float64)
    state = torch.randn(B, H, D, D, dtype=torch.float64)

    want_o, want_S = naive_wkv(r, k, v, log_w, u, state)
    o, S = chunked_wkv(r, k, v, log_w, u, state)
    torch.testing.assert_close(o, want_o, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(S, want_S, atol=1e-10, rtol=1e-10)

    o32, S32 = chunked_wkv(*(t.float() for t in (r, k, v, log_w, u, state)))
    assert torch.isfinite(o32).all() and torch.isfinite(S32).all()
    torch.testing.assert_close(o32.double(), want_o, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(S32.double(), want_S, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("kernel", [chunked_wkv, rwkv6.recurrent_wkv])
def test_kernels_compute_in_fp32_under_bf16_autocast(kernel):
    """As fla's kernels do: a model trained under bf16 autocast must not get bf16 matmuls inside the
    recurrence (on an H100 they put the chunked form 30% away from the sequential one)."""
    torch.manual_seed(0)
    r, k, v = (torch.randn(2, 3 * CHUNK, 2, 16) for _ in range(3))
    log_w = -torch.exp(torch.empty(2, 3 * CHUNK, 2, 16).uniform_(-6, 1))
    u, state = torch.randn(2, 16), torch.randn(2, 2, 16, 16)
    want_o, want_S = kernel(r, k, v, log_w, u, state)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, S = kernel(r, k, v, log_w, u, state)
    assert o.dtype == S.dtype == torch.float32
    torch.testing.assert_close((o, S), (want_o, want_S), atol=0, rtol=0)


def test_kernel_gradients_are_finite_under_extreme_decays():
    torch.manual_seed(0)
    r, k, v = (torch.randn(1, 40, 2, 8, requires_grad=True) for _ in range(3))
    w = torch.cat([torch.full((1, 40, 2, 4), 4.0), torch.full((1, 40, 2, 4), -14.0)], -1).requires_grad_()
    u = torch.randn(2, 8, requires_grad=True)
    o, S = chunked_wkv(r, k, v, -w.exp().clamp(max=-rwkv6.MIN_LOG_DECAY), u)
    (o.square().sum() + S.sum()).backward()
    for t in (r, k, v, w, u):
        assert torch.isfinite(t.grad).all()


CONFIGS = [
    {"d_model": 64, "n_layer": 2, "head_size": 32},
    {"d_model": 96, "n_layer": 3, "head_size": 32, "tie_embeddings": True},
    {"d_model": 128, "n_layer": 1, "d_ffn": 200, "mix_lora": 8, "decay_lora": 16},
    {"d_model": 128, "n_layer": 1, "d_ffn": 200, "mix_lora": 8, "decay_lora": 16, "tie_embeddings": True},
]


def on_meta(config: dict, vocab_size: int = 1000) -> tuple[RWKV6LM, rwkv6.RWKV6Config]:
    cfg = rwkv6.configure(dict(config), vocab_size, 64)
    with torch.device("meta"):
        return RWKV6LM(cfg), cfg


@pytest.mark.parametrize("config", CONFIGS)
def test_analytic_params_match_the_model(config):
    model, cfg = on_meta(config)
    counted, analytic = count_params(model), rwkv6.cost(cfg, 64)
    assert counted.total == analytic.total_params
    assert counted.embedding == analytic.embedding_params
    untied = 2 if not cfg.tie_embeddings else 1
    assert analytic.embedding_params == untied * cfg.vocab_size * cfg.d_model


@pytest.mark.parametrize("seq_len", [64, 50, 8])  # whole chunks, a padded last chunk, one short chunk
@pytest.mark.parametrize("config", [CONFIGS[0], {"d_model": 64, "n_layer": 2, "head_size": 64}])
def test_analytic_flops_match_measured(config, seq_len):
    # Every FLOP of the model, the kernel's included, is a matmul that FlopCounterMode sees; elementwise
    # work (the decay products) is left out on both sides, by accounting.py's conventions. At these
    # sizes the kernel's term is 5-13% of the total, so a wrong one fails the 2% check.
    model, cfg = on_meta(config, vocab_size=300)
    measured, analytic = measured_forward_flops(model, seq_len), rwkv6.cost(cfg, seq_len)
    assert analytic.forward_flops_per_token == pytest.approx(measured, rel=0.02)


def test_state_size_counts_the_returned_state():
    model = random_model()
    out = model(torch.randint(0, 97, (1, 5)), return_state=True)
    elements = sum(t.numel() for layer in out.state for t in layer)
    cost = rwkv6.cost(model.cfg, 5)
    assert cost.state_size == elements
    assert cost.kv_cache_per_token == 0


def test_training_reduces_loss_at_high_lr():
    torch.manual_seed(0)
    model = RWKV6LM(rwkv6.configure({"d_model": 64, "n_layer": 2, "head_size": 32}, 64, 32))
    batch = torch.randint(0, 64, (4, 33))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        logits = model(batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, 64), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.05)  # uniform at init
    assert losses[-1] < 0.6 * losses[0]


def test_configure_rejects_unknown_keys_and_bad_shapes():
    with pytest.raises(TypeError):
        rwkv6.configure({"d_model": 64, "n_heads": 2}, 100, 32)
    with pytest.raises(ValueError):
        rwkv6.configure({"d_model": 96, "head_size": 64}, 100, 32)
    assert rwkv6.configure({"d_model": 768}, 100, 32).d_ffn == 2688


@pytest.mark.parametrize("d_model", [32, 96, 256, 768])
def test_shape_gives_buildable_configs(d_model):
    config = rwkv6.shape(d_model, 2)
    model, cfg = on_meta(config)
    assert cfg.n_head * cfg.head_size == d_model
    assert model(torch.zeros(1, 3, dtype=torch.long, device="meta")).logits.shape == (1, 3, 1000)


def test_time_mixing_parameters_are_not_weight_decayed():
    from rayb.train.engine import param_groups

    model = RWKV6LM(rwkv6.RWKV6Config(vocab_size=64, d_model=64, n_layer=2))
    decayed, exempt = (set(map(id, g["params"])) for g in param_groups(model, 0.1))
    names = {id(p): n for n, p in model.named_parameters()}
    assert {n for i, n in names.items() if i in decayed} >= {"blocks.0.att.key.weight", "head.weight"}
    for name in ("blocks.1.att.time_faaaa", "blocks.0.att.time_maa_w1", "blocks.0.att.time_decay_w2"):
        assert id(model.get_parameter(name)) in exempt and model.get_parameter(name).dim() >= 2
    assert decayed.isdisjoint(exempt) and len(decayed | exempt) == len(names)
