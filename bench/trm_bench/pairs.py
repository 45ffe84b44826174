"""model_scaling's default strategy against every bare Optuna sampler x pruner pair, as a pod pays (issue 54): at each
horizon (a TRM-Bench table), on the training seed where the default does worst, 8 trials at once, the shipped
n_trials, start-ups and evals counted, judged by the seed mean (bench/trm_bench/pod.py's replays).

    python -m bench.trm_bench.pairs --reps 50                  # every horizon whose table can be replayed
    python -m bench.trm_bench.pairs --horizons tiny --reps 50 --slow-reps 20
    python -m bench.trm_bench.pairs_figure bench/results/trm_bench_pairs.json

The default is the sampler and pruner model_scaling's study file selects. A bare pair is a conf/sampler/ file with
one of Optuna's pruners at Optuna's own settings (BARE_PRUNERS, or none), reporting the shipped prune metric. Per
horizon the default runs first on each of the table's seeds; the seed where it holds a near-best configuration
least often (ties: where it pays more) is the horizon's worse seed, and every pair runs there. A table that holds
part of the space is replayed on the sub-grid it holds whole (bench/trm_bench/subgrid.py), and a horizon whose
table cannot be replayed yet is listed with why.

The default beats a pair when it holds a near-best configuration in more of the studies, or in as many for less.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench._results import ROOT, run_header, write_results
from bench.trm_bench.pod import SHIPPED_N_TRIALS, measured_startup_s, run_all, seed_tables
from bench.trm_bench.replay import Strategy
from bench.trm_bench.table import seed_truth
from bench.trm_bench.table_specs import LONG, TINY

CONF = ROOT / "conf"
HORIZONS = {"tiny": TINY.out, "long": LONG.out}  # 500 and 2,000 steps
BARE_PRUNERS = ("none", "median", "percentile", "successive_halving", "hyperband")  # Optuna's, at its settings
SLOW_SAMPLERS = ("gp",)  # seconds an ask at 40 trials: replayed --slow-reps times
WORKERS = 8  # a v4-32's 8 VMs, a trial each
PRUNE_METRIC = "eval/blank_accuracy"  # conf/study/model_scaling.yaml prune_metric


def default_strategy(conf: Path = CONF) -> Strategy:
    """The sampler and pruner conf/study/model_scaling.yaml selects in its defaults list."""
    chosen: dict[str, str] = {}
    for entry in OmegaConf.to_container(OmegaConf.load(conf / "study" / "model_scaling.yaml").defaults):  # type: ignore[union-attr]
        if isinstance(entry, dict):
            for key, value in entry.items():
                group = str(key).removeprefix("override /").split("@")[0]
                chosen[group] = str(value)
    return Strategy(chosen["sampler"], chosen["pruner"], PRUNE_METRIC)


def bare_pairs(conf: Path = CONF) -> list[Strategy]:
    """Every conf/sampler/ file with every bare pruner."""
    samplers = sorted(p.stem for p in (conf / "sampler").glob("*.yaml"))
    return [Strategy(s, p, PRUNE_METRIC) for s in samplers for p in BARE_PRUNERS]


def beats(default: dict[str, Any], pair: dict[str, Any]) -> bool:
    """The module's rule: more near-best studies, or as many for less paid."""
    if default["near_best_at_end"] != pair["near_best_at_end"]:
        return bool(default["near_best_at_end"] > pair["near_best_at_end"])
    return bool(default["paid_at_end_median"] < pair["paid_at_end_median"])


@dataclass(frozen=True)
class Horizon:
    name: str
    path: Path
    steps: int
    configurations: int
    worse_seed: int
    rows: list[dict[str, Any]]  # the default on every seed, then every pair on the worse seed


def replay_horizon(name: str, path: Path, reps: int, slow_reps: int, jobs: int, startup_s: float) -> Horizon:
    tables, _ = seed_tables(path)
    truth = seed_truth(tables)
    default = default_strategy()

    def rows_of(strategy: Strategy, seed: int) -> dict[str, Any]:
        n = slow_reps if strategy.sampler in SLOW_SAMPLERS else reps
        (row,) = run_all(path, seed, truth, [strategy], [WORKERS], n, SHIPPED_N_TRIALS, startup_s, jobs)
        return {**row, "horizon": name, "seed": seed, "default": strategy == default}

    on_seeds = [rows_of(default, t.seed) for t in tables]
    worse = min(on_seeds, key=lambda r: (r["near_best_at_end"], -r["paid_at_end_median"]))
    pairs = [rows_of(s, worse["seed"]) for s in bare_pairs() if s != default]
    steps = max(c.points[-1].step for c in tables[0].curves.values())
    return Horizon(name, path, steps, len(tables[0].curves), worse["seed"], on_seeds + pairs)


