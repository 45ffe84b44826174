"""What pruning buys: the same CPU proxy study (laptop site: tiny preset, 500-step trials, TPE with a fixed
seed) run once per pruner, as real studies of real training jobs. Per arm: trial-steps and FLOPs spent, the
best value found, wall time; against the unpruned arm: the compute ratio and the gap in best value.

    python -m bench.pruning.studies                              # arms none,hyperband; 10 trials each (~35 min here)
    python -m bench.pruning.studies --arms none,hyperband,median --n-trials 12
    python -m bench.pruning.studies --arms none,hyperband,hyperband+study.prune_metric=eval/blank_accuracy
    python -m bench.pruning.studies --quick --out-dir /tmp/p     # smoke run: 3 trials of 20 steps per arm
    python -m bench.pruning.studies --render bench/results/pruning.json
    python -m bench.pruning.studies --seeds 1,2,3 --jobs 2 --arms none,median+pruner.n_startup_trials=1+pruner.n_warmup_steps=100+study.prune_metric=eval/blank_accuracy

An arm is a conf/pruner/ name, then `+key=value` overrides for that arm only (pruner.* or any sweeps.run key).
`--seeds` runs every arm once per sampler seed, each a whole real study, and compares each arm with the
unpruned (first) arm of the same seed: per seed and the median over seeds of the compute ratio and of the gap
in best value, and whether the goal holds in every seed (one seed's study is mostly luck: when its best comes).
`--jobs N` runs N studies at once (give each 1 thread: OMP_NUM_THREADS=1 on a 2-core machine); their wall times
then share the cores and are not compared, trial-steps and FLOPs are unaffected.

Each arm is `python -m sweeps.run study=<study> pruner=<arm> n_trials=N seed=S` on its own SQLite file
(bench/results/pruning/, with --seeds under seed<S>/), W&B off. Training is deterministic for given parameters and seed, so a configuration
that both arms sampled must show the same reported curve up to where one arm pruned it: the script checks
that (`paired`), which makes the comparison a fair one for the trials the arms share. TPE's later proposals
differ between arms (it learns from the pruned trials too): that is part of what is being compared.
Writes bench/results/pruning.json and pruning.md (with --seeds: one result per seed under `per_seed` and the
per-arm summary under `aggregate`). This module runs the arms; the comparison is bench/pruning/comparison.py, the
what-if replays curve_replay.py, the tables report.py.
"""

from __future__ import annotations

