"""Tiny Recursive Model (TRM) for puzzles, with the ACT (adaptive computation time) wrapper.

One small network `net` is applied recursively. Per supervision step, with x the embedded puzzle, y the
current answer embedding and z the latent reasoning state:

    repeat H_cycles times (all but the last without gradients):
        repeat L_cycles times:  z = net(z, injection = y + x)
        y = net(y, injection = z)

The answer is read from y (lm_head) and a Q-halt logit from y's first position (q_head). The ACT
wrapper keeps a *carry* (y, z, step counters and the puzzle each batch slot is working on) across
batches: a slot that halted takes a fresh example from the next batch, the others keep thinking.

Shapes are static: the recursion depths are Python ints that change only at curriculum stages, and the
exploration probability is a tensor, so an XLA step compiles once per stage.

The network and its ACT wrapper follow the order of the reference implementation they are checked against
(tests/test_fidelity.py, docs/fidelity.md).
"""

from __future__ import annotations

import math
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trm.kernels.fused_mix import mix_sublayer
from trm.kernels.fused_mix_backward import mix_sublayer_trainable
from trm.kernels.fused_swiglu import swiglu, swiglu_trainable
from trm.model_config import TRMConfig

__all__ = ["ACTModel", "Carry", "TRMConfig", "TinyRecursiveModel", "count_params", "trunc_normal_init_"]


# Std of a standard normal truncated to [-2, 2]: 0.8796. torch's trunc_normal_(std=s) draws from N(0, s^2) cut at
# +-2s, so its samples have std 0.88 s; the TRM reference (JAX-style) means the samples' real std.
_TRUNCATED_STD = math.sqrt(1 - 4 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(2 / math.sqrt(2)))


def trunc_normal_init_(tensor: Tensor, std: float) -> Tensor:
    """Truncated normal whose samples have standard deviation `std` (JAX-style, as the TRM reference inits).

    Drawn by torch's sampler from N(0, c^2) cut at +-2c with c = std / 0.8796, so the real std is `std`
    (tests/test_fidelity.py checks both against the reference's recorded init)."""
    corrected = std / _TRUNCATED_STD
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, std=corrected, a=-2 * corrected, b=2 * corrected)


def rms_norm(x: Tensor, eps: float) -> Tensor:
    """RMSNorm without a learned scale, computed in float32 (TRM uses post-norm without scale)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)).to(x.dtype)


class CastedLinear(nn.Linear):
    """A linear layer that computes in its input's dtype, its weights cast to it, as the reference's layers do.

    In a bf16 stream (bf16_reference) that is a bf16 GEMM on explicitly cast weights: bitwise the reference's on
    any CPU (autocast's own cast of an fp32 weight takes another oneDNN path on some ISAs, which rounds
    differently). In fp32, and under `bf16` (an fp32 stream that autocast casts), the cast is a no-op."""

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


def init_linear(in_features: int, out_features: int, bias: bool = False) -> nn.Linear:
    """A CastedLinear with the reference's init: truncated normal of std 1/sqrt(fan-in), zero bias."""
    layer = CastedLinear(in_features, out_features, bias=bias)
    trunc_normal_init_(layer.weight, std=1.0 / math.sqrt(in_features))
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


