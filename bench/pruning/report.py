"""The pruning study's tables (bench/results/pruning.md): one seed's arms, trials and replays; with several seeds,
the per-arm summary over seeds first.
"""

from __future__ import annotations

from typing import Any

from bench._results import fmt
from bench.pruning.comparison import GOAL_COMPUTE, GOAL_GAP


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
