"""Every tile of the channel SwiGLU's Triton kernels (trm/kernels/swiglu_gemms.py TILES), launched at that tile: its
outputs against the same products through torch, and a persistent tile's bits against its twin's with a program per
tile.

    python -m bench.gpu.tile_check --device cuda                      # the paper's MLP-t at the timed batch (768)
    python -m bench.gpu.tile_check --device cpu --quick --out-dir /tmp/r   # Triton's interpreter, tiny shapes

The autotuner picks one tile per shape, so a training step runs only that one: this launches each. A tile passes
when every output is within BF16_TOL of torch's (relative to the largest) and, for a persistent tile
(Tile.per_sm), is bit for bit its twin's: the persistent loop's indices put every tile's result where one program
per tile puts it. bench/gpu/candidates.py runs the same check in its prepared GPU call.

On a CPU (--device cpu, TRITON_INTERPRET=1 set here) the interpreter runs the persistent loop's twin in
trm/kernels/swiglu_gemms.py, a while loop over the same index lines (the interpreter's tl.range cannot start at a
program id), with INTERPRETER_SMS programs. Exits 1 when a tile fails (after writing its results).
"""

from __future__ import annotations

import os
import sys

if [a for i, a in enumerate(sys.argv[1:]) if sys.argv[i] == "--device"][-1:] == ["cpu"]:  # the last, as argparse
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: the kernels on CPU tensors

import argparse
import traceback
from typing import Any

import torch

from bench._common import arch_of, train_config
from bench._results import fmt, run_header, write_results
from bench.gpu import cli
from trm.kernel_choice import BF16_TOL
from trm.kernels import fused_swiglu, swiglu_gemms
from trm.model import Block, TRMConfig
from trm.step import carry_dtype

