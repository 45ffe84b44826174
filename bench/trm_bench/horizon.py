"""Pruning rules at several horizons, replayed the same way on each: does a rule hold the best configuration when
trials run 500, 1,000 or 2,000 steps (issue 54)? A rule whose first verdict is a fixed share of `train.steps` was
tuned on one horizon; the calibrated ones (median_near_best, median_agreement: bench/trm_bench/replay.py VARIANTS)
read the verdict's step from the study's own audit trials.

    python -m bench.trm_bench.horizon --reps 200

The choice of model_scaling's pruning rule over horizons is fixed here before the held-out table exists
(`choose_rule`, HELD_OUT: TRM-Bench-long's seed 1, whose curves were still being recorded when the rule was
committed): among the rules a user can select (a conf/pruner/ file), the one whose worst near-best share at the
shipped n_trials over every other table is the highest, among those that pay at most GOAL_SHARE of the grid on
every table with at least that many configurations (ties: the least worst pay). Until TRM-Bench-long's seed 0 is
in, the choice is marked provisional. The held-out table then says whether it holds: >= GOAL_FOUND near-best at
<= GOAL_SHARE paid.

Each replay is a study on an in-memory Optuna storage with the rule's pruner built from conf/pruner/ (as the study
would build it for that horizon), the table's configurations in one random order (seeded by the replay, the same
order for every rule: a paired comparison) with model_scaling's baseline first where the table has it. Each trial
reports its curve's prune metric at every eval and stops where the pruner says. The sampler is left out on
purpose: every rule sees the same orders, so what differs is the rule alone; bench/trm_bench/replay.py replays the
samplers on the 500-step table.

The tables: TRM-Bench-tiny's seeds (500 steps, 72 configurations), the saved unpruned 1,000-step studies
(bench/results/pruning_1000steps.json: 27 configurations, one training seed, their trials deduplicated), and
TRM-Bench-long's seeds (2,000 steps) once they hold MIN_CURVES curves. Judged per table: the study holds a
configuration within one eval SE of that table's best (Table.target), at the shipped n_trials (or every
configuration, where the table has fewer) and at the end; the cost is the share of the table's unpruned FLOPs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from bench._results import RESULTS, ROOT, percentile, run_header, write_results
from bench.trm_bench.pod import SHIPPED_N_TRIALS
from bench.trm_bench.replay import build_pruner, study_conf
from bench.trm_bench.table import Curve, Point, Table, config, load
from bench.trm_bench.tiny import LONG, TINY

# A rule: a pruner (a conf/pruner/ file or a bench/trm_bench/replay.py VARIANTS name), reporting the shipped prune
# metric, or with "/exact" the objective itself (study.prune_metric=eval/exact_accuracy).
RULES = (
    "none",
    "median_late",
    "median_40",
    "median_near_best",
    "median_agreement",
    "headroom",
    "headroom_2",
    "headroom_5",
    "headroom/exact",
    "headroom_2/exact",
)
METRIC = "eval/blank_accuracy"  # the prune metric model_scaling ships (study.prune_metric)
METRICS_BY_SUFFIX = {"exact": "eval/exact_accuracy"}
MIN_CURVES = 12  # a long seed's table joins once a study of it could prune at all past the audits
HELD_OUT = "long:1"  # judged, never chosen on (committed before its curves were recorded)
REQUIRED = ("tiny:0", "tiny:1", "tiny:2", "1000", "long:0")  # the choice is provisional until all are replayed
GOAL_FOUND = 0.90  # issue 54: near-best in this share of studies ...
GOAL_SHARE = 0.40  # ... paying at most this share of the unpruned grid
THOUSAND = RESULTS / "pruning_1000steps.json"


def study_table(path: Path = THOUSAND, seed: int = 0) -> Table:
    """The unpruned arms' trials of the saved multi-seed pruning study (bench/pruning/studies.py) as one table: each
    configuration once (every sampler seed trained it on the same training seed: equal curves), its FLOPs per eval
    spread evenly over its steps (a trial's FLOPs per step are constant)."""
    saved = json.loads(path.read_text())
    curves: dict[Any, Curve] = {}
    for per_seed in saved["per_seed"]:
        for t in per_seed["arms"][0]["trials"]:
            if t["state"] != "COMPLETE" or not t["eval"] or config(t["params"]) in curves:
                continue
            per_step = t["compute_flops"] / t["steps"] / 1e9
            points = tuple(
                Point(e["step"], e["eval/exact_accuracy"], e["eval/blank_accuracy"], per_step * e["step"], 0.0)
                for e in t["eval"]
            )
            curves[config(t["params"])] = Curve(dict(t["params"]), points)
    counts = {int(e["eval/count"]) for c in saved["per_seed"] for t in c["arms"][0]["trials"] for e in t["eval"]}
    if len(counts) != 1:
        raise ValueError(f"{path}: the trials' evals ran {sorted(counts)} puzzles; a table needs one count")
    return Table(seed, curves, counts.pop())


@dataclass(frozen=True)
class Outcome:
    """One replayed study: after each trial, the FLOPs spent so far and whether the study holds a near-best one."""

    gflops: list[float]
    holds: list[bool]
    best: list[float]  # the study's best value so far (0 before its first finished trial)
    pruned: int


def parse_rule(rule: str) -> tuple[str, str]:
    """(the pruner's name, the metric its trials report) of a rule such as "headroom/exact"."""
    pruner, _, suffix = rule.partition("/")
    return pruner, METRICS_BY_SUFFIX[suffix] if suffix else METRIC


def replay(table: Table, rule: str, seed: int, first: dict[str, Any] | None) -> Outcome:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    pruner, metric = parse_rule(rule)
    order = sorted(table.curves, key=lambda c: sorted(c, key=str))
    random.Random(seed).shuffle(order)
    if first is not None and config(first) in table.curves:
        order.remove(config(first))
        order.insert(0, config(first))
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        study_name="model_scaling",
        pruner=build_pruner(pruner, table.steps, table.eval_examples),
        direction="maximize",
    )
    spent, best, pruned = 0.0, 0.0, 0
    gflops: list[float] = []
    holds: list[bool] = []
    bests: list[float] = []
    for c in order:
        curve = table.curves[c]
        trial = study.ask()
        stopped = None
        for point in curve.points:
            trial.report(point.metric(metric), point.step)
            if trial.should_prune():
                stopped = point
                break
        if stopped is not None:
            spent += stopped.gflops
            study.tell(trial, state=TrialState.PRUNED)
            pruned += 1
        else:
            spent += curve.gflops
            best = max(best, curve.value)
            study.tell(trial, curve.value)
        gflops.append(spent)
        holds.append(best >= table.target - 1e-12)
        bests.append(best)
    return Outcome(gflops, holds, bests, pruned)


