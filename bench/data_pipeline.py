"""The data path: how long the paper's Sudoku training set takes to build from a CSV, and whether the loader
can ever be what a trainer waits on.

    python -m bench.data_pipeline                  # 1,000 puzzles x 1,000 augmentations, 3 repeats
    python -m bench.data_pipeline --quick --out-dir /tmp/d   # smoke run: 50 x 20, 1 repeat

Build: `trm.data.build.build_from_csv` (what `python -m trm.data.build --source csv` runs) on a CSV in the
Sudoku-Extreme format (source,question,answer,rating) of `--csv-rows` valid puzzles, subsampled to `--puzzles`
with `--aug` augmentations each (1,000 x 1,000 = 1M training examples, as the TRM paper), timed whole and
by phase (read + validate, augment, write + fingerprint). The CSV holds generated puzzles (the real set cannot
be downloaded here); reading, validation and augmentation cost the same per row whatever the puzzle.

Loader: `trm.data.loader.TrainLoader` over the built split (memory-mapped, as training reads it), batches
per second at the per-host batch of a global batch of 768 on v4-8 (1 host: 768), v4-32 (4 hosts: 192) and
v4-64 (8 hosts: 96), after one warm pass (page cache). Demand: steps per second of the trainer, measured
here for the tiny CPU preset, and estimated for the paper MLP-t config on each pod from its measured FLOPs
per sample-step and the sweep config's TPU peak and utilization (`estimate.*` in conf/sweep.yaml).
Headroom = loader batches/s / trainer steps/s (the goal: >= 50x). Writes bench/results/data_pipeline.json/.md.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench._results import RESULTS, fmt, median, run_header, write_results
from sweeps.config.compose import compose_sweep_config
from trm.data.build import _arrays, build_from_csv
from trm.data.format import load_split, write_split
from trm.data.loader import TrainLoader
from trm.data.sudoku import augment, generate
from trm.data.sudoku_csv import read_csv

GLOBAL_BATCH = 768  # the paper's
CHIPS_PER_HOST = 4  # TPU v4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--puzzles", type=int, default=1000, help="training puzzles kept from the CSV")
    p.add_argument("--aug", type=int, default=999, help="augmented copies per puzzle (999 + the original = 1,000)")
    p.add_argument("--csv-rows", type=int, default=10000, help="rows in the training CSV (subsampled to --puzzles)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=500, help="batches timed per loader measurement")
    p.add_argument("--trainer-steps", type=int, default=5, help="timed tiny-preset train steps (after 2 warm-up)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="50 puzzles x 20, 200-row CSV, 1 repeat, 20 batches")
    args = p.parse_args(argv)
    if args.quick:
        args.puzzles, args.aug, args.csv_rows, args.repeats, args.batches, args.trainer_steps = 50, 19, 200, 1, 20, 2
    if args.csv_rows < args.puzzles:
        raise SystemExit(f"--csv-rows={args.csv_rows} must be >= --puzzles={args.puzzles}")
    return args


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def write_csv(path: Path, puzzles: np.ndarray, solutions: np.ndarray) -> None:
    """Sudoku-Extreme's CSV layout: '.' for a blank, digits as characters, a rating column."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["source", "question", "answer", "rating"])
        for i, (p, s) in enumerate(zip(puzzles, solutions)):
            out.writerow(["bench", "".join("." if c == 0 else str(c) for c in p), "".join(map(str, s)), i % 50])


