"""Sampler x pruner strategies replayed on TRM-Bench-tiny: which finds the best TRM configuration for the least
compute (issue 42). Each replay is a whole study on an in-memory Optuna storage, as the driver runs it: the
sampler and the pruner are built from conf/sampler/ and conf/pruner/ (the objects a real study uses), wrapped in
the driver's DistinctSampler, with model_scaling's tiny space and its baseline enqueued first; each trial reads
its configuration's curve from one seed's table, reports the prune metric at every eval and stops where the
pruner says so. A study runs until every configuration trained (or was pruned).

    python -m bench.trm_bench.replay --seed 0 --reps 100           # choose: every strategy on seed 0's curves
    python -m bench.trm_bench.replay --seed 1 --reps 100 --only tpe/evidence/blank,random/none/blank   # report

Per strategy, over --reps replays (sampler seeds 0..reps-1), with compute as the share of the unpruned grid's
training FLOPs: the compute until the study holds a configuration within one SE of the table's best (its
median and 90th percentile: the latter is the compute at which 90% of studies have found one), the share of
studies that hold one at 40% of the grid's compute, the trials that took (90th percentile: the n_trials that
finds it 9 times in 10), and the median regret (table best - study best) at 10/25/50/100% of the grid's compute.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf
from optuna.trial import TrialState

from bench._results import RESULTS, ROOT, percentile, run_header, write_results
from bench.trm_bench.table import EVAL_EXAMPLES, METRICS, Table, config, load, provenance
from storage.record import DUPLICATE_OF_ATTR
from sweeps.config.optuna_parts import build, resolve_steps, resolved_dict
from sweeps.search.distinct_draws import DistinctSampler, EnumeratingSampler, trained_configs
from sweeps.search.draw import MAX_DUPLICATE_DRAWS
from sweeps.search.space import SearchSpace, params_to_values, parse_space

CONF = ROOT / "conf"
TABLE = RESULTS / "trm_bench_tiny.json"
SAMPLERS = ("random", "tpe", "gp", "cmaes", "grid")
PRUNERS = (
    "none",
    "median",
    "percentile",
    "successive_halving",
    "hyperband",
    "evidence",
    "evidence_near_best",
    "median_late",
    "median_40",
    "median_near_best",
    "median_agreement",
    "headroom",
)
TABLE_EVAL = "<the table's eval puzzles>"  # a VARIANTS value set from the replayed table (build_pruner)
MEDIAN_ANY = {
    "_target_": "optuna.pruners.MedianPruner",
    "n_startup_trials": 3,
    "n_warmup_steps": 0,
    "interval_steps": 1,
}
# A replayed pruner that is a shipped conf/pruner/ file with some keys set: name -> (file, {key: value}).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "evidence_near_best": ("evidence", {"check": "near_best", "eval_examples": TABLE_EVAL}),
    "median_40": ("median_late", {"n_warmup_steps": 0.4}),  # median_late as first shipped: loses 1,000-step winners
    # The median rule with its warm-up read from the study's own evidence, not a share of train.steps (issue 54):
    # no verdict at a step where it would have cut an audit trial that ended within one eval SE of the audits'
    # best (near_best), or where the audits' values there rank them unlike their ends (agreement).
    "median_near_best": ("evidence", {"check": "near_best", "eval_examples": TABLE_EVAL, "wrapped": MEDIAN_ANY}),
    "median_agreement": ("evidence", {"wrapped": MEDIAN_ANY}),
    # The headroom rule with a margin in the prune metric's units: a trial is cut only when even the largest gain
    # seen leaves it short of the best end by more than this.
    "headroom_2": ("headroom", {"margin": 0.02}),
    "headroom_5": ("headroom", {"margin": 0.05}),
}
BUDGETS = (0.10, 0.25, 0.40, 0.50, 1.00)  # shares of the grid's compute the regret and the hit rate are read at
TRIAL_BUDGETS = (6, 8, 12, 16, 24, 36)  # n_trials a study may be given: its hit rate and compute are read there
MAX_REDRAWS = 20  # conf/sweep.yaml draws.max_redraws


@dataclass(frozen=True)
class Strategy:
    """A sampler (conf/sampler/<name>.yaml), a pruner (conf/pruner/<name>.yaml) and the metric it reports."""

    sampler: str
    pruner: str
    metric: str = "eval/blank_accuracy"

    @property
    def name(self) -> str:
        return f"{self.sampler}/{self.pruner}/{METRICS[self.metric]}"

    @staticmethod
    def parse(name: str) -> Strategy:
        sampler, pruner, metric = name.split("/")
        by_column = {v: k for k, v in METRICS.items()}
        return Strategy(sampler, pruner, by_column[metric])


@functools.cache  # read once per process: every replay of a worker asks for it
def study_conf() -> tuple[SearchSpace, dict[str, Any]]:
    """model_scaling's tiny space and baseline, as the study file defines them."""
    study = OmegaConf.load(CONF / "study" / "model_scaling.yaml")
    space = parse_space(study.space.tiny, study.conditional.tiny, "study.space.tiny")
    return space, dict(OmegaConf.to_container(study.baseline.tiny))  # type: ignore[arg-type]


