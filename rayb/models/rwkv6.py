"""RWKV-6 "Finch" (Peng et al. 2024, "Eagle and Finch"), readable top to bottom.

Each layer's time mix is a linear attention with a data-dependent, per-channel decay w_t and a bonus u
for the current token; per head, with a head_size × head_size state S,

    o_t = r_t · (S_{t-1} + diag(u) k_tᵀ v_t)        S_t = diag(w_t) S_{t-1} + k_tᵀ v_t

We chose RWKV-6 over RWKV-7 because this is gated linear attention with a diagonal decay, which has an
exact chunk-parallel matmul form in plain PyTorch (`chunked_wkv`, fast on CPU); RWKV-7's generalised
delta rule with per-channel decay needs a WY-style kernel that only fla's Triton provides.

Parameters follow BlinkDL's RWKV-LM v6 (`RWKV_Tmix_x060`, `RWKV_CMix_x060`): same names, meaning and
initial values, so on CUDA with fla installed the same weights run through fla's `chunk_rwkv6`, which
takes r, k, v, log w and u exactly as computed here (with scale 1). One storage difference: per-channel
vectors (time_maa_*, time_decay) are [d], not [1, 1, d]; an RWKV-LM checkpoint loads after flattening
them. As in RWKV-LM, no time_* parameter is weight-decayed (`RWKV6LM.no_weight_decay`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rayb.models import kernels
from rayb.models.accounting import Cost
from rayb.models.common import LMOutput, autocast_off, init_normal, round_up
from rayb.models.registry import Architecture, InnerWidth, register

CHUNK = 16  # tokens per chunk of the CPU kernel: the [C, C, head_size] decay tensor stays small
HEAD_SIZE_DIVISOR = 8  # RWKV-6 folds it into ln_x's eps (v5 divided the input by it instead)
FLA_MODULE = "fla.ops.rwkv6"  # the GPU kernels (kernels.fla_module)
MIN_LOG_DECAY = -60.0  # a per-token decay below e^-60 already forgets everything; the floor keeps every
# exponent finite, so gradients through a saturated decay stay finite too


def default_ffn(d_model: int) -> int:
    return int(3.5 * d_model) // 32 * 32


@dataclass
class RWKV6Config:
    vocab_size: int
    d_model: int = 768
    n_layer: int = 12
    head_size: int = 64  # n_head = d_model // head_size
    d_ffn: int | None = None  # channel-mix width; 3.5·d_model rounded down to a multiple of 32
    mix_lora: int = 32  # rank of the token-shift (ddlerp) LoRA
    decay_lora: int = 64  # rank of the decay LoRA
    norm_eps: float = 1e-5
    tie_embeddings: bool = False  # RWKV's head is untied
    init_std: float = 0.02

    def __post_init__(self):
        if self.d_ffn is None:
            self.d_ffn = default_ffn(self.d_model)
        for name in ("vocab_size", "d_model", "n_layer", "head_size", "d_ffn", "mix_lora", "decay_lora"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.head_size:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by head_size ({self.head_size})")

    @property
    def n_head(self) -> int:
        return self.d_model // self.head_size


@autocast_off
def recurrent_wkv(r, k, v, log_w, u, state=None):
    """The recurrence above one token at a time, as written: the reference `chunked_wkv` (and fla's
    `chunk_rwkv6` on a GPU) is held to. Same arguments and returns as `chunked_wkv`."""
    dtype, work = v.dtype, torch.promote_types(v.dtype, torch.float32)
    r, k, v, log_w, u = (t.to(work) for t in (r, k, v, log_w, u))
    B, T, H, D = r.shape
    S = r.new_zeros(B, H, D, D) if state is None else state.to(work)
    out = []
    for t in range(T):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]  # k_tᵀ v_t, [B, H, D, D]
        out.append((r[:, t, :, None, :] @ (S + u[..., None] * kv)).squeeze(-2))
        S = log_w[:, t].exp()[..., None] * S + kv
    return torch.stack(out, dim=1).to(dtype), S


def _exclusive(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x moved one step along `dim` with a zero first: an exclusive cumulative sum from an inclusive one,
    by shifting rather than subtracting (a difference of large sums would cancel)."""
    return torch.cat([torch.zeros_like(x.narrow(dim, 0, 1)), x.narrow(dim, 0, x.shape[dim] - 1)], dim)


