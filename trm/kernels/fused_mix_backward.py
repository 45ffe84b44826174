"""The fused MLP-t mix sublayer with a Triton backward: `train.kernels=fused_mix_bwd` (trm/kernel_choice.py).

`mix_sublayer_trainable` is trm.kernels.fused_mix's kernel (same forward numbers) that also keeps the residual sum its
norm normalized (one more write of h's size, no inner-width tensor), and whose backward is `mix_sublayer_grads`:

1. One Triton kernel per (batch row, channel block), in the flash-attention orientation (channels are the dots'
   M, so the gate/up gradient enters the input-gradient product from registers, as attention's probabilities do):
   the norm's backward from the saved sum and the output gradient (the tile holds the whole seq axis), then over
   the inner width in chunks (every block a TMA copy, the weights' pipelined): gate and up recomputed (K = seq), the down
   product's input gradient (K = seq), silu*mul's backward, the input gradient accumulated on chip (K = the
   chunk). It writes act = silu(gate) * up and the gate/up gradient in bf16 (rows: batch x hidden), and h and
   the output gradient transposed to the same rows, seq padded to a multiple of 8 (aligned GEMM operands).
2. The weight gradients, sums over all batch x hidden rows, as two bf16 GEMMs (cuBLAS on a GPU) of those.

The torch path's backward, the recompute one (trm.kernels.fused_mix.mix_sublayer_backward) and this one compute the same
chain rule with the same bf16 roundings (the saved sum is the forward's, bit for bit): the torch path's values to
bf16 rounding (tests/test_fused_mix_backward.py, through Triton's interpreter on a CPU).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from trm.kernels.fused_mix import (
    TensorDescriptor,
    _channels_first,
    _dot,
    _jit,
    _round_bf16,
    interpreting,
    launch_forward,
    padded_seq,
    tl,
    triton,
)

# Tile choices of the backward kernel (channels per program, inner-width chunk per loop step, warps), as
# trm.kernels.fused_mix.TILES: the autotuner times them on a GPU; the interpreter takes the first. Chunks divide the
# inner width (a multiple of 256); 16 channels per warp at least (the chained dots put every warp on the channel side).
# The loop holds the input-gradient accumulator [channels, SEQ_PAD] and three [channels, chunk] fp32 products. Compiled
# for sm_90 at the paper's sizes (bench/gpu/triton_sm90.py; the tests check it): every dot a wgmma, every copy a TMA copy.
BWD_TILES = ((64, 32, 4), (128, 32, 8), (128, 64, 8), (64, 64, 4))  # the interpreter's first, as TILES


@_jit
def _norm_grad(
    sum_desc, dy_desc, b, c0, eps, seq: tl.constexpr, ROUND_SUM: tl.constexpr, INTERPRET: tl.constexpr,
    SEQ_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """The gradient of rms_norm (over seq, axis 1 of the [channels, SEQ_PAD] tile) w.r.t. its input, the residual
    sum as the forward saved it, in fp32 rounded as to h's dtype; padded seq and channels: 0."""
    total = _channels_first(sum_desc, b, c0, SEQ_PAD, BLOCK_C)
    dy = _channels_first(dy_desc, b, c0, SEQ_PAD, BLOCK_C)
    inv = tl.rsqrt(tl.sum(total * total, axis=1) / seq + eps)
    y = total * inv[:, None]
    d_total = inv[:, None] * (dy - y * (tl.sum(dy * y, axis=1) / seq)[:, None])
    if ROUND_SUM:
        d_total = _round_bf16(d_total, INTERPRET)
    return d_total


