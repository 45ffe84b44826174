"""What our Triton kernels compile to on a Hopper GPU, read on a machine without one: registers, spills, wgmma.

    python -m bench.triton_sm90                 # every tile of trm/fused_swiglu.py, the paper's sizes
    python -m bench.triton_sm90 --dim 512 --inner 1536 --out-dir /tmp/r

Triton compiles a kernel for a named target (sm_90) without a device, and its bundled ptxas reports registers and
spill bytes per thread. Before a GPU is lent, this says which tile choices are worth the autotuner's time: a tile
that spills registers or whose dots are not wgmma instructions (the tensor cores' Hopper path) is on a slow path.
Counted in the PTX: wgmma.mma_async (tensor-core products) and cp.async.bulk.tensor (TMA copies); shared memory
from Triton's metadata (a block gets at most 227 KB). TRITON_INTERPRET must be unset (the interpreter replaces
the kernels before they can be compiled). Results: <out-dir>/triton_sm90.json and .md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bench._results import RESULTS, run_header, write_results
from trm import fused_swiglu

NAME = "triton_sm90"
TARGET = GPUTarget("cuda", 90, 32)
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def _descriptor(rows: int, cols: int) -> str:
    return f"tensordesc<bf16[{rows},{cols}]>"


def swiglu_signature(kernel_name: str, tile: tuple[int, ...]) -> dict[str, str]:
    """trm.fused_swiglu's kernel arguments as Triton types: bf16 descriptors of the tile's blocks, then constexprs."""
    size = dict(zip("MNK", tile[:3]))
    blocks = {
        name: _descriptor(*(size[side] for side in sides)) for name, sides in fused_swiglu._BLOCKS[kernel_name].items()
    }
    flags = ("ROUND_X", "SAVE_GU") if kernel_name == "forward" else ()
    names = ("dim", "inner", *flags, "INTERPRET", "BLOCK_M", "BLOCK_N", "BLOCK_K")
    return {**blocks, **dict.fromkeys(names, "constexpr")}


def compile_report(kernel_name: str, tile: tuple[int, ...], dim: int, inner: int, save_gu: bool) -> dict[str, Any]:
    """One kernel at one tile (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), compiled for sm_90."""
    block_m, block_n, block_k, warps, stages = tile
    signature = swiglu_signature(kernel_name, tile)
    values: dict[str, Any] = {"dim": dim, "inner": inner, "INTERPRET": False}
    values |= {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k}
    if kernel_name == "forward":
        values |= {"ROUND_X": False, "SAVE_GU": save_gu}
    constexprs = {(list(signature).index(name),): value for name, value in values.items()}
    source = ASTSource(fn=fused_swiglu.KERNELS[kernel_name], signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=TARGET, options={"num_warps": warps, "num_stages": stages})
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        info = subprocess.run(
            [str(PTXAS), "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True, check=True
        ).stderr
    registers = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores", info)
    return {
        "kernel": kernel_name + (" (saving gate/up)" if save_gu else ""),
        "tile": list(tile),
        "registers": int(registers.group(1)) if registers else None,
        "spill_bytes": int(spills.group(1)) if spills else None,
        "wgmma": ptx.count("wgmma.mma_async"),
        "tma_copies": ptx.count("cp.async.bulk.tensor"),
        "shared_bytes": compiled.metadata.shared,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dim", type=int, default=512, help="the channel SwiGLU's input width (arch.hidden_size)")
    p.add_argument("--inner", type=int, default=1536, help="its inner width (trm.model.SwiGLU of dim, expansion 4)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1: the interpreter replaces the kernels; unset it to compile them")
    result: dict[str, Any] = run_header(NAME, argv)
    cases = [("forward", False), ("forward", True), ("backward", False)]
    result["kernels"] = [
        compile_report(name, tile, args.dim, args.inner, save_gu)
        for name, save_gu in cases
        for tile in fused_swiglu.TILES[name]
    ]
    lines = ["| kernel | tile (M, N, K, warps, stages) | registers | spill bytes | wgmma | TMA copies | shared KB |"]
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for k in result["kernels"]:
        lines.append(
            f"| {k['kernel']} | {tuple(k['tile'])} | {k['registers']} | {k['spill_bytes']} | {k['wgmma']} "
            f"| {k['tma_copies']} | {k['shared_bytes'] / 1024:.0f} |"
        )
    lines += [
        "",
        f"trm/fused_swiglu.py compiled for sm_90 (Triton {triton.__version__}), dim {args.dim}, inner {args.inner}.",
    ]
    write_results(NAME, result, "\n".join(lines), args.out_dir)
    return result


if __name__ == "__main__":
    main()