@autocast_off
def chunked_wkv(r, k, v, log_w, u, state=None, chunk: int = CHUNK):
    """The recurrence above for r, k, v, log_w [B, T, H, D] (log_w ≤ 0), u [H, D], state [B, H, D, D].

    Within a chunk every pair (t, s) is computed at once with the decay exp(Σ_{s<j<t} log_w_j) ≤ 1;
    across chunks the state carries the rest. Every decay exponent is summed directly over its own
    tokens, never taken as a difference of two cumulative sums, which with strong decays (log_w down
    to −60 per token) would cancel and cost fp32 about 1e-5; and only non-positive numbers are ever
    exponentiated, so strong decays underflow to 0 instead of overflowing.
    Returns o [B, T, H, D] and the state after the last token.
    """
    B, T, H, D = r.shape
    dtype, work = v.dtype, torch.promote_types(v.dtype, torch.float32)  # at least fp32 inside
    C = min(chunk, T)
    pad = -T % C  # zero keys add nothing and zero log-decay keeps the state: padding is inert
    r, k, v, log_w = (F.pad(t.to(work), (0, 0, 0, 0, 0, pad)).transpose(1, 2) for t in (r, k, v, log_w))
    N = (T + pad) // C
    r, k, v, log_w = (t.reshape(B, H, N, C, D) for t in (r, k, v, log_w))

    a_excl = _exclusive(log_w.cumsum(-2), -2)  # log decay from the chunk's start through t-1
    a_after = _exclusive(log_w.flip(-2).cumsum(-2), -2).flip(-2)  # ... from t+1 through the chunk's end
    a_last = log_w.sum(-2, keepdim=True)  # ... over the whole chunk

    # Intra-chunk: pair (t, s<t) decays by the log-decays strictly between them, summed along t for each
    # s ([.., C(t), C(s), D]); the diagonal gets the bonus u instead.
    below = torch.ones(C, C, dtype=torch.bool, device=r.device).tril(-1)
    between = log_w.unsqueeze(-2).expand(B, H, N, C, C, D).masked_fill(~below[..., None], 0)
    between = _exclusive(between.cumsum(-3), -3).masked_fill(~below[..., None], -math.inf)
    eye = torch.eye(C, dtype=work, device=r.device)[..., None]
    decay = between.exp() + eye * u.to(work).view(H, 1, 1, 1, D)  # [B, H, N, C(t), C(s), D]
    scores = (r.unsqueeze(-2) @ (decay * k.unsqueeze(-3)).transpose(-1, -2)).squeeze(-2)
    o = scores @ v

    # Inter-chunk: the state before each chunk, decayed to each token; keys decayed to the chunk's end.
    chunk_kv = (k * a_after.exp()).transpose(-1, -2) @ v  # [B, H, N, D, D]
    chunk_decay = a_last.exp().transpose(-1, -2)  # [B, H, N, D, 1]
    S = r.new_zeros(B, H, D, D) if state is None else state.to(work)
    starts = []
    for n in range(N):
        starts.append(S)
        S = chunk_decay[:, :, n] * S + chunk_kv[:, :, n]
    o = o + (r * a_excl.exp()) @ torch.stack(starts, dim=2)
    return o.reshape(B, H, N * C, D)[:, :, :T].transpose(1, 2).to(dtype), S


def wkv(r, k, v, log_w, u, state=None):
    """`chunked_wkv`, or on CUDA with fla installed fla's Triton kernel (same [B, T, H, D] layout);
    `recurrent_wkv` within `kernels.reference_paths()`."""
    if kernels.reference_only():
        return recurrent_wkv(r, k, v, log_w, u, state)
    # fla ≥ 0.2 (no head_first argument); None without fla or where its kernels are wrong (kernels.py)
    if r.is_cuda and (fla := kernels.fla_module(FLA_MODULE, tilelang_fixes=False)) is not None:
        return fla.chunk_rwkv6(r, k, v, log_w, u, scale=1.0, initial_state=state, output_final_state=True)
    return chunked_wkv(r, k, v, log_w, u, state)


