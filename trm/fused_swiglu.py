"""The channel SwiGLU (trm.model.Block's `mlp`) with its silu*mul inside the GEMMs: `train.kernels=fused_mix_swiglu`.

For x of shape [tokens, dim] (every batch row and position), the sublayer is

    y = down(silu(gate(x)) * up(x))

Through torch it runs as the gate/up GEMM (its [tokens, 2 x inner] output goes to device memory), a memory-bound
kernel reading it back for silu*mul, and the down GEMM; its backward as the down product's input-gradient GEMM,
another memory-bound kernel (silu*mul's backward) and three GEMMs. On a GPU those two memory-bound kernels were
the largest after the token-mixing sublayer's (docs/benchmarks.md, "A GPU"). Here:

- forward: one Triton GEMM computes a tile of gate and the matching tile of up from the same loads of x, and
  writes only silu(gate) * up (`act`, half the width), and, in the calls with gradients, gate and up too (what the
  backward needs, as autograd of the torch path saves them); cuBLAS then computes the down product.
- backward: one Triton GEMM computes the down product's input gradient (`d_act`) a tile at a time, reads the saved
  gate and up of the same tile, and writes the gate/up gradient and act (the down weight's gradient needs it): no
  [tokens, inner] gradient goes to memory. cuBLAS computes the input and weight gradients.

No library provides a GEMM with this two-accumulator epilogue for torch (liger-kernel's SwiGLU fuses only the
elementwise part; xformers' fused SwiGLU is a compiled extension tied to its torch build), hence Triton here.

Numbers: the dots take bf16 operands with fp32 accumulation, as autocast's; gate, up, act and d_act are rounded to
bf16 where the torch path stores them in bf16: the torch path's values to bf16 rounding
(tests/test_fused_swiglu.py, through Triton's interpreter on a CPU). So it serves the bf16 precisions only.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from trm.fused_mix import TensorDescriptor, _dot, _jit, _round_bf16, interpreting, misaligned, tl, triton

# Tile choices (tokens per program, inner columns per program, K step, warps, pipeline stages) of each kernel:
# Triton's autotuner times them at the first call per shape on a GPU; the interpreter takes the first. The inner
# width is a multiple of 256 (trm.model.SwiGLU), so every column block divides it. Compiled for sm_90 at the paper's
# sizes, none spills registers and every dot is a wgmma fed by TMA copies (bench/triton_sm90.py; the tests check it).
FWD_TILES = ((64, 64, 64, 4, 3), (128, 64, 64, 8, 4), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4))
BWD_TILES = ((64, 64, 64, 4, 3), (64, 64, 64, 4, 4), (128, 64, 64, 8, 3), (128, 64, 64, 8, 4), (64, 128, 64, 8, 3))
TILES = {"forward": FWD_TILES, "backward": BWD_TILES}
MAX_BLOCK_N = max(n for tiles in TILES.values() for _, n, _, _, _ in tiles)


@_jit
def _swiglu_kernel(
    x_desc, w_desc, act_desc, gu_desc, tokens, dim: tl.constexpr, inner: tl.constexpr, ROUND_X: tl.constexpr,
    SAVE_GU: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program: inner columns [program_id(0) * BLOCK_N, + BLOCK_N) of tokens [program_id(1) * BLOCK_M, ...).
    Column blocks vary fastest, so programs running together share their rows of x (read once from memory). Every
    block moves by TMA copies on a GPU (rows past the tokens and K past dim read as 0, and are not written).
    ROUND_X: x is fp32 (rounded to bf16 as autocast does); SAVE_GU: gate and up go to gu [tokens, 2 x inner].
    `tokens` (the descriptors know the extent) keys the autotuner: the best tile depends on it."""
    n0 = tl.program_id(0) * BLOCK_N
    m0 = tl.program_id(1) * BLOCK_M
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, dim, BLOCK_K):
        x = x_desc.load([m0, k0])  # [M, K]
        if ROUND_X:
            x = _round_bf16(x, INTERPRET)
        x = x.to(tl.bfloat16)
        acc_gate = _dot(x, tl.trans(w_desc.load([n0, k0])), acc_gate, INTERPRET)  # weights' rows: [N, K]
        acc_up = _dot(x, tl.trans(w_desc.load([inner + n0, k0])), acc_up, INTERPRET)
    gate = _round_bf16(acc_gate, INTERPRET)
    up = _round_bf16(acc_up, INTERPRET)
    act_desc.store([m0, n0], _round_bf16(gate * tl.sigmoid(gate) * up, INTERPRET).to(tl.bfloat16))
    if SAVE_GU:
        gu_desc.store([m0, n0], gate.to(tl.bfloat16))
        gu_desc.store([m0, inner + n0], up.to(tl.bfloat16))


