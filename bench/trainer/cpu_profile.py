"""Where a CPU train step's time goes: operator time by kind, and every matmul shape against the CPU's peak.

    python -m bench.trainer.cpu_profile                                  # MLP-t, batch 8, bf16 (the paper preset's), compiled
    python -m bench.trainer.cpu_profile --precision fp32 --out-name cpu_profile_fp32
    python -m bench.trainer.cpu_profile --quick --out-dir /tmp/x                   # smoke run: tiny MLP-t, fp32, eager, 1 step

The real step (bench/_common.StepRunner: `trm.step.train_step` with the paper preset's optimizers) after --warmup
steps (compilation happens there), then --steps steps under torch.profiler (CPU activity, input shapes). Self
time is grouped by kind: matmul (aten mm/bmm/addmm: oneDNN or BLAS), the compiled graphs' own code (inductor's
fused C++ kernels: elementwise, norms, reductions), copies, the optimizer, the rest. Each matmul shape gets its
GFLOP/s against a dense n x n x n torch.matmul measured in the same precision just before, the number the
trainer benchmarks call the peak. It answers "what keeps the step from the peak": bf16 matmuls run at the peak
(or above it) but the fused elementwise code does not get faster with bf16. Never part of the test suite.
Results: <out-dir>/<out-name>.json and .md.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from bench._common import STEP_PROFILE_KEYS, StepRunner, machine_info, matmul_rate, step_profile_parser, train_config
from bench._results import run_header, write_results
from trm.flops import flops_per_sample_step
from trm.model import SwiGLU
from trm.step import carry_dtype

MATMULS = ("aten::mm", "aten::bmm", "aten::addmm")
KINDS = (  # first match wins
    ("matmul", MATMULS),
    ("compiled graph code (inductor kernels)", ("## Call CompiledFxGraph",)),
    ("copies and casts", ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous")),
    ("optimizer", ("aten::atan2", "aten::lerp_", "aten::sqrt", "Optimizer.")),
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16_reference": torch.bfloat16}


def kind_of(name: str) -> str:
    for kind, prefixes in KINDS:
        if any(name.startswith(p) for p in prefixes):
            return kind
    return "other"


def operands(name: str, shapes: list[Any]) -> list[Any]:
    """The two multiplied operands' shapes (addmm's inputs are bias, [m,k], [k,n])."""
    return shapes[1:3] if name == "aten::addmm" else shapes[:2]


def matmul_flops(name: str, shapes: list[Any]) -> int:
    """FLOPs of one call from its input shapes (mm: [m,k]x[k,n]; bmm: [b,m,k]x[b,k,n])."""
    a, b = operands(name, shapes)
    return 2 * a[0] * a[1] * a[2] * b[2] if name == "aten::bmm" else 2 * a[0] * a[1] * b[1]


def _swiglu_product(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up  # what SwiGLU.forward does between its two matmuls


def _plain_product(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return gate * up  # the same memory traffic without the silu


def swiglu_elementwise(runner: StepRunner, shapes: list[dict[str, Any]], dtype: torch.dtype) -> list[dict[str, Any]]:
    """The elementwise middle of each distinct SwiGLU (silu(gate) * up), compiled alone at the step's shape, timed,
    and multiplied by its forward calls per step (the profiled gate_up matmuls: [.., in] x [in, 2 inner]): how
    much of the compiled graphs' time the forward SwiGLUs alone explain, and how much of it is the silu."""
    arch, batch = runner.arch, runner.batch_size
    out, seen = [], set()
    for module in runner.model.modules():
        if not isinstance(module, SwiGLU):
            continue
        width, inner2 = module.gate_up.in_features, module.gate_up.out_features
        if (width, inner2) in seen:
            continue
        seen.add((width, inner2))
        channel = width == arch.hidden_size  # else the MLP-t sequence mixer, whose width is the sequence
        rows = batch * (arch.total_len if channel else arch.hidden_size)
        calls = sum(
            s["calls_per_step"]
            for s in shapes
            if s["shapes"][1][-2:] == [width, inner2] and s["shapes"][0][-1] == width
        )
        x = torch.randn(rows, inner2).to(dtype)
        row: dict[str, Any] = {
            "swiglu": "channel MLP" if channel else "sequence mixer",
            "rows": rows,
            "gate_up_width": inner2,
            "forward_calls_per_step": calls,
        }
        for name, fn in (("silu_times_up", _swiglu_product), ("product_only", _plain_product)):
            compiled = torch.compile(fn)
            compiled(x)
            iters, start = 0, time.perf_counter()
            while time.perf_counter() - start < 0.5 or iters < 5:
                compiled(x)
                iters += 1
            per_call = (time.perf_counter() - start) / iters
            row[f"{name}_ms_per_call"] = 1e3 * per_call
            row[f"{name}_ms_per_step"] = 1e3 * per_call * calls
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = step_profile_parser(__doc__, batch=8, warmup=3, steps=3, out_name="cpu_profile")
    p.add_argument("--matmul-size", type=int, default=2048)
    p.add_argument("--quick", action="store_true", help="smoke run: arch tiny, batch 2, fp32, eager, 1 step")
    args = p.parse_args(argv)
    if args.quick:
        args.arch, args.batch, args.precision, args.compile = "tiny", 2, "fp32", "off"
        args.warmup, args.steps, args.matmul_size = 1, 1, 256
    result: dict[str, Any] = run_header("cpu_profile", argv)
    cfg = train_config(args.arch, args.batch, args.precision, ["experiment=paper_sudoku"])
    runner = StepRunner("step", cfg, args.batch, compile=args.compile, state_dtype=carry_dtype(args.precision))
    for _ in range(args.warmup):
        print(f"  warmup: {runner.step():.3f} s", flush=True)
    peak = matmul_rate(DTYPES[args.precision], args.matmul_size, 1.0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            runner.step()
        wall = time.perf_counter() - start
    by_kind: dict[str, float] = {}
    for event in prof.key_averages():
        by_kind[kind_of(event.key)] = by_kind.get(kind_of(event.key), 0.0) + event.self_cpu_time_total / 1e6
    shapes = []
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key in MATMULS and event.self_cpu_time_total > 0:
            seconds = event.self_cpu_time_total / 1e6
            flops = matmul_flops(event.key, event.input_shapes) * event.count
            shapes.append(
                {
                    "op": event.key,
                    "shapes": operands(event.key, event.input_shapes),
                    "calls_per_step": event.count / args.steps,
                    "ms_per_step": 1e3 * seconds / args.steps,
                    "gflops": flops / seconds / 1e9,
                    "of_peak": flops / seconds / peak,
                }
            )
    shapes.sort(key=lambda s: -s["ms_per_step"])
    swiglus = [] if args.quick else swiglu_elementwise(runner, shapes, DTYPES[args.precision])
    profiled = sum(by_kind.values())
    flops = flops_per_sample_step(runner.arch) * args.batch * args.steps
    result.update(
        {
            "machine": machine_info(),
            **{key: getattr(args, key) for key in STEP_PROFILE_KEYS},
            "wall_s_per_step": wall / args.steps,
            "matmul_peak_gflops": peak / 1e9,
            "flops_per_step": flops / args.steps,  # trm.flops (FlopCounterMode on the step)
            "matmul_flops_per_step": sum(s["gflops"] * 1e9 * s["ms_per_step"] / 1e3 for s in shapes),  # profiled
            "of_peak": flops / wall / peak,
            "s_per_step_by_kind": {k: v / args.steps for k, v in by_kind.items()},
            "matmul_shapes": shapes,
            "swiglu_elementwise": swiglus,
        }
    )
    m = result["machine"]
    lines = [
        f"{args.arch}, batch {args.batch}, {args.precision}, compile={args.compile}; {m['cpu_model']}, "
        f"{m.get('torch_threads')} threads: {1e3 * wall / args.steps:.0f} ms/step under the profiler, "
        f"{100 * result['of_peak']:.1f}% of the {args.precision} matmul peak ({peak / 1e9:.0f} GFLOP/s, "
        f"{args.matmul_size}^3)",
        "",
        "| kind | ms per step | share of the profiled time |",
        "|---|---:|---:|",
        *(
            f"| {k} | {1e3 * v / args.steps:.1f} | {100 * v / profiled:.1f}% |"
            for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        ),
        "",
        "| matmul | shapes | calls/step | ms/step | GFLOP/s | of the peak |",
        "|---|---|---:|---:|---:|---:|",
        *(
            f"| {s['op']} | {' x '.join(str(x) for x in s['shapes'][:2])} | {s['calls_per_step']:.0f} | "
            f"{s['ms_per_step']:.1f} | {s['gflops']:.0f} | {100 * s['of_peak']:.0f}% |"
            for s in shapes[:14]
        ),
    ]
    if swiglus:
        lines += [
            "",
            "| forward SwiGLU middle, compiled alone | rows x 2 inner | calls/step | silu(gate) * up, ms/step | "
            "gate * up only, ms/step |",
            "|---|---|---:|---:|---:|",
            *(
                f"| {w['swiglu']} | {w['rows']} x {w['gate_up_width']} | {w['forward_calls_per_step']:.0f} | "
                f"{w['silu_times_up_ms_per_step']:.1f} | {w['product_only_ms_per_step']:.1f} |"
                for w in swiglus
            ),
        ]
    write_results(args.out_name, result, "\n".join(lines), args.out_dir)
    return result


if __name__ == "__main__":
    main()