@_jit
def _mix_grad_kernel(
    h_desc, sum_desc, dy_desc, wgu_desc, wd_desc, dx_desc, act_desc, dgu_desc, xt_desc, dout_desc, batch, hidden, eps,
    seq: tl.constexpr, inner: tl.constexpr, ROUND_SUM: tl.constexpr, INTERPRET: tl.constexpr, SEQ_PAD: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_I: tl.constexpr,
):  # fmt: skip
    """One program: batch row program_id(0), channels [program_id(1) * BLOCK_C, + BLOCK_C), the whole seq; tiles
    are [channels, seq] (h's layout read transposed). Every block moves by TMA copies on a GPU (trm.kernels.fused_mix's
    forward says which). ROUND_SUM: h is bf16 (its sum and gradients round to it). `batch` and `hidden` key the
    autotuner."""
    b, c0 = tl.program_id(0), tl.program_id(1) * BLOCK_C
    d_total = _norm_grad(sum_desc, dy_desc, b, c0, eps, seq, ROUND_SUM, INTERPRET, SEQ_PAD, BLOCK_C)
    d_out = _round_bf16(d_total, INTERPRET).to(tl.bfloat16)  # the down product's output gradient
    x = _channels_first(h_desc, b, c0, SEQ_PAD, BLOCK_C)
    if not ROUND_SUM:  # an fp32 stream: the dots take it rounded to bf16, as autocast does
        x = _round_bf16(x, INTERPRET)
    x = x.to(tl.bfloat16)
    # Rows (batch, channel) of x and d_out for the weight gradients' GEMMs; seq past its multiple of 8 not written.
    xt_desc.store([b, c0, 0], tl.reshape(x, (1, BLOCK_C, SEQ_PAD)))
    dout_desc.store([b, c0, 0], tl.reshape(d_out, (1, BLOCK_C, SEQ_PAD)))
    acc = tl.zeros((BLOCK_C, SEQ_PAD), dtype=tl.float32)
    for start in range(0, inner, BLOCK_I):
        w_gate = wgu_desc.load([start, 0])  # [chunk, SEQ_PAD], zero-padded
        w_up = wgu_desc.load([inner + start, 0])
        w_down = wd_desc.load([0, start])  # [SEQ_PAD, chunk]
        zeros = tl.zeros((BLOCK_C, BLOCK_I), dtype=tl.float32)
        gate = _round_bf16(_dot(x, tl.trans(w_gate), zeros, INTERPRET), INTERPRET)  # [channels, chunk]
        up = _round_bf16(_dot(x, tl.trans(w_up), zeros, INTERPRET), INTERPRET)
        d_act = _round_bf16(_dot(d_out, w_down, zeros, INTERPRET), INTERPRET)
        sig = tl.sigmoid(gate)
        silu = gate * sig
        act = _round_bf16(silu * up, INTERPRET).to(tl.bfloat16)
        d_gate = _round_bf16(d_act * up * (sig * (1 + gate * (1 - sig))), INTERPRET).to(tl.bfloat16)
        d_up = _round_bf16(d_act * silu, INTERPRET).to(tl.bfloat16)
        acc = _dot(d_gate, w_gate, acc, INTERPRET)  # [channels, SEQ_PAD]
        acc = _dot(d_up, w_up, acc, INTERPRET)
        act_desc.store([b, c0, start], tl.reshape(act, (1, BLOCK_C, BLOCK_I)))  # channels past hidden dropped
        dgu_desc.store([b, c0, start], tl.reshape(d_gate, (1, BLOCK_C, BLOCK_I)))
        dgu_desc.store([b, c0, inner + start], tl.reshape(d_up, (1, BLOCK_C, BLOCK_I)))
    if ROUND_SUM:  # the norm's gradient is bf16 already: d_out
        d_total = d_out.to(tl.float32)
    else:  # recomputed: holding it through the loop spilled registers
        d_total = _norm_grad(sum_desc, dy_desc, b, c0, eps, seq, ROUND_SUM, INTERPRET, SEQ_PAD, BLOCK_C)
    d_x = d_total + _round_bf16(acc, INTERPRET)
    if ROUND_SUM:
        d_x = _round_bf16(d_x, INTERPRET)
    dx_desc.store([b, 0, c0], tl.reshape(tl.trans(d_x), (1, SEQ_PAD, BLOCK_C)).to(dx_desc.dtype))


def _descriptor_blocks(nargs: dict[str, Any]) -> None:
    """The blocks the TMA descriptors copy: the weights' [chunk, SEQ_PAD] and [SEQ_PAD, chunk] rows of the tile's
    chunk, act's and the gate/up gradient's [1, channels, chunk], [1, SEQ_PAD, channels] of h, the sum and the
    gradients, [1, channels, SEQ_PAD] of the transposed rows."""
    nargs["wgu_desc"].block_shape = [nargs["BLOCK_I"], nargs["SEQ_PAD"]]
    nargs["wd_desc"].block_shape = [nargs["SEQ_PAD"], nargs["BLOCK_I"]]
    nargs["act_desc"].block_shape = nargs["dgu_desc"].block_shape = [1, nargs["BLOCK_C"], nargs["BLOCK_I"]]
    for name in ("h_desc", "sum_desc", "dy_desc", "dx_desc"):
        nargs[name].block_shape = [1, nargs["SEQ_PAD"], nargs["BLOCK_C"]]
    nargs["xt_desc"].block_shape = nargs["dout_desc"].block_shape = [1, nargs["BLOCK_C"], nargs["SEQ_PAD"]]


@functools.cache
def _tuned_grad_kernel() -> Any:
    """The backward kernel under Triton's autotuner over BWD_TILES, keyed on the shapes."""
    configs = [
        triton.Config({"BLOCK_C": c, "BLOCK_I": i}, num_warps=w, pre_hook=_descriptor_blocks) for c, i, w in BWD_TILES
    ]
    return triton.autotune(configs=configs, key=["batch", "hidden", "seq", "inner", "ROUND_SUM"])(_mix_grad_kernel)


