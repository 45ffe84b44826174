"""What our Triton kernels compile to on a Hopper GPU, read on a machine without one: registers, spills, wgmma.

    python -m bench.gpu.triton_sm90                 # every tile of trm/fused_*.py at the paper's sizes
    python -m bench.gpu.triton_sm90 --seq 97 --hidden 512 --out-dir /tmp/r
    python -m bench.gpu.triton_sm90 --capability 80 --out-name triton_sm80   # Ampere: no wgmma, no TMA
    python -m bench.gpu.triton_sm90 --stream fp32 --out-name triton_sm90_fp32   # train.precision=bf16's fp32 carry

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
from typing import Any, NamedTuple

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
from triton.compiler import ASTSource

from bench._results import run_header, write_results
from bench.gpu import cli
from trm.kernel_choice import MIX_BACKWARD, MIX_FORWARD, MIX_SAVING, SWIGLU_BACKWARD, SWIGLU_FORWARD, SWIGLU_SAVING
from trm.kernels import fused_mix, fused_mix_backward, swiglu_gemms
from trm.model import SwiGLU

NAME = "triton_sm90"
HOPPER = 90  # compute capability x 10 of the lent H100/H200


def _descriptor(*block: int, dtype: str = "bf16") -> str:
    return f"tensordesc<{dtype}[{','.join(map(str, block))}]>"


def _constexprs(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "constexpr")


class Case(NamedTuple):
    """One kernel as the compiler sees it at one tile: its argument types and its constexpr values."""

    kernel: str
    fn: Any
    tile: tuple[int, ...]
    warps: int
    stages: int
    signature: dict[str, str]
    constexprs: dict[str, Any]
    per_sm: int = 0  # programs per multiprocessor of a persistent grid (trm.kernels.swiglu_gemms.Tile); 0: one per tile


def swiglu_cases(dim: int, inner: int, stream: str = "bf16") -> list[Case]:
    """trm/kernels/swiglu_gemms.py's two kernels at each of their tiles (the forward also as it saves gate/up), x in the
    `stream` dtype; the backward only with the bf16 stream (its inputs are bf16 in either)."""
    cases = []
    for name, save_gu in (("forward", False), ("forward", True), ("backward", False))[: 3 if stream == "bf16" else 2]:
        for tile in swiglu_gemms.TILES[name]:
            size = {"M": tile.m, "N": tile.n, "K": tile.k, "W": 2 * tile.n}
            blocks = {
                arg: _descriptor(*(size[side] for side in sides), dtype=stream if arg == "x_desc" else "bf16")
                for arg, sides in swiglu_gemms.DESCRIPTOR_BLOCKS[name].items()
            }
            values: dict[str, Any] = {"dim": dim, "inner": inner}
            values |= {"ROUND_X": stream == "fp32", "SAVE_GU": save_gu} if name == "forward" else {}
            values |= {"INTERPRET": False, **swiglu_gemms.constexprs(name, tile)}
            label = {"backward": SWIGLU_BACKWARD, "forward": SWIGLU_SAVING if save_gu else SWIGLU_FORWARD}[name]
            signature = {**blocks, "tokens": "i32", **_constexprs(*values)}
            cases.append(
                Case(
                    label,
                    swiglu_gemms.KERNELS[name],
                    tile[:3],
                    tile.warps,
                    tile.stages,
                    signature,
                    values,
                    tile.per_sm,
                )
            )
    return cases


def mix_cases(seq: int, inner: int, stream: str = "bf16") -> list[Case]:
    """trm/kernels/fused_mix.py's forward (also as it saves the residual sum) and trm/kernels/fused_mix_backward.py's
    kernel at each of their tiles, the stream (h, the sum, the output and their gradients) in the `stream` dtype."""
    seq_pad = fused_mix.padded_seq(seq)
    scalars = {"batch": "i32", "hidden": "i32", "eps": "fp32"}
    rounds = stream == "bf16"  # ROUND_SUM: the sum rounded to a bf16 stream
    cases = []
    for save in (False, True):
        for c, i, warps, stages in fused_mix.TILES:
            values = {"seq": seq, "inner": inner, "ROUND_SUM": rounds, "SAVE_SUM": save, "INTERPRET": False}
            values |= {"SEQ_PAD": seq_pad, "BLOCK_C": c, "BLOCK_I": i}
            stream_block = _descriptor(1, seq_pad, c, dtype=stream)
            signature = {
                "h_desc": stream_block,
                "wgu_desc": _descriptor(i, seq_pad),
                "wd_desc": _descriptor(seq_pad, i),
            }
            signature |= {"out_desc": stream_block, "sum_desc": stream_block, **scalars, **_constexprs(*values)}
            label = MIX_SAVING if save else MIX_FORWARD
            cases.append(Case(label, fused_mix._mix_kernel, (c, i), warps, stages, signature, values))
    for c, i, warps in fused_mix_backward.BWD_TILES:
        values = {"seq": seq, "inner": inner, "ROUND_SUM": rounds, "INTERPRET": False}
        values |= {"SEQ_PAD": seq_pad, "BLOCK_C": c, "BLOCK_I": i}
        stream_block, rows_block = _descriptor(1, seq_pad, c, dtype=stream), _descriptor(1, c, seq_pad)
        signature = {"h_desc": stream_block, "sum_desc": stream_block, "dy_desc": stream_block}
        signature |= {"wgu_desc": _descriptor(i, seq_pad), "wd_desc": _descriptor(seq_pad, i), "dx_desc": stream_block}
        signature |= {"act_desc": _descriptor(1, c, i), "dgu_desc": _descriptor(1, c, i), "xt_desc": rows_block}
        signature |= {"dout_desc": rows_block, **scalars, **_constexprs(*values)}
        cases.append(Case(MIX_BACKWARD, fused_mix_backward._mix_grad_kernel, (c, i), warps, 3, signature, values))
    return cases


def compile_report(case: Case, capability: int = HOPPER) -> dict[str, Any]:
    """One case compiled for sm_<capability>: ptxas's registers and spill bytes, the PTX's wgmma and TMA counts (and
    plain global loads: what a TMA copy becomes on a GPU without TMA)."""
    constexprs = {(list(case.signature).index(name),): value for name, value in case.constexprs.items()}
    source = ASTSource(fn=case.fn, signature=case.signature, constexprs=constexprs)
    target = GPUTarget("cuda", capability, 32)
    compiled = triton.compile(source, target=target, options={"num_warps": case.warps, "num_stages": case.stages})
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        info = subprocess.run(
            [
                get_ptxas(capability).path,
                f"-arch={sm_arch_from_capability(capability)}",
                "-v",
                f.name,
                "-o",
                os.devnull,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    registers = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores", info)
    return {
        "kernel": case.kernel,
        "tile": [*case.tile, case.warps, case.stages],
        "per_sm": case.per_sm,
        "registers": int(registers.group(1)) if registers else None,
        "spill_bytes": int(spills.group(1)) if spills else None,
        "wgmma": ptx.count("wgmma.mma_async"),
        "tma_copies": ptx.count("cp.async.bulk.tensor"),
        "global_loads": ptx.count("ld.global"),
        "shared_bytes": compiled.metadata.shared,
    }


def inner_width(dim: int) -> int:
    """The inner width trm.model.SwiGLU gives `dim` at the presets' expansion (4)."""
    return int(SwiGLU(dim, 4.0).down.weight.shape[1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512, help="arch.hidden_size: the channel SwiGLU's input width")
    p.add_argument("--seq", type=int, default=97, help="arch's total_len: the token mixing's width")
    p.add_argument("--capability", type=int, default=HOPPER, help="the target's compute capability x 10 (80: Ampere)")
    p.add_argument(
        "--stream", default="bf16", choices=("bf16", "fp32"), help="the carry: bf16 (bf16_reference) or fp32 (bf16)"
    )
    cli.add_output(p, NAME)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1: the interpreter replaces the kernels; unset it to compile them")
    result: dict[str, Any] = run_header(NAME, argv)
    cases = mix_cases(args.seq, inner_width(args.seq), args.stream)
    cases += swiglu_cases(args.hidden, inner_width(args.hidden), args.stream)
    result["kernels"] = [compile_report(case, args.capability) for case in cases]
    lines = ["| kernel | tile (blocks, warps, stages) | registers | spill bytes | wgmma | TMA copies | global loads "
             "| shared KB |", "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for k in result["kernels"]:
        grid = f" persistent, {k['per_sm']}/SM" if k["per_sm"] else ""
        lines.append(
            f"| {k['kernel']} | {tuple(k['tile'])}{grid} | {k['registers']} | {k['spill_bytes']} | {k['wgmma']} "
            f"| {k['tma_copies']} | {k['global_loads']} | {k['shared_bytes'] / 1024:.0f} |"
        )
    lines += [
        "",
        f"Compiled for sm_{args.capability} (Triton {triton.__version__}): seq {args.seq}, hidden {args.hidden}, "
        f"{args.stream} stream.",
    ]
    write_results(args.out_name, result, "\n".join(lines), args.out_dir)
    return result


if __name__ == "__main__":
    main()
