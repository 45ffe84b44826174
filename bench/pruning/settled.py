"""Compare the arms of a stopped `bench.pruning.studies` run on the trials every arm has settled.

    python -m bench.pruning.settled --work-dir DIR --seed 1 --arms none,evidence

`bench.pruning.studies` compares arms only when every study has finished. Trials are deterministic and, with a random
sampler, every arm draws the same configurations in the same order, so the first N trials settled (COMPLETE or
PRUNED) in every arm are what an N-trial study of each arm would have run: this compares those. Reads
DIR/pruning/seed<S>/<i>_<arm>.db (study pruning_<i>_<arm>, as bench.pruning.studies names them); the first arm is the
reference. Kept: the arm's best within one binomial eval standard error (--eval-examples) of the reference's.
Writes bench/results/<out-name>.json and .md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench._results import fmt, run_header, write_results
from bench._sweep import load_trials, trial_record
from contracts.eval_noise import binomial_stderr

SETTLED = ("COMPLETE", "PRUNED")


def settled_records(db: Path, study: str) -> dict[int, dict[str, Any]]:
    """The finished trials of one arm's study, by number (a trial stopped while running is left out)."""
    trials = [t for t in load_trials(f"sqlite:///{db}", study) if t.state.is_finished()]
    return {r["number"]: r for r in map(trial_record, trials)}


def compare(arms: dict[str, dict[int, dict[str, Any]]], eval_examples: int) -> dict[str, Any]:
    """Each arm over the first N trials settled in every arm: trials, FLOPs, best, and the gap to the first arm."""
    n = 0
    while all(arms[a].get(n, {}).get("state") in SETTLED for a in arms):
        n += 1
    rows: dict[str, Any] = {}
    for arm, records in arms.items():
        trials = [records[i] for i in range(n)]
        complete = [t for t in trials if t["state"] == "COMPLETE"]
        best = max(complete, key=lambda t: t["value"]) if complete else None
        rows[arm] = {
            "trials": trials,
            "complete": len(complete),
            "pruned": n - len(complete),
            "flops": sum(t["compute_flops"] or 0 for t in trials),
            "best_value": best["value"] if best else None,
            "best_trial": best["number"] if best else None,
        }
    reference = rows[next(iter(rows))]
    p = reference["best_value"] or 0.0
    stderr = binomial_stderr(p, eval_examples)
    for row in rows.values():
        row["flops_ratio"] = row["flops"] / reference["flops"] if reference["flops"] else None
        row["gap"] = None if row["best_value"] is None else p - row["best_value"]
        row["kept"] = row["gap"] is not None and row["gap"] <= stderr + 1e-12
    return {"settled_trials": n, "reference_stderr": stderr, "arms": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"First {result['settled_trials']} trials settled in every arm; one eval SE of the reference best: "
        f"{result['reference_stderr']:.4f}.",
        "",
        "| arm | complete / pruned | TFLOP | FLOPs vs reference | best (trial) | gap | kept |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for arm, row in result["arms"].items():
        lines.append(
            f"| {arm} | {row['complete']} / {row['pruned']} | {row['flops'] / 1e12:.1f} | {fmt(row['flops_ratio'], '.0%')} "
            f"| {fmt(row['best_value'], '.4f')} ({row['best_trial']}) | {fmt(row['gap'], '+.4f')} | {'yes' if row['kept'] else 'no'} |"
        )
    lines += ["", "| trial | params | " + " | ".join(result["arms"]) + " |", "|---|---|" + "---|" * len(result["arms"])]
    first = next(iter(result["arms"].values()))["trials"]
    for i, trial in enumerate(first):
        cells = []
        for row in result["arms"].values():
            t = row["trials"][i]
            cells.append(f"{t['state'].lower()} at {t['steps']}: {fmt(t['value'], '.4f')}")
        params = " ".join(f"{k.split('.')[-1]}={v}" for k, v in trial["params"].items())
        lines.append(f"| {trial['number']} | {params} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--work-dir", type=Path, required=True, help="the --out-dir of the bench.pruning.studies run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--arms", default="none,evidence", help="the arms in bench.pruning.studies's order; the first is the reference"
    )
    p.add_argument("--eval-examples", type=int, default=256, help="puzzles each eval scored (the standard error's n)")
    p.add_argument("--out-name", default="pruning_settled")
    args = p.parse_args(argv)
    seed_dir = args.work_dir / "pruning" / f"seed{args.seed}"
    names = [a.strip() for a in args.arms.split(",") if a.strip()]
    arms = {arm: settled_records(seed_dir / f"{i}_{arm}.db", f"pruning_{i}_{arm}") for i, arm in enumerate(names)}
    result = {**run_header("pruning_settled", argv), **compare(arms, args.eval_examples)}
    write_results(args.out_name, result, table(result))
    return result


if __name__ == "__main__":
    main()
