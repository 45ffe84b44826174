"""The default strategy, chosen from TRM-Bench-tiny's replays by a rule fixed before the seed it is judged on exists.

    python -m bench.trm_bench.choice            # the choice, each candidate's worst seed, the held-out verdict

The rule (issue 42: no tuning to the data reported on). Seed 0 alone chose GP, and the held-out seed 1 did not
confirm it: its lead came from seed 0's winners sitting at the corner GP tries first. So the choice now guards
against one seed's luck: among the strategies a user can select (conf/ files) replayed at least MIN_REPS times on every seed of CHOICE_SEEDS, the
one whose *worst* seed needs the least compute until 90% of its studies hold a configuration within one SE of that
seed's best (ties: the lesser worst median). Its n_trials is the most, over those seeds, of the trials that find one
9 times in 10. The rule and CHOICE_SEEDS were committed before HELD_OUT_SEED's curves were recorded; the verdict is
read on HELD_OUT_SEED's replays of the chosen strategy alone (the issue's goal: >= 90% of studies at <= 40% of the
grid's compute).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench._results import RESULTS, ROOT, run_header, write_results

CHOICE_SEEDS = (0, 1)
HELD_OUT_SEED = 2
MIN_REPS = 100
GOAL_SHARE = 0.40  # of the grid's compute ...
GOAL_FOUND = 0.90  # ... at which this share of held-out studies must hold a near-best configuration

Row = dict[str, Any]


def shipped(row: Row, conf: Path = ROOT / "conf") -> bool:
    """A strategy a user can select: its sampler and pruner are conf/ files (a replayed variant such as median_40,
    a shipped pruner with other settings, is reported for comparison but is not a default anyone could run)."""
    return (conf / "sampler" / f"{row['sampler']}.yaml").exists() and (
        conf / "pruner" / f"{row['pruner']}.yaml"
    ).exists()


def replay_path(seed: int, results: Path = RESULTS) -> Path:
    return results / f"trm_bench_replay_seed{seed}.json"


def load_rows(seed: int, results: Path = RESULTS) -> dict[str, Row]:
    """A seed's replay rows by strategy name ({} where that seed has no replays yet)."""
    path = replay_path(seed, results)
    if not path.exists():
        return {}
    return {r["strategy"]: r for r in json.loads(path.read_text())["rows"]}


@dataclass(frozen=True)
class Choice:
    strategy: str
    sampler: str
    pruner: str
    metric: str
    worst_p90: float  # the compute (share of the grid) at which 90% of studies found one, on the worse choice seed
    n_trials: int  # finds one in 9 of 10 studies on every choice seed


def worst(rows: list[Row], key: str) -> float:
    """The worst (largest) value of `key` over one strategy's rows; never found (inf or missing) is inf."""
    values = [r.get(key) for r in rows]
    return max(math.inf if v is None or math.isnan(v) else float(v) for v in values)


def choose(by_seed: dict[int, dict[str, Row]], min_reps: int = MIN_REPS) -> Choice:
    """The rule in the module's docstring, on the replay rows of each choice seed."""
    seeds = sorted(by_seed)
    names = set.intersection(*(set(by_seed[s]) for s in seeds)) if seeds else set()
    candidates = {
        name: [by_seed[s][name] for s in seeds]
        for name in names
        if all(by_seed[s][name]["reps"] >= min_reps and shipped(by_seed[s][name]) for s in seeds)
    }
    if not candidates:
        raise ValueError(f"no strategy is replayed >= {min_reps} times on every choice seed {seeds}")
    name = min(
        sorted(candidates),
        key=lambda n: (worst(candidates[n], "compute_to_find_p90"), worst(candidates[n], "compute_to_find_median")),
    )
    rows = candidates[name]
    trials = worst(rows, "trials_to_find_p90")
    if math.isinf(trials):
        raise ValueError(f"{name}: the chosen strategy never finds a near-best configuration in 9 of 10 studies")
    return Choice(
        strategy=name,
        sampler=rows[0]["sampler"],
        pruner=rows[0]["pruner"],
        metric=rows[0]["metric"],
        worst_p90=worst(rows, "compute_to_find_p90"),
        n_trials=math.ceil(trials),
    )


def held_out_verdict(row: Row | None) -> bool | None:
    """Does the held-out seed confirm the choice (None: not replayed there yet)?"""
    if row is None:
        return None
    return bool(row["reps"] >= MIN_REPS and row["found_at"][f"{GOAL_SHARE:.2f}"] >= GOAL_FOUND)


def markdown(by_seed: dict[int, dict[str, Row]], held_out: dict[str, Row], choice: Choice) -> str:
    def pct(x: float | None) -> str:
        return "never" if x is None or math.isinf(x) or math.isnan(x) else f"{100 * x:.0f}%"

    seeds = sorted(by_seed)
    names = set.intersection(*(set(by_seed[s]) for s in seeds))
    ranked = sorted(names, key=lambda n: worst([by_seed[s][n] for s in seeds], "compute_to_find_p90"))
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [
        f"Compute (share of the grid's) at which 90% of replayed studies hold a configuration within one SE of the "
        f"seed's best; chosen on seeds {', '.join(map(str, seeds))} by the worst of them, judged on held-out seed "
        f"{HELD_OUT_SEED} (found at {GOAL_SHARE:.0%} of the compute, goal >= {GOAL_FOUND:.0%}).",
        "",
        f"| strategy | {head} | worst | held-out seed {HELD_OUT_SEED}: 90% at | found at {GOAL_SHARE:.0%} |",
        "|---|" + "---:|" * (len(seeds) + 3),
    ]
    for n in ranked:
        rows = [by_seed[s][n] for s in seeds]
        h = held_out.get(n)
        mark = " **(chosen)**" if n == choice.strategy else ""
        lines.append(
            f"| {n}{mark} | "
            + " | ".join(pct(r["compute_to_find_p90"]) for r in rows)
            + f" | {pct(worst(rows, 'compute_to_find_p90'))} | "
            + (
                f"{pct(h['compute_to_find_p90'])} | {100 * h['found_at'][f'{GOAL_SHARE:.2f}']:.0f}% |"
                if h
                else "- | - |"
            )
        )
    verdict = held_out_verdict(held_out.get(choice.strategy))
    said = {None: "not replayed yet", True: "confirmed", False: "NOT confirmed"}[verdict]
    lines += ["", f"Chosen: {choice.strategy}, n_trials {choice.n_trials}. Held-out seed {HELD_OUT_SEED}: {said}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> Choice:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="where trm_bench_replay_seed<S>.json lie")
    args = p.parse_args(argv)
    by_seed = {s: load_rows(s, args.results) for s in CHOICE_SEEDS}
    choice = choose(by_seed)
    held_out = load_rows(HELD_OUT_SEED, args.results)
    result = {
        **run_header("trm_bench_choice", argv),
        "choice_seeds": list(CHOICE_SEEDS),
        "held_out_seed": HELD_OUT_SEED,
        "choice": asdict(choice),
        "held_out_confirms": held_out_verdict(held_out.get(choice.strategy)),
    }
    write_results("trm_bench_choice", result, markdown(by_seed, held_out, choice), args.results)
    return choice


if __name__ == "__main__":
    main()
