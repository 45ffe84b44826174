"""The arms of a pruning study compared with its first (unpruned) arm (bench/pruning/studies.py runs them): compute
ratios, the gap in best value, whether the goal holds, and the same configurations' curves checked to agree; with
several sampler seeds, per seed and the median over seeds.
"""

from __future__ import annotations

import json
from typing import Any

from bench._results import median
from bench.pruning.curve_replay import replay

# The goal the issue sets: pruned best within 1% (absolute accuracy) of the unpruned best for <= 40% compute.
GOAL_GAP, GOAL_COMPUTE = 0.01, 0.40


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
