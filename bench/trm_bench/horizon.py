"""Pruning rules at several horizons, replayed the same way on each: does a rule hold the best configuration when
trials run 500, 1,000 or 2,000 steps (issue 54)? A rule whose first verdict is a fixed share of `train.steps` was
tuned on one horizon; the calibrated ones (median_near_best, median_agreement: bench/trm_bench/replay.py VARIANTS)
read the verdict's step from the study's own audit trials.

    python -m bench.trm_bench.horizon --reps 200

The choice of model_scaling's rule over these replays, and its held-out table: bench/trm_bench/rule_choice.py.

Each replay is a study on an in-memory Optuna storage with the rule's pruner built from conf/pruner/ (as the study
would build it for that horizon), the table's configurations in one random order (seeded by the replay, the same
order for every rule: a paired comparison) with model_scaling's baseline first where the table has it. Each trial
reports its curve's prune metric at every eval and stops where the pruner says. The sampler is left out on
purpose: every rule sees the same orders, so what differs is the rule alone; bench/trm_bench/replay.py replays the
samplers on the 500-step table.

The tables: TRM-Bench-tiny's seeds (500 steps, 72 configurations), the saved unpruned 1,000-step studies
(bench/results/pruning_1000steps.json: 27 configurations, one training seed, their trials deduplicated), and
TRM-Bench-long's seeds (2,000 steps, the configurations both seeds hold) once they hold MIN_CURVES curves. Judged
at the shipped n_trials (or every configuration, where the table has fewer) and at the end: the configuration the
study would report (its best trial's) is near-best by its mean over the table's training seeds, within one
seed-inclusive SE of the best mean (bench/trm_bench/truths.py says how for each table; the rows say which SE);
beside it, the eval-SE-only judgment of the table's own seed (Table.target). The cost is the share of the table's
unpruned FLOPs.
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

from bench._results import RESULTS, percentile, run_header, write_results
from bench.trm_bench.pod import SHIPPED_N_TRIALS
from bench.trm_bench.replay import build_pruner, study_conf
from bench.trm_bench.rule_choice import HELD_OUT, choose_rule
from bench.trm_bench.table import Config, Curve, Point, SeedTruth, Table, config, load
from bench.trm_bench.table_specs import LONG, TINY
from bench.trm_bench.truths import EVAL_ONLY, shared, truths

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
MIN_SD_CURVES = 5  # ... and lends its training-seed SD (to the one-seed 1,000-step table) from this many
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
    holds: list[bool]  # on the table's own seed, within one eval SE of its best
    best: list[float]  # the study's best value so far (0 before its first finished trial)
    pruned: int
    reported: list[Config | None]  # the configuration of the study's best trial so far: what it would report


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
    reported: list[Config | None] = []
    leader: Config | None = None
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
            if leader is None or curve.value > best:
                leader, best = c, curve.value
            study.tell(trial, curve.value)
        gflops.append(spent)
        holds.append(best >= table.target - 1e-12)
        bests.append(best)
        reported.append(leader)
    return Outcome(gflops, holds, bests, pruned, reported)


CURVE_POINTS = 101  # the figure's compute axis: 0%, 1%, ..., 100% of the grid


def judged(run: Outcome, i: int, truth: SeedTruth | None) -> bool:
    """Whether the study, after its trial i, would report a near-best configuration (`truth`: by its seed mean;
    None: on the table's own seed, within one eval SE)."""
    if truth is None:
        return run.holds[i]
    reported = run.reported[i]
    return reported is not None and truth.near_best(reported)


def at_compute(run: Outcome, budget: float, truth: SeedTruth | None) -> tuple[bool, bool, float]:
    """Among the trials finished within `budget`: whether the study held a near-best configuration (judged by
    `truth`, then by the eval SE alone), and its best value."""
    state = (False, False, 0.0)
    for i, spent in enumerate(run.gflops):
        if spent > budget + 1e-9:
            break
        state = (judged(run, i, truth), run.holds[i], run.best[i])
    return state


def curves(table: Table, runs: list[Outcome], truth: SeedTruth | None = None) -> dict[str, list[float]]:
    """Over the replays, at each share of the grid's compute: the share holding a near-best configuration (judged
    by `truth`; "found_eval": by the eval SE alone), and the regret (table best - study best) at its 10th, 50th and
    90th percentiles (the figure's band)."""
    out: dict[str, list[float]] = {"found": [], "found_eval": [], "regret_p10": [], "regret_p50": [], "regret_p90": []}
    for i in range(CURVE_POINTS):
        budget = i / (CURVE_POINTS - 1) * table.grid_gflops
        states = [at_compute(r, budget, truth) for r in runs]
        regret = [table.best - best for _, _, best in states]
        out["found"].append(sum(held for held, _, _ in states) / len(runs))
        out["found_eval"].append(sum(held for _, held, _ in states) / len(runs))
        for q in (10, 50, 90):
            out[f"regret_p{q}"].append(float(percentile(regret, q) or 0.0))
    return out


def summarize(
    name: str, table: Table, rule: str, runs: list[Outcome], truth: tuple[SeedTruth, str] | None = None
) -> dict[str, Any]:
    """One rule on one table over its replays; near-best judged by `truth` (its seed truth and which SE) where the
    table has one, else by the eval SE alone."""
    n = min(SHIPPED_N_TRIALS, len(table.curves))
    grid = table.grid_gflops
    seed, said = truth if truth is not None else (None, EVAL_ONLY)
    return {
        "table": name,
        "rule": rule,
        "steps": table.steps,
        "configurations": len(table.curves),
        "reps": len(runs),
        "n_trials": n,
        "judged_by": said,
        "truth": None if seed is None else seed.summary(),
        "near_best_at_n_trials": sum(judged(r, n - 1, seed) for r in runs) / len(runs),
        "near_best_eval_at_n_trials": sum(r.holds[n - 1] for r in runs) / len(runs),
        "paid_at_n_trials_median": statistics.median(r.gflops[n - 1] / grid for r in runs),
        "near_best_at_end": sum(judged(r, len(r.holds) - 1, seed) for r in runs) / len(runs),
        "paid_at_end_median": statistics.median(r.gflops[-1] / grid for r in runs),
        "pruned_share_median": statistics.median(r.pruned / len(r.gflops) for r in runs),
        "best": table.best,
        "se": table.se,
        "curves": curves(table, runs, seed),
    }


def _one(args: tuple[str, Table, str, int, dict[str, Any] | None]) -> Outcome:
    _, table, rule, seed, first = args
    return replay(table, rule, seed, first)


def tables(long_min: int = MIN_CURVES) -> dict[str, Table]:
    """Every table a horizon can be read from, by name (tiny:S, 1000, long:S)."""
    out = {f"tiny:{s}": load(TINY.out, s) for s in TINY.seeds}
    out["1000"] = study_table()
    if LONG.out.exists():
        saved = json.loads(LONG.out.read_text())["seeds"]
        longs = [load(LONG.out, s) for s in LONG.seeds if len(saved.get(str(s), [])) >= long_min]
        out.update({f"long:{t.seed}": t for t in shared(longs)})  # judged by the mean over both: the shared ones
    return out


def run_all(
    named: dict[str, Table], rules: Iterable[str], reps: int, jobs: int, every: dict[str, Table] | None = None
) -> list[dict[str, Any]]:
    """Every rule on every table in `named`, judged by the seed truths of `every` table there is."""
    _, baseline = study_conf()
    judges = truths(named, every if every is not None else named)
    rows = []
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for name, table in named.items():
            for rule in rules:
                runs = list(pool.map(_one, [(name, table, rule, s, baseline) for s in range(reps)], chunksize=8))
                row = summarize(name, table, rule, runs, judges.get(name))
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
        f"it), prune metric {METRIC} (a rule ending /exact: eval/exact_accuracy). Near-best: the configuration the "
        "study would report is within one SE of the best, its mean over the table's training seeds against the best "
        "mean, with the SE the table's truth line says (eval + seed); beside it, on the table's own seed within one "
        "eval SE. Paid: the share of the table's unpruned FLOPs.",
        "",
    ]
    said = {r["table"]: (r["judged_by"], r["truth"]) for r in rows}
    for name, (judge, truth) in said.items():
        t = named[name]
        detail = (
            f"own best {t.best:.4f}, eval SE {t.se:.4f}"
            if truth is None
            else f"best mean {truth['best']:.4f} ({truth['best_params']}), seed SD {truth['seed_sd']:.4f}, "
            f"SE {truth['se']:.4f}, {truth['near_best']} near-best; own best {t.best:.4f}, eval SE {t.se:.4f}"
        )
        lines.append(f"- {name}: judged by {judge}: {detail}.")
    lines += [
        "",
        "| table | steps | configurations | rule | near-best at n_trials | (eval SE) | paid at n_trials | near-best "
        "at end | paid at end | trials pruned |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['table']} | {r['steps']} | {r['configurations']} | {r['rule']} | "
            f"{100 * r['near_best_at_n_trials']:.0f}% (n={r['n_trials']}) | "
            f"{100 * r['near_best_eval_at_n_trials']:.0f}% | {100 * r['paid_at_n_trials_median']:.0f}% "
            f"| {100 * r['near_best_at_end']:.0f}% | {100 * r['paid_at_end_median']:.0f}% "
            f"| {100 * r['pruned_share_median']:.0f}% |"
        )
    return "\n".join(lines)


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
        rows = run_all(named, args.rules.split(","), args.reps, args.jobs, every=tables(long_min=MIN_SD_CURVES))
    choice = choose_rule(rows)
    result = {**run_header("trm_bench_horizon", argv), "metric": METRIC, "rows": rows, "choice": asdict(choice)}
    said = {None: "not replayed yet", True: "holds", False: "does NOT hold"}[choice.held_out_holds]
    if choice.held_out_holds is not None and not choice.held_out_whole:
        said += " on the configurations recorded so far"
    missing = ", ".join(choice.missing)
    verdict = (
        f"\n\nChosen rule: {choice.rule}"
        + (f" (provisional: {missing} missing)" if choice.provisional else "")
        + f"; worst near-best {choice.worst_near_best:.0%} over {', '.join(choice.tables)}, "
        + (
            f"worst paid {choice.worst_paid:.0%} (over {', '.join(choice.budget_tables)})"
            if choice.budget_tables
            else f"pay not judged (no table of >= {SHIPPED_N_TRIALS} configurations)"
        )
        + ("" if choice.within_budget else " (no rule within the budget)")
        + f". Held-out {HELD_OUT}: {said}."
    )
    write_results(args.out_name, result, markdown(rows, named) + verdict)
    return rows


if __name__ == "__main__":
    main()