def tuned_grad_tile() -> str | None:
    """The backward tile the autotuner chose (after a GPU call; None before one), for the bench's record."""
    best = getattr(_tuned_grad_kernel(), "best_config", None) if triton is not None and not interpreting() else None
    return None if best is None else str(best)


@torch.library.custom_op("trm::mix_sublayer_saving", mutates_args=())
def mix_sublayer_saving(h: Tensor, gate_up: Tensor, down: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """trm.kernels.fused_mix.mix_sublayer and the residual sum it normalized (h's shape and dtype), for the backward."""
    return launch_forward(h, gate_up, down, eps, save_sum=True)


@mix_sublayer_saving.register_fake
def _(h: Tensor, gate_up: Tensor, down: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(h), torch.empty_like(h)


@torch.library.custom_op("trm::mix_sublayer_grads", mutates_args=())
def mix_sublayer_grads(
    h: Tensor, total: Tensor, grad_y: Tensor, gate_up: Tensor, down: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of mix_sublayer w.r.t. h, gate_up and down, from h, the saved residual sum and the output's
    gradient (all [batch, seq, hidden])."""
    batch, seq, hidden = h.shape
    inner = down.shape[1]
    seq_pad, seq8 = padded_seq(seq), -(-seq // 8) * 8
    h, total, grad_y = h.contiguous(), total.contiguous(), grad_y.contiguous()
    gate_up_pad, down_pad = F.pad(gate_up, (0, seq_pad - seq)), F.pad(down, (0, 0, 0, seq_pad - seq))
    rows, bf16 = batch * hidden, torch.bfloat16
    d_h = torch.empty_like(h)
    act, d_gu = h.new_empty(rows, inner, dtype=bf16), h.new_empty(rows, 2 * inner, dtype=bf16)
    x_t, d_out_t = h.new_empty(rows, seq8, dtype=bf16), h.new_empty(rows, seq8, dtype=bf16)
    # Block shapes set per tile (_descriptor_blocks); seq8 rows of 2 bytes: the 16-byte alignment TMA needs.
    tensors = {
        "h_desc": h, "sum_desc": total, "dy_desc": grad_y, "wgu_desc": gate_up_pad, "wd_desc": down_pad, "dx_desc": d_h,
        "act_desc": act.view(batch, hidden, inner), "dgu_desc": d_gu.view(batch, hidden, 2 * inner),
        "xt_desc": x_t.view(batch, hidden, seq8), "dout_desc": d_out_t.view(batch, hidden, seq8),
    }  # fmt: skip
    descriptors = {name: TensorDescriptor.from_tensor(t, [1] * t.dim()) for name, t in tensors.items()}
    args = (*descriptors.values(), batch, hidden, eps)
    meta = {"seq": seq, "inner": inner, "ROUND_SUM": h.dtype != torch.float32, "SEQ_PAD": seq_pad}
    if interpreting():
        block_c, chunk, _ = BWD_TILES[0]
        grid = (batch, -(-hidden // block_c))
        _descriptor_blocks({**descriptors, "BLOCK_C": block_c, "BLOCK_I": chunk, "SEQ_PAD": seq_pad})
        _mix_grad_kernel[grid](*args, **meta, INTERPRET=True, BLOCK_C=block_c, BLOCK_I=chunk)
    else:
        _tuned_grad_kernel()[lambda m: (batch, -(-hidden // m["BLOCK_C"]))](*args, **meta, INTERPRET=False)
    d_gate_up = (d_gu.t() @ x_t)[:, :seq]  # sums over batch x hidden rows: bf16 GEMMs, fp32 accumulation
    d_down = (d_out_t.t() @ act)[:seq]
    return d_h, d_gate_up.contiguous(), d_down.contiguous()


@mix_sublayer_grads.register_fake
def _(
    h: Tensor, total: Tensor, grad_y: Tensor, gate_up: Tensor, down: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(h), torch.empty_like(gate_up), torch.empty_like(down)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    h, gate_up, down, eps = inputs
    ctx.save_for_backward(h, output[1], gate_up, down)
    ctx.mark_non_differentiable(output[1])
    ctx.eps = eps


def _backward(ctx: Any, grad_y: Tensor, _grad_total: Tensor | None) -> tuple[Tensor, Tensor, Tensor, None]:
    h, total, gate_up, down = ctx.saved_tensors
    return (*mix_sublayer_grads(h, total, grad_y, gate_up, down, ctx.eps), None)


mix_sublayer_saving.register_autograd(_backward, setup_context=_setup_context)


def mix_sublayer_trainable(h: Tensor, gate_up: Tensor, down: Tensor, eps: float) -> Tensor:
    """trm.kernels.fused_mix.mix_sublayer's value, differentiated by mix_sublayer_grads (the calls with gradients)."""
    return mix_sublayer_saving(h, gate_up, down, eps)[0]
