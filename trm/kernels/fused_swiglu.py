"""The channel SwiGLU (trm.model.Block's `mlp`) with its silu*mul inside the GEMMs: `train.kernels=fused_mix_swiglu`.

For x of shape [tokens, dim] (every batch row and position), the sublayer is

    y = down(silu(gate(x)) * up(x))

Through torch it runs as the gate/up GEMM (its [tokens, 2 x inner] output goes to device memory), a memory-bound
kernel reading it back for silu*mul, and the down GEMM; its backward as the down product's input-gradient GEMM,
another memory-bound kernel (silu*mul's backward) and three GEMMs. On a GPU those two memory-bound kernels were
the largest after the token-mixing sublayer's (docs/benchmarks.md, "A GPU"). Here:

- forward: one Triton GEMM computes a tile of gate and the matching tile of up as one product (gate_up's rows
  interleaved, the accumulator split in registers), and writes only silu(gate) * up (`act`, half the width), and,
  in the calls with gradients, gate and up too (what the backward needs, as autograd of the torch path saves
  them); cuBLAS then computes the down product.
- backward: one Triton GEMM computes the down product's input gradient (`d_act`) a tile at a time, reads the saved
  gate and up of the same tile, and writes the gate/up gradient: no [tokens, inner] gradient goes to memory. cuBLAS
  computes the input and weight gradients (the down weight's from act, saved by the forward as the torch path's
  autograd saves it).

No library provides a GEMM with this gate/up epilogue for torch (liger-kernel's SwiGLU fuses only the
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

from trm.kernels import swiglu_gemms
from trm.kernels.fused_mix import TensorDescriptor, interpreting, misaligned, triton
from trm.kernels.swiglu_gemms import Tile, constexprs


def _descriptor_blocks(nargs: dict[str, Any]) -> None:
    """Set each descriptor's block shape to the tile's (the autotuner's pre_hook, and the interpreter's launch)."""
    size = {"M": nargs["BLOCK_M"], "N": nargs["BLOCK_N"], "K": nargs["BLOCK_K"], "W": 2 * nargs["BLOCK_N"]}
    for name, sides in swiglu_gemms.DESCRIPTOR_BLOCKS["forward" if "x_desc" in nargs else "backward"].items():
        nargs[name].block_shape = [size[side] for side in sides]


@functools.cache
def _tuned(kernel_name: str) -> Any:
    """One of the two kernels under Triton's autotuner over its tiles (swiglu_gemms.TILES), keyed on the shapes."""
    kernel = swiglu_gemms.KERNELS[kernel_name]
    configs = [
        triton.Config(
            constexprs(kernel_name, t),
            num_warps=t.warps,
            num_stages=t.stages,
            pre_hook=_descriptor_blocks,
        )
        for t in swiglu_gemms.TILES[kernel_name]
    ]
    key = ["tokens", "dim", "inner"] + (["ROUND_X", "SAVE_GU"] if kernel_name == "forward" else [])
    return triton.autotune(configs=configs, key=key)(kernel)


def tuned_tiles() -> dict[str, str | None]:
    """The tiles the autotuner chose (after a GPU call; None before one), for the bench's record."""
    if triton is None or interpreting():
        return {"forward": None, "backward": None}
    best = {name: getattr(_tuned(name), "best_config", None) for name in ("forward", "backward")}
    return {name: None if config is None else str(config) for name, config in best.items()}


INTERPRETER_SMS = 2  # the multiprocessors a persistent grid is sized for under the interpreter: programs loop