def make_csvs(work: Path, rows: int, test_rows: int) -> tuple[Path, Path]:
    """Valid (puzzle, solution) rows quickly: a few generated puzzles, each augmented into many."""
    base_p, base_s = generate(max(10, rows // 100), blanks=45, seed=7)
    per = -(-(rows + test_rows) // len(base_p))
    all_p, all_s, _ = augment(base_p, base_s, per - 1, np.random.default_rng(7))
    train, test = work / "train.csv", work / "test.csv"
    write_csv(train, all_p[:rows], all_s[:rows])
    write_csv(test, all_p[rows : rows + test_rows], all_s[rows : rows + test_rows])
    return train, test


def bench_build(args: argparse.Namespace, work: Path, train_csv: Path, test_csv: Path) -> dict[str, Any]:
    """The whole build, and its phases called one by one (same seed, same sizes)."""
    totals, reads, augments, writes = [], [], [], []
    for r in range(args.repeats):
        out = work / "dataset"
        shutil.rmtree(out, ignore_errors=True)
        seconds, summary = timed(
            lambda: build_from_csv(out, train_csv, test_csv, subsample=args.puzzles, num_aug=args.aug, seed=0)
        )
        totals.append(seconds)
        t, (p, s) = timed(lambda: read_csv(train_csv, subsample=args.puzzles, seed=r))
        reads.append(t)
        t, (ap, asol, _) = timed(lambda: augment(p, s, args.aug, np.random.default_rng(r)))
        augments.append(t)
        phase_dir = work / "phase"
        shutil.rmtree(phase_dir, ignore_errors=True)
        t, _ = timed(lambda: write_split(phase_dir, "train", _arrays(ap, asol, args.aug + 1), {"kind": "bench"}))
        writes.append(t)
        print(
            f"build {r + 1}/{args.repeats}: {seconds:.2f} s (read {reads[-1]:.2f}, augment {augments[-1]:.2f}, write {writes[-1]:.2f})",
            flush=True,
        )
    split = work / "dataset" / "train"
    return {
        "examples": args.puzzles * (args.aug + 1),
        "csv_rows": args.csv_rows,
        "total_s": totals,
        "read_s": reads,
        "augment_s": augments,
        "write_s": writes,
        "median_total_s": median(totals),
        "median_read_s": median(reads),
        "median_augment_s": median(augments),
        "median_write_s": median(writes),
        "train_split_bytes": sum(f.stat().st_size for f in split.iterdir()),
        "fingerprint": summary["train"]["fingerprint"] if isinstance(summary.get("train"), dict) else None,
    }


def bench_loader(args: argparse.Namespace, dataset: Path, local_batches: list[int]) -> dict[int, dict[str, Any]]:
    arrays, meta = load_split(dataset, "train")  # memory-mapped, as trm.train reads it
    results = {}
    for local in local_batches:
        world = GLOBAL_BATCH // local
        loader = TrainLoader(arrays, GLOBAL_BATCH, 0, world, seed=0)  # rank 0's share of the global batch
        for _ in range(args.batches):  # warm: page cache, epoch orders
            next(loader)
        rates = []
        for _ in range(args.repeats):
            seconds, _ = timed(lambda: [next(loader) for _ in range(args.batches)])
            rates.append(args.batches / seconds)
        results[local] = {"world_size": world, "batches_per_s": rates, "median_batches_per_s": median(rates)}
        print(f"loader, local batch {local}: {median(rates):,.0f} batches/s", flush=True)
    return results


def trainer_demand(args: argparse.Namespace) -> dict[str, Any]:
    """Steps/s the trainer asks for: measured for the tiny CPU preset, estimated for the paper config on pods."""
    from bench._common import StepRunner, train_config  # torch: imported only here
    from contracts.hydra_app import compose_train_config, to_dict
    from trm.flops import flops_per_sample_step
    from trm.info import arch_config

    runner = StepRunner("tiny", train_config("tiny", 64, "fp32"), 64)
    for _ in range(2):
        runner.step()
    tiny_s = median([runner.step() for _ in range(args.trainer_steps)])
    paper = compose_train_config(["experiment=paper_sudoku"])
    flops = flops_per_sample_step(arch_config(to_dict(paper.arch)))
    est = compose_sweep_config([]).estimate
    pods = {}
    for name, chips in est.pods.items():
        step_s = flops * GLOBAL_BATCH / (chips * est.peak_tflops * 1e12 * est.utilization)
        pods[name] = {
            "chips": chips,
            "hosts": max(1, chips // CHIPS_PER_HOST),
            "step_s": step_s,
            "steps_per_s": 1 / step_s,
        }
    return {
        "tiny_cpu": {"batch": 64, "step_s": tiny_s, "steps_per_s": 1 / tiny_s},
        "paper_flops_per_sample_step": flops,
        "estimate": {"peak_tflops": est.peak_tflops, "utilization": est.utilization},
        "pods": pods,
    }


def markdown(result: dict[str, Any]) -> str:
    b = result["build"]
    lines = [
        f"Build of {b['examples']:,} training examples from a {b['csv_rows']:,}-row CSV (median of {len(b['total_s'])}):",
        "",
        "| total s | read + validate s | augment s | write + fingerprint s | train split on disk |",
        "|---:|---:|---:|---:|---:|",
        f"| {b['median_total_s']:.2f} | {b['median_read_s']:.2f} | {b['median_augment_s']:.2f} | {b['median_write_s']:.2f} | {b['train_split_bytes'] / 1e6:.0f} MB |",
        "",
        "| trainer | per-host batch | trainer steps/s | loader batches/s | headroom |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in result["headroom"]:
        lines.append(
            f"| {row['trainer']} | {row['local_batch']} | {row['steps_per_s']:.2f} | {row['batches_per_s']:,.0f} | {fmt(row['headroom'], ',.0f')}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    work = args.out_dir / "data_bench"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    train_csv, test_csv = make_csvs(work, args.csv_rows, test_rows=1000 if not args.quick else 50)
    build = bench_build(args, work, train_csv, test_csv)
    demand = trainer_demand(args)
    hosts = {name: pod["hosts"] for name, pod in demand["pods"].items()}
    local_batches = sorted({GLOBAL_BATCH // h for h in hosts.values()} | {64}, reverse=True)
    loader = bench_loader(args, work / "dataset", local_batches)
    headroom = [
        {"trainer": "tiny preset, this CPU", "local_batch": 64, "steps_per_s": demand["tiny_cpu"]["steps_per_s"]}
    ]
    for name, pod in demand["pods"].items():
        headroom.append(
            {
                "trainer": f"paper MLP-t, {name} (estimated)",
                "local_batch": GLOBAL_BATCH // pod["hosts"],
                "steps_per_s": pod["steps_per_s"],
            }
        )
    for row in headroom:
        row["batches_per_s"] = loader[row["local_batch"]]["median_batches_per_s"]
        row["headroom"] = row["batches_per_s"] / row["steps_per_s"]
    result = {
        **run_header("data_pipeline", argv),
        "build": build,
        "loader": loader,
        "demand": demand,
        "headroom": headroom,
    }
    table = markdown(result)
    write_results("data_pipeline", result, table, args.out_dir)
    shutil.rmtree(work, ignore_errors=True)  # 1M examples: ~200 MB per copy
    return result


if __name__ == "__main__":
    main()