def build_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    node = OmegaConf.load(CONF / "sampler" / f"{name}.yaml")
    node.seed = seed
    sampler = build(node)
    # As sweeps.search.distinct_draws.choose_sampler runs sampler=grid (Optuna's own stops the study: refused under ask/tell).
    return EnumeratingSampler(seed=seed) if isinstance(sampler, optuna.samplers.BruteForceSampler) else sampler


def build_pruner(name: str, steps: int, eval_examples: int = EVAL_EXAMPLES) -> optuna.pruners.BasePruner:
    file, keys = VARIANTS.get(name, (name, {}))
    node = OmegaConf.load(CONF / "pruner" / f"{file}.yaml")
    for key, value in keys.items():
        node[key] = eval_examples if value == TABLE_EVAL else value
    spec = resolve_steps(resolved_dict(node), steps)  # as sweeps.config.optuna_parts.pruner_spec resolves it
    return build(spec)


@dataclass
class Trajectory:
    """One replayed study: after each trained trial, the compute spent so far and the study's best so far."""

    gflops: list[float]
    best: list[float]
    pruned: int
    duplicates: int


def draw(study: optuna.Study, space: SearchSpace) -> tuple[optuna.trial.Trial, dict[str, Any]] | None:
    """A new trial and its configuration; None for a repeat of one the study trained, trains or will train, which
    is recorded (FAIL, duplicate_of) and not trained, as sweeps.search.draw does."""
    trial = study.ask()
    values = params_to_values(space.sample(trial))
    taken = trained_configs(study.get_trials(deepcopy=False), but=trial.number)
    if config(trial.params) in taken:
        trial.set_user_attr(DUPLICATE_OF_ATTR, taken[config(trial.params)])
        study.tell(trial, state=TrialState.FAIL)
        return None
    return trial, values


def replay(
    table: Table, strategy: Strategy, seed: int, space: SearchSpace, baseline: dict[str, Any] | None
) -> Trajectory:
    """One study of `strategy` on `table`, sampler seed `seed`, until every configuration trained, or the study
    holds the table's best and has run the largest of TRIAL_BUDGETS."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampler = DistinctSampler(build_sampler(strategy.sampler, seed), space, MAX_REDRAWS, seed)
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        study_name="model_scaling",  # Hyperband places trials in brackets by a hash of the name and number
        sampler=sampler,
        pruner=build_pruner(strategy.pruner, table.steps, table.eval_examples),
        direction="maximize",
    )
    if baseline is not None:
        study.enqueue_trial(baseline)
    out = Trajectory([], [], 0, 0)
    spent, best, repeats, top = 0.0, 0.0, 0, table.best
    while len(out.gflops) < len(table.curves) and repeats < MAX_DUPLICATE_DRAWS:
        if best >= top and len(out.gflops) >= max(TRIAL_BUDGETS):
            break  # it holds the table's best and every budget below is read: nothing it reports can change
        drawn = draw(study, space)
        if drawn is None:
            out.duplicates, repeats = out.duplicates + 1, repeats + 1
            continue
        trial, values = drawn
        repeats = 0
        curve = table.curves[config(values)]
        stopped = None
        for point in curve.points:
            trial.report(point.metric(strategy.metric), point.step)
            if trial.should_prune():
                stopped = point
                break
        if stopped is not None:
            spent += stopped.gflops
            study.tell(trial, state=TrialState.PRUNED)
            out.pruned += 1
        else:
            spent += curve.gflops
            best = max(best, curve.value)
            study.tell(trial, curve.value)
        out.gflops.append(spent)
        out.best.append(best)
    return out


def hit(trajectory: Trajectory, target: float) -> tuple[float, int] | None:
    """(compute, trials) when the study first held a configuration at or above `target`; None if it never did."""
    for i, (spent, best) in enumerate(zip(trajectory.gflops, trajectory.best)):
        if best >= target - 1e-12:
            return spent, i + 1
    return None


def best_within(trajectory: Trajectory, budget: float) -> float:
    """The study's best among the trials that finished within `budget` GFLOPs (0 before the first)."""
    best = 0.0
    for spent, value in zip(trajectory.gflops, trajectory.best):
        if spent > budget:
            break
        best = value
    return best


