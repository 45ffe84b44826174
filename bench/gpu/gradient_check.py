"""The train.kernels candidates' first-step loss and gradients against the torch path's and fp32's, alone: part 1 of
bench/gpu/candidates.py as a run of its own (bench/gpu/session.py's gradient check).

    python -m bench.gpu.gradient_check --device cuda                                  # paper MLP-t, batch 32, eager
    python -m bench.gpu.gradient_check --device cpu --quick --out-dir /tmp/r          # Triton's interpreter, tiny arch

A candidate passes when each gradient is no further from fp32 than 2x the torch path's distance in the same
precision (bench.gpu.candidates.gradient_check). Exits 1 when a candidate fails (after writing its results).
"""

from __future__ import annotations

import os
import sys

if [a for i, a in enumerate(sys.argv[1:]) if sys.argv[i] == "--device"][-1:] == ["cpu"]:  # the last, as argparse
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: a fused candidate on a CPU tensor

import argparse
from pathlib import Path
from typing import Any

import torch

from bench._results import run_header, write_results
from bench.gpu import cli
from bench.gpu.candidates import gradient_check, gradient_markdown
from contracts.choices import KERNEL_CHOICES

NAME = "gradient_check"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    cli.add_device(p)
    cli.add_arch(p)
    p.add_argument("--check-batch", type=int, default=None, help="batch of the step (32; 2 with --quick)")
    p.add_argument("--candidates", default="torch,fused_mix_nograd,fused_mix_bwd,fused_mix_swiglu")
    cli.add_precision(p)
    cli.add_quick(p)
    cli.add_output(p, NAME)
    args = p.parse_args(argv)
    args.arch = args.arch or ("tiny" if args.quick else "trm_mlp_t_sudoku")
    args.check_batch = args.check_batch or (2 if args.quick else 32)
    args.candidates = [c for c in args.candidates.split(",") if c]
    unknown = [c for c in args.candidates if c not in KERNEL_CHOICES or c == "auto"]
    if unknown:
        raise SystemExit(f"--candidates {unknown}: not concrete train.kernels choices (trm/kernel_choice.py)")
    result: dict[str, Any] = run_header(NAME, argv)
    result["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    no_state = Path(os.devnull) / "none"  # no saved start: the candidates share the seed's weights
    result["gradient_check"] = gradient_check(args, no_state)
    result["passes"] = all(c["passes"] for c in result["gradient_check"])
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU, Triton's interpreter"
    footer = f"{args.arch}, batch {args.check_batch}, {args.precision}, one eager step against fp32; {where}."
    write_results(
        args.out_name, result, "\n".join([*gradient_markdown(result["gradient_check"]), "", footer]), args.out_dir
    )
    if not result["passes"]:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
