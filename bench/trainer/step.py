"""Trainer benchmark: seconds per real train step of a paper TRM config, fp32 vs bf16, eager vs torch.compile.

    python -m bench.trainer.step                       # MLP-t (trm_mlp_t_sudoku), batch 64, fp32+bf16, eager, 3 repeats
    python -m bench.trainer.step --compile             # ... plus torch.compile variants (compile time reported apart)
    python -m bench.trainer.step --arch trm_att_sudoku --batch 32
    python -m bench.trainer.step --quick               # smoke run: batch 8, 2 repeats, -> results/trainer_quick.json
    python -m bench.trainer.step --render bench/results/trainer.json   # recompute + print the table of a saved run

Each variant owns a real ACTModel, the optimizers of trm.optim.build_optimizers (Adam-atan2 + SignSGD), the
model's own carry (kept across steps) and a Sudoku-shaped batch; one step is `trm.step.train_step` (autocast
from train.precision, stablemax loss, backward, optimizer step). After `--warmup` steps per variant, the
variants and a dense matmul peak (fp32 and bf16 torch.matmul, n x n) are run round-robin `--repeats` times;
every figure is a median (utilization and speedups: medians of same-round ratios). FLOPs per sample-step come from trm.flops.flops_per_sample_step (FlopCounterMode on
the real step); achieved FLOP/s = flops * batch / s_per_step, utilization = achieved / matmul peak of the
same dtype. A markdown table is printed; JSON goes to bench/results/trainer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from bench._common import RESULTS, StepRunner, arch_of, machine_info, matmul_rate, median, round_robin, train_config
from trm.flops import flops_per_sample_step

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--arch", default="trm_mlp_t_sudoku", help="conf/arch preset (trm_mlp_t_sudoku | trm_att_sudoku | tiny)"
    )
    p.add_argument("--batch", type=int, default=None, help="batch size (default 64; 8 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="measured steps per variant (default 3; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps per variant first (compile happens here)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma list of train.precision values")
    p.add_argument("--compile", action="store_true", help="also run torch.compile(model) variants")
    p.add_argument("--compile-precisions", default=None, help="precisions to compile (default: all of --precisions)")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n x n peak matmul")
    p.add_argument(
        "--matmul-seconds", type=float, default=None, help="time per peak measurement (default 2; 0.5 with --quick)"
    )
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="let torch.compile use its on-disk cache (default: a fresh cache dir, so compile time is a cold compile)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the steps and the peak run")
    p.add_argument("--quick", action="store_true", help="smoke run: batch 8, 2 repeats, short matmul timing")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default bench/results/trainer.json, trainer_quick.json with --quick)",
    )
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides of the train config (e.g. train.loss=softmax)")
    args = p.parse_args(argv)
    args.batch = args.batch or (8 if args.quick else 64)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.matmul_seconds = args.matmul_seconds or (0.5 if args.quick else 2.0)
    args.out = args.out or RESULTS / ("trainer_quick.json" if args.quick else "trainer.json")
    args.precisions = [s for s in args.precisions.split(",") if s]
    args.compile_precisions = (
        ([s for s in args.compile_precisions.split(",") if s] if args.compile_precisions else list(args.precisions))
        if args.compile
        else []
    )
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
    cache_dir = None
    if args.compile and not args.warm_cache:  # inductor reads the variable when it first needs its cache
        cache_dir = tempfile.mkdtemp(prefix="trainer-bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    cfg0 = train_config(args.arch, args.batch, "fp32", args.overrides)
    arch = arch_of(cfg0)
    flops = flops_per_sample_step(arch)
    print(
        f"# {args.arch} batch {args.batch}: {flops / 1e9:.2f} GFLOP per sample-step, "
        f"{flops * args.batch / 1e12:.3f} TFLOP per step; {info['cpu_model']}, {info['torch_threads']} threads",
        flush=True,
    )

    runners: list[StepRunner] = []
    for prec in args.precisions:
        runners.append(
            StepRunner(
                f"{prec} eager",
                train_config(args.arch, args.batch, prec, args.overrides),
                args.batch,
                device=args.device,
            )
        )
    for prec in args.compile_precisions:
        runners.append(
            StepRunner(
                f"{prec} compile",
                train_config(args.arch, args.batch, prec, args.overrides),
                args.batch,
                compile="model",
                device=args.device,
            )
        )

    warm_up(runners, args.warmup)
    if args.compile:
        import torch._dynamo.utils as dynamo_utils

        graphs_before = dict(dynamo_utils.counters["stats"])
    matmul = measure(runners, args.repeats, args.matmul_size, args.matmul_seconds, device=args.device)
    rows = [variant_row(r, r.cfg.train.precision, r.compile != "off") for r in runners]
    if args.compile:
        after = dict(dynamo_utils.counters["stats"])
        recompiles = {
            k: after.get(k, 0) - graphs_before.get(k, 0) for k in after if after.get(k, 0) != graphs_before.get(k, 0)
        }
    result = {
        "benchmark": "trainer",
        "machine": {
            **info,
            "loadavg_end": list(os.getloadavg()),
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        },
        "compile_cache": "warm (default on-disk cache)" if args.warm_cache else "cold (fresh TORCHINDUCTOR_CACHE_DIR)",
        "arch": args.arch,
        "arch_config": vars(arch),
        "batch": args.batch,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "overrides": args.overrides,
        "flops_per_sample_step": flops,
        "flops_per_step": flops * args.batch,
        "params": runners[0].params,
        "matmul": matmul,
        "variants": rows,
        "dynamo_stats_during_measurement": recompiles if args.compile else None,
        "wall_s": time.time() - started,
        "command": "python -m bench.trainer.step " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    summarize(result)
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print()
    print(markdown(result))
    print(f"\nwall {result['wall_s']:.0f} s; JSON: {args.out}")
    return result


def warm_up(runners: list[Any], warmup: int) -> None:
    """`warmup` unmeasured steps per runner, one runner after another (compilation happens here): the first
    step's time is reported (runner.first_step_s), not measured. A runner that fails gets runner.error (a
    failing compile is a result, not a crash) and is left out afterwards. Runners: StepRunner, or any object
    with its name / step() / first_step_s / error / times / rounds."""
    for runner in runners:
        for i in range(warmup):
            try:
                seconds = runner.step()
            except Exception as err:  # noqa: BLE001 - a failing variant is a row, not the bench's end
                runner.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                print(f"  {runner.name}: FAILED in warmup: {runner.error}", flush=True)
                traceback.print_exc(limit=3)
                break
            if i == 0:
                runner.first_step_s = seconds
            print(f"  warmup {runner.name}: {seconds:.2f} s", flush=True)


def measure(
    runners: list[Any],
    repeats: int,
    matmul_size: int,
    matmul_seconds: float,
    layouts: tuple[str, ...] = ("nn",),
    device: str = "cpu",
) -> dict[str, Any]:
    """The runners that have not failed and a dense matmul peak per dtype of DTYPES, round-robin `repeats`
    times (step times go to runner.times / runner.rounds). A round's peak is the fastest of `layouts`
    (_common.MATMUL_LAYOUTS). Returns the result's "matmul" part."""
    peaks: dict[str, list[float]] = {p: [] for p in DTYPES}
    peak_rounds: dict[str, list[int]] = {p: [] for p in DTYPES}
    by_layout: dict[str, list[dict[str, float]]] = {p: [] for p in DTYPES}

    def run(item: Any, rnd: int) -> None:
        if isinstance(item, str):
            rates = {
                layout: matmul_rate(DTYPES[item], matmul_size, matmul_seconds, layout, device) for layout in layouts
            }
            peaks[item].append(max(rates.values()))
            peak_rounds[item].append(rnd)
            by_layout[item].append(rates)
            shown = ", ".join(f"{layout} {rate / 1e9:.1f}" for layout, rate in rates.items())
            print(f"  round {rnd + 1} matmul {item}: {shown} GFLOP/s", flush=True)
            return
        if item.error:
            return
        try:
            seconds = item.step()
        except Exception as err:  # noqa: BLE001 - a failing variant is a row, not the bench's end
            item.error = f"{type(err).__name__}: {err}"
            print(f"  {item.name}: FAILED: {item.error}", flush=True)
            return
        item.times.append(seconds)
        item.rounds.append(rnd)
        print(f"  round {rnd + 1} {item.name}: {seconds:.2f} s", flush=True)

    round_robin([*(r for r in runners if r.error is None), *DTYPES], repeats, run)
    return {
        "n": matmul_size,
        "seconds_each": matmul_seconds,
        "layouts": list(layouts),
        "flops_samples": peaks,
        "rounds": peak_rounds,
        "flops_by_layout": by_layout,
    }


