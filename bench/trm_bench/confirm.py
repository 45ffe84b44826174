"""Confirm stages replayed on TRM-Bench (issue 55, item 2): which top_k and seeds make a study's winner hold when
it is trained again, at what extra cost, beside the unconfirmed winner and `study.seeds` 2 and 3.

    python -m bench.trm_bench.confirm --reps 100                 # every table seed -> results/trm_bench_confirm.*
    python -m bench.trm_bench.confirm --reps 20 --seeds 1 --out-name trm_bench_confirm_seed1

Per table seed s (the seed the study trains on), `--reps` whole studies of the shipped strategy are replayed on s's
curves one trial at a time with the platform's start-up per trial (bench.trm_bench.pod.replay_pod, at the laptop's
n_trials), each configuration at its steady pace over the seeds (pod.with_steady_seconds). Then the confirm stage,
as sweeps/trials/confirm.py runs it: the top_k complete configurations by the study's value are trained again on
`seeds` fresh training seeds (the table's other seeds, in order from s + 1), and ranked by
sweeps.trials.confirm_rank.rank, the platform's own arithmetic, over their own value and the fresh ones, each with
the eval's binomial SE. Its first is the confirmed winner.

Judged against the mean over every seed of the table, within one seed-inclusive SE (bench.trm_bench.table
.seed_truth). The extra cost is the confirm jobs' seconds (each a whole trial on its fresh seed, with start-up)
over the study's own. With 3 seeds the fresh seeds are also in the truth, so a confirmed winner is judged partly
on the values that chose it: the rates are an upper bound until a table has more seeds (said in the results).

`study.seeds=m` is modelled as a study on the curves' point-wise mean over m seeds (s first), paying m times each
trial: optimistic, since the platform runs a trial's seeds one after another and its pruner sees each seed's
job, not their mean.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench._results import ROOT, run_header, write_results
from bench.trm_bench.pod import (
    SHIPPED_N_TRIALS,
    PodStudy,
    measured_startup_s,
    replay_pod,
    trial_seconds,
    with_steady_seconds,
)
from bench.trm_bench.replay import TABLE, Strategy, study_conf
from bench.trm_bench.table import Config, Curve, Point, SeedTruth, Table, load, provenance, seed_truth
from contracts.eval_noise import binomial_stderr
from sweeps.trials.confirm_rank import SeedValue, rank

TOP_K = (1, 2, 3, 5)
CONFIRM_SEEDS = (1, 2)  # fresh seeds: a table of 3 seeds has 2 beside the study's own
STUDY_SEEDS = (2, 3)
OWN_VARIANCE_AT = int(OmegaConf.load(ROOT / "conf" / "sweep.yaml").confirm.own_variance_at)  # as the platform ranks


def shipped() -> Strategy:
    """model_scaling's sampler/pruner/metric: the committed choice's, which conf/ ships (tests tie the two)."""
    from bench.trm_bench.check import shipped_strategy

    return Strategy.parse(shipped_strategy())


def fresh_seeds(tables: Sequence[Table], own: int, n: int) -> list[Table]:
    """The `n` tables after seed `own`'s, wrapping around: the fresh seeds a confirm stage trains on."""
    i = [t.seed for t in tables].index(own)
    return [tables[(i + 1 + j) % len(tables)] for j in range(n)]


def confirm(
    study: PodStudy, own: Table, fresh: Sequence[Table], top_k: int, startup_s: float
) -> tuple[Config | None, float]:
    """The confirmed winner among the study's top_k complete configurations, and the stage's seconds."""
    top = sorted(study.completed, key=lambda cv: -cv[1])[:top_k]
    if not top:
        return None, 0.0
    values = {
        i: [SeedValue(v, binomial_stderr(v, own.eval_examples))]
        + [
            SeedValue(t.curves[c].value, binomial_stderr(t.curves[c].value, t.eval_examples), t.seed, "confirm")
            for t in fresh
        ]
        for i, (c, v) in enumerate(top)
    }
    ranked = rank(values, maximize=True, own_variance_at=OWN_VARIANCE_AT)
    seconds = sum(trial_seconds(t.curves[c], startup_s) for c, _ in top for t in fresh)
    return top[ranked[0].trial][0], seconds


def mean_table(tables: Sequence[Table]) -> Table:
    """The curves' point-wise mean over `tables` (values), their FLOPs and seconds summed: study.seeds=len(tables)."""
    first = tables[0]
    curves = {}
    for c, curve in first.curves.items():
        runs = [t.curves[c].points for t in tables]
        points = tuple(
            Point(
                p.step,
                statistics.fmean(r[i].exact for r in runs),
                statistics.fmean(r[i].blank for r in runs),
                sum(r[i].gflops for r in runs),
                sum(r[i].wall_s for r in runs),
            )
            for i, p in enumerate(curve.points)
        )
        curves[c] = Curve(curve.params, points)
    return replace(first, curves=curves)


def _study(args: tuple[Table, Strategy, int, float]) -> PodStudy:
    table, strategy, seed, startup_s = args
    space, baseline = study_conf()
    return replay_pod(table, strategy, seed, space, baseline, 1, SHIPPED_N_TRIALS, startup_s)


def judge(truth: SeedTruth, winners: Sequence[Config | None]) -> float:
    return sum(w is not None and truth.near_best(w) for w in winners) / len(winners)


