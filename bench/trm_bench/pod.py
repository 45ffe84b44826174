"""Replays that count what a pod pays (issue 54): a whole study of a sampler x pruner on a TRM-Bench table, run
as a slice runs it, with W trials at once, each paying its start-up and its evals, and judged by whether the
configuration it ends with is near the best of the mean over training seeds.

    python -m bench.trm_bench.pod --seed 1 --reps 100 --workers 1,8,32 --only tpe/median_late/blank,tpe/none/blank
    python -m bench.trm_bench.pod --table bench/results/trm_bench_long.json --seed 0 --n-trials 40

What it adds to bench/trm_bench/replay.py, whose replays run one trial at a time, count training FLOPs only and
score the compute at the first hit on one seed's own best:

- **W trials at once.** An event loop in the table's wall seconds: a free worker asks the study for a trial at
  once (so the sampler sees only the trials that ended by then, as Optuna's `ask` in the driver does), each
  trial's evals are reported in time order across the running trials (so the pruner judges against what the
  study holds at that moment), and a worker frees when its trial is pruned or ends. W=1 with no start-up is
  bench/trm_bench/replay.py's study, trial for trial (tests/test_trm_bench.py checks it).
- **Seconds, not FLOPs.** A trial costs its start-up (`--startup-s`, the platform's measured launch to first step
  plus last step to tell, bench/results/sweep_overhead.json) plus the recorded wall seconds to its last eval, evals
  included, at the configuration's steady pace over the table's seeds (with_steady_seconds). What a slice pays is
  its wall time x W (idle workers included); what the trials used is the sum of their own times. Both are shares
  of the unpruned grid's cost: every configuration trained to its end, each with its start-up, one after the other
  (the least any schedule pays for the whole grid).
- **The study's own budget.** A study stops after `--n-trials` trials (the shipped site's n_trials): what it
  costs there is what a user pays. The cost at the first hit is reported beside it.
- **The sub-grid a table holds.** A table with part of the space (TRM-Bench-long) is replayed on the sub-grid of
  model_scaling's space that every seed of it holds whole, its grid and truth cut to it (bench/trm_bench/subgrid.py).
- **Near the seed-mean best.** A configuration's truth is its mean over the table's training seeds; the target is
  the best mean less one seed-inclusive SE (the pooled training-seed SD of the top configurations over the square
  root of the seed count, bench.trm_bench.table.seed_truth). A study holds a near-best configuration when the
  trial it would report (its best value on the seed it ran on) is at or above the target in the mean.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from bench._results import RESULTS, percentile, run_header, write_results
from bench.trm_bench.replay import MAX_REDRAWS, TABLE, Strategy, build_pruner, build_sampler, draw, study_conf
from bench.trm_bench.subgrid import cut, subgrid_space
from bench.trm_bench.table import Config, Curve, SeedTruth, Table, config, load, provenance, seed_truth
from sweeps.search.distinct_draws import DistinctSampler
from sweeps.search.draw import MAX_DUPLICATE_DRAWS
from sweeps.search.space import SearchSpace

SWEEP_OVERHEAD = RESULTS / "sweep_overhead.json"
WORKERS = (1, 8, 32)  # one trial at a time, a v4-32's 8 VMs with a trial each, and a trial per chip
SHIPPED_N_TRIALS = 40  # conf/site/laptop.yaml n_trials, the tiny space's budget (checked by a test)


def measured_startup_s(path: Path = SWEEP_OVERHEAD) -> float:
    """The platform's cost outside training per trial with the default launcher: launch to first step plus last
    step to tell (bench/sweep_overhead.py's 'outside training per trial', the median over its trials)."""
    launchers = json.loads(path.read_text())["launchers"]
    local = next(r for r in launchers if r["launcher"] == "local")
    return float(local["summary"]["median_outside_per_trial_s"])


@dataclass(frozen=True)
class Finished:
    """A trial's end: when (s since the study began), the slice's paid and used seconds by then, and the
    configuration the study would report then (None before its first complete trial)."""

    at_s: float
    used_s: float
    reported: Config | None
    reported_value: float


@dataclass
class PodStudy:
    """One replayed study on W workers: each trial's end, in time order."""

    workers: int
    ends: list[Finished] = field(default_factory=list)
    completed: list[tuple[Config, float]] = field(default_factory=list)  # each complete trial and its value, in order
    pruned: int = 0
    duplicates: int = 0

    @property
    def wall_s(self) -> float:
        return self.ends[-1].at_s if self.ends else 0.0

    @property
    def paid_s(self) -> float:
        """What the slice pays: its wall time x its workers, idle ones included."""
        return self.wall_s * self.workers


@dataclass(order=True)
class _Event:
    at_s: float
    order: int  # ties in time: the trial started first reports first
    trial: optuna.trial.Trial = field(compare=False)
    curve: Curve = field(compare=False)
    index: int = field(compare=False)  # the curve's point this event reports
    start_s: float = field(compare=False)


def trial_seconds(curve: Curve, startup_s: float, until: int | None = None) -> float:
    """A trial's seconds from its launch to its eval `until` (default: the last): start-up, then the recorded wall
    seconds since its first step (training and evals)."""
    point = curve.points[-1 if until is None else until]
    return startup_s + point.wall_s


def replay_pod(
    table: Table,
    strategy: Strategy,
    seed: int,
    space: SearchSpace,
    baseline: dict[str, Any] | None,
    workers: int,
    n_trials: int,
    startup_s: float,
) -> PodStudy:
    """One study of `strategy` on `table` with `workers` trials at once, until `n_trials` trials trained (a
    refused repeat is not one, as in the driver) or the space is exhausted."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        study_name="model_scaling",  # Hyperband places trials in brackets by a hash of the name and number
        sampler=DistinctSampler(build_sampler(strategy.sampler, seed), space, MAX_REDRAWS, seed),
        pruner=build_pruner(strategy.pruner, table.steps, table.eval_examples),
        direction="maximize",
    )
    if baseline is not None:
        study.enqueue_trial(baseline)
    out = PodStudy(workers)
    events: list[_Event] = []
    now, used, started, order, repeats = 0.0, 0.0, 0, 0, 0
    reported: tuple[float, Config | None] = (-math.inf, None)
    limit = min(n_trials, len(table.curves))
    while True:
        while len(events) < workers and started < limit and repeats < MAX_DUPLICATE_DRAWS:
            drawn = draw(study, space)
            if drawn is None:
                out.duplicates, repeats = out.duplicates + 1, repeats + 1
                continue
            trial, values = drawn
            repeats, started, order = 0, started + 1, order + 1
            curve = table.curves[config(values)]
            heapq.heappush(events, _Event(now + trial_seconds(curve, startup_s, 0), order, trial, curve, 0, now))
        if not events:
            return out
        event = heapq.heappop(events)
        now = event.at_s
        point = event.curve.points[event.index]
        event.trial.report(point.metric(strategy.metric), point.step)
        last = event.index == len(event.curve.points) - 1
        if not last and not event.trial.should_prune():
            nxt = event.index + 1
            at = event.start_s + trial_seconds(event.curve, startup_s, nxt)
            heapq.heappush(events, _Event(at, event.order, event.trial, event.curve, nxt, event.start_s))
            continue
        used += now - event.start_s
        if last:
            value = event.curve.value
            study.tell(event.trial, value)
            out.completed.append((config(event.curve.params), value))
            if value > reported[0]:
                reported = (value, config(event.curve.params))
        else:
            study.tell(event.trial, state=TrialState.PRUNED)
            out.pruned += 1
        out.ends.append(Finished(now, used, reported[1], max(reported[0], 0.0)))


def with_steady_seconds(table: Table, tables: Sequence[Table]) -> Table:
    """`table` with each configuration's evals a steady interval apart: the median over `tables` (the seeds'
    recordings of the same configuration) of each recording's median seconds from one eval to the next. Every
    interval holds the same steps and one eval, so a job on a machine of its own spends the same on each; a
    recording on a shared machine stalls for minutes while other work holds the cores, often on every seed at once
    (which a per-eval median over the seeds keeps), and a slice pays none of that."""
    curves = {}
    for c, curve in table.curves.items():
        paces = [
            statistics.median(b.wall_s - a for a, b in zip((0.0, *(p.wall_s for p in points)), points))
            for points in (t.curves[c].points for t in tables if c in t.curves)
        ]
        steady_s = statistics.median(paces)
        points = tuple(replace(p, wall_s=(i + 1) * steady_s) for i, p in enumerate(curve.points))
        curves[c] = replace(curve, points=points)
    return replace(table, curves=curves)


def grid_cost_s(table: Table, startup_s: float) -> float:
    """The unpruned grid's cost: every configuration trained to its end with its start-up, one after the other."""
    return sum(trial_seconds(c, startup_s) for c in table.curves.values())


