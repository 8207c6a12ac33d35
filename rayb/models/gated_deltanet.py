"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule").

Each head keeps a key→value memory S (head_dim × value_dim). Per token it forgets a little of all of it
(Mamba-2's decay exp(g_t), g_t ≤ 0), moves what it recalls for k_t towards v_t by a step beta_t (the delta
rule), and is read by the query:   S_t = exp(g_t)·S_{t-1};  S_t += beta_t·k_t(v_t − S_tᵀk_t)ᵀ;  o_t = S_tᵀq_t

Parameter names, shapes and maths are those of flash-linear-attention's `fla.layers.GatedDeltaNet`, so a
checkpoint moves between this pure-PyTorch path (CPU) and fla's Triton kernels (CUDA). Block names follow
fla's model too (embeddings, layers.i.attn_norm/attn/mlp_norm/mlp, norm, lm_head); only the MLP is
rayb's SwiGLU (gate/up/down where fla has gate_proj/up_proj/down_proj).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import register_flop_formula

from rayb.models import kernels
from rayb.models.accounting import Cost
from rayb.models.common import LMOutput, SwiGLU, autocast_off, init_normal, swiglu_width
from rayb.models.registry import Architecture, InnerWidth, register

FLA_MODULE = "fla.ops.gated_delta_rule"  # the GPU kernels (kernels.fla_module)


