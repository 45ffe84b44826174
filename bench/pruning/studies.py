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
per-arm summary under `aggregate`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import optuna
from omegaconf import OmegaConf

from bench._results import RESULTS, ROOT, fmt, median, run_header, write_results
from bench._sweep import QUICK_TRIAL, hydra_list, load_trials, overhead_summary, run_study, trial_record

# The goal the issue sets: pruned best within 1% (absolute accuracy) of the unpruned best for <= 40% compute.
GOAL_GAP, GOAL_COMPUTE = 0.01, 0.40


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
            "reeval.at_end=false",  # the re-evaluation after a study is no part of what the arms compare
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


def paired(reference: dict[str, Any], arm: dict[str, Any], metric: str = "eval/exact_accuracy") -> dict[str, Any]:
    """Configurations both arms ran: their eval curves must agree at every step both reached."""
    ref = {json.dumps(r["params"], sort_keys=True): r for r in reference["trials"]}
    shared, worst = 0, 0.0
    for rec in arm["trials"]:
        other = ref.get(json.dumps(rec["params"], sort_keys=True))
        if other is None:
            continue
        shared += 1
        theirs = {r["step"]: r[metric] for r in other["eval"]}
        for r in rec["eval"]:
            if r["step"] in theirs:
                worst = max(worst, abs(r[metric] - theirs[r["step"]]))
    return {"shared_configurations": shared, "max_abs_diff_of_eval_curves": worst}


def compute_to_target(arm: dict[str, Any], target: float) -> dict[str, Any]:
    """Trial-steps and FLOPs the study had spent when its best first came within the goal of the target."""
    steps = flops = 0
    for rec in sorted(arm["trials"], key=lambda r: r["number"]):
        steps, flops = steps + (rec["steps"] or 0), flops + (rec["compute_flops"] or 0)
        if rec["state"] == "COMPLETE" and rec["value"] is not None and rec["value"] >= target:
            return {"steps": steps, "flops": flops, "trial": rec["number"]}
    return {"steps": None, "flops": None, "trial": None}


def compare(arms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reference = arms[0]
    target = reference["best_value"] - GOAL_GAP if reference["best_value"] is not None else None
    ref_reach = compute_to_target(reference, target) if target is not None else None
    rows = []
    for arm in arms:
        steps_ratio = arm["trial_steps"] / reference["trial_steps"] if reference["trial_steps"] else None
        flops_ratio = arm["compute_flops"] / reference["compute_flops"] if reference["compute_flops"] else None
        gap = (
            reference["best_value"] - arm["best_value"]
            if None not in (reference["best_value"], arm["best_value"])
            else None
        )
        reach = compute_to_target(arm, target) if target is not None else {"steps": None, "flops": None, "trial": None}
        rows.append({
            "arm": arm["arm"],
            "steps_ratio": steps_ratio,
            "flops_ratio": flops_ratio,
            "wall_ratio": arm["wall_s"] / reference["wall_s"],
            "best_gap": gap,
            "meets_goal": None if arm is reference or gap is None else bool(gap <= GOAL_GAP and flops_ratio <= GOAL_COMPUTE),
            "to_target": reach,  # when the study's best came within GOAL_GAP of the reference's best
            "to_target_flops_ratio": reach["flops"] / reference["compute_flops"] if reach["flops"] and reference["compute_flops"] else None,
            "reference_to_target": ref_reach,
            **paired(reference, arm),
        })  # fmt: skip
    return rows


REPLAY_PRUNERS = {  # what-if pruners replayed on the reference arm's recorded curves (conf/pruner/ values first)
    "hyperband(100, rf 3)": lambda steps: optuna.pruners.HyperbandPruner(
        min_resource=100, max_resource=steps, reduction_factor=3
    ),
    "median(3 startup, 0 warmup)": lambda steps: optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=0),
    "successive_halving(300, rf 3)": lambda steps: optuna.pruners.SuccessiveHalvingPruner(
        min_resource=300, reduction_factor=3
    ),
    "median(1 startup, 100 warmup)": lambda steps: optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=100),
    "median(1 startup, 200 warmup)": lambda steps: optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=200),
}


RESOURCES = ("steps", "gflops")  # what a replay reports as Optuna's step: the training step, or cumulative GFLOPs


