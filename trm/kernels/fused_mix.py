"""MLP-t's token-mixing sublayer as one Triton kernel: `train.kernels=fused_mix` (trm/kernel_choice.py chooses it).

The sublayer (trm.model.Block with mixer=mlp_t), for h of shape [batch, seq, hidden] and each channel c:

    y[:, c] = rms_norm(h[:, c] + down(silu(gate(h[:, c])) * up(h[:, c])))      (over the seq axis)

Through torch it runs as two transposes, two GEMMs whose inner width (2 x 512 for the paper's seq of 97) is ten
times the input's, a memory-bound silu*mul between them and an add+norm: the gate/up product goes to device
memory and back. Here one program owns one batch row and a block of channels, loops over the inner width in
chunks (gate and up chunk, silu*mul, accumulated into the down product, never leaving the chip) and finishes
with the residual add and the norm, reading h and writing y in h's own layout (no transposes in memory).

Numbers: the dots take bf16 operands with fp32 accumulation, as the bf16 precisions' autocast does; gate, up,
their silu*mul and the down output are rounded to bf16 where the torch path stores them in bf16, the residual
sum to h's dtype, the norm runs in fp32: the torch path's values to bf16 rounding (tests/test_fused_mix.py).
So it serves the bf16 precisions only; fp32 keeps the torch path.

Gradients: `mix_sublayer` is a torch custom op (torch.compile keeps it as one call) whose backward recomputes the
sublayer from its input in torch ops (`mix_sublayer_backward`, the explicit chain rule of the same bf16 roundings),
so nothing of the inner width is saved. `train.kernels=fused_mix_bwd` differentiates it with a Triton backward
instead (trm/kernels/fused_mix_backward.py), for which the kernel also writes the residual sum (SAVE_SUM). Under
Triton's interpreter (TRITON_INTERPRET=1) it runs on CPU tensors: the tests' way to check the kernel without a GPU.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# Tile choices (channels per program, inner-width chunk per loop step, warps, pipeline stages): on a GPU Triton's
# autotuner times them at the first call per shape and keeps the fastest; the interpreter takes the first. The inner
# width is a multiple of 256 (trm.model.SwiGLU), so every chunk divides it. 16 channels per warp at least: the chained
# dots put every warp on the channel side, and fewer rows than that would repeat products. Compiled for sm_90 at the
# paper's sizes, every dot is a wgmma, every copy a TMA copy within a block's shared memory, and no tile spills
# registers (bench/gpu/triton_sm90.py; the tests check it).
TILES = (
    (64, 64, 4, 3),  # first: the interpreter's (the smallest channel block: the tests' odd sizes at half the work)
    (128, 64, 8, 3),
    (128, 64, 8, 2),
    (128, 32, 8, 3),
    (64, 32, 4, 3),
)
MAX_CHUNK = max(chunk for _, chunk, _, _ in TILES)


try:  # the kernel's only dependency beyond torch; absent on some CPU-only installs (trm/kernel_choice.py refuses then)
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = TensorDescriptor = None

MAX_SEQ_PAD = 256  # a TMA copy's largest block side: the weights' blocks span SEQ_PAD (kernel_choice refuses longer)


def available() -> bool:
    """Whether Triton is importable."""
    return triton is not None


def interpreting() -> bool:
    """Whether Triton runs its interpreter (TRITON_INTERPRET=1 before the import): kernels then take CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _jit(fn: Any) -> Any:
    return fn if triton is None else triton.jit(fn)