def first_hit(study: PodStudy, truth: SeedTruth) -> Finished | None:
    """The first trial end at which the configuration the study reports is near the seed-mean best."""
    for end in study.ends:
        if end.reported is not None and truth.near_best(end.reported):
            return end
    return None


def summarize(
    table: Table, truth: SeedTruth, strategy: Strategy, workers: int, runs: Sequence[PodStudy], startup_s: float
) -> dict[str, Any]:
    grid = grid_cost_s(table, startup_s)
    hits = [first_hit(s, truth) for s in runs]
    final_ok = [s.ends[-1].reported is not None and truth.near_best(s.ends[-1].reported) for s in runs if s.ends]
    paid_at_hit = [h.at_s * workers / grid if h else math.inf for h in hits]
    return {
        "strategy": strategy.name,
        "workers": workers,
        "reps": len(runs),
        # what a user gets and pays at the study's own n_trials
        "near_best_at_end": sum(final_ok) / len(runs),
        "paid_at_end_median": statistics.median(s.paid_s / grid for s in runs),
        "paid_at_end_p10": percentile([s.paid_s / grid for s in runs], 10),
        "paid_at_end_p90": percentile([s.paid_s / grid for s in runs], 90),
        "used_at_end_median": statistics.median(s.ends[-1].used_s / grid for s in runs),
        "wall_at_end_median_s": statistics.median(s.wall_s for s in runs),
        # had the user known when to stop
        "found": sum(h is not None for h in hits) / len(runs),
        "paid_to_find_median": percentile(paid_at_hit, 50),
        "paid_to_find_p90": percentile(paid_at_hit, 90),
        "pruned_share_median": statistics.median(s.pruned / max(len(s.ends), 1) for s in runs),
        "regret_at_end_median": statistics.median(
            truth.best - truth.means[s.ends[-1].reported] if s.ends and s.ends[-1].reported else truth.best
            for s in runs
        ),
    }


