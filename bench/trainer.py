"""Trainer benchmark: seconds per real train step of a paper TRM config, fp32 vs bf16, eager vs torch.compile.

    python bench/trainer.py                       # MLP-t (trm_mlp_t_sudoku), batch 64, fp32+bf16, eager, 3 repeats
    python bench/trainer.py --compile             # ... plus torch.compile variants (compile time reported apart)
    python bench/trainer.py --arch trm_att_sudoku --batch 32
    python bench/trainer.py --quick               # smoke run: batch 8, 2 repeats, -> results/trainer_quick.json

Each variant owns a real ACTModel, the optimizers of trm.optim.build_optimizers (Adam-atan2 + SignSGD), the
model's own carry (kept across steps) and a Sudoku-shaped batch; one step is `trm.train.train_step` (autocast
from train.precision, stablemax loss, backward, optimizer step). After `--warmup` steps per variant, the
variants and a dense matmul peak (fp32 and bf16 torch.matmul, n x n) are run round-robin `--repeats` times;
every figure is a median. FLOPs per sample-step come from trm.info.flops_per_sample_step (FlopCounterMode on
the real step); achieved FLOP/s = flops * batch / s_per_step, utilization = achieved / matmul peak of the
same dtype. A markdown table is printed; JSON goes to bench/results/trainer.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from _common import RESULTS, StepRunner, arch_of, machine_info, matmul_rate, median, round_robin, train_config  # noqa: E402

from trm.info import flops_per_sample_step  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="trm_mlp_t_sudoku", help="conf/arch preset (trm_mlp_t_sudoku | trm_att_sudoku | tiny)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 64; 8 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="measured steps per variant (default 3; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps per variant first (compile happens here)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma list of train.precision values")
    p.add_argument("--compile", action="store_true", help="also run torch.compile(model) variants")
    p.add_argument("--compile-precisions", default=None, help="precisions to compile (default: all of --precisions)")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n x n peak matmul")
    p.add_argument("--matmul-seconds", type=float, default=None, help="time per peak measurement (default 2; 0.5 with --quick)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="smoke run: batch 8, 2 repeats, short matmul timing")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/trainer.json, trainer_quick.json with --quick)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides of the train config (e.g. train.loss=softmax)")
    args = p.parse_args(argv)
    args.batch = args.batch or (8 if args.quick else 64)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.matmul_seconds = args.matmul_seconds or (0.5 if args.quick else 2.0)
    args.out = args.out or RESULTS / ("trainer_quick.json" if args.quick else "trainer.json")
    args.precisions = [s for s in args.precisions.split(",") if s]
    args.compile_precisions = (
        [s for s in args.compile_precisions.split(",") if s] if args.compile_precisions else list(args.precisions)
    ) if args.compile else []
    for prec in args.precisions + args.compile_precisions:
        if prec not in DTYPES:
            raise SystemExit(f"unknown precision {prec!r}: expected fp32 or bf16")
    return args


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.time()
    info = machine_info()
    cfg0 = train_config(args.arch, args.batch, "fp32", args.overrides)
    arch = arch_of(cfg0)
    flops = flops_per_sample_step(arch)
    print(f"# {args.arch} batch {args.batch}: {flops / 1e9:.2f} GFLOP per sample-step, "
          f"{flops * args.batch / 1e12:.3f} TFLOP per step; {info['cpu_model']}, {info['torch_threads']} threads", flush=True)

    runners: list[StepRunner] = []
    for prec in args.precisions:
        runners.append(StepRunner(f"{prec} eager", train_config(args.arch, args.batch, prec, args.overrides), args.batch))
    for prec in args.compile_precisions:
        runners.append(StepRunner(f"{prec} compile", train_config(args.arch, args.batch, prec, args.overrides), args.batch, compile=True))
    peaks: dict[str, list[float]] = {p: [] for p in DTYPES}

    # Warmup (and compilation) first, one variant after another: first-step time is reported, not measured.
    for runner in runners:
        for i in range(args.warmup):
            try:
                seconds = runner.step()
            except Exception as err:  # a failing compile is a result, not a crash
                runner.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                print(f"  {runner.name}: FAILED in warmup: {runner.error}", flush=True)
                traceback.print_exc(limit=3)
                break
            if i == 0:
                runner.first_step_s = seconds
            print(f"  warmup {runner.name}: {seconds:.2f} s", flush=True)
    live = [r for r in runners if r.error is None]
    if args.compile:
        import torch._dynamo.utils as dynamo_utils
        graphs_before = dict(dynamo_utils.counters["stats"])

    def run(item: Any, rnd: int) -> None:
        if isinstance(item, str):
            rate = matmul_rate(DTYPES[item], args.matmul_size, args.matmul_seconds)
            peaks[item].append(rate)
            print(f"  round {rnd + 1} matmul {item}: {rate / 1e9:.1f} GFLOP/s", flush=True)
            return
        try:
            seconds = item.step()
        except Exception as err:
            item.error = f"{type(err).__name__}: {err}"
            print(f"  {item.name}: FAILED: {item.error}", flush=True)
            return
        item.times.append(seconds)
        print(f"  round {rnd + 1} {item.name}: {seconds:.2f} s", flush=True)

    round_robin([*live, *DTYPES], args.repeats, lambda item, rnd: None if (not isinstance(item, str) and item.error) else run(item, rnd))

    peak = {p: median(v) for p, v in peaks.items()}
    rows = []
    for r in runners:
        prec = r.cfg.train.precision
        s = median(r.times)
        achieved = flops * args.batch / s if s else None
        row = {
            "variant": r.name,
            "precision": prec,
            "compiled": r.compile,
            "times_s": [round(t, 4) for t in r.times],
            "median_s_per_step": s,
            "min_s_per_step": min(r.times) if r.times else None,
            "samples_per_s": args.batch / s if s else None,
            "achieved_flops": achieved,
            "utilization_vs_matmul_peak": achieved / peak[prec] if achieved and peak[prec] else None,
            "first_step_s": r.first_step_s,
            "error": r.error,
        }
        rows.append(row)
    eager = {row["precision"]: row["median_s_per_step"] for row in rows if not row["compiled"]}
    compiled_ = {row["precision"]: row["median_s_per_step"] for row in rows if row["compiled"]}
    for row in rows:
        if row["compiled"] and row["first_step_s"] and row["median_s_per_step"]:
            row["compile_s"] = row["first_step_s"] - row["median_s_per_step"]  # first call minus a steady step
    if args.compile:
        after = dict(dynamo_utils.counters["stats"])
        recompiles = {k: after.get(k, 0) - graphs_before.get(k, 0) for k in after if after.get(k, 0) != graphs_before.get(k, 0)}
    result = {
        "benchmark": "trainer",
        "machine": {**info, "loadavg_end": list(__import__("os").getloadavg())},
        "arch": args.arch,
        "arch_config": vars(arch),
        "batch": args.batch,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "overrides": args.overrides,
        "flops_per_sample_step": flops,
        "flops_per_step": flops * args.batch,
        "params": runners[0].params,
        "matmul": {"n": args.matmul_size, "seconds_each": args.matmul_seconds,
                   "flops_samples": {p: v for p, v in peaks.items()}, "median_flops": peak},
        "variants": rows,
        "bf16_speedup_eager": eager["fp32"] / eager["bf16"] if eager.get("fp32") and eager.get("bf16") else None,
        "compile_speedup": {p: eager[p] / compiled_[p] for p in compiled_ if compiled_[p] and eager.get(p)},
        "dynamo_stats_during_measurement": recompiles if args.compile else None,
        "wall_s": time.time() - started,
        "command": "python bench/trainer.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print()
    print(markdown(result))
    print(f"\nwall {result['wall_s']:.0f} s; JSON: {args.out}")
    return result


def markdown(result: dict[str, Any]) -> str:
    peak = result["matmul"]["median_flops"]
    lines = [
        f"{result['arch']}, batch {result['batch']}, {result['flops_per_step'] / 1e12:.3f} TFLOP/step "
        f"({result['flops_per_sample_step'] / 1e9:.2f} GFLOP/sample-step); medians of {result['repeats']} steps",
        "",
        "| variant | s/step (median) | min | samples/s | achieved GFLOP/s | matmul peak GFLOP/s | utilization | first step s | compile s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["variants"]:
        if row["error"] and not row["times_s"]:
            lines.append(f"| {row['variant']} | failed: {row['error'][:80]} | | | | | | | |")
            continue
        util = row["utilization_vs_matmul_peak"]
        lines.append(
            f"| {row['variant']} | {fmt(row['median_s_per_step'], '.2f')} | {fmt(row['min_s_per_step'], '.2f')} "
            f"| {fmt(row['samples_per_s'], '.2f')} | {fmt(row['achieved_flops'] and row['achieved_flops'] / 1e9, '.1f')} "
            f"| {fmt(peak[row['precision']] and peak[row['precision']] / 1e9, '.1f')} | {fmt(util and 100 * util, '.1f')}% "
            f"| {fmt(row['first_step_s'], '.1f')} | {fmt(row.get('compile_s'), '.1f')} |"
        )
    n = result["matmul"]["n"]
    lines.append("")
    lines.append(f"Dense peak: torch.matmul {n}x{n}x{n}, fp32 {fmt(peak['fp32'] and peak['fp32'] / 1e9, '.1f')} GFLOP/s, "
                 f"bf16 {fmt(peak['bf16'] and peak['bf16'] / 1e9, '.1f')} GFLOP/s (medians, interleaved with the steps).")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
