"""The channel SwiGLU's Triton kernels and their tile choices (trm/kernels/fused_swiglu.py launches them and wraps them
in torch custom ops; its docstring says what they compute and why): the forward's gate/up GEMM with silu*mul in its
epilogue, and the backward's d_act GEMM with silu*mul's backward in its epilogue. Under Triton's interpreter (INTERPRET)
they run on CPU tensors."""

from __future__ import annotations

from typing import NamedTuple

from trm.kernels.fused_mix import _dot, _jit, _round_bf16, tl


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
# (bench/gpu/triton_sm90.py; the tests check it). Which won on an H100: docs/benchmarks.md, "Fused kernels".
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
    elif INTERPRET:  # the loop below as a while loop, on the same index lines (bench/gpu/tile_check.py runs it on a
        # CPU): the interpreter's tl.range cannot start at a program id (a 1-element array there, not an index)
        stored = tile - tl.num_programs(0)  # the epilogue's own count: no dependency on the next tile's copies
        loaded = tile
        while loaded < tiles:
            m0, n0 = _tile_origin(loaded, inner, BLOCK_M, BLOCK_N)
            gate, up = _gate_up(x_desc, w_desc, m0, n0, dim, ROUND_X, INTERPRET, BLOCK_M, BLOCK_N, BLOCK_K)
            stored += tl.num_programs(0)
            m0, n0 = _tile_origin(stored, inner, BLOCK_M, BLOCK_N)
            _store_act(act_desc, gu_desc, gate, up, m0, n0, inner, SAVE_GU, INTERPRET)
            loaded += tl.num_programs(0)
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


def constexprs(kernel_name: str, tile: Tile) -> dict[str, int]:
    """The kernel's tile constexprs at `tile` (the backward has no PER_SM)."""
    sizes = {"BLOCK_M": tile.m, "BLOCK_N": tile.n, "BLOCK_K": tile.k}
    return sizes | {"PER_SM": tile.per_sm} if kernel_name == "forward" else sizes