def seed_tables(path: Path, seeds: Sequence[int] | None = None) -> tuple[list[Table], SearchSpace]:
    """The seeds' tables (default: every seed with curves) cut to the sub-grid of model_scaling's space that all of
    them hold whole (bench/trm_bench/subgrid.py), and that space: what a sampler is replayed on."""
    if seeds is None:
        seeds = [int(s) for s, rows in json.loads(path.read_text())["seeds"].items() if rows]
    tables = [load(path, s) for s in seeds]
    held = set.intersection(*(set(t.curves) for t in tables))
    space = subgrid_space(study_conf()[0], held)
    return [cut(t, space) for t in tables], space


_VIEWS: dict[tuple[Path, int], tuple[Table, SearchSpace]] = {}


def _view(path: Path, seed: int) -> tuple[Table, SearchSpace]:
    """Seed `seed`'s curves on the replayed sub-grid, its evals at each configuration's steady pace over every
    seed of the table (cached per process), and the sub-grid's space."""
    if (path, seed) not in _VIEWS:
        tables, space = seed_tables(path)
        own = next(t for t in tables if t.seed == seed)
        _VIEWS[(path, seed)] = with_steady_seconds(own, tables), space
    return _VIEWS[(path, seed)]


def _one(args: tuple[Path, int, Strategy, int, int, int, float]) -> PodStudy:
    path, table_seed, strategy, seed, workers, n_trials, startup_s = args
    table, space = _view(path, table_seed)
    baseline = study_conf()[1]
    first = baseline if config(baseline) in table.curves else None  # a sub-grid without it starts with a draw
    return replay_pod(table, strategy, seed, space, first, workers, n_trials, startup_s)