def replay_curves(
    trials: list[dict[str, Any]],
    pruner: optuna.pruners.BasePruner,
    metric: str,
    objective: str = "eval/exact_accuracy",
    resource: str = "steps",
) -> dict[str, Any]:
    """Optuna's `pruner` on recorded curves, on an in-memory study: the trials that reported are asked in their
    order (with their recorded parameters), report `metric` at each eval and ask should_prune(); a finished one is
    told its best `objective`. The step reported is the training step (`resource="steps"`) or the trial's
    cumulative FLOPs to that eval in whole GFLOPs (`"gflops"`: successive-halving rungs become FLOP budgets).
    Returns the steps and FLOPs they ran (at each trial's FLOPs per step), the best value kept, the pruned trials."""
    if resource not in RESOURCES:
        raise ValueError(f"resource={resource!r}: expected one of {', '.join(RESOURCES)}")
    # A fixed name: Hyperband assigns brackets by a hash of the study name and trial number.
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(), study_name="replay", direction="maximize", pruner=pruner
    )
    replayed = [rec for rec in sorted(trials, key=lambda r: r["number"]) if rec["eval"]]  # refused ones trained nothing
    choices: dict[str, list[Any]] = {}
    for rec in replayed:
        for name, value in (rec.get("params") or {}).items():
            choices.setdefault(name, []).extend([] if value in choices.get(name, []) else [value])
    space = {name: optuna.distributions.CategoricalDistribution(values) for name, values in choices.items()}
    steps = flops = 0.0
    best, pruned_trials = None, []
    for rec in replayed:
        study.enqueue_trial(rec.get("params") or {})  # the trial carries its recorded parameters: none is drawn
        trial, per_step = study.ask(space), (rec["compute_flops"] or 0) / max(1, rec["steps"] or 1)
        done, pruned = 0, False
        for r in rec["eval"]:
            trial.report(r[metric], r["step"] if resource == "steps" else round(r["step"] * per_step / 1e9))
            done = r["step"]
            if trial.should_prune():
                pruned = True
                break
        steps, flops = steps + done, flops + done * per_step
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            pruned_trials.append(rec["number"])
        else:
            value = max(r[objective] for r in rec["eval"])
            best = value if best is None else max(best, value)
            study.tell(trial, value)
    return {"steps": steps, "flops": flops, "best": best, "pruned": pruned_trials, "study": study}


def replay(
    reference: dict[str, Any], metrics: tuple[str, ...] = ("eval/exact_accuracy", "eval/blank_accuracy")
) -> list[dict[str, Any]]:
    """Each pruner and reported metric replayed on the reference's full curves, trials in the same order: cheap,
    but it assumes the sampler would have proposed the same trials (TPE learns from pruned ones too)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    rows = []
    for metric in metrics:
        for name, make in REPLAY_PRUNERS.items():
            longest = max((rec["steps"] or 1) for rec in reference["trials"] if rec["eval"])
            run = replay_curves(reference["trials"], make(longest), metric)
            rows.append(
                {
                    "metric": metric,
                    "pruner": name,
                    "steps_ratio": run["steps"] / reference["trial_steps"],
                    "flops_ratio": run["flops"] / reference["compute_flops"],
                    "best_value": run["best"],
                }
            )
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| pruner | complete / pruned / fail | trial-steps | TFLOP | wall s | best value (trial) | steps vs ref | FLOPs vs ref | best gap | goal met |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for arm, cmp in zip(result["arms"], result["comparison"]):
        s = arm["states"]
        goal = "-" if cmp["meets_goal"] is None else ("yes" if cmp["meets_goal"] else "no")
        lines.append(
            f"| {arm['arm']} | {s['COMPLETE']} / {s['PRUNED']} / {s['FAIL']} | {arm['trial_steps']} | {arm['compute_flops'] / 1e12:.1f} "
            f"| {arm['wall_s']:.0f} | {fmt(arm['best_value'], '.4f')} ({arm['best_trial']}) | {fmt(cmp['steps_ratio'], '.0%')} "
            f"| {fmt(cmp['flops_ratio'], '.0%')} | {fmt(cmp['best_gap'], '+.4f')} | {goal} |"
        )
    lines += [
        "",
        "| arm | best within 1% of the reference best at trial | trial-steps then | FLOPs then, vs the reference's whole study |",
        "|---|---:|---:|---:|",
    ]
    for cmp in result["comparison"]:
        t = cmp["to_target"]
        lines.append(
            f"| {cmp['arm']} | {fmt(t['trial'], 'd')} | {fmt(t['steps'], 'd')} | {fmt(cmp['to_target_flops_ratio'], '.0%')} |"
        )
    lines += [
        "",
        "Replayed on the reference's curves (same trials in the same order; TPE would have adapted):",
        "",
        "| reported metric | pruner | trial-steps vs ref | FLOPs vs ref | best kept |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result.get("replay", []):
        lines.append(
            f"| {r['metric']} | {r['pruner']} | {r['steps_ratio']:.0%} | {r['flops_ratio']:.0%} | {fmt(r['best_value'], '.4f')} |"
        )
    lines.append("")
    lines.append("| pruner | trial | params | state | steps | reported values (step: value) |")
    lines.append("|---|---:|---|---|---:|---|")
    for arm in result["arms"]:
        for t in arm["trials"]:
            params = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in t["params"].items())
            curve = " ".join(f"{k}:{v:.3f}" for k, v in t["intermediate"].items())
            lines.append(f"| {arm['arm']} | {t['number']} | {params} | {t['state']} | {t['steps']} | {curve} |")
    return "\n".join(lines)


def seed_result(seed: int, arms: list[dict[str, Any]]) -> dict[str, Any]:
    """One seed's arms, compared with its first (unpruned) arm, and the what-if replays on that arm's curves."""
    return {"seed": seed, "arms": arms, "comparison": compare(arms), "replay": replay(arms[0])}


def aggregate(per_seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm (by position: the same spec in every seed): its compute ratio and best-value gap against the
    unpruned arm of the same seed, per seed and the median over seeds, and whether the goal held in every seed
    (measured in FLOPs, as `meets_goal`; `meets_goal_steps` measures the compute in trial-steps)."""
    rows = []
    for i, arm in enumerate(per_seed[0]["comparison"]):
        cmps = [r["comparison"][i] for r in per_seed]
        if any(c["arm"] != arm["arm"] for c in cmps):
            raise ValueError(f"arm {i} differs between seeds: {[c['arm'] for c in cmps]}")
        seeds = []
        for r, c in zip(per_seed, cmps):
            gap = c["best_gap"]
            seeds.append({
                "seed": r["seed"],
                "steps_ratio": c["steps_ratio"],
                "flops_ratio": c["flops_ratio"],
                "best_gap": gap,
                "best_value": r["arms"][i]["best_value"],
                "reference_best": r["arms"][0]["best_value"],
                "states": r["arms"][i]["states"],
                "meets_goal": c["meets_goal"],
                "meets_goal_steps": None if i == 0 or gap is None or c["steps_ratio"] is None else bool(gap <= GOAL_GAP and c["steps_ratio"] <= GOAL_COMPUTE),
                "to_target_flops_ratio": c["to_target_flops_ratio"],
            })  # fmt: skip

        def med(key: str, seeds: list[dict[str, Any]] = seeds) -> float | None:
            values = [s[key] for s in seeds if s[key] is not None]
            return median(values) if len(values) == len(seeds) else None  # a seed without a value: no median

        rows.append({
            "arm": arm["arm"],
            "per_seed": seeds,
            "median_steps_ratio": med("steps_ratio"),
            "median_flops_ratio": med("flops_ratio"),
            "median_best_gap": med("best_gap"),
            "goal_every_seed": None if i == 0 else all(s["meets_goal"] is True for s in seeds),
            "goal_steps_every_seed": None if i == 0 else all(s["meets_goal_steps"] is True for s in seeds),
            "goal_seeds": None if i == 0 else sum(s["meets_goal"] is True for s in seeds),
        })  # fmt: skip
    return rows


def yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def markdown_seeds(result: dict[str, Any]) -> str:
    """The multi-seed summary (per arm: each seed, then the median over seeds), then each seed's own tables."""
    n = len(result["per_seed"])
    lines = [
        "| arm | seed | complete / pruned / fail | best (unpruned best) | trial-steps vs ref | FLOPs vs ref | best gap | goal met (FLOPs / steps) |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for row in result["aggregate"]:
        for s in row["per_seed"]:
            st = s["states"]
            lines.append(
                f"| {row['arm']} | {s['seed']} | {st['COMPLETE']} / {st['PRUNED']} / {st['FAIL']} "
                f"| {fmt(s['best_value'], '.4f')} ({fmt(s['reference_best'], '.4f')}) | {fmt(s['steps_ratio'], '.0%')} "
                f"| {fmt(s['flops_ratio'], '.0%')} | {fmt(s['best_gap'], '+.4f')} "
                f"| {yes_no(s['meets_goal'])} / {yes_no(s['meets_goal_steps'])} |"
            )
        every = (
            "-"
            if row["goal_every_seed"] is None
            else f"{yes_no(row['goal_every_seed'])} / {yes_no(row['goal_steps_every_seed'])} (in every seed)"
        )
        lines.append(
            f"| **{row['arm']}** | **median of {n}** | | | **{fmt(row['median_steps_ratio'], '.0%')}** "
            f"| **{fmt(row['median_flops_ratio'], '.0%')}** | **{fmt(row['median_best_gap'], '+.4f')}** | {every} |"
        )
    lines += [
        "",
        f"Goal: best within {GOAL_GAP:g} (absolute) of the unpruned best of the same seed for <= {GOAL_COMPUTE:.0%} "
        f"of its compute (FLOPs; 'steps': in trial-steps). {result['n_trials']} trials per study"
        + (
            f"; {result['jobs']} studies ran at once, so wall times are not compared."
            if result.get("jobs", 1) > 1
            else "."
        ),
    ]
    for r in result["per_seed"]:
        lines += ["", f"### Seed {r['seed']}", "", markdown(r)]
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    return markdown_seeds(result) if "per_seed" in result else markdown(result)


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
