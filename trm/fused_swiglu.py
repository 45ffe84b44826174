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
from typing import Any, NamedTuple

import torch
from torch import Tensor

from trm.fused_mix import TensorDescriptor, _dot, _jit, _round_bf16, interpreting, misaligned, tl, triton


class Tile(NamedTuple):
    """One tile choice of a kernel: tokens (m) and inner columns (n) per tile, the K step, warps, pipeline stages,
    and (the forward's only) the grid: per_sm 0 gives every tile its own program; per_sm > 0 launches that many
    programs per multiprocessor, each looping over tiles (a persistent grid: the loop is flattened, so the next
    tile's copies are issued while this tile's epilogue computes and stores, which K = dim's few steps otherwise
    leave exposed)."""

    m: int
    n: int
    k: int
    warps: int
    stages: int
    per_sm: int = 0


# Tile choices of each kernel: Triton's autotuner times them at the first call per shape on a GPU; the interpreter
# takes the first. The inner width is a multiple of 256 (trm.model.SwiGLU), so every column block divides it.
# Compiled for sm_90 at the paper's sizes, none spills registers and every dot is a wgmma fed by TMA copies
# (bench/triton_sm90.py; the tests check it). Which won on an H100: docs/benchmarks.md, "Fused kernels".
FWD_TILES = (
    Tile(64, 64, 64, 4, 3),
    Tile(128, 128, 64, 8, 3),
    Tile(128, 128, 64, 8, 4),
    Tile(128, 128, 64, 8, 3, per_sm=1),
)
BWD_TILES = (
    Tile(64, 64, 64, 4, 3),
    Tile(64, 64, 64, 4, 4),
    Tile(128, 64, 64, 8, 3),
    Tile(128, 64, 64, 8, 4),
    Tile(64, 128, 64, 8, 3),
)
TILES = {"forward": FWD_TILES, "backward": BWD_TILES}
MAX_BLOCK_N = max(tile.n for tiles in TILES.values() for tile in tiles)
assert not any(tile.per_sm for tile in BWD_TILES), "the backward's grid has a program per tile"
assert all(2 * tile.n <= 256 for tile in FWD_TILES), "the forward's weight block (2n rows) is one TMA box: <= 256"


@_jit
def _tile_origin(tile, inner: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The first token and inner column of tile number `tile`. Column blocks vary fastest, so the tiles running
    together share their rows of the token-side operand (read once from memory)."""
    column_blocks: tl.constexpr = inner // BLOCK_N
    return (tile // column_blocks) * BLOCK_M, (tile % column_blocks) * BLOCK_N


@_jit
def _gate_up(
    x_desc, w_desc, m0, n0, dim: tl.constexpr, ROUND_X: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The forward's main loop: the tile's gate and up products (fp32) as one product of width 2 x BLOCK_N. w holds
    gate_up's rows interleaved (gate row j, then up row j), so the accumulator's column pairs are (gate, up), split
    apart in registers: one wgmma per K step instead of two sharing x (measured: docs/benchmarks.md)."""
    acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    for k0 in range(0, dim, BLOCK_K):
        x = x_desc.load([m0, k0])  # [M, K]
        if ROUND_X:
            x = _round_bf16(x, INTERPRET)
        acc = _dot(x.to(tl.bfloat16), tl.trans(w_desc.load([2 * n0, k0])), acc, INTERPRET)  # w's rows: [2N, K]
    return tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))


@_jit
def _store_act(
    act_desc, gu_desc, acc_gate, acc_up, m0, n0, inner: tl.constexpr, SAVE_GU: tl.constexpr, INTERPRET: tl.constexpr
):  # fmt: skip
    """The forward's epilogue: silu(gate) * up to act and, with SAVE_GU, gate and up to gu, all rounded to bf16."""
    gate = _round_bf16(acc_gate, INTERPRET)
    up = _round_bf16(acc_up, INTERPRET)
    act_desc.store([m0, n0], _round_bf16(gate * tl.sigmoid(gate) * up, INTERPRET).to(tl.bfloat16))
    if SAVE_GU:
        gu_desc.store([m0, n0], gate.to(tl.bfloat16))
        gu_desc.store([m0, inner + n0], up.to(tl.bfloat16))