def summarize(table: Table, strategy: Strategy, runs: list[Trajectory]) -> dict[str, Any]:
    grid = table.grid_gflops
    hits = [hit(t, table.target) for t in runs]
    share = [h[0] / grid if h else math.inf for h in hits]
    trials = [h[1] if h else math.inf for h in hits]
    return {
        "strategy": strategy.name,
        **asdict(strategy),
        "reps": len(runs),
        "found": sum(h is not None for h in hits) / len(runs),
        "compute_to_find_median": percentile(share, 50),
        "compute_to_find_p90": percentile(share, 90),
        "trials_to_find_p90": percentile(trials, 90),
        "found_at": {f"{b:.2f}": sum(s <= b for s in share) / len(runs) for b in BUDGETS},
        "median_regret_at": {
            f"{b:.2f}": statistics.median(table.best - best_within(t, b * grid) for t in runs) for b in BUDGETS
        },
        "pruned_share_median": statistics.median(t.pruned / len(t.gflops) for t in runs),
        # A study given n_trials=N: the share that ends holding one, and its median compute.
        "found_with_n_trials": {str(n): sum(t <= n for t in trials) / len(runs) for n in TRIAL_BUDGETS},
        "compute_with_n_trials_median": {
            str(n): statistics.median(t.gflops[min(n, len(t.gflops)) - 1] / grid for t in runs) for n in TRIAL_BUDGETS
        },
        "curve": success_curve(share),
        "regret_curve": [
            statistics.median(table.best - best_within(t, i / 100 * grid) for t in runs) for i in range(101)
        ],
    }


def success_curve(share: list[float], points: int = 101) -> list[float]:
    """The share of studies holding a configuration within one SE of the best, at 0%, 1%, ..., 100% compute."""
    return [sum(s <= i / (points - 1) for s in share) / len(share) for i in range(points)]


def _one(args: tuple[Path, int, Strategy, int, bool]) -> Trajectory:
    path, table_seed, strategy, seed, with_baseline = args
    space, baseline = study_conf()
    return replay(_table(path, table_seed), strategy, seed, space, baseline if with_baseline else None)


_TABLES: dict[tuple[Path, int], Table] = {}


def _table(path: Path, seed: int) -> Table:
    if (path, seed) not in _TABLES:
        _TABLES[(path, seed)] = load(path, seed)
    return _TABLES[(path, seed)]


def run_all(
    path: Path, table_seed: int, strategies: Iterable[Strategy], reps: int, jobs: int, baseline: bool
) -> list[dict[str, Any]]:
    table = _table(path, table_seed)
    rows = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for strategy in strategies:
            start = time.time()
            tasks = [(path, table_seed, strategy, s, baseline) for s in range(reps)]
            runs = list(pool.map(_one, tasks, chunksize=4))
            row = summarize(table, strategy, runs)
            row["replay_s"] = round(time.time() - start, 1)
            print(
                f"{strategy.name:40s} found {row['found']:.2f}, p90 compute {row['compute_to_find_p90']:.3f}, "
                f"at 40% {row['found_at']['0.40']:.2f} ({row['replay_s']} s)",
                flush=True,
            )
            rows.append(row)
    return rows