@functools.cache
def _multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def grid_size(tokens: int, inner: int, block_m: int, block_n: int, per_sm: int, sms: int) -> int:
    """Programs of a launch: one per tile, or with per_sm (Tile.per_sm) that many per multiprocessor, at most one
    per tile."""
    tiles = -(-tokens // block_m) * (inner // block_n)
    return min(tiles, per_sm * sms) if per_sm else tiles


def _launch(kernel_name: str, tensors: tuple[Tensor, ...], tokens: int, tile: Tile | None, **meta: Any) -> None:
    """One of the kernels over its 1-D grid of tiles (grid_size), its tensors as TMA descriptors (block shapes set
    per tile): at `tile`, else the autotuner's (the interpreter's: the first of swiglu_gemms.TILES); `meta` holds dim
    and inner."""
    descriptors = [TensorDescriptor.from_tensor(t, [1] * t.dim()) for t in tensors]
    inner, interpret = meta["inner"], interpreting()
    sms = INTERPRETER_SMS if interpret else _multiprocessors(tensors[0].device.index or 0)
    if tile is None and not interpret:
        grid = lambda m: (grid_size(tokens, inner, m["BLOCK_M"], m["BLOCK_N"], m.get("PER_SM", 0), sms),)  # noqa: E731 - Triton calls the grid with the autotuned meta
        _tuned(kernel_name)[grid](*descriptors, tokens, **meta, INTERPRET=False)
        return
    tile = tile or swiglu_gemms.TILES[kernel_name][0]
    sizes = constexprs(kernel_name, tile)
    _descriptor_blocks({**dict(zip(swiglu_gemms.DESCRIPTOR_BLOCKS[kernel_name], descriptors)), **sizes})
    programs = grid_size(tokens, inner, tile.m, tile.n, tile.per_sm, sms)
    swiglu_gemms.KERNELS[kernel_name][(programs,)](
        *descriptors, tokens, **meta, INTERPRET=interpret, **sizes, num_warps=tile.warps, num_stages=tile.stages
    )


def _check(x: Tensor, gate_up: Tensor, down: Tensor) -> None:
    dim, inner = x.shape[-1], down.shape[1]
    if gate_up.shape != (2 * inner, dim) or down.shape != (dim, inner) or inner % swiglu_gemms.MAX_BLOCK_N:
        raise ValueError(
            f"fused_swiglu: x {tuple(x.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}: expected "
            f"gate_up [2*inner, dim], down [dim, inner], inner a multiple of {swiglu_gemms.MAX_BLOCK_N}"
        )
    if misaligned(dim):
        raise ValueError(f"fused_swiglu: {misaligned(dim)}")
    if gate_up.dtype != torch.bfloat16 or down.dtype != torch.bfloat16:
        raise ValueError(f"fused_swiglu: weights must be bf16 (got {gate_up.dtype}, {down.dtype})")


def launch_forward(
    x: Tensor, gate_up: Tensor, down: Tensor, save_gu: bool, tile: Tile | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """y (bf16, x's shape), with save_gu gate and up side by side ([tokens, 2 x inner] bf16; else empty), and act
    ([tokens, inner] bf16: the down product's input); `tile`: run the kernel at that tile (bench/gpu/candidates.py
    checks each), else at the autotuner's."""
    _check(x, gate_up, down)
    dim, inner = x.shape[-1], down.shape[1]
    flat = x.reshape(-1, dim).contiguous()
    tokens = flat.shape[0]
    act = flat.new_empty(tokens, inner, dtype=torch.bfloat16)
    gu = flat.new_empty(tokens, 2 * inner, dtype=torch.bfloat16) if save_gu else act.new_empty(0)
    interleaved = gate_up.reshape(2, inner, dim).transpose(0, 1).reshape(2 * inner, dim)  # gate, up rows alternate
    tensors = (flat, interleaved, act, gu if save_gu else act)
    _launch("forward", tensors, tokens, tile, dim=dim, inner=inner, ROUND_X=x.dtype != torch.bfloat16, SAVE_GU=save_gu)
    return (act @ down.t()).view(*x.shape[:-1], dim), gu, act


@torch.library.custom_op("trm::swiglu", mutates_args=())
def swiglu(x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """down(silu(gate(x)) * up(x)) for x [..., dim] with the SwiGLU's bf16 weights gate_up [2*inner, dim] and down
    [dim, inner]: bf16, as autocast's Linear returns. The calls without gradients."""
    return launch_forward(x, gate_up, down, save_gu=False)[0]


@swiglu.register_fake
def _(x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    return x.new_empty(x.shape, dtype=torch.bfloat16)


@torch.library.custom_op("trm::swiglu_saving", mutates_args=())
def swiglu_saving(x: Tensor, gate_up: Tensor, down: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """swiglu's value, the gate/up product it computed ([tokens, 2 x inner] bf16) and act ([tokens, inner] bf16),
    for the backward (what autograd of the torch path saves)."""
    return launch_forward(x, gate_up, down, save_gu=True)


@swiglu_saving.register_fake
def _(x: Tensor, gate_up: Tensor, down: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    tokens = x.numel() // x.shape[-1]
    y = x.new_empty(x.shape, dtype=torch.bfloat16)
    return y, x.new_empty(tokens, gate_up.shape[0], dtype=torch.bfloat16), y.new_empty(tokens, down.shape[1])


def launch_backward(dy: Tensor, gu: Tensor, down: Tensor, tile: Tile | None = None) -> Tensor:
    """The gate/up gradient [tokens, 2 x inner] (bf16) from dy [tokens, dim] (bf16) and the saved gate/up product;
    `tile` as launch_forward's."""
    tokens, dim, inner = dy.shape[0], dy.shape[1], down.shape[1]
    d_gu = dy.new_empty(tokens, 2 * inner)
    _launch("backward", (dy, down.contiguous(), gu, d_gu), tokens, tile, dim=dim, inner=inner)
    return d_gu


@torch.library.custom_op("trm::swiglu_grads", mutates_args=())
def swiglu_grads(
    x: Tensor, gu: Tensor, act: Tensor, grad_y: Tensor, gate_up: Tensor, down: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of swiglu w.r.t. x (in x's dtype), gate_up and down (bf16), from x, the saved gate/up product and
    act, and the output's gradient."""
    dim = x.shape[-1]
    xb = x.reshape(-1, dim).to(torch.bfloat16)
    dy = grad_y.reshape(-1, dim).to(torch.bfloat16).contiguous()
    d_gu = launch_backward(dy, gu, down)
    d_x = (d_gu @ gate_up).to(x.dtype).view(x.shape)  # bf16 GEMMs, fp32 accumulation (cuBLAS on a GPU)
    return d_x, d_gu.t() @ xb, dy.t() @ act


@swiglu_grads.register_fake
def _(
    x: Tensor, gu: Tensor, act: Tensor, grad_y: Tensor, gate_up: Tensor, down: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(gate_up), torch.empty_like(down)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    x, gate_up, down = inputs
    _, gu, act = output
    ctx.save_for_backward(x, gu, act, gate_up, down)
    ctx.mark_non_differentiable(gu, act)


def _backward(
    ctx: Any, grad_y: Tensor, _grad_gu: Tensor | None, _grad_act: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    x, gu, act, gate_up, down = ctx.saved_tensors
    return swiglu_grads(x, gu, act, grad_y, gate_up, down)


swiglu_saving.register_autograd(_backward, setup_context=_setup_context)


def swiglu_trainable(x: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """swiglu's value, differentiated by swiglu_grads (the calls with gradients)."""
    return swiglu_saving(x, gate_up, down)[0]