@_jit
def _swiglu_kernel(
    x_desc, w_desc, act_desc, gu_desc, tokens, dim: tl.constexpr, inner: tl.constexpr, ROUND_X: tl.constexpr,
    SAVE_GU: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PER_SM: tl.constexpr,
):  # fmt: skip
    """Tiles of act = silu(x @ gate.T) * (x @ up.T) [tokens, inner]: program_id(0)'s tile, or with PER_SM every
    num_programs(0)-th tile from it (Tile.per_sm). Every block moves by TMA copies on a GPU (rows past the tokens
    and K past dim read as 0, and are not written). w: gate_up's rows interleaved (_gate_up); ROUND_X: x is fp32
    (rounded to bf16 as autocast does); SAVE_GU: gate and up go to gu [tokens, 2 x inner]. `tokens` (the
    descriptors know the extent) keys the autotuner: the best tile depends on it."""
    tile = tl.program_id(0)
    tiles = tl.cdiv(tokens, BLOCK_M) * (inner // BLOCK_N)
    if PER_SM == 0:
        m0, n0 = _tile_origin(tile, inner, BLOCK_M, BLOCK_N)
        gate, up = _gate_up(x_desc, w_desc, m0, n0, dim, ROUND_X, INTERPRET, BLOCK_M, BLOCK_N, BLOCK_K)
        _store_act(act_desc, gu_desc, gate, up, m0, n0, inner, SAVE_GU, INTERPRET)
    elif INTERPRET:  # the same tiles; the interpreter's tl.range cannot start at a program id
        while tile < tiles:
            m0, n0 = _tile_origin(tile, inner, BLOCK_M, BLOCK_N)
            gate, up = _gate_up(x_desc, w_desc, m0, n0, dim, ROUND_X, INTERPRET, BLOCK_M, BLOCK_N, BLOCK_K)
            _store_act(act_desc, gu_desc, gate, up, m0, n0, inner, SAVE_GU, INTERPRET)
            tile += tl.num_programs(0)
    else:
        stored = tile - tl.num_programs(0)  # the epilogue's own count: no dependency on the next tile's copies
        for loaded in tl.range(tile, tiles, tl.num_programs(0), flatten=True):
            m0, n0 = _tile_origin(loaded, inner, BLOCK_M, BLOCK_N)
            gate, up = _gate_up(x_desc, w_desc, m0, n0, dim, ROUND_X, INTERPRET, BLOCK_M, BLOCK_N, BLOCK_K)
            stored += tl.num_programs(0)
            m0, n0 = _tile_origin(stored, inner, BLOCK_M, BLOCK_N)
            _store_act(act_desc, gu_desc, gate, up, m0, n0, inner, SAVE_GU, INTERPRET)


@_jit
def _swiglu_grad_kernel(
    dy_desc, wd_desc, gu_desc, dgu_desc, tokens, dim: tl.constexpr, inner: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program, a tile of the forward's: d_act = dy @ down (K = dim), then silu*mul's backward from the saved
    gate and up: the gate/up gradient to dgu [tokens, 2 x inner] (bf16)."""
    m0, n0 = _tile_origin(tl.program_id(0), inner, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, dim, BLOCK_K):
        acc = _dot(dy_desc.load([m0, k0]), wd_desc.load([k0, n0]), acc, INTERPRET)  # [M, K] @ [K, N]
    d_act = _round_bf16(acc, INTERPRET)
    gate = gu_desc.load([m0, n0]).to(tl.float32)
    up = gu_desc.load([m0, inner + n0]).to(tl.float32)
    sig = tl.sigmoid(gate)
    dgu_desc.store([m0, n0], _round_bf16(d_act * up * (sig * (1 + gate * (1 - sig))), INTERPRET).to(tl.bfloat16))
    dgu_desc.store([m0, inner + n0], _round_bf16(d_act * (gate * sig), INTERPRET).to(tl.bfloat16))  # d_act * silu


KERNELS = {"forward": _swiglu_kernel, "backward": _swiglu_grad_kernel}
# The descriptors of each kernel, in argument order: the block each copies, from the tile's sizes (W: 2 x N).
DESCRIPTOR_BLOCKS = {
    "forward": {"x_desc": "MK", "w_desc": "WK", "act_desc": "MN", "gu_desc": "MN"},
    "backward": {"dy_desc": "MK", "wd_desc": "KN", "gu_desc": "MN", "dgu_desc": "MN"},
}


def _descriptor_blocks(nargs: dict[str, Any]) -> None:
    """Set each descriptor's block shape to the tile's (the autotuner's pre_hook, and the interpreter's launch)."""
    size = {"M": nargs["BLOCK_M"], "N": nargs["BLOCK_N"], "K": nargs["BLOCK_K"], "W": 2 * nargs["BLOCK_N"]}
    for name, sides in DESCRIPTOR_BLOCKS["forward" if "x_desc" in nargs else "backward"].items():
        nargs[name].block_shape = [size[side] for side in sides]


@functools.cache
def _tuned(kernel_name: str) -> Any:
    """One of the two kernels under Triton's autotuner over its TILES, keyed on the shapes."""
    kernel = KERNELS[kernel_name]
    configs = [
        triton.Config(
            constexprs(kernel_name, t),
            num_warps=t.warps,
            num_stages=t.stages,
            pre_hook=_descriptor_blocks,
        )
        for t in TILES[kernel_name]
    ]
    key = ["tokens", "dim", "inner"] + (["ROUND_X", "SAVE_GU"] if kernel_name == "forward" else [])
    return triton.autotune(configs=configs, key=key)(kernel)


def tuned_tiles() -> dict[str, str | None]:
    """The tiles the autotuner chose (after a GPU call; None before one), for the bench's record."""
    if triton is None or interpreting():
        return {"forward": None, "backward": None}
    best = {name: getattr(_tuned(name), "best_config", None) for name in ("forward", "backward")}
    return {name: None if config is None else str(config) for name, config in best.items()}


def constexprs(kernel_name: str, tile: Tile) -> dict[str, int]:
    """The kernel's tile constexprs at `tile` (the backward has no PER_SM)."""
    sizes = {"BLOCK_M": tile.m, "BLOCK_N": tile.n, "BLOCK_K": tile.k}
    return sizes | {"PER_SM": tile.per_sm} if kernel_name == "forward" else sizes


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
    per tile): at `tile`, else the autotuner's (the interpreter's: TILES' first); `meta` holds dim and inner."""
    descriptors = [TensorDescriptor.from_tensor(t, [1] * t.dim()) for t in tensors]
    inner, interpret = meta["inner"], interpreting()
    sms = INTERPRETER_SMS if interpret else _multiprocessors(tensors[0].device.index or 0)
    if tile is None and not interpret:
        grid = lambda m: (grid_size(tokens, inner, m["BLOCK_M"], m["BLOCK_N"], m.get("PER_SM", 0), sms),)  # noqa: E731
        _tuned(kernel_name)[grid](*descriptors, tokens, **meta, INTERPRET=False)
        return
    tile = tile or TILES[kernel_name][0]
    sizes = constexprs(kernel_name, tile)
    _descriptor_blocks({**dict(zip(DESCRIPTOR_BLOCKS[kernel_name], descriptors)), **sizes})
    programs = grid_size(tokens, inner, tile.m, tile.n, tile.per_sm, sms)
    KERNELS[kernel_name][(programs,)](
        *descriptors, tokens, **meta, INTERPRET=interpret, **sizes, num_warps=tile.warps, num_stages=tile.stages
    )


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


def launch_forward(
    x: Tensor, gate_up: Tensor, down: Tensor, save_gu: bool, tile: Tile | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """y (bf16, x's shape), with save_gu gate and up side by side ([tokens, 2 x inner] bf16; else empty), and act
    ([tokens, inner] bf16: the down product's input); `tile`: run the kernel at that tile (bench/gpu_candidates.py
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
