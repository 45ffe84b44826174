"""The evidence-checking pruner (contracts/pruning/evidence.py) replayed on the saved unpruned studies' curves.

    python -m bench.pruning.evidence                     # reads bench/results/pruning_1000steps.json
    python -m bench.pruning.evidence --results other.json --out-name pruning_evidence_other

Each rule is Optuna's own pruner, bare or wrapped in EvidencePruner, run on an in-memory Optuna study: the
unpruned study's trained trials are asked in their order, each reports its recorded curve of the prune metric
and asks should_prune() at every eval; a pruned trial stops there, a finished one is told its best exact accuracy
(the studies' objective). Compute is counted as the steps (and FLOPs, at the trial's FLOPs per step) each trial
ran. The same trials in the same order as the unpruned study: TPE would have drawn differently after a prune, so
a replay ranks rules; a real study shows one.

Kept: the replay's best within one eval standard error of the unpruned best (contracts.eval_noise.binomial_stderr, as the
study's re-evaluation) at the unpruned best p and the eval's puzzle count n (`eval/count` of the curves).
Table: bench/results/<out-name>.md; the cheapest rule that keeps the best in every seed first. The replay and the
table are shared with bench/pruning/replays.py (other Optuna pruners, some on cumulative FLOPs as the step).
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import optuna

from bench._results import RESULTS, run_header, write_results
from bench.pruning.curve_replay import replay_curves
from contracts.eval_noise import binomial_stderr
from contracts.pruning.evidence import EvidencePruner
from storage.study_record import StudyAttrs

OBJECTIVE = "eval/exact_accuracy"
METRICS = ("eval/exact_accuracy", "eval/blank_accuracy")

WRAPPED: dict[str, Callable[[int], optuna.pruners.BasePruner]] = {  # by the trial length in steps
    "hyperband(100, rf 3)": lambda steps: optuna.pruners.HyperbandPruner(100, steps, 3),
    "successive_halving(100, rf 3)": lambda steps: optuna.pruners.SuccessiveHalvingPruner(100, 3),
    "successive_halving(300, rf 3)": lambda steps: optuna.pruners.SuccessiveHalvingPruner(300, 3),
    "median(1 startup, 0 warmup)": lambda steps: optuna.pruners.MedianPruner(1, 0),
    "median(3 startup, 0 warmup)": lambda steps: optuna.pruners.MedianPruner(3, 0),
    "percentile(25, 3 startup)": lambda steps: optuna.pruners.PercentilePruner(25.0, 3, 0),
}
# (audit_first, audit_every, min_audit)
AUDITS = [(4, 0, 4), (5, 0, 5), (6, 0, 4), (6, 0, 6), (8, 0, 6), (3, 3, 3), (4, 4, 4), (6, 6, 6)]
AGREEMENTS = (0.3, 0.5, 0.7)


class Rule(NamedTuple):
    """A replayed rule: the metric its trials report, a factory for a fresh pruner per replay (some keep state on
    the instance: Hyperband its brackets), and what is reported as Optuna's step (bench.pruning.curve_replay.RESOURCES)."""

    metric: str
    make: Callable[[], optuna.pruners.BasePruner]
    resource: str = "steps"


def trained(arm: dict[str, Any]) -> list[dict[str, Any]]:
    """The trials that reported, in the order the study ran them (refused duplicates trained nothing)."""
    return sorted((t for t in arm["trials"] if t["eval"]), key=lambda t: t["number"])


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