def verdict(h: Horizon) -> dict[str, Any]:
    """On the worse seed: the default's row and the pairs it does not beat."""
    default = next(r for r in h.rows if r["default"] and r["seed"] == h.worse_seed)
    pairs = [r for r in h.rows if not r["default"]]
    return {
        "default": default["strategy"],
        "near_best": default["near_best_at_end"],
        "paid": default["paid_at_end_median"],
        "not_beaten_by_default": [r["strategy"] for r in pairs if not beats(default, r)],
        "pairs": len(pairs),
    }


def markdown(horizons: list[Horizon], skipped: dict[str, str]) -> str:
    lines = [
        f"{WORKERS} trials at once, n_trials {SHIPPED_N_TRIALS} (or the sub-grid, if smaller), start-ups and evals "
        "counted; near-best: the reported configuration's seed mean within one eval + seed SE of the best mean. "
        "Paid: the slice's wall time x its workers, a share of the unpruned grid's seconds.",
        "",
    ]
    for h in horizons:
        v = verdict(h)
        lines += [
            f"## {h.name}: {h.steps} steps, {h.configurations} configurations, worse seed {h.worse_seed}",
            "",
            f"The default ({v['default']}) on seed {h.worse_seed}: near-best in {100 * v['near_best']:.0f}% for "
            f"{100 * v['paid']:.0f}%. It beats {v['pairs'] - len(v['not_beaten_by_default'])} of {v['pairs']} "
            "pairs" + (f"; not: {', '.join(v['not_beaten_by_default'])}." if v["not_beaten_by_default"] else "."),
            "",
            "| strategy | seed | reps | near-best at n_trials | paid, median | paid, 10-90% | trials pruned |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sorted(h.rows, key=lambda r: (not r["default"], -r["near_best_at_end"], r["paid_at_end_median"])):
            lines.append(
                f"| {r['strategy']}{' (default)' if r['default'] else ''} | {r['seed']} | {r['reps']} | "
                f"{100 * r['near_best_at_end']:.0f}% | {100 * r['paid_at_end_median']:.0f}% | "
                f"{100 * r['paid_at_end_p10']:.0f}-{100 * r['paid_at_end_p90']:.0f}% | "
                f"{100 * r['pruned_share_median']:.0f}% |"
            )
        lines.append("")
    for name, why in skipped.items():
        lines.append(f"- {name}: not replayed: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Horizon]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--horizons", default=",".join(HORIZONS), help=f"comma list of {', '.join(HORIZONS)}")
    p.add_argument("--reps", type=int, default=50, help="replays per strategy (sampler seeds 0..reps-1)")
    p.add_argument("--slow-reps", type=int, default=20, help=f"replays for {', '.join(SLOW_SAMPLERS)}")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out-name", default="trm_bench_pairs")
    args = p.parse_args(argv)
    unknown = sorted(set(args.horizons.split(",")) - set(HORIZONS))
    if unknown:
        p.error(f"--horizons {','.join(unknown)}: expected some of {', '.join(HORIZONS)}")
    startup_s = measured_startup_s()
    horizons, skipped = [], {}
    for name in args.horizons.split(","):
        try:
            seed_tables(HORIZONS[name])
        except (ValueError, FileNotFoundError) as e:
            skipped[name] = str(e)
            print(f"{name}: not replayed: {e}", flush=True)
            continue
        horizons.append(replay_horizon(name, HORIZONS[name], args.reps, args.slow_reps, args.jobs, startup_s))
    result = {
        **run_header("trm_bench_pairs", argv),
        "workers": WORKERS,
        "n_trials": SHIPPED_N_TRIALS,
        "startup_s": startup_s,
        "horizons": [
            {
                "name": h.name,
                "steps": h.steps,
                "configurations": h.configurations,
                "worse_seed": h.worse_seed,
                "verdict": verdict(h),
                "rows": h.rows,
            }
            for h in horizons
        ],  # fmt: skip
        "skipped": skipped,
    }
    write_results(args.out_name, result, markdown(horizons, skipped))
    return horizons


if __name__ == "__main__":
    main()