def token_shift(x: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
    """x moved one token later; the first slot gets the previous call's last token (or zeros)."""
    first = torch.zeros_like(x[:, :1]) if prev is None else prev.unsqueeze(1).to(x.dtype)
    return torch.cat([first, x[:, :-1]], dim=1)


def _ramps(cfg: RWKV6Config, layer_id: int):
    """RWKV's layer-dependent init: early layers mix in more of the previous token and decay faster."""
    d = cfg.d_model
    to_1 = layer_id / max(cfg.n_layer - 1, 1)  # 0 at the first layer, 1 at the last
    to_0 = 1.0 - layer_id / cfg.n_layer  # 1 at the first layer, towards 0 at the last
    return to_1, to_0, torch.arange(d) / d


class TimeMix(nn.Module):
    def __init__(self, cfg: RWKV6Config, layer_id: int):
        super().__init__()
        d, H, D = cfg.d_model, cfg.n_head, cfg.head_size
        self.n_head, self.head_size = H, D
        to_1, to_0, ddd = _ramps(cfg, layer_id)
        lerp = lambda power, shift=0.0: nn.Parameter(1.0 - (ddd**power + shift))  # noqa: E731
        self.time_maa_x, self.time_maa_w, self.time_maa_k = lerp(to_0), lerp(to_0), lerp(to_0)
        self.time_maa_v = lerp(to_0, 0.3 * to_1)
        self.time_maa_r, self.time_maa_g = lerp(0.5 * to_0), lerp(0.5 * to_0)
        # Data-dependent lerp amounts for w, k, v, r, g: a zero first matrix, as RWKV-LM does.
        self.time_maa_w1 = nn.Parameter(torch.zeros(d, 5 * cfg.mix_lora))
        self.time_maa_w2 = nn.Parameter(torch.empty(5, cfg.mix_lora, d).uniform_(-0.01, 0.01))
        # Per-channel base decay, from slow (e^-e^-6 ≈ 0.998 per token) to fast (e^-e^-1 ≈ 0.69);
        # deeper layers keep more channels slow.
        n = torch.arange(d) / (d - 1 if d > 1 else 1)
        self.time_decay = nn.Parameter(-6 + 5 * n ** (0.7 + 1.3 * to_1))
        self.time_decay_w1 = nn.Parameter(torch.zeros(d, cfg.decay_lora))
        self.time_decay_w2 = nn.Parameter(torch.empty(cfg.decay_lora, d).uniform_(-0.01, 0.01))
        zigzag = ((torch.arange(d) + 1) % 3 - 1) * 0.1
        self.time_faaaa = nn.Parameter((to_1 * (1 - n) + zigzag).view(H, D))  # the bonus u
        self.receptance, self.key, self.value, self.gate, self.output = (
            nn.Linear(d, d, bias=False) for _ in range(5)
        )
        self.ln_x = nn.GroupNorm(H, d, eps=1e-5 * HEAD_SIZE_DIVISOR**2)

    def forward(self, x: torch.Tensor, state=None):
        B, T, d = x.shape
        prev_x, S = (None, None) if state is None else state
        xx = token_shift(x, prev_x) - x
        # ddlerp: how much of the previous token each of w, k, v, r, g sees depends on the input.
        m = torch.tanh((x + xx * self.time_maa_x) @ self.time_maa_w1).view(B * T, 5, -1).transpose(0, 1)
        m = torch.bmm(m, self.time_maa_w2).view(5, B, T, d)
        maa = (self.time_maa_w, self.time_maa_k, self.time_maa_v, self.time_maa_r, self.time_maa_g)
        xw, xk, xv, xr, xg = (x + xx * (mu + dm) for mu, dm in zip(maa, m.unbind(0), strict=True))

        r, k, v = self.receptance(xr), self.key(xk), self.value(xv)
        g = F.silu(self.gate(xg))
        w = self.time_decay + torch.tanh(xw @ self.time_decay_w1) @ self.time_decay_w2
        log_w = -torch.exp(w.float()).clamp(max=-MIN_LOG_DECAY)  # log of the decay e^{-e^w}
        heads = lambda t: t.view(B, T, self.n_head, self.head_size)  # noqa: E731
        o, S = wkv(heads(r), heads(k), heads(v), heads(log_w), self.time_faaaa, S)
        o = self.ln_x(o.reshape(B * T, d)).view(B, T, d)
        return self.output(o * g), (x[:, -1], S)


class ChannelMix(nn.Module):
    def __init__(self, cfg: RWKV6Config, layer_id: int):
        super().__init__()
        _, to_0, ddd = _ramps(cfg, layer_id)
        self.time_maa_k = nn.Parameter(1.0 - ddd**to_0)
        self.time_maa_r = nn.Parameter(1.0 - ddd**to_0)
        self.key = nn.Linear(cfg.d_model, cfg.d_ffn, bias=False)
        self.receptance = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.value = nn.Linear(cfg.d_ffn, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, prev_x=None):
        xx = token_shift(x, prev_x) - x
        k = torch.relu(self.key(x + xx * self.time_maa_k)) ** 2
        out = torch.sigmoid(self.receptance(x + xx * self.time_maa_r)) * self.value(k)
        return out, x[:, -1]


class Block(nn.Module):
    def __init__(self, cfg: RWKV6Config, layer_id: int):
        super().__init__()
        # RWKV normalises the embedding once, in the first block (it lets the embedding start tiny).
        self.ln0 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps) if layer_id == 0 else None
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.att = TimeMix(cfg, layer_id)
        self.ffn = ChannelMix(cfg, layer_id)

    def forward(self, x: torch.Tensor, state=None):
        """state, per layer: (time mix's previous x [B, d], wkv state [B, H, D, D], channel mix's previous x)."""
        att_x, S, ffn_x = (None, None, None) if state is None else state
        if self.ln0 is not None:
            x = self.ln0(x)
        h, (att_x, S) = self.att(self.ln1(x), (att_x, S))
        x = x + h
        h, ffn_x = self.ffn(self.ln2(x), ffn_x)
        return x + h, (att_x, S, ffn_x)


