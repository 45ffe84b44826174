"""Learning curves of a fused train.kernels choice, the torch path and the TRM reference from the same initial weights.

    python -m bench.gpu.kernel_curves --device cuda --ref REF_DIR --ref-python python3     # 300 steps, paper MLP-t
    python -m bench.gpu.kernel_curves --device cpu --quick --out-dir /tmp/r                # interpreter, no reference

Each runner trains --steps steps of the real step on the same batch (bench/_common.StepRunner; the reference's in
its worker, bench/trainer/_reference_worker.py), the carry kept across steps: the curve is how fast each fits one batch,
so the three differ by their kernels and rounding only; the paper's optimizer at a constant --lr. The reference's initial state is loaded into ours
(trm.reference_weights, via bench.trainer.vs_reference.build_reference); without --ref the fused runner loads the
torch runner's weights. Every step's mean lm_loss of each runner is recorded, and for each pair the largest
relative difference over the curve and over its last tenth. The steps run in lockstep, one step of each runner in
turn; a runner that raises stops with its error recorded, the others go on. Results: <out-dir>/<out-name>.json (also
written every tenth of the steps, for a run killed at its budget) and .md.
"""

from __future__ import annotations

import os
import sys

if [a for i, a in enumerate(sys.argv[1:]) if sys.argv[i] == "--device"][-1:] == ["cpu"]:  # the last, as argparse
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton loads: a fused choice on CPU tensors

import argparse
import json
import tempfile
import time
import traceback
from itertools import combinations
from pathlib import Path
from typing import Any

import torch

from bench._common import StepRunner, arch_of, train_config
from bench._results import run_header, write_results
from bench.gpu import cli
from bench.trainer.reference_side import ReferenceRunner, ReferenceWorker, build_reference
from contracts.choices import KERNEL_CHOICES
from trm.step import carry_dtype