class SwiGLU(nn.Module):
    """Gated MLP; the inner width is 2/3 * expansion * dim rounded up to a multiple of 256."""

    def __init__(self, dim: int, expansion: float):
        super().__init__()
        inner = -(-round(expansion * dim * 2 / 3) // 256) * 256
        self.gate_up = init_linear(dim, 2 * inner)
        self.down = init_linear(inner, dim)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Rotary(nn.Module):
    """Precomputed RoPE tables for the whole (prefix + puzzle) sequence."""

    cos: Tensor  # buffers (register_buffer), declared for the type checker
    sin: Tensor

    def __init__(self, head_dim: int, length: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, heads, L, head_dim]
        x32 = x.float()  # rotated in fp32 whatever the activations' dtype, as the reference does
        first, second = x32.chunk(2, dim=-1)
        rotated = torch.cat([-second, first], dim=-1)
        return (x32 * self.cos + rotated * self.sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: TRMConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.qkv = init_linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.out = init_linear(cfg.hidden_size, cfg.hidden_size)
        self.rotary = Rotary(self.head_dim, cfg.total_len, cfg.rope_theta) if cfg.pos_encodings == "rope" else None

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q, k, v)  # non-causal: every cell sees the whole grid
        return self.out(y.transpose(1, 2).reshape(batch, length, -1))


class Block(nn.Module):
    """Post-norm block: token mixing (attention or an MLP across positions), then a SwiGLU."""

    def __init__(self, cfg: TRMConfig):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.mlp_t = cfg.mixer == "mlp_t"
        self.mix = SwiGLU(cfg.total_len, cfg.expansion) if self.mlp_t else Attention(cfg)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.expansion)
        # off | nograd | all | all_bwd: where the mix runs as one kernel, all_bwd with the Triton backward
        self.fused_mix = "off"  # (trm/kernel_choice.py sets both)
        self.fused_swiglu = False  # the channel SwiGLU's silu*mul inside its GEMMs (trm/kernels/fused_swiglu.py)

    def forward(self, h: Tensor) -> Tensor:
        h = self.mix_sublayer(h)
        return rms_norm(h + self.channel_mlp(h), self.eps)

    def channel_mlp(self, h: Tensor) -> Tensor:
        """The channel SwiGLU; with `fused_swiglu`, its Triton GEMMs (the same values to bf16 rounding)."""
        if not self.fused_swiglu:
            return self.mlp(h)
        fused = swiglu_trainable if torch.is_grad_enabled() else swiglu
        bf16 = torch.bfloat16
        return fused(h, self.mlp.gate_up.weight.to(bf16), self.mlp.down.weight.to(bf16))

    def mix_sublayer(self, h: Tensor) -> Tensor:
        """Token mixing, its residual and norm; `fused_mix` says where mlp_t's runs as one Triton kernel."""
        if not self.mlp_t:
            return rms_norm(h + self.mix(h), self.eps)
        grad = torch.is_grad_enabled()
        if self.fused_mix in ("all", "all_bwd") or (self.fused_mix == "nograd" and not grad):
            mix, bf16 = cast(SwiGLU, self.mix), torch.bfloat16  # the lines below as one kernel (kernels/fused_mix.py)
            fused = mix_sublayer_trainable if self.fused_mix == "all_bwd" and grad else mix_sublayer
            return fused(h, mix.gate_up.weight.to(bf16), mix.down.weight.to(bf16), self.eps)
        # Mix and normalize while transposed ([B, hidden, seq]): the residual's RMSNorm runs over the *sequence*
        # axis for each channel, as in the reference; normalizing over hidden after transposing back is another
        # network (gradients 10^6x larger, docs/fidelity.md).
        channels_first = h.transpose(1, 2)
        return rms_norm(channels_first + self.mix(channels_first), self.eps).transpose(1, 2)


class RecursiveNet(nn.Module):
    """The one tiny network TRM reuses for both the latent (z) and the answer (y) update."""

    def __init__(self, cfg: TRMConfig):
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.L_layers))

    def forward(self, state: Tensor, injection: Tensor) -> Tensor:
        h = state + injection
        for block in self.blocks:
            h = block(h)
        return h