@dataclass
class GatedDeltaNetConfig:
    vocab_size: int
    d_model: int = 768
    n_layer: int = 12
    n_head: int | None = None  # default: H·head_dim ≈ 3/4·d_model, fla's budget of ~6·d² per mixer
    head_dim: int = 64  # query/key head dim
    expand_v: int = 2  # value head dim = expand_v·head_dim
    conv_size: int = 4
    d_ff: int | None = None  # SwiGLU width; swiglu_width(d_model) by default
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    chunk_size: int = 64
    init_std: float = 0.02

    def __post_init__(self):
        self.n_head = self.n_head or max(1, 3 * self.d_model // (4 * self.head_dim))
        self.d_ff = self.d_ff or swiglu_width(self.d_model)

    @property
    def value_dim(self) -> int:
        return self.expand_v * self.head_dim


# ---- the recurrence, two ways: whole chunks at once (training, prefill) and one token (decoding) ----


@autocast_off
def chunk_gated_delta_rule(q, k, v, g, beta, state=None, chunk_size=64):
    """q, k [B,T,H,K] (unit-norm; q already scaled), v [B,T,H,V], g (log-decay) and beta [B,T,H],
    state [B,H,K,V] or None. Returns o [B,T,H,V] and the state after the last token (fp32, as fla)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    c = min(chunk_size, T)  # a short sequence is one chunk, not one padded to chunk_size
    q, k, v, g, beta = (_chunks(x.float(), c) for x in (q, k, v, g, beta))  # [B,H,n,c,...]
    b = g.cumsum(-1)  # log of the decay from the chunk's start to each token
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    # exp(b_i − b_j) for j ≤ i, 0 above: only differences are exponentiated, so nothing overflows.
    decay = (b[..., :, None] - b[..., None, :]).masked_fill(~causal, -math.inf).exp()
    # The writes inside a chunk see each other: token i corrects what tokens j < i just wrote. With
    # S0 the state at the chunk's start, the corrections δ (S_t = e^{b_t} S0 + Σ_{j≤t} e^{b_t−b_j} k_j δ_jᵀ)
    # solve the unit lower-triangular system (I + A) δ = β(v − e^b K S0), A_ij = β_i e^{b_i−b_j} k_i·k_j
    # for j < i. One triangular solve for all tokens gives δ = u − w S0 (the WY form fla uses too).
    A = ((k @ k.transpose(-1, -2)) * decay * beta[..., None]).tril(-1)
    rhs = torch.cat([v, k * b.exp()[..., None]], dim=-1) * beta[..., None]
    u, w = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True).split([V, K], dim=-1)
    attn = (q @ k.transpose(-1, -2)) * decay  # the chunk's own causal, decayed q·k
    q_read = q * b.exp()[..., None]  # queries see S0 through the decay since the chunk's start
    k_write = k * (b[..., -1:] - b).exp()[..., None]  # the chunk's writes, decayed to its end
    S = q.new_zeros(B, H, K, V) if state is None else state.float()
    out = []
    for i in range(q.shape[2]):  # only the state crosses chunks: a short sequential loop
        delta = u[:, :, i] - w[:, :, i] @ S
        out.append(q_read[:, :, i] @ S + attn[:, :, i] @ delta)
        S = S * b[:, :, i, -1, None, None].exp() + k_write[:, :, i].transpose(-1, -2) @ delta
    o = torch.stack(out, dim=2).reshape(B, H, -1, V)[:, :, :T]
    return o.transpose(1, 2), S


# FlopCounterMode has no formula for triangular solves and would count the one above as free; teach it
# the standard one, so that measured_forward_flops sees the work cost() charges: a unit triangle of size
# n costs n(n−1)/2 multiply-adds per right-hand column (n(n+1)/2 with a general diagonal).
def _solve_triangular_flops(a_shape, b_shape, *args, out_shape, unitriangular=False, **kwargs) -> int:
    return math.prod(out_shape) * (a_shape[-1] + (-1 if unitriangular else 1))


with contextlib.suppress(RuntimeError):  # already registered: a reload, or a future torch of its own
    register_flop_formula(torch.ops.aten.linalg_solve_triangular)(_solve_triangular_flops)


def _chunks(x: torch.Tensor, c: int) -> torch.Tensor:
    """[B,T,H,...] → [B,H,T/c,c,...], zero-padded at the end (g = beta = 0 there: no decay, no write)."""
    x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, -x.shape[1] % c)).transpose(1, 2)
    return x.reshape(x.shape[0], x.shape[1], -1, c, *x.shape[3:])


@autocast_off
def recurrent_gated_delta_rule(q, k, v, g, beta, state=None):
    """One token, the recurrence as written: q, k [B,1,H,K], v [B,1,H,V], g, beta [B,1,H]."""
    q, k, v, g, beta = (x[:, 0].float() for x in (q, k, v, g, beta))
    S = q.new_zeros(*k.shape, v.shape[-1]) if state is None else state.float()
    S = S * g.exp()[..., None, None]
    error = v - (k[..., None, :] @ S).squeeze(-2)  # what the memory should recall for k, minus what it does
    S = S + beta[..., None, None] * k[..., :, None] * error[..., None, :]
    return (q[..., None, :] @ S).transpose(1, 2), S  # o [B,1,H,V]


def sequential_gated_delta_rule(q, k, v, g, beta, state=None):
    """The whole sequence one token at a time: the reference `chunk_gated_delta_rule` (and fla's
    kernels on a GPU) is held to."""
    out = []
    for t in range(q.shape[1]):
        o, state = recurrent_gated_delta_rule(*(x[:, t : t + 1] for x in (q, k, v, g, beta)), state)
        out.append(o)
    return torch.cat(out, dim=1), state


def _fla_ops():  # None without fla or where its kernels are wrong; only asked for CUDA tensors
    return kernels.fla_module(FLA_MODULE, tilelang_fixes=True)


def gated_delta_rule(q, k, v, g, beta, state, chunk_size):
    if kernels.reference_only():  # within kernels.reference_paths(): the recurrence as written
        return sequential_gated_delta_rule(q, k, v, g, beta, state)
    # ---- GPU: fla's kernels take the same inputs (q, k already normalised, q scaled, so scale=1). ----
    if on_gpu(q) and (ops := _fla_ops()) is not None and (dtype := fla_dtype(q.device.type)) is not None:
        kernel = ops.fused_recurrent_gated_delta_rule if q.shape[1] == 1 else ops.chunk_gated_delta_rule
        q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
        return kernel(q=q, k=k, v=v, g=g, beta=beta, scale=1.0, initial_state=state, output_final_state=True)
    if q.shape[1] == 1:
        return recurrent_gated_delta_rule(q, k, v, g, beta, state)
    return chunk_gated_delta_rule(q, k, v, g, beta, state, chunk_size)


def on_gpu(x: torch.Tensor) -> bool:
    return x.is_cuda


def fla_dtype(device_type: str) -> torch.dtype | None:
    """The one dtype fla's kernels get q, k and v in: the autocast dtype the model runs under. fla asserts
    that q, k and v share a dtype and that it is not fp32, and under CUDA autocast l2norm's rsqrt returns
    fp32 q and k beside a bf16 v. None outside a 16-bit autocast: an fp32 forward (fp32 evaluation) runs
    rayb's chunked path, plain PyTorch, on the GPU as well."""
    if not torch.is_autocast_enabled(device_type):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    return None if dtype == torch.float32 else dtype


# ---- the model ----


class ShortConv(nn.Conv1d):
    """fla's ShortConvolution: depthwise causal conv over time (weight [D,1,W], no bias), then SiLU.
    Its state is the last W−1 inputs, so a continued sequence sees the same left context."""

    def __init__(self, dim: int, size: int):
        super().__init__(dim, dim, size, groups=dim, bias=False)

    def forward(self, x, state=None):  # x [B,T,D], state [B,D,W-1]
        x = x.transpose(1, 2)
        state = x.new_zeros(*x.shape[:2], self.kernel_size[0] - 1) if state is None else state
        x = torch.cat([state, x], dim=-1)
        y = F.silu(F.conv1d(x, self.weight, groups=self.groups))
        return y.transpose(1, 2), x[..., x.shape[-1] - state.shape[-1] :]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)  # fla's l2norm: eps inside the sqrt


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: GatedDeltaNetConfig):
        super().__init__()
        d, H, K, V = cfg.d_model, cfg.n_head, cfg.head_dim, cfg.value_dim
        self.H, self.K, self.V, self.chunk_size = H, K, V, cfg.chunk_size
        self.q_proj = nn.Linear(d, H * K, bias=False)
        self.k_proj = nn.Linear(d, H * K, bias=False)
        self.v_proj = nn.Linear(d, H * V, bias=False)
        self.a_proj = nn.Linear(d, H, bias=False)  # per-token decay rate
        self.b_proj = nn.Linear(d, H, bias=False)  # per-token write strength
        # Mamba-2's decay init: A ~ U[1, 16] (fla draws U(0, 16)); dt log-uniform in [1e-3, 0.1] stored
        # as softplus⁻¹(dt), as fla, so the initial decay exp(−A·dt) spans short and long memories.
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1, 16).log())
        dt = (torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).exp().clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.q_conv1d = ShortConv(H * K, cfg.conv_size)
        self.k_conv1d = ShortConv(H * K, cfg.conv_size)
        self.v_conv1d = ShortConv(H * V, cfg.conv_size)
        self.g_proj = nn.Linear(d, H * V, bias=False)  # output gate
        self.o_norm = nn.RMSNorm(V, eps=cfg.norm_eps)  # per head, then gated: fla's FusedRMSNormGated
        self.o_proj = nn.Linear(H * V, d, bias=False)

    def forward(self, x, state=None):
        B, T, _ = x.shape
        (conv_q, conv_k, conv_v), S = state if state is not None else ((None, None, None), None)
        q, conv_q = self.q_conv1d(self.q_proj(x), conv_q)
        k, conv_k = self.k_conv1d(self.k_proj(x), conv_k)
        v, conv_v = self.v_conv1d(self.v_proj(x), conv_v)
        # Unit-norm keys keep the delta rule's step (I − beta·k kᵀ) a contraction for beta in (0, 1).
        q = l2norm(q.view(B, T, self.H, self.K)) * self.K**-0.5
        k = l2norm(k.view(B, T, self.H, self.K))
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
        beta = self.b_proj(x).float().sigmoid()
        o, S = gated_delta_rule(q, k, v.view(B, T, self.H, self.V), g, beta, S, self.chunk_size)
        o = (self.o_norm(o) * F.silu(self.g_proj(x).float().view(B, T, self.H, self.V))).to(x.dtype)
        return self.o_proj(o.reshape(B, T, -1)), ((conv_q, conv_k, conv_v), S)