def variant_row(runner: Any, precision: str, compiled: bool) -> dict[str, Any]:
    """A runner's raw times as a result row; `precision` (fp32 | bf16) picks the matmul peak it is read against."""
    return {
        "variant": runner.name,
        "precision": precision,
        "compiled": compiled,
        "times_s": [round(t, 4) for t in runner.times],
        "rounds": runner.rounds,
        "first_step_s": runner.first_step_s,
        "error": runner.error,
    }


def paired_ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """Median over the rounds both rows ran of a's time / b's time (> 1: b is faster)."""
    ta, tb = dict(zip(a["rounds"], a["times_s"])), dict(zip(b["rounds"], b["times_s"]))
    return median([ta[r] / tb[r] for r in ta if r in tb])


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Derived figures from the raw per-round times (in place). The machine's load changes between rounds, so
    utilization is the median over rounds of (step FLOP/s / matmul peak of the same dtype in the same round),
    which cancels the weather better than a ratio of two medians; the latter is kept as well."""
    flops_step = result["flops_per_step"]
    mm = result["matmul"]
    peak_by_round = {p: dict(zip(mm["rounds"][p], mm["flops_samples"][p])) for p in mm["flops_samples"]}
    mm["median_flops"] = {p: median(v) for p, v in mm["flops_samples"].items()}
    for row in result["variants"]:
        times, prec = row["times_s"], row["precision"]
        s = median(times)
        paired = [
            flops_step / t / peak_by_round[prec][r] for t, r in zip(times, row["rounds"]) if r in peak_by_round[prec]
        ]
        row.update(
            {
                "median_s_per_step": s,
                "min_s_per_step": min(times) if times else None,
                "samples_per_s": result["batch"] / s if s else None,
                "achieved_flops": flops_step / s if s else None,
                "utilization_vs_matmul_peak": median(paired),
                "utilization_ratio_of_medians": flops_step / s / mm["median_flops"][prec]
                if s and mm["median_flops"][prec]
                else None,
            }
        )
        if row["compiled"] and row["first_step_s"] and s:
            row["compile_s"] = row["first_step_s"] - s  # first call minus a steady step: an estimate
    eager = {r["precision"]: r for r in result["variants"] if not r["compiled"] and r["times_s"]}
    comp = {r["precision"]: r for r in result["variants"] if r["compiled"] and r["times_s"]}

    result["bf16_speedup_eager"] = (
        paired_ratio(eager["fp32"], eager["bf16"]) if {"fp32", "bf16"} <= eager.keys() else None
    )
    result["compile_speedup"] = {p: paired_ratio(eager[p], comp[p]) for p in comp if p in eager}
    return result


def markdown(result: dict[str, Any]) -> str:
    peak = result["matmul"]["median_flops"]
    lines = [
        f"{result['arch']}, batch {result['batch']}, {result['flops_per_step'] / 1e12:.3f} TFLOP/step "
        f"({result['flops_per_sample_step'] / 1e9:.2f} GFLOP/sample-step); medians of {result['repeats']} round-robin steps",
        "",
        "| variant | s/step (median) | min | samples/s | achieved GFLOP/s | matmul peak GFLOP/s | utilization (same-round) | first step s | compile s |",
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
    lines.append(
        f"Dense peak: torch.matmul {n}x{n}x{n}, fp32 {fmt(peak['fp32'] and peak['fp32'] / 1e9, '.1f')} GFLOP/s, "
        f"bf16 {fmt(peak['bf16'] and peak['bf16'] / 1e9, '.1f')} GFLOP/s (medians, interleaved with the steps)."
    )
    speed = [f"bf16 vs fp32 eager {result['bf16_speedup_eager']:.2f}x"] if result.get("bf16_speedup_eager") else []
    speed += [f"compile vs eager ({p}) {v:.2f}x" for p, v in (result.get("compile_speedup") or {}).items() if v]
    if speed:
        lines.append("Speedups (median of same-round ratios): " + ", ".join(speed) + ".")
    return "\n".join(lines)


def render(path: Path) -> None:
    """Recompute the derived figures of a saved JSON (e.g. after changing summarize) and print its table."""
    result = summarize(json.loads(path.read_text()))
    path.write_text(json.dumps(result, indent=2, default=str))
    print(markdown(result))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--render":
        render(Path(sys.argv[2]))
    else:
        main()