def replay(
    arm: dict[str, Any], pruner: optuna.pruners.BasePruner, metric: str, resource: str = "steps"
) -> dict[str, Any]:
    """One rule on one unpruned study's curves: steps and FLOPs against the study's, the best kept."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    run = replay_curves(arm["trials"], pruner, metric, OBJECTIVE, resource)
    reference = max(max(r[OBJECTIVE] for r in t["eval"]) for t in trained(arm))
    se = binomial_stderr(reference, int(trained(arm)[0]["eval"][-1]["eval/count"]))
    gap = reference - (run["best"] if run["best"] is not None else 0.0)
    return {
        "steps_ratio": run["steps"] / arm["trial_steps"],
        "flops_ratio": run["flops"] / arm["compute_flops"],
        "best": run["best"],
        "unpruned_best": reference,
        "se": se,
        "gap": gap,
        "kept": gap <= se + 1e-12,
        "pruned": run["pruned"],
        "rungs_on": rungs_on(StudyAttrs.of(run["study"].user_attrs).pruner_evidence),
    }


def rungs_on(record: dict[str, Any] | None) -> list[int] | None:
    """The steps an EvidencePruner let prune at the end of a replay (None: a bare pruner, which measures nothing)."""
    return None if record is None else sorted(int(step) for step, rung in record["rungs"].items() if rung["on"])


def rules(steps: int) -> dict[str, Rule]:
    """Every rule: the bare Optuna pruners, then each wrapped with every audit setting."""
    out: dict[str, Rule] = {}
    for metric, (name, make) in itertools.product(METRICS, WRAPPED.items()):
        out[f"{name}, {metric}"] = Rule(metric, lambda m=make: m(steps))
        for (first, every, min_audit), agree in itertools.product(AUDITS, AGREEMENTS):
            label = f"evidence(audit first {first}, every {every or '-'}, tau >= {agree} over >= {min_audit}) on {name}, {metric}"
            out[label] = Rule(
                metric,
                lambda m=make, f=first, e=every, a=agree, k=min_audit: EvidencePruner(m(steps), f, e, k, a),
            )
    return out


def replay_all(
    argv: list[str] | None, doc: str | None, out_name: str, rules: Callable[[list[dict[str, Any]]], dict[str, Rule]]
) -> dict[str, Any]:
    """Every rule (`rules(arms)`, name -> Rule) replayed on every seed's unpruned study: the JSON result and the
    table at <out-dir>/<out-name>.{json,md}, sorted by seeds kept, then mean FLOPs."""
    args, saved, arms = unpruned_studies(argv, doc, out_name)
    rows = []
    for name, rule in rules(arms).items():
        seeds = [replay(arm, rule.make(), rule.metric, rule.resource) for arm in arms]
        rows.append({
            "rule": name,
            "seeds": seeds,
            "kept_in": sum(s["kept"] for s in seeds),
            "max_flops_ratio": max(s["flops_ratio"] for s in seeds),
            "mean_flops_ratio": sum(s["flops_ratio"] for s in seeds) / len(seeds),
        })  # fmt: skip
    rows.sort(key=lambda r: (-r["kept_in"], r["mean_flops_ratio"]))
    result = {**run_header(out_name, argv), "source": str(args.results), "rows": rows}
    seeds = [s["seed"] for s in saved["per_seed"]]
    lines = [
        f"Replays on the unpruned studies of {args.results.name} (seeds {seeds}): per seed the FLOPs share, the gap "
        "to the unpruned best and whether it is within one eval standard error (kept); sorted by seeds kept, then "
        "mean FLOPs.",
        "",
        "| rule | " + " | ".join(f"seed {s}: FLOPs, gap, kept" for s in seeds) + " | kept in | mean FLOPs |",
        "|---|" + "---:|" * len(seeds) + "---:|---:|",
    ]
    for row in rows:
        cells = " | ".join(
            f"{100 * s['flops_ratio']:.0f}%, {s['gap']:+.4f}, {'yes' if s['kept'] else 'no'}" for s in row["seeds"]
        )
        lines.append(
            f"| {row['rule']} | {cells} | {row['kept_in']} of {len(seeds)} | {100 * row['mean_flops_ratio']:.0f}% |"
        )
    write_results(args.out_name, result, "\n".join(lines), args.out_dir)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return replay_all(
        argv, __doc__, "pruning_evidence", lambda arms: rules(max(t["steps"] for a in arms for t in trained(a)))
    )


if __name__ == "__main__":
    main()