NAME = "tile_check"


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    ours, reference = ours.detach().double(), reference.detach().double()
    return float((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


def tile_check(device: str, arch: TRMConfig, tokens: int, precision: str) -> list[dict[str, Any]]:
    """Every tile of the channel SwiGLU's kernels at [tokens, arch.hidden_size], x in `precision`'s carry dtype: its
    outputs against the same products through torch (cuBLAS on a GPU, bf16 rounding where the torch path rounds),
    relative error within BF16_TOL; a persistent tile also bit for bit against the same tile with one program per
    tile. One row per tile, `passes` in each; a tile that raises is a failing row."""
    dim = arch.hidden_size
    inner = Block(arch).mlp.down.weight.shape[1]
    torch.manual_seed(0)
    x, dy = (torch.randn(tokens, dim, device=device, dtype=torch.bfloat16) for _ in range(2))
    x_stream = x.to(carry_dtype(precision))  # what the forward takes in training: bf16, or fp32 (ROUND_X)
    gate_up = (torch.randn(2 * inner, dim, device=device) * dim**-0.5).bfloat16()
    down = (torch.randn(dim, inner, device=device) * inner**-0.5).bfloat16()
    gu = (x.float() @ gate_up.float().t()).bfloat16()  # what autocast's bf16 Linear returns, to its rounding
    gate, up = gu.float().chunk(2, dim=1)
    silu = (gate * torch.sigmoid(gate)).bfloat16().float()
    act = (silu * up).bfloat16()
    d_act = (dy.float() @ down.float()).bfloat16().float()
    sig = torch.sigmoid(gate)
    d_gu = torch.cat([d_act * up * sig * (1 + gate * (1 - sig)), d_act * silu], dim=1).bfloat16()
    expected = {"forward": (act.float() @ down.float().t(), gu, act), "backward": (d_gu,)}
    rows, outputs = [], {}
    for kernel, tiles in swiglu_gemms.TILES.items():
        # One program per tile first: a persistent tile's twin must have run before it (the shipped order has it so).
        for tile in sorted(tiles, key=lambda t: t.per_sm > 0):
            try:
                if kernel == "forward":
                    got = fused_swiglu.launch_forward(x_stream, gate_up, down, save_gu=True, tile=tile)
                else:
                    got = (fused_swiglu.launch_backward(dy, gu, down, tile=tile),)
            except Exception as err:  # noqa: BLE001 - a failing tile is a result; the others still run
                traceback.print_exc(limit=5)
                error = f"{type(err).__name__}: {err}"[:500]
                rows.append({"kernel": kernel, "tile": list(tile), "error": error, "passes": False})
                continue
            if not tile.per_sm:  # a persistent tile's twin (at the timed shape, each output set is ~1 GB)
                outputs[kernel, tile] = got
            errors = [relative_error(g, e) for g, e in zip(got, expected[kernel])]
            twin = outputs.get((kernel, tile._replace(per_sm=0)))
            same_as_twin = None if not tile.per_sm or twin is None else all(map(torch.equal, got, twin))
            rows.append(
                {
                    "kernel": kernel,
                    "tile": list(tile),
                    "max_relative_error": max(errors),
                    "same_bits_as_one_program_per_tile": same_as_twin,
                    "passes": max(errors) < BF16_TOL and same_as_twin is not False,
                    **tile_times(kernel, tile, x_stream, gate_up, down, dy, gu, device),
                }
            )
            print(f"  tile {kernel} {tuple(tile)}: {rows[-1]}", flush=True)
    return rows


def tile_times(
    kernel: str, tile: swiglu_gemms.Tile, x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, dy: torch.Tensor,
    gu: torch.Tensor, device: str,
) -> dict[str, float | None]:  # fmt: skip
    """Median ms of one call at `tile` (triton.testing.do_bench, CUDA events; None on a CPU): the forward as the
    calls without gradients run it (its kernel and the down GEMM) and as those with them (also saving gate/up),
    or the backward's kernel."""
    if device != "cuda":
        return {"ms": None, "saving_ms": None} if kernel == "forward" else {"ms": None}
    from triton.testing import do_bench

    if kernel == "backward":
        return {"ms": do_bench(lambda: fused_swiglu.launch_backward(dy, gu, down, tile=tile), return_mode="median")}
    return {
        "ms": do_bench(lambda: fused_swiglu.launch_forward(x, gate_up, down, False, tile), return_mode="median"),
        "saving_ms": do_bench(lambda: fused_swiglu.launch_forward(x, gate_up, down, True, tile), return_mode="median"),
    }


def markdown_rows(rows: list[dict[str, Any]]) -> list[str]:
    """The tile check as a table (also bench/gpu/candidates.py's)."""
    lines = ["| fused_swiglu kernel | tile (m, n, k, warps, stages, per SM) | max relative error | "
             "bits as one program per tile | passes | ms (saving gate/up) |", "|---|---|---:|---|---|---:|"]  # fmt: skip
    for t in rows:
        if "error" in t:
            lines.append(f"| {t['kernel']} | {tuple(t['tile'])} | failed: {t['error'][:200]} ||||")
            continue
        same = {None: "-", True: "same", False: "DIFFER"}[t["same_bits_as_one_program_per_tile"]]
        saving = f" ({fmt(t['saving_ms'], '.3f')})" if "saving_ms" in t else ""
        lines.append(
            f"| {t['kernel']} | {tuple(t['tile'])} | {t['max_relative_error']:.4f} | {same} "
            f"| {'yes' if t['passes'] else 'NO'} | {fmt(t['ms'], '.3f')}{saving} |"
        )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    cli.add_device(p)
    cli.add_arch(p)
    p.add_argument("--batch", type=int, default=None, help="batch rows: tokens = batch x total_len (768; 2 --quick)")
    cli.add_precision(p)
    cli.add_quick(p)
    cli.add_output(p, NAME)
    args = p.parse_args(argv)
    args.arch = args.arch or ("tiny" if args.quick else "trm_mlp_t_sudoku")
    args.batch = args.batch or (2 if args.quick else 768)
    arch = arch_of(train_config(args.arch, args.batch, args.precision, ["experiment=paper_sudoku"]))
    result: dict[str, Any] = run_header(NAME, argv)
    result["tokens"] = tokens = args.batch * arch.total_len
    result["tiles"] = tile_check(args.device, arch, tokens, args.precision)
    result["passes"] = all(t["passes"] for t in result["tiles"])
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU, Triton's interpreter"
    table = "\n".join(
        markdown_rows(result["tiles"])
        + ["", f"{args.arch}: {tokens} tokens x hidden {arch.hidden_size}, {args.precision}; {where}."]
    )
    write_results(args.out_name, result, table, args.out_dir)
    if not result["passes"]:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