def run_seed(
    tables: Sequence[Table], own: int, truth: SeedTruth, strategy: Strategy, reps: int, startup_s: float, jobs: int
) -> list[dict[str, Any]]:
    table = next(t for t in tables if t.seed == own)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        studies = list(pool.map(_study, [(table, strategy, s, startup_s) for s in range(reps)], chunksize=4))
        own_s = [s.ends[-1].used_s for s in studies]
        rows = [
            {
                "seed": own,
                "arm": "unconfirmed",
                "near_best": judge(truth, [s.ends[-1].reported for s in studies]),
                "extra_cost_median": 0.0,
            }
        ]
        for n in CONFIRM_SEEDS:
            fresh = fresh_seeds(tables, own, n)
            for k in TOP_K:
                stages = [confirm(s, table, fresh, k, startup_s) for s in studies]
                rows.append(
                    {
                        "seed": own,
                        "arm": f"confirm top_k={k} seeds={n}",
                        "top_k": k,
                        "seeds": n,
                        "near_best": judge(truth, [w for w, _ in stages]),
                        "extra_cost_median": statistics.median(x / o for (_, x), o in zip(stages, own_s)),
                    }
                )
        for m in STUDY_SEEDS:
            mean = mean_table([table, *fresh_seeds(tables, own, m - 1)])
            averaged = list(pool.map(_study, [(mean, strategy, s, startup_s) for s in range(reps)], chunksize=4))
            rows.append(
                {
                    "seed": own,
                    "arm": f"study.seeds={m}",
                    "near_best": judge(truth, [s.ends[-1].reported for s in averaged]),
                    "extra_cost_median": statistics.median(a.ends[-1].used_s / o - 1 for a, o in zip(averaged, own_s)),
                }
            )
    for row in rows:
        print(f"seed {own} {row['arm']:28s} near-best {row['near_best']:.2f}, extra {row['extra_cost_median']:.2f}")
    return rows


MAX_EXTRA = 0.25  # the stage may cost at most this share of the study's own (issue 55)


def choose(rows: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """The shipped (top_k, seeds): among the confirm arms whose extra cost is within MAX_EXTRA on every table seed,
    the highest near-best rate on the worst seed, then the least extra cost on the worst seed."""
    arms: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if "top_k" in r:
            arms.setdefault((r["top_k"], r["seeds"]), []).append(r)
    within = {arm: rs for arm, rs in arms.items() if max(r["extra_cost_median"] for r in rs) <= MAX_EXTRA}
    if not within:
        raise ValueError(f"no confirm arm costs at most {MAX_EXTRA:.0%} of the study on every seed")
    return max(
        within,
        key=lambda arm: (
            min(r["near_best"] for r in within[arm]),
            -max(r["extra_cost_median"] for r in within[arm]),
        ),
    )


def markdown(truth: SeedTruth, strategy: Strategy, rows: list[dict[str, Any]], reps: int) -> str:
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        f"{strategy.name} at n_trials {SHIPPED_N_TRIALS}, {reps} replays per table seed; truth: the mean over seeds "
        f"{list(truth.seeds)}, best {truth.best:.4f} ({truth.best_params}), target {truth.target:.4f} (one "
        f"eval + seed SE {truth.se:.4f}). Share of studies whose winner is near the seed-mean best, and the median "
        "extra cost over the study's own. The fresh seeds are in the truth too (an upper bound: see the module).",
        "",
        "| arm | " + " | ".join(f"seed {s}: near-best | extra" for s in seeds) + " | worst near-best |",
        "|---|" + "---:|---:|" * len(seeds) + "---:|",
    ]
    for arm in dict.fromkeys(r["arm"] for r in rows):
        cells, worst = [], 1.0
        for s in seeds:
            r = next(r for r in rows if r["arm"] == arm and r["seed"] == s)
            cells.append(f"{100 * r['near_best']:.0f}% | {100 * r['extra_cost_median']:.0f}%")
            worst = min(worst, r["near_best"])
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {100 * worst:.0f}% |")
    top_k, seeds = choose(rows)
    lines += [
        "",
        f"Chosen (extra cost within {MAX_EXTRA:.0%} on every seed, best worst seed): top_k={top_k}, seeds={seeds}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, default=TABLE)
    p.add_argument("--seeds", default=None, help="the table seeds the studies train on (default: every seed)")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out-name", default="trm_bench_confirm")
    p.add_argument("--render", type=Path, help="instead of replaying: write the table of this run's JSON again")
    args = p.parse_args(argv)
    saved = json.loads(args.table.read_text())
    recorded = [load(args.table, int(s)) for s, rows in sorted(saved["seeds"].items()) if rows]
    tables = [with_steady_seconds(t, recorded) for t in recorded]  # a trial's seconds as the pod replays count them
    truth = seed_truth(tables)
    if args.render:
        done = json.loads(args.render.read_text())
        rows = done["rows"]
        write_results(args.out_name, done, markdown(truth, Strategy.parse(done["strategy"]), rows, done["reps"]))
        return rows
    study_seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [t.seed for t in tables]
    strategy, startup_s = shipped(), measured_startup_s()
    rows = [r for s in study_seeds for r in run_seed(tables, s, truth, strategy, args.reps, startup_s, args.jobs)]
    result = {
        **run_header("trm_bench_confirm", argv),
        "table": provenance(args.table),
        "strategy": strategy.name,
        "n_trials": SHIPPED_N_TRIALS,
        "reps": args.reps,
        "startup_s": startup_s,
        "truth": truth.summary(),
        "rows": rows,
    }
    write_results(args.out_name, result, markdown(truth, strategy, rows, args.reps))
    return rows


if __name__ == "__main__":
    main()
