"""Where a GPU train step's time goes: kernel time by kind, and how much of the step the GPU is busy at all.

    python -m bench.gpu.profile --batch 768                  # MLP-t, bf16 (the paper preset's bf16_reference), compiled
    python -m bench.gpu.profile --arch trm_att_sudoku --compile off --out-name gpu_profile_att

The real step (bench/_common.StepRunner: `trm.step.train_step` with the paper preset's optimizers) after
--warmup steps (compilation happens there), then --steps steps under torch.profiler (CPU + CUDA activity).
Kernels are grouped by name: matmul (cuBLAS/CUTLASS/nvjet GEMMs), fused (Triton kernels that torch.compile
generated), aten (eager elementwise/reduction kernels), copies and memsets; "busy" is the sum of kernel time over
the wall time of the profiled steps (the rest is the GPU idle: launch gaps, host work, syncs). Needs a CUDA GPU;
never part of the test suite. Results: <out-dir>/<out-name>.json and .md.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bench._common import STEP_PROFILE_KEYS, StepRunner, machine_info, step_profile_parser, train_config
from bench._results import run_header, write_results
from trm.flops import flops_per_sample_step
from trm.step import carry_dtype

KINDS = (  # first match wins; names are lower-cased
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "wgmma")),
    ("ours (trm/fused_*.py)", ("_mix_kernel", "_mix_grad_kernel", "_swiglu_kernel", "_swiglu_grad_kernel")),
    ("fused (triton)", ("triton",)),
    ("copies", ("memcpy", "memset", "copy")),
    ("aten elementwise / reduce", ("elementwise", "vectorized", "reduce", "kernel")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, marks in KINDS if any(m in low for m in marks)), "other")


def kernel_times(prof: Any) -> dict[str, dict[str, float]]:
    """Self device time (s) and launches per kernel name, the device's events only."""
    out: dict[str, dict[str, float]] = {}
    for event in prof.key_averages():
        if "cuda" not in str(getattr(event, "device_type", "")).lower():
            continue
        seconds = float(getattr(event, "self_device_time_total", 0.0)) / 1e6
        if seconds > 0:
            out[event.key] = {"s": seconds, "count": float(event.count)}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = step_profile_parser(__doc__, batch=768, warmup=2, steps=5, out_name="gpu_profile")
    p.add_argument("--kernels", default="torch", help="a concrete train.kernels choice (trm/kernel_choice.py)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu/profile.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    result: dict[str, Any] = run_header("gpu_profile", argv)
    cfg = train_config(args.arch, args.batch, args.precision, ["experiment=paper_sudoku"])
    runner = StepRunner(
        "step",
        cfg,
        args.batch,
        compile=args.compile,
        kernels=args.kernels,
        state_dtype=carry_dtype(args.precision),
        device="cuda",
    )
    for _ in range(args.warmup):
        print(f"  warmup: {runner.step():.3f} s", flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            runner.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = kernel_times(prof)
    by_kind: dict[str, float] = {}
    for name, k in kernels.items():
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + k["s"]
    busy = sum(by_kind.values())
    flops = flops_per_sample_step(runner.arch) * args.batch * args.steps
    top = sorted(kernels.items(), key=lambda kv: -kv[1]["s"])[:15]
    result.update(
        {
            "machine": {**machine_info(), "gpu": torch.cuda.get_device_name(0)},
            **{key: getattr(args, key) for key in STEP_PROFILE_KEYS},
            "wall_s_per_step": wall / args.steps,
            "profiled_tflops": flops / wall / 1e12,
            "kernel_s_per_step": {k: v / args.steps for k, v in by_kind.items()},
            "busy_share": busy / wall,
            "launches_per_step": sum(k["count"] for k in kernels.values()) / args.steps,
            "top_kernels": [{"name": n[:120], "kind": kind_of(n), **k} for n, k in top],
        }
    )
    lines = [
        f"{args.arch}, batch {args.batch}, {args.precision}, compile={args.compile}, kernels={args.kernels}, "
        f"{result['machine']['gpu']}: "
        f"{1e3 * wall / args.steps:.1f} ms/step under the profiler ({result['profiled_tflops']:.0f} TFLOP/s), "
        f"GPU busy {100 * busy / wall:.0f}% of it, {result['launches_per_step']:.0f} kernel launches per step",
        "",
        "| kernels | ms per step | share of the step's wall time |",
        "|---|---:|---:|",
        *(
            f"| {k} | {1e3 * v / args.steps:.2f} | {100 * v / wall:.1f}% |"
            for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        ),
        f"| idle (launch gaps, host work) | {1e3 * (wall - busy) / args.steps:.2f} | {100 * (wall - busy) / wall:.1f}% |",
        "",
        "Top kernels: " + "; ".join(f"{n[:60]} ({kind_of(n)}) {1e3 * k['s'] / args.steps:.2f} ms" for n, k in top[:8]),
    ]
    write_results(args.out_name, result, "\n".join(lines), args.out_dir)
    return result


if __name__ == "__main__":
    main()
