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

from trm.fused_mix import _dot, _jit, _round_bf16, interpreting, tl, triton

# Tile choices (tokens per program, inner columns per program, K step, warps, pipeline stages): Triton's
# autotuner times them at the first call per shape on a GPU; the interpreter takes the first. The inner width is a
# multiple of 256 (trm.model.SwiGLU), so every column block divides it; the tokens and dim are masked.
TILES = ((64, 64, 64, 4, 3), (128, 64, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 64, 32, 4, 4))
MAX_BLOCK_N = max(n for _, n, _, _, _ in TILES)


@_jit
def _swiglu_kernel(
    x_ptr, w_ptr, act_ptr, gu_ptr, tokens, dim: tl.constexpr, inner: tl.constexpr, ROUND_X: tl.constexpr,
    SAVE_GU: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program: inner columns [program_id(0) * BLOCK_N, + BLOCK_N) of tokens [program_id(1) * BLOCK_M, ...).
    Column blocks vary fastest, so programs running together share their rows of x (read once from memory).
    ROUND_X: x is fp32 (rounded to bf16 as autocast does); SAVE_GU: gate and up go to gu_ptr [tokens, 2 x inner]."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    m_ok = m < tokens
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, dim, BLOCK_K):
        kk = start + k
        k_ok = kk < dim
        x = tl.load(x_ptr + m[:, None] * dim + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if ROUND_X:
            x = _round_bf16(x, INTERPRET)
        x = x.to(tl.bfloat16)
        w_gate = tl.load(w_ptr + n[None, :] * dim + kk[:, None], mask=k_ok[:, None], other=0.0)  # [K, N]
        w_up = tl.load(w_ptr + (n[None, :] + inner) * dim + kk[:, None], mask=k_ok[:, None], other=0.0)
        acc_gate = _dot(x, w_gate, acc_gate, INTERPRET)
        acc_up = _dot(x, w_up, acc_up, INTERPRET)
    gate = _round_bf16(acc_gate, INTERPRET)
    up = _round_bf16(acc_up, INTERPRET)
    act = _round_bf16(gate * tl.sigmoid(gate) * up, INTERPRET)
    rows = m[:, None] * inner + n[None, :]
    tl.store(act_ptr + rows, act.to(tl.bfloat16), mask=m_ok[:, None])
    if SAVE_GU:
        saved = m[:, None] * (2 * inner) + n[None, :]
        tl.store(gu_ptr + saved, gate.to(tl.bfloat16), mask=m_ok[:, None])
        tl.store(gu_ptr + saved + inner, up.to(tl.bfloat16), mask=m_ok[:, None])


@_jit
def _swiglu_grad_kernel(
    dy_ptr, wd_ptr, gu_ptr, dgu_ptr, act_ptr, tokens, dim: tl.constexpr, inner: tl.constexpr,
    INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program, the forward's tile: d_act = dy @ down (K = dim) for inner columns [program_id(0) * BLOCK_N, ...)
    of tokens [program_id(1) * BLOCK_M, ...), then silu*mul's backward from the saved gate and up: the gate/up
    gradient to dgu_ptr [tokens, 2 x inner] and act (recomputed) to act_ptr [tokens, inner], all bf16."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.program_id(1).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    m_ok = m < tokens
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, dim, BLOCK_K):
        kk = start + k
        k_ok = kk < dim
        dy = tl.load(dy_ptr + m[:, None] * dim + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_down = tl.load(wd_ptr + kk[:, None] * inner + n[None, :], mask=k_ok[:, None], other=0.0)  # [K, N]
        acc = _dot(dy, w_down, acc, INTERPRET)
    d_act = _round_bf16(acc, INTERPRET)
    saved = m[:, None] * (2 * inner) + n[None, :]
    gate = tl.load(gu_ptr + saved, mask=m_ok[:, None], other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + saved + inner, mask=m_ok[:, None], other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    d_gate = _round_bf16(d_act * up * (sig * (1 + gate * (1 - sig))), INTERPRET)
    d_up = _round_bf16(d_act * silu, INTERPRET)
    act = _round_bf16(silu * up, INTERPRET)
    tl.store(dgu_ptr + saved, d_gate.to(tl.bfloat16), mask=m_ok[:, None])
    tl.store(dgu_ptr + saved + inner, d_up.to(tl.bfloat16), mask=m_ok[:, None])
    tl.store(act_ptr + m[:, None] * inner + n[None, :], act.to(tl.bfloat16), mask=m_ok[:, None])


def _configs() -> list[Any]:
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in TILES
    ]


@functools.cache
def _tuned(kernel_name: str) -> Any:
    """One of the two kernels under Triton's autotuner over TILES, keyed on the shapes."""
    kernel = {"forward": _swiglu_kernel, "backward": _swiglu_grad_kernel}[kernel_name]
    key = ["tokens", "dim", "inner"] + (["ROUND_X", "SAVE_GU"] if kernel_name == "forward" else [])
    return triton.autotune(configs=_configs(), key=key)(kernel)


def tuned_tiles() -> dict[str, str | None]:
    """The tiles the autotuner chose (after a GPU call; None before one), for the bench's record."""
    if triton is None or interpreting():
        return {"forward": None, "backward": None}
    best = {name: getattr(_tuned(name), "best_config", None) for name in ("forward", "backward")}
    return {name: None if config is None else str(config) for name, config in best.items()}


def _launch(kernel_name: str, args: tuple[Any, ...], tokens: int, **meta: Any) -> None:
    """One of the kernels over the (inner column block, token block) grid; `meta` holds dim and inner."""
    inner = meta["inner"]
    if interpreting():
        bm, bn, bk, _, _ = TILES[0]
        kernel = _swiglu_kernel if kernel_name == "forward" else _swiglu_grad_kernel
        kernel[(inner // bn, -(-tokens // bm))](*args, **meta, INTERPRET=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    else:
        _tuned(kernel_name)[lambda m: (inner // m["BLOCK_N"], -(-tokens // m["BLOCK_M"]))](
            *args, **meta, INTERPRET=False
        )


def _check(x: Tensor, gate_up: Tensor, down: Tensor) -> None:
    dim, inner = x.shape[-1], down.shape[1]
    if gate_up.shape != (2 * inner, dim) or down.shape != (dim, inner) or inner % MAX_BLOCK_N:
        raise ValueError(
            f"fused_swiglu: x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}: expected "
            f"gate_up [2*inner, dim], down [dim, inner], inner a multiple of {MAX_BLOCK_N}"
        )
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
    args = (flat, gate_up.contiguous(), act, gu if save_gu else act, tokens)
    _launch("forward", args, tokens, dim=dim, inner=inner, ROUND_X=x.dtype != torch.bfloat16, SAVE_GU=save_gu)
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
    _launch("backward", (dy, down.contiguous(), gu, d_gu, act, tokens), tokens, dim=dim, inner=inner)
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