def run_all(
    path: Path,
    table_seed: int,
    truth: SeedTruth,
    strategies: Iterable[Strategy],
    workers: Sequence[int],
    reps: int,
    n_trials: int,
    startup_s: float,
    jobs: int,
) -> list[dict[str, Any]]:
    table = _view(path, table_seed)[0]
    rows = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for strategy in strategies:
            for w in workers:
                start = time.time()
                tasks = [(path, table_seed, strategy, s, w, n_trials, startup_s) for s in range(reps)]
                row = summarize(table, truth, strategy, w, list(pool.map(_one, tasks, chunksize=4)), startup_s)
                row["replay_s"] = round(time.time() - start, 1)
                print(
                    f"{strategy.name:28s} W={w:<3d} near-best at end {row['near_best_at_end']:.2f}, paid "
                    f"{row['paid_at_end_median']:.3f} of the grid (used {row['used_at_end_median']:.3f}); "
                    f"p90 paid to find {row['paid_to_find_p90']:.3f} ({row['replay_s']} s)",
                    flush=True,
                )
                rows.append(row)
    return rows


def markdown(table: Table, truth: SeedTruth, rows: list[dict[str, Any]], n_trials: int, startup_s: float) -> str:
    def pct(x: float | None) -> str:
        return "never" if x is None or math.isinf(x) else f"{100 * x:.0f}%"

    lines = [
        f"Seed {table.seed}'s curves ({len(table.curves)}, {table.steps} steps); truth: the mean over seeds "
        f"{list(truth.seeds)}, best {truth.best:.4f} ({truth.best_params}), one seed-inclusive SE {truth.se:.4f} "
        f"(pooled training-seed SD {truth.seed_sd:.4f} over the top {truth.pooled_over}): target {truth.target:.4f}. "
        f"n_trials {n_trials}, start-up {startup_s:.2f} s a trial. Costs are shares of the unpruned grid's "
        "seconds (every configuration to its end with its start-up, one after the other).",
        "",
        "| strategy | trials at once | near-best at n_trials | paid at n_trials (wall x W) | used (trials' own) "
        "| paid to find, median | ... 90% of studies | trials pruned | median regret at end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["strategy"], r["workers"])):
        lines.append(
            f"| {r['strategy']} | {r['workers']} | {100 * r['near_best_at_end']:.0f}% | "
            f"{pct(r['paid_at_end_median'])} | {pct(r['used_at_end_median'])} | {pct(r['paid_to_find_median'])} | "
            f"{pct(r['paid_to_find_p90'])} | {100 * r['pruned_share_median']:.0f}% | {r['regret_at_end_median']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, default=TABLE)
    p.add_argument("--seed", type=int, default=0, help="whose curves the studies run on")
    p.add_argument("--truth-seeds", default=None, help="the seeds whose mean is the truth (default: every seed)")
    p.add_argument("--reps", type=int, default=100, help="replays per strategy and W (sampler seeds 0..reps-1)")
    p.add_argument("--workers", default=",".join(map(str, WORKERS)), help="trials at once, comma-separated")
    p.add_argument("--n-trials", type=int, default=SHIPPED_N_TRIALS)
    p.add_argument("--startup-s", type=float, default=None, help="default: measured (sweep_overhead.json)")
    p.add_argument("--only", default="tpe/median_late/blank,tpe/none/blank,random/none/blank,random/median_late/blank")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out-name", default=None, help="default: trm_bench_pod_<table>_seed<seed>")
    args = p.parse_args(argv)
    startup_s = measured_startup_s() if args.startup_s is None else args.startup_s
    seeds = [int(s) for s in args.truth_seeds.split(",")] if args.truth_seeds else None
    truth = seed_truth(seed_tables(args.table, seeds)[0])
    strategies = [Strategy.parse(name) for name in args.only.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    rows = run_all(args.table, args.seed, truth, strategies, workers, args.reps, args.n_trials, startup_s, args.jobs)
    table = _view(args.table, args.seed)[0]
    result = {
        **run_header("trm_bench_pod", argv),
        "table": provenance(args.table),
        "seed": args.seed,
        "n_trials": args.n_trials,
        "startup_s": startup_s,
        "truth": truth.summary(),
        "rows": rows,
    }
    name = args.out_name or f"trm_bench_pod_{args.table.stem.removeprefix('trm_bench_')}_seed{args.seed}"
    write_results(name, result, markdown(table, truth, rows, args.n_trials, startup_s))
    return rows


if __name__ == "__main__":
    main()
