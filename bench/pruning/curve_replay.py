"""Optuna's pruners replayed on recorded learning curves, on an in-memory study: what a pruner would have cut and
kept of a study that ran unpruned (bench/pruning/studies.py's what-if table; bench/pruning/evidence.py, replays.py).
"""

from __future__ import annotations

from typing import Any

import optuna

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