@_jit
def _swiglu_grad_kernel(
    dy_desc, wd_desc, gu_desc, dgu_desc, act_desc, tokens, dim: tl.constexpr, inner: tl.constexpr,
    INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program, the forward's tile: d_act = dy @ down (K = dim) for inner columns [program_id(0) * BLOCK_N, ...)
    of tokens [program_id(1) * BLOCK_M, ...), then silu*mul's backward from the saved gate and up: the gate/up
    gradient to dgu [tokens, 2 x inner] and act (recomputed) to act [tokens, inner], all bf16."""
    n0 = tl.program_id(0) * BLOCK_N
    m0 = tl.program_id(1) * BLOCK_M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, dim, BLOCK_K):
        acc = _dot(dy_desc.load([m0, k0]), wd_desc.load([k0, n0]), acc, INTERPRET)  # [M, K] @ [K, N]
    d_act = _round_bf16(acc, INTERPRET)
    gate = gu_desc.load([m0, n0]).to(tl.float32)
    up = gu_desc.load([m0, inner + n0]).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    dgu_desc.store([m0, n0], _round_bf16(d_act * up * (sig * (1 + gate * (1 - sig))), INTERPRET).to(tl.bfloat16))
    dgu_desc.store([m0, inner + n0], _round_bf16(d_act * silu, INTERPRET).to(tl.bfloat16))
    act_desc.store([m0, n0], _round_bf16(silu * up, INTERPRET).to(tl.bfloat16))


KERNELS = {"forward": _swiglu_kernel, "backward": _swiglu_grad_kernel}
# The descriptors of each kernel, in argument order: the block each copies, from the tile's sizes.
DESCRIPTOR_BLOCKS = {
    "forward": {"x_desc": "MK", "w_desc": "NK", "act_desc": "MN", "gu_desc": "MN"},
    "backward": {"dy_desc": "MK", "wd_desc": "KN", "gu_desc": "MN", "dgu_desc": "MN", "act_desc": "MN"},
}


def _descriptor_blocks(nargs: dict[str, Any]) -> None:
    """Set each descriptor's block shape to the tile's (the autotuner's pre_hook, and the interpreter's launch)."""
    size = {"M": nargs["BLOCK_M"], "N": nargs["BLOCK_N"], "K": nargs["BLOCK_K"]}
    for name, sides in DESCRIPTOR_BLOCKS["forward" if "x_desc" in nargs else "backward"].items():
        nargs[name].block_shape = [size[side] for side in sides]


@functools.cache
def _tuned(kernel_name: str) -> Any:
    """One of the two kernels under Triton's autotuner over its TILES, keyed on the shapes."""
    kernel = KERNELS[kernel_name]
    configs = [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s, pre_hook=_descriptor_blocks
        )
        for bm, bn, bk, w, s in TILES[kernel_name]
    ]
    key = ["tokens", "dim", "inner"] + (["ROUND_X", "SAVE_GU"] if kernel_name == "forward" else [])
    return triton.autotune(configs=configs, key=key)(kernel)


def tuned_tiles() -> dict[str, str | None]:
    """The tiles the autotuner chose (after a GPU call; None before one), for the bench's record."""
    if triton is None or interpreting():
        return {"forward": None, "backward": None}
    best = {name: getattr(_tuned(name), "best_config", None) for name in ("forward", "backward")}
    return {name: None if config is None else str(config) for name, config in best.items()}