class Block(nn.Module):
    def __init__(self, cfg: GatedDeltaNetConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = GatedDeltaNet(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x, state=None):
        h, state = self.attn(self.attn_norm(x), state)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), state


class GatedDeltaNetLM(nn.Module):
    def __init__(self, cfg: GatedDeltaNetConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embeddings.weight

    def _init(self, m: nn.Module) -> None:
        init_normal(m, self.cfg.init_std)
        if isinstance(m, ShortConv):  # fla draws the conv taps from N(0, std) as well
            nn.init.normal_(m.weight, std=self.cfg.init_std)

    def forward(self, input_ids: torch.Tensor, state=None, return_state: bool = False) -> LMOutput:
        """`state` (a previous call's LMOutput.state, with return_state=True) continues a sequence."""
        x = self.embeddings(input_ids)
        states = []
        for i, layer in enumerate(self.layers):
            x, layer_state = layer(x, None if state is None else state[i])
            states.append(layer_state)
        return LMOutput(logits=self.lm_head(self.norm(x)), state=states if return_state else None)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head


def configure(config: dict, vocab_size: int, seq_len: int) -> GatedDeltaNetConfig:
    return GatedDeltaNetConfig(vocab_size=vocab_size, **config)


def kernel_flops(cfg: GatedDeltaNetConfig, seq_len: int) -> float:
    """Matmul FLOPs per token of chunk_gated_delta_rule (all heads of one layer). Per chunk of c tokens
    and head: k·kᵀ and q·kᵀ (2c²K), the unit-triangular solve for [u w] (c(c−1)/2·(K+V)), then against
    the carried state w·S, q·S, kᵀ·δ (3cKV) and attn·δ (c²V); padding to whole chunks counts as work."""
    K, V, T = cfg.head_dim, cfg.value_dim, seq_len
    if T == 1:  # one token takes the recurrent step: kᵀS and qᵀS (the rank-1 write is elementwise)
        return 2 * cfg.n_head * 2 * K * V
    c = min(cfg.chunk_size, T)
    macs_per_chunk = 2 * c * c * K + c * (c - 1) // 2 * (K + V) + 3 * c * K * V + c * c * V
    return 2 * cfg.n_head * macs_per_chunk * -(-T // c) / T


def cost(cfg: GatedDeltaNetConfig, seq_len: int) -> Cost:
    d, H, K, V, W, L = cfg.d_model, cfg.n_head, cfg.head_dim, cfg.value_dim, cfg.conv_size, cfg.n_layer
    projections = d * (2 * H * K + 2 * H * V + 2 * H) + H * V * d  # q k v g a b, o
    conv = W * (2 * H * K + H * V)  # depthwise taps
    mixer = projections + conv + 2 * H + V  # + A_log, dt_bias, o_norm weight
    mlp = 3 * d * cfg.d_ff
    layer_flops = 2 * (projections + conv + mlp) + kernel_flops(cfg, seq_len)
    return Cost(
        embedding_params=cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2),
        non_embedding_params=L * (mixer + mlp + 2 * d) + d,  # + two norms per block, the final norm
        forward_flops_per_token=L * layer_flops + 2 * d * cfg.vocab_size,
        state_size=L * (H * K * V + (W - 1) * (2 * H * K + H * V)),
    )


def shape(d_model: int, n_layer: int) -> dict:
    return {"d_model": d_model, "n_layer": n_layer, "head_dim": 64, "n_head": max(1, 3 * d_model // 256)}


register(
    Architecture(
        name="gated_deltanet",
        configure=configure,
        model=GatedDeltaNetLM,
        cost=cost,
        shape=shape,
        aspect=64.0,
        knobs=(InnerWidth("d_ff", swiglu_width),),
        description="Gated DeltaNet (fla parameterization); pure-PyTorch chunked on CPU, fla kernels on GPU",
        kernel_paths=kernels.fla(
            "delta rule", "chunk_gated_delta_rule", "rayb chunked delta rule", FLA_MODULE, tilelang_fixes=True
        ),
        reference="the sequential delta rule",
    )
)