NAME = "kernel_curves"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    cli.add_reference(p)
    cli.add_device(p)
    cli.add_arch(p)
    p.add_argument("--batch", type=int, default=None, help="the batch every runner fits (96; 2 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="steps of each runner (300; 4 with --quick)")
    p.add_argument("--fused", default="fused_mix_swiglu", help="the fused train.kernels choice")
    cli.add_precision(p)
    p.add_argument("--lr", type=float, default=1e-3, help="optim.lr, constant: no warm-up (the paper's starts at 0)")
    p.add_argument("--compile", default="off", choices=("off", "net", "model"), help="train.compile of ours")
    p.add_argument("--threads", type=int, default=min(8, len(os.sched_getaffinity(0))))
    cli.add_quick(p, "tiny arch, batch 2, 4 steps: the interpreter's sizes")
    cli.add_output(p, NAME)
    args = p.parse_args(argv)
    args.arch = args.arch or ("tiny" if args.quick else "trm_mlp_t_sudoku")
    args.batch = args.batch or (2 if args.quick else 96)
    args.steps = args.steps or (4 if args.quick else 300)
    if args.fused not in KERNEL_CHOICES or args.fused in ("auto", "torch"):
        raise SystemExit(
            f"--fused {args.fused}: a fused train.kernels choice (trm/kernel_choice.py), not auto or torch"
        )
    return args


def differences(curves: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Each pair of curves over the steps both reached: the largest |a - b| / |b| over all of them and over the
    last tenth (at least one step), and both curves' last values."""
    rows = []
    for a, b in combinations(curves, 2):
        n = min(len(curves[a]), len(curves[b]))
        if n == 0:
            rows.append({"pair": [a, b], "steps": 0})
            continue
        rel = [abs(x - y) / max(abs(y), 1e-30) for x, y in zip(curves[a][:n], curves[b][:n])]
        tail = max(1, n // 10)
        rows.append(
            {
                "pair": [a, b],
                "steps": n,
                "max_relative_difference": max(rel),
                "max_relative_difference_last_tenth": max(rel[-tail:]),
                "last": [curves[a][n - 1], curves[b][n - 1]],
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    curves, args = result["curves"], result["args"]
    marks = sorted({0, *range(args["steps"] // 4 - 1, args["steps"], max(1, args["steps"] // 4))})
    names = list(curves)
    lines = [
        "| step | " + " | ".join(f"{n} lm_loss" for n in names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for i in marks:
        cells = [f"{curves[n][i]:.4f}" if i < len(curves[n]) else "-" for n in names]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines += ["", "| pair | steps | max relative difference | over the last tenth |", "|---|---:|---:|---:|"]
    for d in result["differences"]:
        if not d["steps"]:
            lines.append(f"| {' vs '.join(d['pair'])} | 0 | - | - |")
            continue
        lines.append(
            f"| {' vs '.join(d['pair'])} | {d['steps']} | {d['max_relative_difference']:.4f} "
            f"| {d['max_relative_difference_last_tenth']:.4f} |"
        )
    errors = [f"{n}: {e}" for n, e in result["errors"].items() if e]
    lines += [
        "",
        f"{args['arch']}, batch {args['batch']} (one batch, fitted), {args['precision']}, train.compile="
        f"{args['compile']}, {args['steps']} steps, same initial weights"
        + ("" if args["ref"] else "; **reference not run (no --ref)**")
        + (f"; errors: {'; '.join(errors)}" if errors else "")
        + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.time()
    result: dict[str, Any] = run_header(NAME, argv)
    overrides = ["experiment=paper_sudoku", f"optim.lr={args.lr}", "optim.warmup_steps=1"]
    cfg = train_config(args.arch, args.batch, args.precision, overrides)
    arch = arch_of(cfg)
    dtype = carry_dtype(args.precision)
    ours = {
        kernels: StepRunner(
            f"ours {kernels}", cfg, args.batch, compile=args.compile, kernels=kernels, state_dtype=dtype,
            device=args.device,
        )
        for kernels in ("torch", args.fused)
    }  # fmt: skip
    runners: dict[str, StepRunner | ReferenceRunner] = {f"ours {k}": r for k, r in ours.items()}
    worker = ReferenceWorker(args.ref, args.ref_python, args.threads, args.device) if args.ref else None
    state_path = Path(tempfile.mkdtemp(prefix="trm-curves-")) / "state.pt"
    curves: dict[str, list[float]] = {name: [] for name in runners}

    def record() -> None:  # the JSON so far: a run killed at its budget keeps the steps it took
        result.update(
            {
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "curves": curves,
                "errors": {name: runner.error for name, runner in runners.items()},
                "differences": differences(curves),
                "wall_s": time.time() - started,
            }
        )
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / f"{args.out_name}.json").write_text(json.dumps(result, indent=2))

    try:
        if worker is not None:
            runners["reference"] = build_reference(
                worker, "reference", ours["torch"], arch, args.compile != "off", "bfloat16", state_path
            )
            curves["reference"] = []
        ours[args.fused].model.load_state_dict(ours["torch"].model.state_dict())  # the reference's, when loaded
        for step in range(args.steps):
            for name, runner in runners.items():
                if runner.error:
                    continue
                try:
                    runner.step()
                    loss = runner.lm_loss if isinstance(runner, ReferenceRunner) else runner.last_lm_loss()
                except Exception as err:  # noqa: BLE001 - a failing runner is a result; the others go on
                    traceback.print_exc(limit=5)
                    runner.error = f"step {step + 1}: {type(err).__name__}: {err}"[:500]
                    continue
                assert loss is not None
                curves[name].append(loss)
            if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
                shown = ", ".join(f"{n} {c[-1]:.4f}" for n, c in curves.items() if c)
                print(f"  step {step + 1}: {shown}", flush=True)
                record()
    finally:
        if worker is not None:
            worker.close()
        state_path.unlink(missing_ok=True)
        state_path.parent.rmdir()
    record()
    write_results(args.out_name, result, markdown(result), args.out_dir)
    return result


if __name__ == "__main__":
    main()