class RWKV6LM(nn.Module):
    def __init__(self, cfg: RWKV6Config):
        super().__init__()
        self.cfg = cfg
        self.emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)])
        self.ln_out = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.emb.weight
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self):
        # Matrices: rayb's common N(0, init_std), where RWKV-LM uses orthogonal ones of similar scale.
        self.apply(lambda m: init_normal(m, self.cfg.init_std))
        if not self.cfg.tie_embeddings:  # RWKV-LM's tiny embedding (ln0 rescales it); tied, the head's
            nn.init.uniform_(self.emb.weight, -1e-4, 1e-4)
        for i, block in enumerate(self.blocks):
            # RWKV-LM: every block starts as the identity (zero output projections), keys and gates small,
            # and deeper layers' ln_x scaled up.
            for zero in (block.att.output, block.ffn.value, block.ffn.receptance):
                nn.init.zeros_(zero.weight)
            block.att.key.weight.mul_(0.1)
            block.att.gate.weight.mul_(0.1)
            block.att.ln_x.weight.fill_(((1 + i) / self.cfg.n_layer) ** 0.7)

    def forward(self, input_ids: torch.Tensor, state=None, return_state: bool = False) -> LMOutput:
        """state: what an earlier call returned (return_state=True); it continues that sequence."""
        x = self.emb(input_ids)
        new_state = []
        for i, block in enumerate(self.blocks):
            x, layer_state = block(x, None if state is None else state[i])
            new_state.append(layer_state)
        logits = self.head(self.ln_out(x))
        return LMOutput(logits=logits, state=new_state if return_state else None)

    def no_weight_decay(self) -> set[str]:
        """RWKV-LM never decays its time-mixing parameters, the LoRA matrices and the [H, D] bonus
        included (timm's hook, which rayb's optimizer honours)."""
        return {name for name, _ in self.named_parameters() if ".time_" in name}

    def get_input_embeddings(self) -> nn.Embedding:
        return self.emb

    def get_output_embeddings(self) -> nn.Linear:
        return self.head


def configure(config: dict, vocab_size: int, seq_len: int) -> RWKV6Config:
    return RWKV6Config(vocab_size=vocab_size, **config)


def cost(cfg: RWKV6Config, seq_len: int) -> Cost:
    d, L, V, D, f = cfg.d_model, cfg.n_layer, cfg.vocab_size, cfg.head_size, cfg.d_ffn
    loras = 2 * 5 * cfg.mix_lora * d + 2 * cfg.decay_lora * d  # down and up matrices of both LoRAs
    matrices = 5 * d * d + loras + 2 * d * f + d * d  # time mix r, k, v, g, output; channel mix
    vectors = 6 * d + d + d + 2 * d + 2 * d + 4 * d  # time_maa_*, decay, bonus, ln_x; cmix maa; ln1, ln2
    # chunked_wkv, per token and head, for chunks of C tokens (padded up to a whole chunk): the
    # C×C×D pair scores and their C×C×D product with v, plus reading and writing the D×D state.
    C = min(CHUNK, seq_len)
    mixing = round_up(seq_len, C) / seq_len * cfg.n_head * (4 * C * D + 4 * D * D)
    return Cost(
        embedding_params=V * d * (1 if cfg.tie_embeddings else 2),
        non_embedding_params=L * (matrices + vectors) + 2 * d + 2 * d,  # + ln0, ln_out
        forward_flops_per_token=L * (2 * matrices + mixing) + 2 * V * d,
        kv_cache_per_token=0,
        state_size=L * (cfg.n_head * D * D + 2 * d),
    )


def shape(d_model: int, n_layer: int) -> dict:
    return {"d_model": d_model, "n_layer": n_layer, "head_size": 64 if d_model % 64 == 0 else 32}


register(
    Architecture(
        name="rwkv6",
        configure=configure,
        model=RWKV6LM,
        cost=cost,
        shape=shape,
        aspect=64.0,
        knobs=(InnerWidth("d_ffn", default_ffn),),
        description="RWKV-6 Finch; pure-PyTorch chunked on CPU, fla kernels on GPU",
        kernel_paths=kernels.fla("WKV", "chunk_rwkv6", "rayb chunked WKV", FLA_MODULE, tilelang_fixes=False),
        reference="the sequential WKV recurrence",
    )
)
