"""Two pruning ideas the 1,000-step studies pointed to, replayed on their unpruned curves before anything is built.

    python -m bench.pruning_replays                                   # reads bench/results/pruning_1000steps.json
    python -m bench.pruning_replays --results other.json --out-name pruning_replays_other

1. Depth-grouped median: a trial is compared only with completed trials of the same group (recursion depth, by
   one of several keys), so deeper recursion, which starts slower (docs/benchmarks.md, Pruning), is not judged
   against shallow trials. No group peer yet: not pruned. Prune when the trial's best value so far, from the
   warm-up step on, is below the peers' median at that step (Optuna's MedianPruner rule, within the group;
   ungrouped it decides as MedianPruner does: tests/test_bench.py).
2. Threshold: prune a trial whose value at a step is still below a floor (Optuna's ThresholdPruner rule), to
   drop only the hopeless (the attention trials of this tiny study stay at 0 exact accuracy for 1,000 steps).
3. Successive halving on a budget in FLOPs (the issue's suggestion): rungs at r0, r0 x eta, r0 x eta^2 ... FLOPs
   spent by the trial (not steps), so a cheap configuration is judged after more steps than a costly one; at each
   rung a trial goes on only if its value there is in the top 1/eta of every value recorded at that rung
   (Optuna's SuccessiveHalvingPruner rule, asynchronous: with fewer than eta values, only the best goes on).
   Written by hand because Optuna's pruner counts its resource in reported steps; with one FLOP per step it
   decides exactly as Optuna's does (tests/test_bench.py).

Both are replays: the same trials in the same order as the unpruned study (TPE would have drawn differently
after a pruned trial), so they rank ideas, they do not show a goal met. The goal is bench/pruning.py's: the best
within 0.01 of the unpruned best for <= 40% of its FLOPs, in every seed. Table: bench/results/<out-name>.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._results import RESULTS, run_header, write_results
from bench.pruning import GOAL_COMPUTE, GOAL_GAP

GROUPS: dict[str, Callable[[dict[str, Any]], tuple[Any, ...]]] = {
    "the same H and L cycles": lambda p: (p["arch.H_cycles"], p["arch.L_cycles"]),
    "the same H cycles": lambda p: (p["arch.H_cycles"],),
    "the same mixer and H cycles": lambda p: (p["arch.mixer"], p["arch.H_cycles"]),
    "all trials (Optuna's MedianPruner)": lambda p: (),
}


def trained(arm: dict[str, Any]) -> list[dict[str, Any]]:
    """The trials that reported, in the order the study ran them (refused duplicates trained nothing)."""
    return sorted((t for t in arm["trials"] if t["eval"]), key=lambda t: t["number"])


def replay(arm: dict[str, Any], prune: Callable[[dict[str, Any], dict[str, Any], list], bool]) -> dict[str, float]:
    """FLOPs share and best kept when `prune(trial, eval_row, completed)` decides at every eval."""
    completed: list[dict[str, Any]] = []
    flops = best = 0.0
    for trial in trained(arm):
        per_step = (trial["compute_flops"] or 0) / max(1, trial["steps"] or 1)
        last, pruned = 0, False
        for row in trial["eval"]:
            last = row["step"]
            if prune(trial, row, completed):
                pruned = True
                break
        flops += last * per_step
        if not pruned:
            completed.append(trial)
            best = max(best, *(r["eval/exact_accuracy"] for r in trial["eval"]))
    reference = max(max(r["eval/exact_accuracy"] for r in t["eval"]) for t in trained(arm))
    return {"flops_ratio": flops / arm["compute_flops"], "gap": reference - best}


def grouped_median(metric: str, warmup: int, group: Callable[[dict[str, Any]], tuple[Any, ...]]) -> Callable:
    def prune(trial: dict[str, Any], row: dict[str, Any], completed: list[dict[str, Any]]) -> bool:
        if row["step"] < warmup:  # Optuna's n_warmup_steps: a verdict from the warm-up step on
            return False
        peers = [
            r[metric]
            for t in completed
            if group(t["params"]) == group(trial["params"])
            for r in t["eval"]
            if r["step"] == row["step"]
        ]
        so_far = max(r[metric] for r in trial["eval"] if r["step"] <= row["step"])  # Optuna: the best so far
        return bool(peers) and so_far < statistics.median(peers)

    return prune


def threshold(metric: str, at_step: int, floor: float) -> Callable:
    return lambda trial, row, completed: row["step"] >= at_step and row[metric] < floor


def flop_halving(metric: str, first_rung_flops: float, eta: int, last_step: int) -> Callable:
    """Rule 3; its rungs are shared by the trials of one replay, so build one per replay."""
    rungs: dict[int, list[float]] = {}
    next_rung: dict[int, int] = {}

    def prune(trial: dict[str, Any], row: dict[str, Any], completed: list[dict[str, Any]]) -> bool:
        per_step = (trial["compute_flops"] or 0) / max(1, trial["steps"] or 1)
        value = row[metric]  # Optuna's rule: the value reported at the rung, not the best so far
        k = next_rung.setdefault(trial["number"], 0)
        while row["step"] < last_step and row["step"] * per_step >= first_rung_flops * eta**k:
            values = sorted([*rungs.get(k, []), value], reverse=True)
            rungs[k] = values
            next_rung[trial["number"]] = k = k + 1
            if value < values[max(0, len(values) // eta - 1)]:
                return True
        return False

    return prune


def unpruned_studies(
    argv: list[str] | None, doc: str | None, out_name: str
) -> tuple[argparse.Namespace, dict[str, Any], list[dict[str, Any]]]:
    """A replay script's arguments, the saved multi-seed results they name, and each seed's unpruned study."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS / "pruning_1000steps.json")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--out-name", default=out_name)
    args = p.parse_args(argv)
    saved = json.loads(args.results.read_text())
    return args, saved, [seed["arms"][0] for seed in saved["per_seed"]]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, saved, arms = unpruned_studies(argv, __doc__, "pruning_replays")
    # Each rule as a factory: a replay gets a fresh one (flop_halving keeps its rungs' values).
    rules: dict[str, Callable[[], Callable]] = {}
    for metric in ("eval/blank_accuracy", "eval/exact_accuracy"):
        for warmup in (100, 200, 300):
            for name, group in GROUPS.items():
                rules[f"median within {name}, {metric}, warm-up {warmup}"] = lambda m=metric, w=warmup, g=group: (
                    grouped_median(m, w, g)
                )
    for at_step in (200, 300, 400):
        for floor in (0.2, 0.3, 0.5):
            rules[f"threshold eval/blank_accuracy < {floor} at step >= {at_step}"] = lambda a=at_step, f=floor: (
                threshold("eval/blank_accuracy", a, f)
            )
    last_step = max(t["steps"] for arm in arms for t in trained(arm))
    for metric in ("eval/blank_accuracy", "eval/exact_accuracy"):
        for tflops in (0.5, 1, 2, 3):
            for eta in (2, 3, 4):
                rules[f"successive halving in FLOPs: first rung {tflops:g} TFLOP, eta {eta}, {metric}"] = (
                    lambda m=metric, r=tflops * 1e12, e=eta: flop_halving(m, r, e, last_step)
                )
    rows = []
    for name, make_rule in rules.items():
        per_seed = [replay(arm, make_rule()) for arm in arms]
        met = sum(r["flops_ratio"] <= GOAL_COMPUTE and r["gap"] <= GOAL_GAP for r in per_seed)
        rows.append({"rule": name, "seeds": per_seed, "goal_met_in": met})
    result = {**run_header("pruning_replays", argv), "source": str(args.results), "rows": rows}
    lines = [
        f"Replays on the unpruned studies of {args.results.name} ({len(arms)} seeds): FLOPs share and gap to the "
        "unpruned best per seed; goal: <= 40% and <= 0.01 in every seed.",
        "",
        "| rule | " + " | ".join(f"seed {s['seed']}: FLOPs, gap" for s in saved["per_seed"]) + " | goal met in |",
        "|---|" + "---:|" * len(arms) + "---:|",
    ]
    for row in rows:
        cells = " | ".join(f"{100 * s['flops_ratio']:.0f}%, {s['gap']:+.4f}" for s in row["seeds"])
        lines.append(f"| {row['rule']} | {cells} | {row['goal_met_in']} of {len(arms)} |")
    write_results(args.out_name, result, "\n".join(lines), args.out_dir)
    return result


if __name__ == "__main__":
    main()