@_jit
def _dot(a, b, acc, INTERPRET: tl.constexpr):
    """tl.dot(a, b, acc). Triton's interpreter multiplies bf16 operands as raw bits, so there they go in as fp32,
    which holds bf16 values and their products exactly: the same sums up to their order."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc)


@_jit
def _round_bf16(x, INTERPRET: tl.constexpr):
    """x (fp32) rounded to the nearest bf16, to even on ties, kept in fp32 (torch's rounding of a bf16 output).
    Triton's interpreter truncates on a bf16 cast, so there the rounding is done on the bits."""
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@_jit
def _channels_first(desc, b, c0, SEQ_PAD: tl.constexpr, BLOCK_C: tl.constexpr):
    """The [1, SEQ_PAD, BLOCK_C] block at (b, 0, c0) of a [batch, seq, hidden] descriptor as a [BLOCK_C, SEQ_PAD]
    fp32 tile; rows past seq and channels past hidden read as 0."""
    return tl.trans(tl.reshape(desc.load([b, 0, c0]), (SEQ_PAD, BLOCK_C))).to(tl.float32)


@_jit
def _mix_kernel(
    h_desc, wgu_desc, wd_desc, out_desc, sum_desc, batch, hidden, eps, seq: tl.constexpr, inner: tl.constexpr,
    ROUND_SUM: tl.constexpr, SAVE_SUM: tl.constexpr, INTERPRET: tl.constexpr, SEQ_PAD: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_I: tl.constexpr,
):  # fmt: skip
    """One program: batch row program_id(0), channels [program_id(1) * BLOCK_C, + BLOCK_C), the whole seq. Every
    block moves by TMA copies on a GPU: h, the output and the sum as [1, SEQ_PAD, BLOCK_C] blocks of [batch, seq,
    hidden] (rows past seq and channels past hidden read as 0 and are not written), the weights zero-padded to
    SEQ_PAD. The dots run channels first ([channels, seq] tiles), so their M side is the channel block: a chained
    dot spreads its warps over M only, and an M smaller than 16 rows per warp would repeat the same products.
    SAVE_SUM: the residual sum (the norm's input, in h's dtype) goes to sum_desc too, for the fused backward.
    `batch` and `hidden` (the descriptors know the extents) key the autotuner: they set the grid."""
    b, c0 = tl.program_id(0), tl.program_id(1) * BLOCK_C
    x = _channels_first(h_desc, b, c0, SEQ_PAD, BLOCK_C)  # [BLOCK_C, SEQ_PAD]
    if not ROUND_SUM:  # an fp32 stream, rounded to bf16 as autocast does (the interpreter's cast truncates)
        x = _round_bf16(x, INTERPRET)
    x = x.to(tl.bfloat16)
    acc = tl.zeros((BLOCK_C, SEQ_PAD), dtype=tl.float32)
    for start in range(0, inner, BLOCK_I):
        w_gate = wgu_desc.load([start, 0])  # [BLOCK_I, SEQ_PAD]
        w_up = wgu_desc.load([inner + start, 0])
        zeros = tl.zeros((BLOCK_C, BLOCK_I), dtype=tl.float32)
        gate = _round_bf16(_dot(x, tl.trans(w_gate), zeros, INTERPRET), INTERPRET)  # [BLOCK_C, BLOCK_I]
        up = _round_bf16(_dot(x, tl.trans(w_up), zeros, INTERPRET), INTERPRET)
        act = _round_bf16(gate * tl.sigmoid(gate) * up, INTERPRET).to(tl.bfloat16)
        acc = _dot(act, tl.trans(wd_desc.load([0, start])), acc, INTERPRET)  # [BLOCK_C, SEQ_PAD]; padded seq: 0
    h = tl.reshape(h_desc.load([b, 0, c0]), (SEQ_PAD, BLOCK_C)).to(tl.float32)  # again: not held through the loop
    total = h + _round_bf16(tl.trans(acc), INTERPRET)
    if ROUND_SUM:
        total = _round_bf16(total, INTERPRET)
    if SAVE_SUM:
        sum_desc.store([b, 0, c0], tl.reshape(total, (1, SEQ_PAD, BLOCK_C)).to(sum_desc.dtype))
    mean_square = tl.sum(total * total, axis=0) / seq  # padded rows are 0
    y = total * tl.rsqrt(mean_square + eps)[None, :]
    out_desc.store([b, 0, c0], tl.reshape(y, (1, SEQ_PAD, BLOCK_C)).to(out_desc.dtype))


def descriptor_blocks(nargs: dict[str, Any]) -> None:
    """The blocks the TMA descriptors copy for a tile: gate_up's [chunk, SEQ_PAD] rows, down's [SEQ_PAD, chunk]
    columns, and [1, SEQ_PAD, channels] of h, the output and the sum (the autotuner's pre_hook; the interpreter's
    launch calls it too)."""
    nargs["wgu_desc"].block_shape = [nargs["BLOCK_I"], nargs["SEQ_PAD"]]
    for name in ("h_desc", "out_desc", "sum_desc"):
        nargs[name].block_shape = [1, nargs["SEQ_PAD"], nargs["BLOCK_C"]]
    nargs["wd_desc"].block_shape = [nargs["SEQ_PAD"], nargs["BLOCK_I"]]


@functools.cache
def _tuned_kernel() -> Any:
    """The kernel under Triton's autotuner over TILES, keyed on the shapes (batch too: it sets the grid)."""
    configs = [
        triton.Config({"BLOCK_C": c, "BLOCK_I": i}, num_warps=w, num_stages=stages, pre_hook=descriptor_blocks)
        for c, i, w, stages in TILES
    ]
    key = ["batch", "hidden", "seq", "inner", "ROUND_SUM", "SAVE_SUM"]
    return triton.autotune(configs=configs, key=key)(_mix_kernel)


def tuned_tile() -> str | None:
    """The tile the autotuner chose (after a GPU call; None before one), for the bench's record."""
    best = getattr(_tuned_kernel(), "best_config", None) if available() and not interpreting() else None
    return None if best is None else str(best)


def _check(h: Tensor, gate_up: Tensor, down: Tensor) -> None:
    batch, seq, hidden = h.shape
    inner = down.shape[1]
    if gate_up.shape != (2 * inner, seq) or down.shape != (seq, inner) or inner % MAX_CHUNK:
        raise ValueError(
            f"fused_mix: h {tuple(h.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}: expected "
            f"gate_up [2*inner, seq], down [seq, inner], inner a multiple of {MAX_CHUNK}"
        )
    if gate_up.dtype != torch.bfloat16 or down.dtype != torch.bfloat16:
        raise ValueError(f"fused_mix: weights must be bf16 (got {gate_up.dtype}, {down.dtype})")
    if too_long(seq) or misaligned(hidden):
        raise ValueError(f"fused_mix: {too_long(seq) or misaligned(hidden)}")


def misaligned(hidden: int) -> str:
    """Why a width of `hidden` (arch.hidden_size) cannot go through the kernels' TMA copies ('' if it can)."""
    if hidden % 8 == 0:
        return ""
    return f"arch.hidden_size={hidden} is no multiple of 8 (a TMA copy's rows are 16-byte aligned)"


def too_long(seq: int) -> str:
    """Why a sequence of `seq` positions is too long for the kernels ('' if it is not)."""
    if padded_seq(seq) <= MAX_SEQ_PAD:
        return ""
    return f"the sequence ({seq} positions) pads to {padded_seq(seq)}, over {MAX_SEQ_PAD}: the kernels' TMA blocks"


def padded_seq(seq: int) -> int:
    """The kernels' SEQ_PAD: seq rounded up to a power of two, at least 16 (the dots' smallest K)."""
    return max(16, 1 << (seq - 1).bit_length())


def launch_forward(h: Tensor, gate_up: Tensor, down: Tensor, eps: float, save_sum: bool) -> tuple[Tensor, Tensor]:
    """The kernel's output and, with save_sum, the residual sum it normalized (else an empty tensor)."""
    _check(h, gate_up, down)
    batch, seq, hidden = h.shape
    seq_pad = padded_seq(seq)
    # Zero-padded to SEQ_PAD (aligned rows, loads without masks; the pad adds zeros to every dot): the weights only.
    h, gate_up, down = h.contiguous(), F.pad(gate_up, (0, seq_pad - seq)), F.pad(down, (0, 0, 0, seq_pad - seq))
    out = torch.empty_like(h)
    total = torch.empty_like(h) if save_sum else h.new_empty(0)
    # Block shapes set per tile (descriptor_blocks); without save_sum the sum's descriptor is the output's, unwritten.
    tensors = {
        "h_desc": h,
        "wgu_desc": gate_up,
        "wd_desc": down,
        "out_desc": out,
        "sum_desc": total if save_sum else out,
    }
    descriptors = {name: TensorDescriptor.from_tensor(t, [1] * t.dim()) for name, t in tensors.items()}
    args = (*descriptors.values(), batch, hidden, eps)
    meta = {"seq": seq, "inner": down.shape[1], "ROUND_SUM": h.dtype != torch.float32, "SAVE_SUM": save_sum}
    meta["SEQ_PAD"] = seq_pad
    if interpreting():
        block_c, chunk, _, _ = TILES[0]
        descriptor_blocks({**descriptors, "BLOCK_C": block_c, "BLOCK_I": chunk, "SEQ_PAD": seq_pad})
        _mix_kernel[(batch, -(-hidden // block_c))](*args, **meta, INTERPRET=True, BLOCK_C=block_c, BLOCK_I=chunk)
    else:
        _tuned_kernel()[lambda m: (batch, -(-hidden // m["BLOCK_C"]))](*args, **meta, INTERPRET=False)
    return out, total


@torch.library.custom_op("trm::mix_sublayer", mutates_args=())
def mix_sublayer(h: Tensor, gate_up: Tensor, down: Tensor, eps: float) -> Tensor:
    """rms_norm(h + mix(h)) over the seq axis of h [batch, seq, hidden]; gate_up [2*inner, seq] and down
    [seq, inner] are the mix SwiGLU's weights in bf16."""
    return launch_forward(h, gate_up, down, eps, save_sum=False)[0]


@mix_sublayer.register_fake
def _(h: Tensor, gate_up: Tensor, down: Tensor, eps: float) -> Tensor:
    return torch.empty_like(h)


def mix_sublayer_backward(
    h: Tensor, gate_up: Tensor, down: Tensor, eps: float, grad_y: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of mix_sublayer w.r.t. h, gate_up and down: the sublayer recomputed from h in torch ops with the
    kernel's roundings, then the chain rule written out (what autograd of the torch path computes)."""
    x = h.transpose(1, 2)  # [batch, hidden, seq]: channels first, as the torch path mixes
    xb = x.to(torch.bfloat16)
    gate, up = (xb @ gate_up.t()).float().chunk(2, dim=-1)
    sig = torch.sigmoid(gate)
    silu = gate * sig
    act = (silu * up).to(torch.bfloat16)
    total = x.float() + (act @ down.t()).float()
    if h.dtype != torch.float32:
        total = total.to(h.dtype).float()
    inv = torch.rsqrt(total.square().mean(-1, keepdim=True) + eps)
    y = total * inv
    dy = grad_y.transpose(1, 2).float()
    d_total = (inv * (dy - y * (dy * y).mean(-1, keepdim=True))).to(h.dtype)
    d_out = d_total.to(torch.bfloat16)
    d_down = d_out.flatten(0, 1).t() @ act.flatten(0, 1)
    d_act = (d_out @ down).float()
    d_gate = d_act * up * (sig * (1 + gate * (1 - sig)))
    d_gu = torch.cat([d_gate, d_act * silu], dim=-1).to(torch.bfloat16)
    d_gate_up = d_gu.flatten(0, 1).t() @ xb.flatten(0, 1)
    d_x = d_total.float() + (d_gu @ gate_up).float()
    return d_x.to(h.dtype).transpose(1, 2), d_gate_up, d_down


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    h, gate_up, down, eps = inputs
    ctx.save_for_backward(h, gate_up, down)
    ctx.eps = eps


def _backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
    h, gate_up, down = ctx.saved_tensors
    return (*mix_sublayer_backward(h, gate_up, down, ctx.eps, grad_y), None)


mix_sublayer.register_autograd(_backward, setup_context=_setup_context)