import argparse
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench._results import RESULTS, ROOT, run_header, write_results
from bench._sweep import NO_END_STAGES, QUICK_TRIAL, hydra_list, load_trials, overhead_summary, run_study, trial_record
from bench.pruning.comparison import GOAL_COMPUTE, GOAL_GAP, aggregate, seed_result
from bench.pruning.report import render


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--arms",
        default="none,hyperband,hyperband+study.prune_metric=eval/blank_accuracy",
        help="comma list of arms, each a pruner config name (conf/pruner/) with optional +key=value overrides; the first is the reference",
    )
    p.add_argument("--study", default="model_scaling")
    p.add_argument("--n-trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=1, help="sampler seed, the same for every arm")
    p.add_argument(
        "--seeds",
        help="comma list of sampler seeds (e.g. 1,2,3): every arm runs once per seed, each a whole study; "
        "the table adds per-seed and median compute ratios and gaps (overrides --seed)",
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="studies run at once (with OMP_NUM_THREADS=1 each takes one core)"
    )
    p.add_argument(
        "--out-dir", type=Path, default=RESULTS, help="results go here; the studies' files under <out-dir>/pruning/"
    )
    p.add_argument("--quick", action="store_true", help="3 trials of 20 steps per arm (a smoke run)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep each arm's study file and runs: a driver restarted on a study "
        "continues up to n_trials, so an interrupted bench goes on where it stopped",
    )
    p.add_argument(
        "--render",
        type=Path,
        help="reprint the table of a saved pruning.json (multi-seed: compared and summarized again from its arms)",
    )
    p.add_argument(
        "--reuse",
        type=Path,
        help="a previous pruning.json: arms it holds with the same spec, study, trials and seed are "
        "taken from it instead of run again (training is deterministic; marked 'reused')",
    )
    p.add_argument("overrides", nargs="*", help="extra sweeps.run overrides for every arm")
    args = p.parse_args(argv)
    args.work = args.out_dir / "pruning"
    args.seed_list = [int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else None
    if args.quick:
        args.n_trials = min(args.n_trials, 3)
        args.overrides = [
            f"trial.overrides={hydra_list(QUICK_TRIAL)}",
            "pruner.min_resource=10",
            "poll_s=0.2",
            *NO_END_STAGES,  # no part of what the arms compare
            *args.overrides,
        ]
    return args


def pruner_keys(pruner: str) -> set[str]:
    """The arguments conf/pruner/<pruner>.yaml sets: the only pruner.* keys a shared override may set for it."""
    path = ROOT / "conf" / "pruner" / f"{pruner}.yaml"
    return {str(k) for k in OmegaConf.load(path)} - {"_target_"} if path.exists() else set()


def shared_overrides(pruner: str, overrides: list[str]) -> list[str]:
    """The overrides for every arm, less the pruner.* ones this arm's pruner does not take (--quick's
    min_resource means nothing to the median pruner and NopPruner takes no arguments)."""
    keys = pruner_keys(pruner)
    return [
        o
        for o in overrides
        if not o.startswith("pruner=") and not (o.startswith("pruner.") and o.split("=")[0][7:] not in keys)
    ]


def run_arm(
    index: int, arm: str, args: argparse.Namespace, seed: int | None = None, work: Path | None = None
) -> dict[str, Any]:
    seed = args.seed if seed is None else seed
    work = args.work if work is None else work
    pruner, *arm_overrides = arm.split("+")
    key = f"{index}_{pruner}"  # file and study names
    db = work / f"{key}.db"
    if not args.resume:
        db.unlink(missing_ok=True)
    url = f"sqlite:///{db}"
    name = f"pruning_{key}"
    overrides = [
        f"study={args.study}", f"study.name={name}", f"pruner={pruner}", f"n_trials={args.n_trials}", f"seed={seed}",
        f"storage.url={url}", f"output_root={work / 'runs' / key}", "wandb.enabled=false",
        f"hydra.run.dir={work / 'hydra' / key}", *shared_overrides(pruner, args.overrides), *arm_overrides,
    ]  # fmt: skip
    run = run_study(overrides, work / f"{key}.log")
    trials = load_trials(url, name)
    if args.resume:  # the study may have run (partly) before this call: its wall time is its trials' span
        run["started_at"] = min(t.datetime_start.timestamp() for t in trials)
        run["ended_at"] = max(t.datetime_complete.timestamp() for t in trials if t.datetime_complete)
        run["wall_s"] = round(run["ended_at"] - run["started_at"], 2)
    records = [trial_record(t) for t in trials]
    for rec in records:  # the full eval curves (every metric), for looking at early predictors of the objective
        metrics = Path(rec.pop("workdir") or "/nonexistent") / "run" / "metrics.jsonl"
        rec["eval"] = (
            [r for r in map(json.loads, metrics.read_text().splitlines()) if "eval/accuracy" in r]
            if metrics.exists()
            else []
        )
    complete = [r for r in records if r["state"] == "COMPLETE"]
    best = max(complete, key=lambda r: r["value"], default=None)
    return {
        "arm": arm,
        "reused": None,
        **run,
        "trials": records,
        "states": {s: sum(r["state"] == s for r in records) for s in ("COMPLETE", "PRUNED", "FAIL")},
        "trial_steps": sum(r["steps"] or 0 for r in records),
        "compute_flops": sum(r["compute_flops"] or 0 for r in records),
        "best_value": best["value"] if best else None,
        "best_trial": best["number"] if best else None,
        "best_params": best["params"] if best else None,
        "overhead": overhead_summary(trials, run),
    }


def reusable(args: argparse.Namespace, seeds: list[int]) -> dict[tuple[int, str], dict[str, Any]]:
    """Arms of a previous pruning.json (single- or multi-seed) with the same study and trial count, by (seed, arm)."""
    if not args.reuse:
        return {}
    old = json.loads(args.reuse.read_text())
    if (old["study"], old["n_trials"]) != (args.study, args.n_trials):
        print(f"--reuse {args.reuse}: another study or trial count; running every arm", flush=True)
        return {}
    tag = f"{args.reuse} ({old['machine']['date']})"
    runs = old.get("per_seed") or [{"seed": old["seed"], "arms": old["arms"]}]
    return {
        (r["seed"], a["arm"]): {**a, "reused": a.get("reused") or tag}
        for r in runs
        if r["seed"] in seeds
        for a in r["arms"]
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.render:
        result = json.loads(args.render.read_text())
        if "per_seed" in result:  # comparisons and summary are computed again from each seed's arms
            result["per_seed"] = [seed_result(r["seed"], r["arms"]) for r in result["per_seed"]]
            result["aggregate"] = aggregate(result["per_seed"])
        print(render(result))
        return result
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if len(arms) < 2:
        raise SystemExit(
            f"--arms={args.arms!r}: name at least two pruners (the first is the reference), e.g. none,hyperband"
        )
    seeds = args.seed_list or [args.seed]
    works = {seed: args.work / f"seed{seed}" if args.seed_list else args.work for seed in seeds}
    for work in works.values():
        if not args.resume:
            shutil.rmtree(work / "runs", ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
    previous = reusable(args, seeds)

    def one(seed: int, index: int, arm: str) -> dict[str, Any]:
        return previous.get((seed, arm)) or run_arm(index, arm, args, seed, works[seed])

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # each study is a subprocess
        futures = {(seed, i): pool.submit(one, seed, i, arm) for seed in seeds for i, arm in enumerate(arms)}
        runs = {key: f.result() for key, f in futures.items()}
    per_seed = [seed_result(seed, [runs[(seed, i)] for i in range(len(arms))]) for seed in seeds]
    header = {
        **run_header("pruning", argv),
        "study": args.study,
        "n_trials": args.n_trials,
        "goal": {"max_best_gap": GOAL_GAP, "max_compute_ratio": GOAL_COMPUTE},
        "jobs": args.jobs,
    }
    if args.seed_list:
        result = {**header, "seeds": seeds, "per_seed": per_seed, "aggregate": aggregate(per_seed)}
    else:
        (single,) = per_seed
        result = {**header, "seed": single.pop("seed"), **single}
    write_results("pruning", result, render(result), args.out_dir)
    return result


if __name__ == "__main__":
    main()