def _launch(kernel_name: str, tensors: tuple[Tensor, ...], tokens: int, **meta: Any) -> None:
    """One of the kernels over the (inner column block, token block) grid, its tensors as TMA descriptors (block
    shapes set per tile); `meta` holds dim and inner."""
    descriptors = [TensorDescriptor.from_tensor(t, [1] * t.dim()) for t in tensors]
    inner = meta["inner"]
    if interpreting():
        bm, bn, bk, _, _ = TILES[kernel_name][0]
        tile = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        _descriptor_blocks({**dict(zip(DESCRIPTOR_BLOCKS[kernel_name], descriptors)), **tile})
        KERNELS[kernel_name][(inner // bn, -(-tokens // bm))](*descriptors, tokens, **meta, INTERPRET=True, **tile)
    else:
        grid = lambda m: (inner // m["BLOCK_N"], -(-tokens // m["BLOCK_M"]))  # noqa: E731 - the autotuner's grid
        _tuned(kernel_name)[grid](*descriptors, tokens, **meta, INTERPRET=False)


def _check(x: Tensor, gate_up: Tensor, down: Tensor) -> None:
    dim, inner = x.shape[-1], down.shape[1]
    if gate_up.shape != (2 * inner, dim) or down.shape != (dim, inner) or inner % MAX_BLOCK_N:
        raise ValueError(
            f"fused_swiglu: x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}: expected "
            f"gate_up [2*inner, dim], down [dim, inner], inner a multiple of {MAX_BLOCK_N}"
        )
    if misaligned(dim):
        raise ValueError(f"fused_swiglu: {misaligned(dim)}")
    if gate_up.dtype != torch.bfloat16 or down.dtype != torch.bfloat16:
        raise ValueError(f"fused_swiglu: weights must be bf16 (got {gate_up.dtype}, {down.dtype})")


def launch_forward(x: Tensor, gate_up: Tensor, down: Tensor, save_gu: bool) -> tuple[Tensor, Tensor]:
    """y (bf16, x's shape) and, with save_gu, gate and up side by side ([tokens, 2 x inner] bf16; else empty)."""
    _check(x, gate_up, down)
    dim, inner = x.shape[-1], down.shape[1]
    flat = x.reshape(-1, dim).contiguous()
    tokens = flat.shape[0]
    act = flat.new_empty(tokens, inner, dtype=torch.bfloat16)
    gu = flat.new_empty(tokens, 2 * inner, dtype=torch.bfloat16) if save_gu else act.new_empty(0)
    tensors = (flat, gate_up.contiguous(), act, gu if save_gu else act)
    _launch("forward", tensors, tokens, dim=dim, inner=inner, ROUND_X=x.dtype != torch.bfloat16, SAVE_GU=save_gu)
    return (act @ down.t()).view(*x.shape[:-1], dim), gu


@torch.library.custom_op("trm::swiglu", mutates_args=())
def swiglu(x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """down(silu(gate(x)) * up(x)) for x [..., dim] with the SwiGLU's bf16 weights gate_up [2*inner, dim] and down
    [dim, inner]: bf16, as autocast's Linear returns. The calls without gradients."""
    return launch_forward(x, gate_up, down, save_gu=False)[0]


@swiglu.register_fake
def _(x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    return x.new_empty(x.shape, dtype=torch.bfloat16)


@torch.library.custom_op("trm::swiglu_saving", mutates_args=())
def swiglu_saving(x: Tensor, gate_up: Tensor, down: Tensor) -> tuple[Tensor, Tensor]:
    """swiglu's value and the gate/up product it computed ([tokens, 2 x inner] bf16), for the backward."""
    return launch_forward(x, gate_up, down, save_gu=True)


@swiglu_saving.register_fake
def _(x: Tensor, gate_up: Tensor, down: Tensor) -> tuple[Tensor, Tensor]:
    tokens = x.numel() // x.shape[-1]
    return x.new_empty(x.shape, dtype=torch.bfloat16), x.new_empty(tokens, gate_up.shape[0], dtype=torch.bfloat16)


@torch.library.custom_op("trm::swiglu_grads", mutates_args=())
def swiglu_grads(x: Tensor, gu: Tensor, grad_y: Tensor, gate_up: Tensor, down: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of swiglu w.r.t. x (in x's dtype), gate_up and down (bf16), from x, the saved gate/up product and
    the output's gradient."""
    dim, inner = x.shape[-1], down.shape[1]
    xb = x.reshape(-1, dim).to(torch.bfloat16)
    dy = grad_y.reshape(-1, dim).to(torch.bfloat16).contiguous()
    tokens = xb.shape[0]
    d_gu = dy.new_empty(tokens, 2 * inner)
    act = dy.new_empty(tokens, inner)
    _launch("backward", (dy, down.contiguous(), gu, d_gu, act), tokens, dim=dim, inner=inner)
    d_x = (d_gu @ gate_up).to(x.dtype).view(x.shape)  # bf16 GEMMs, fp32 accumulation (cuBLAS on a GPU)
    return d_x, d_gu.t() @ xb, dy.t() @ act


@swiglu_grads.register_fake
def _(x: Tensor, gu: Tensor, grad_y: Tensor, gate_up: Tensor, down: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(gate_up), torch.empty_like(down)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    x, gate_up, down = inputs
    ctx.save_for_backward(x, output[1], gate_up, down)
    ctx.mark_non_differentiable(output[1])


def _backward(ctx: Any, grad_y: Tensor, _grad_gu: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    x, gu, gate_up, down = ctx.saved_tensors
    return swiglu_grads(x, gu, grad_y, gate_up, down)


swiglu_saving.register_autograd(_backward, setup_context=_setup_context)


def swiglu_trainable(x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """swiglu's value, differentiated by swiglu_grads (the calls with gradients)."""
    return swiglu_saving(x, gate_up, down)[0]