CURVE_POINTS = 101  # the figure's compute axis: 0%, 1%, ..., 100% of the grid


def at_compute(run: Outcome, budget: float) -> tuple[bool, float]:
    """Whether the study held a near-best configuration, and its best, among the trials finished within `budget`."""
    held, best = False, 0.0
    for spent, holds, value in zip(run.gflops, run.holds, run.best):
        if spent > budget + 1e-9:
            break
        held, best = holds, value
    return held, best


def curves(table: Table, runs: list[Outcome]) -> dict[str, list[float]]:
    """Over the replays, at each share of the grid's compute: the share holding a near-best configuration, and the
    regret (table best - study best) at its 10th, 50th and 90th percentiles (the figure's band)."""
    out: dict[str, list[float]] = {"found": [], "regret_p10": [], "regret_p50": [], "regret_p90": []}
    for i in range(CURVE_POINTS):
        budget = i / (CURVE_POINTS - 1) * table.grid_gflops
        states = [at_compute(r, budget) for r in runs]
        regret = [table.best - best for _, best in states]
        out["found"].append(sum(held for held, _ in states) / len(runs))
        for q in (10, 50, 90):
            out[f"regret_p{q}"].append(float(percentile(regret, q) or 0.0))
    return out


def summarize(name: str, table: Table, rule: str, runs: list[Outcome]) -> dict[str, Any]:
    n = min(SHIPPED_N_TRIALS, len(table.curves))
    grid = table.grid_gflops
    return {
        "table": name,
        "rule": rule,
        "steps": table.steps,
        "configurations": len(table.curves),
        "reps": len(runs),
        "n_trials": n,
        "near_best_at_n_trials": sum(r.holds[n - 1] for r in runs) / len(runs),
        "paid_at_n_trials_median": statistics.median(r.gflops[n - 1] / grid for r in runs),
        "near_best_at_end": sum(r.holds[-1] for r in runs) / len(runs),
        "paid_at_end_median": statistics.median(r.gflops[-1] / grid for r in runs),
        "pruned_share_median": statistics.median(r.pruned / len(r.gflops) for r in runs),
        "best": table.best,
        "se": table.se,
        "curves": curves(table, runs),
    }