def strategies(only: str | None) -> list[Strategy]:
    if only:
        return [Strategy.parse(name) for name in only.split(",")]
    out = []
    for sampler in SAMPLERS:
        for pruner in PRUNERS:
            for metric in METRICS if pruner != "none" else ("eval/blank_accuracy",):
                out.append(Strategy(sampler, pruner, metric))
    return out


def markdown(table: Table, rows: list[dict[str, Any]]) -> str:
    def pct(x: float | None) -> str:
        return "never" if x is None or math.isinf(x) else f"{100 * x:.0f}%"

    lines = [
        f"Seed {table.seed}: {len(table.curves)} curves, best {table.best:.4f} (one SE {table.se:.4f}: target "
        f"{table.target:.4f}), grid {table.grid_gflops / 1e3:.1f} TFLOP. Sorted by the compute at which 90% of "
        "studies hold a configuration within one SE of the best.",
        "",
        "| strategy | compute to find, median | ... 90% of studies | found at 40% compute | trials to find, 90% "
        "| median regret at 10 / 25 / 50 / 100% | trials pruned | replays |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows, key=lambda r: (r["compute_to_find_p90"], r["compute_to_find_median"])):
        regret = " / ".join(f"{r['median_regret_at'][k]:.3f}" for k in ("0.10", "0.25", "0.50", "1.00"))
        trials = r["trials_to_find_p90"]
        lines.append(
            f"| {r['strategy']} | {pct(r['compute_to_find_median'])} | {pct(r['compute_to_find_p90'])} | "
            f"{100 * r['found_at']['0.40']:.0f}% | {'never' if math.isinf(trials) else f'{trials:.0f}'} | {regret} | "
            f"{100 * r['pruned_share_median']:.0f}% | {r['reps']} |"
        )
    return "\n".join(lines)


def merged_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The rows of several runs (one per group of samplers: TPE and GP take seconds a replay, random milliseconds),
    a later file's row replacing an earlier one's of the same strategy. A percentile stored as NaN by an earlier
    version (inf - inf) reads as never found (inf)."""
    rows: dict[str, dict[str, Any]] = {}
    for path in paths:
        for row in json.loads(path.read_text())["rows"]:
            for key in ("compute_to_find_median", "compute_to_find_p90", "trials_to_find_p90"):
                if isinstance(row[key], float) and math.isnan(row[key]):
                    row[key] = math.inf
            rows[row["strategy"]] = row
    return list(rows.values())


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", type=Path, default=TABLE)
    p.add_argument(
        "--seed", type=int, default=None, help="whose curves (default 0): choose on one seed, report on the other"
    )
    p.add_argument("--reps", type=int, default=100, help="replays per strategy (sampler seeds 0..reps-1)")
    p.add_argument("--only", help="comma list of strategies sampler/pruner/metric (e.g. tpe/evidence/blank)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="do not enqueue the study's baseline first (a study without a prior, as a new space has)",
    )
    p.add_argument("--out-name", default=None, help="default: trm_bench_replay_seed<seed>")
    p.add_argument("--merge", nargs="+", type=Path, help="instead of replaying: the rows of these runs' JSON files")
    args = p.parse_args(argv)
    if args.merge and args.seed is None:  # the merged rows were replayed on some seed: a default would mislabel them
        p.error("--merge needs --seed: the seed whose curves the merged rows were replayed on")
    args.seed = 0 if args.seed is None else args.seed
    if args.merge:
        rows = merged_rows(args.merge)
    else:
        rows = run_all(args.table, args.seed, strategies(args.only), args.reps, args.jobs, not args.no_baseline)
    table = _table(args.table, args.seed)
    result = {
        **run_header("trm_bench_replay", argv),
        "table": provenance(args.table),
        "seed": args.seed,
        "baseline_enqueued": not args.no_baseline,
        "target": {"best": table.best, "se": table.se, "grid_gflops": table.grid_gflops},
        "rows": rows,
    }
    write_results(args.out_name or f"trm_bench_replay_seed{args.seed}", result, markdown(table, rows))
    return rows


if __name__ == "__main__":
    main()