class TinyRecursiveModel(nn.Module):
    """One supervision step of TRM: embed, recurse, read out the answer and the Q-halt logit."""

    y_init: Tensor  # buffers (register_buffer), declared for the type checker
    z_init: Tensor

    def __init__(self, cfg: TRMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_scale = math.sqrt(cfg.hidden_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        trunc_normal_init_(self.embed_tokens.weight, std=1.0 / self.embed_scale)
        # Puzzle embedding: trained by SignSGD (trm.optim), zero at start, as in the reference; none for width 0.
        self.puzzle_emb = nn.Embedding(cfg.num_puzzle_identifiers, cfg.emb_ndim) if cfg.emb_ndim else None
        if self.puzzle_emb is not None:
            nn.init.zeros_(self.puzzle_emb.weight)
        self.pos_emb = None
        if cfg.pos_encodings == "learned":
            self.pos_emb = nn.Parameter(
                trunc_normal_init_(torch.empty(cfg.total_len, cfg.hidden_size), 1.0 / self.embed_scale)
            )
        self.net = RecursiveNet(cfg)
        self.lm_head = init_linear(cfg.hidden_size, cfg.vocab_size)
        # Two outputs (halt, continue) as in the reference; only the halt logit is used (no ACT-continue).
        self.q_head = init_linear(cfg.hidden_size, 2, bias=True)
        with torch.no_grad():
            self.q_head.weight.zero_()
            self.q_head.bias.fill_(-5.0)  # start by never halting early
        self.register_buffer("y_init", trunc_normal_init_(torch.empty(cfg.hidden_size), 1.0))
        self.register_buffer("z_init", trunc_normal_init_(torch.empty(cfg.hidden_size), 1.0))

    def embed(self, inputs: Tensor, puzzle_identifiers: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """The input sequence in `dtype`. Each table is cast to `dtype` before the sum and the scale, as the
        reference does in its forward_dtype: under bf16_reference (a bf16 carry) the rounding is the reference's
        bit for bit; summing in fp32 and rounding once differs by one bf16 step in ~20% of entries."""
        cfg = self.cfg
        x = tokens = self.embed_tokens(inputs).to(dtype)
        if self.puzzle_emb is not None:
            prefix = self.puzzle_emb(puzzle_identifiers).to(dtype)
            prefix = F.pad(prefix, (0, cfg.puzzle_emb_len * cfg.hidden_size - cfg.emb_ndim))
            x = torch.cat([prefix.view(-1, cfg.puzzle_emb_len, cfg.hidden_size), tokens], dim=1)
        if self.pos_emb is not None:
            x = 0.707106781 * (x + self.pos_emb.to(dtype))  # keep the variance of a sum of two
        return self.embed_scale * x

    def latent_recursion(self, x: Tensor, y: Tensor, z: Tensor, l_cycles: int) -> tuple[Tensor, Tensor]:
        for _ in range(l_cycles):
            z = self.net(z, y + x)
        y = self.net(y, z)
        return y, z

    def forward(
        self, y: Tensor, z: Tensor, inputs: Tensor, puzzle_identifiers: Tensor, h_cycles: int, l_cycles: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        x = self.embed(inputs, puzzle_identifiers, y.dtype)  # a bf16 carry means a bf16 residual stream
        with torch.no_grad():
            for _ in range(h_cycles - 1):
                y, z = self.latent_recursion(x, y, z, l_cycles)
        y, z = self.latent_recursion(x, y, z, l_cycles)  # the only cycle that carries gradients
        logits = self.lm_head(y)[:, self.cfg.puzzle_emb_len :]
        q_halt = self.q_head(y[:, 0]).float()[:, 0]
        return y.detach(), z.detach(), logits, q_halt


class Carry(NamedTuple):
    """What persists across batches for each batch slot."""

    y: Tensor  # [B, total_len, hidden] answer state
    z: Tensor  # [B, total_len, hidden] latent state
    steps: Tensor  # [B] supervision steps taken on the current puzzle
    halted: Tensor  # [B] bool: take a fresh example next time
    inputs: Tensor  # [B, seq_len] the puzzle this slot works on
    labels: Tensor  # [B, seq_len]
    puzzle_identifiers: Tensor  # [B]


class ACTModel(nn.Module):
    """TRM with adaptive halting: deep supervision over a carry that outlives the batch."""

    def __init__(self, cfg: TRMConfig):
        super().__init__()
        self.cfg = cfg
        self.inner = TinyRecursiveModel(cfg)

    def initial_carry(self, batch: dict[str, Tensor], state_dtype: torch.dtype = torch.float32) -> Carry:
        size = batch["inputs"].shape[0]
        device = batch["inputs"].device
        state = torch.zeros(size, self.cfg.total_len, self.cfg.hidden_size, dtype=state_dtype, device=device)
        return Carry(
            y=state,
            z=state.clone(),
            steps=torch.zeros(size, dtype=torch.int32, device=device),
            halted=torch.ones(size, dtype=torch.bool, device=device),  # every slot loads on the first step
            inputs=torch.zeros_like(batch["inputs"]),
            labels=torch.zeros_like(batch["labels"]),
            puzzle_identifiers=torch.zeros_like(batch["puzzle_identifiers"]),
        )

    def forward(
        self,
        carry: Carry,
        batch: dict[str, Tensor],
        exploration_prob: Tensor | float = 0.0,
        h_cycles: int | None = None,
        l_cycles: int | None = None,
    ) -> tuple[Carry, Tensor, Tensor]:
        cfg = self.cfg
        fresh = carry.halted
        y = torch.where(fresh[:, None, None], self.inner.y_init.to(carry.y.dtype), carry.y)
        z = torch.where(fresh[:, None, None], self.inner.z_init.to(carry.z.dtype), carry.z)
        steps = torch.where(fresh, 0, carry.steps)
        inputs = torch.where(fresh[:, None], batch["inputs"], carry.inputs)
        labels = torch.where(fresh[:, None], batch["labels"], carry.labels)
        puzzle_ids = torch.where(fresh, batch["puzzle_identifiers"], carry.puzzle_identifiers)

        new_y, new_z, logits, q_halt = self.inner(
            y, z, inputs, puzzle_ids, h_cycles or cfg.H_cycles, l_cycles or cfg.L_cycles
        )

        with torch.no_grad():
            steps = steps + 1
            halted = steps >= cfg.halt_max_steps
            if self.training and cfg.halt_max_steps > 1:
                halted = halted | (q_halt > 0)
                # Exploration: with probability p, force a random minimum number of steps in [2, max].
                explore = torch.rand_like(q_halt) < exploration_prob
                min_steps = explore * torch.randint_like(steps, low=2, high=cfg.halt_max_steps + 1)
                halted = halted & (steps >= min_steps)

        new_carry = Carry(new_y.to(carry.y.dtype), new_z.to(carry.z.dtype), steps, halted, inputs, labels, puzzle_ids)
        return new_carry, logits, q_halt


def count_params(model: nn.Module) -> dict[str, int]:
    """Trainable parameters, with the SignSGD-trained puzzle embedding counted apart (as the paper does)."""
    emb = sum(p.numel() for n, p in model.named_parameters() if "puzzle_emb" in n)
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"params": total - emb, "puzzle_emb_params": emb}