def _one(args: tuple[str, Table, str, int, dict[str, Any] | None]) -> Outcome:
    _, table, rule, seed, first = args
    return replay(table, rule, seed, first)


def tables(long_min: int = MIN_CURVES) -> dict[str, Table]:
    """Every table a horizon can be read from, by name (tiny:S, 1000, long:S)."""
    out = {f"tiny:{s}": load(TINY.out, s) for s in TINY.seeds}
    out["1000"] = study_table()
    if LONG.out.exists():
        for s in LONG.seeds:
            rows = json.loads(LONG.out.read_text())["seeds"].get(str(s), [])
            if len(rows) >= long_min:
                out[f"long:{s}"] = load(LONG.out, s)
    return out


def run_all(named: dict[str, Table], rules: Iterable[str], reps: int, jobs: int) -> list[dict[str, Any]]:
    _, baseline = study_conf()
    rows = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for name, table in named.items():
            for rule in rules:
                runs = list(pool.map(_one, [(name, table, rule, s, baseline) for s in range(reps)], chunksize=8))
                row = summarize(name, table, rule, runs)
                print(
                    f"{name:8s} {rule:18s} near-best at n_trials {row['near_best_at_n_trials']:.2f} "
                    f"for {row['paid_at_n_trials_median']:.2f}",
                    flush=True,
                )
                rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], named: dict[str, Table]) -> str:
    lines = [
        "Random-order replays, the same orders for every rule (model_scaling's baseline first where the table has "
        f"it), prune metric {METRIC} (a rule ending /exact: eval/exact_accuracy). Near-best: within one eval SE of "
        "the table's best. Paid: the share of the table's unpruned FLOPs.",
        "",
        "| table | steps | configurations (best, SE) | rule | near-best at n_trials | paid at n_trials | near-best "
        "at end | paid at end | trials pruned |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t = named[r["table"]]
        lines.append(
            f"| {r['table']} | {r['steps']} | {r['configurations']} ({t.best:.4f}, {t.se:.4f}) | {r['rule']} | "
            f"{100 * r['near_best_at_n_trials']:.0f}% (n={r['n_trials']}) | {100 * r['paid_at_n_trials_median']:.0f}% "
            f"| {100 * r['near_best_at_end']:.0f}% | {100 * r['paid_at_end_median']:.0f}% "
            f"| {100 * r['pruned_share_median']:.0f}% |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class RuleChoice:
    rule: str
    worst_near_best: float  # over the choice tables, at the shipped n_trials
    worst_paid: float  # over the budget tables (>= SHIPPED_N_TRIALS configurations), at the shipped n_trials
    tables: tuple[str, ...]
    provisional: bool  # a REQUIRED table is missing
    within_budget: bool  # False: no rule paid <= GOAL_SHARE on every budget table; the best worst case regardless
    held_out_holds: bool | None  # None: the held-out table is not replayed yet


def selectable(rule: str, conf: Path = ROOT / "conf") -> bool:
    return (conf / "pruner" / f"{parse_rule(rule)[0]}.yaml").exists()


def choose_rule(rows: list[dict[str, Any]], conf: Path = ROOT / "conf") -> RuleChoice:
    """The rule in the module's docstring, on the rows of one run (every rule on every table)."""
    by_rule: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_rule.setdefault(r["rule"], {})[r["table"]] = r
    names = sorted({r["table"] for r in rows} - {HELD_OUT})
    candidates = {rule: t for rule, t in by_rule.items() if selectable(rule, conf) and set(names) <= set(t)}
    if not candidates:
        raise ValueError(f"no selectable rule (a conf/pruner/ file) is replayed on every table {names}")

    def worst_found(rule: str) -> float:
        return min(candidates[rule][n]["near_best_at_n_trials"] for n in names)

    def worst_paid(rule: str) -> float:
        budget = [n for n in names if candidates[rule][n]["configurations"] >= SHIPPED_N_TRIALS]
        return max((candidates[rule][n]["paid_at_n_trials_median"] for n in budget), default=0.0)

    within = [rule for rule in candidates if worst_paid(rule) <= GOAL_SHARE]
    pool = within or list(candidates)
    rule = min(sorted(pool), key=lambda n: (-worst_found(n), worst_paid(n)))
    held = by_rule[rule].get(HELD_OUT)
    holds = (
        None
        if held is None
        else held["near_best_at_n_trials"] >= GOAL_FOUND and held["paid_at_n_trials_median"] <= GOAL_SHARE
    )
    return RuleChoice(
        rule,
        worst_found(rule),
        worst_paid(rule),
        tuple(names),
        provisional=not set(REQUIRED) <= set(names),
        within_budget=bool(within),
        held_out_holds=holds,
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--reps", type=int, default=200, help="replays per table and rule (orders seeded 0..reps-1)")
    p.add_argument("--rules", default=",".join(RULES))
    p.add_argument("--tables", default=None, help="comma list of table names (default: every one that exists)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out-name", default="trm_bench_horizon")
    p.add_argument("--rows-from", type=Path, help="instead of replaying: choose on the rows of this run's JSON")
    args = p.parse_args(argv)
    named = tables()
    if args.tables:
        unknown = sorted(set(args.tables.split(",")) - set(named))
        if unknown:
            p.error(f"--tables {','.join(unknown)}: no such table; expected some of {', '.join(named)}")
        named = {k: v for k, v in named.items() if k in args.tables.split(",")}
    if args.rows_from:
        rows = json.loads(args.rows_from.read_text())["rows"]
    else:
        rows = run_all(named, args.rules.split(","), args.reps, args.jobs)
    choice = choose_rule(rows)
    result = {**run_header("trm_bench_horizon", argv), "metric": METRIC, "rows": rows, "choice": asdict(choice)}
    said = {None: "not replayed yet", True: "holds", False: "does NOT hold"}[choice.held_out_holds]
    missing = ", ".join(sorted(set(REQUIRED) - set(choice.tables)))
    verdict = (
        f"\n\nChosen rule: {choice.rule}"
        + (f" (provisional: {missing} missing)" if choice.provisional else "")
        + f"; worst near-best {choice.worst_near_best:.0%} over {', '.join(choice.tables)}, worst paid "
        f"{choice.worst_paid:.0%}"
        + ("" if choice.within_budget else " (no rule within the budget)")
        + f". Held-out {HELD_OUT}: {said}."
    )
    write_results(args.out_name, result, markdown(rows, named) + verdict)
    return rows


if __name__ == "__main__":
    main()
