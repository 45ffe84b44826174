"""How fast the train step's own matmul shapes run, against the square-matmul peak (fp32 and bf16, interleaved).

    python -m bench.trainer.gemms                     # trm_mlp_t_sudoku shapes at batch 64
    python -m bench.trainer.gemms --arch trm_att_sudoku --batch 16

For each Linear of one Block (forward y = x W^T and the two backward products dX = dY W, dW = dY^T X) the
script times torch.mm of exactly that shape, round-robin with the n x n peak, and reports GFLOP/s, the
fraction of the peak and the share of the block's matmul FLOPs. For the MLP-t sequence mixer, whose
contraction/output dimension is the sequence length (97 = 16 prefix + 81 cells), it also times the same
products with that dimension rounded up to a multiple of 32, to show what the odd size costs.
JSON goes to bench/results/trainer_gemms.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from bench._common import RESULTS, arch_of, machine_info, median, round_robin, train_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def swiglu_inner(dim: int, expansion: float) -> int:
    return -(-round(expansion * dim * 2 / 3) // 256) * 256  # as trm.model.SwiGLU


def block_linears(arch, batch: int, pad_seq: int | None = None) -> list[tuple[str, int, int, int]]:
    """(name, rows, in, out) of every Linear in one Block; rows = how many vectors it maps."""
    d, length = arch.hidden_size, pad_seq or arch.total_len
    inner = swiglu_inner(d, arch.expansion)
    out = [("mlp.gate_up", batch * length, d, 2 * inner), ("mlp.down", batch * length, inner, d)]
    if arch.mixer == "mlp_t":
        seq_inner = swiglu_inner(arch.total_len, arch.expansion)
        out = [
            ("mix.gate_up (K=L)", batch * d, length, 2 * seq_inner),
            ("mix.down (N=L)", batch * d, seq_inner, length),
        ] + out
    else:
        out = [("attn.qkv", batch * length, d, 3 * d), ("attn.out", batch * length, d, d)] + out
    return out


def gemm_cases(arch, batch: int) -> list[dict[str, Any]]:
    cases = []
    for tag, pad in [("", None)] + ([(" [L padded]", -(-arch.total_len // 32) * 32)] if arch.mixer == "mlp_t" else []):
        for name, rows, k_in, n_out in block_linears(arch, batch, pad):
            if tag and not name.startswith("mix."):
                continue
            # forward x[rows,in] @ W^T[in,out]; backward dX = dY[rows,out] @ W[out,in]; dW = dY^T[out,rows] @ X[rows,in]
            for kind, (m, k, n) in (
                ("fwd", (rows, k_in, n_out)),
                ("dX", (rows, n_out, k_in)),
                ("dW", (n_out, rows, k_in)),
            ):
                cases.append({"name": f"{name}{tag} {kind}", "m": m, "k": k, "n": n, "padded": bool(tag)})
    return cases


def time_mm(a: torch.Tensor, b: torch.Tensor, min_seconds: float) -> float:
    torch.mm(a, b)
    iters, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        iters += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and iters >= 2:
            return elapsed / iters


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="trm_mlp_t_sudoku")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    p.add_argument("--peak-size", type=int, default=2048)
    p.add_argument("--out", type=Path, default=RESULTS / "trainer_gemms.json")
    args = p.parse_args(argv)
    started = time.time()
    arch = arch_of(train_config(args.arch, args.batch, "fp32"))
    cases = gemm_cases(arch, args.batch)
    items = [(prec, c) for prec in DTYPES for c in cases] + [
        (prec, {"name": "peak", "m": args.peak_size, "k": args.peak_size, "n": args.peak_size}) for prec in DTYPES
    ]
    times: dict[tuple[str, str], list[float]] = {(prec, c["name"]): [] for prec, c in items}
    tensors: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for prec, c in items:
        g = torch.Generator().manual_seed(0)
        tensors[(prec, c["name"])] = (
            torch.randn(c["m"], c["k"], generator=g).to(DTYPES[prec]),
            torch.randn(c["k"], c["n"], generator=g).to(DTYPES[prec]),
        )

    def run(item: tuple[str, dict], rnd: int) -> None:
        prec, c = item
        times[(prec, c["name"])].append(time_mm(*tensors[(prec, c["name"])], args.seconds))

    round_robin(items, args.repeats, run)
    peak = {prec: 2 * args.peak_size**3 / median(times[(prec, "peak")]) for prec in DTYPES}
    unpadded_flops = sum(2 * c["m"] * c["k"] * c["n"] for c in cases if not c["padded"])
    rows = []
    for prec, c in items:
        if c["name"] == "peak":
            continue
        flops = 2 * c["m"] * c["k"] * c["n"]
        rate = flops / median(times[(prec, c["name"])])
        rows.append(
            {
                "precision": prec,
                **c,
                "gflop": flops / 1e9,
                "gflops_per_s": rate / 1e9,
                "fraction_of_peak": rate / peak[prec],
                "share_of_block_flops": None if c["padded"] else flops / unpadded_flops,
            }
        )
    # Time-weighted efficiency of the unpadded block: total FLOPs / total time at the measured rates.
    summary = {}
    for prec in DTYPES:
        sel = [r for r in rows if r["precision"] == prec and not r["padded"]]
        total_t = sum(r["gflop"] / r["gflops_per_s"] for r in sel)
        summary[prec] = {
            "peak_gflops_per_s": peak[prec] / 1e9,
            "block_gemm_gflops_per_s": sum(r["gflop"] for r in sel) / total_t,
            "block_gemm_fraction_of_peak": sum(r["gflop"] for r in sel) / total_t / (peak[prec] / 1e9),
        }
    result = {
        "benchmark": "trainer_gemms",
        "machine": machine_info(),
        "arch": args.arch,
        "batch": args.batch,
        "repeats": args.repeats,
        "peak_size": args.peak_size,
        "summary": summary,
        "gemms": rows,
        "wall_s": time.time() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{args.arch} batch {args.batch}: one Block's matmuls, medians of {args.repeats}\n")
    print(
        "| matmul | m x k x n | share of FLOPs | fp32 GFLOP/s | fp32 % peak | bf16 GFLOP/s | bf16 % peak |\n|---|---|---:|---:|---:|---:|---:|"
    )
    by = {(r["precision"], r["name"]): r for r in rows}
    for c in cases:
        f, b = by[("fp32", c["name"])], by[("bf16", c["name"])]
        share = "-" if c["padded"] else f"{100 * f['share_of_block_flops']:.1f}%"
        print(
            f"| {c['name']} | {c['m']}x{c['k']}x{c['n']} | {share} | {f['gflops_per_s']:.0f} | {100 * f['fraction_of_peak']:.0f}% "
            f"| {b['gflops_per_s']:.0f} | {100 * b['fraction_of_peak']:.0f}% |"
        )
    for prec, s in summary.items():
        print(
            f"\n{prec}: peak {s['peak_gflops_per_s']:.0f} GFLOP/s; the block's matmuls together {s['block_gemm_gflops_per_s']:.0f} GFLOP/s "
            f"({100 * s['block_gemm_fraction_of_peak']:.0f}% of peak)",
            end="",
        )
    print(f"\n\nwall {result['wall_s']:.0f} s; JSON: {args.out}")
    return result


if __name__ == "__main__":
    main()
