"""How late must the median rule wait in a longer trial? `pruner=median_late`'s warmup share replayed on the saved
unpruned 1,000-step studies (bench/results/pruning_1000steps.json), bare and wrapped in the evidence pruner.

    python -m bench.pruning.warmup          # -> bench/results/pruning_warmup.{json,md}

TRM-Bench-tiny's 500-step curves choose the rule; these three studies are the only longer curves at hand, so they
set the earliest share of a trial at which it may judge (docs/benchmarks.md, TRM-Bench-tiny). Each rule is
Optuna's MedianPruner with model_scaling's n_startup_trials and `n_warmup_steps` = share x the trial's steps, on
blank accuracy (model_scaling's prune metric); the replay, the kept rule and the table are bench/pruning/evidence.py's.
"""

from __future__ import annotations

from typing import Any

import optuna

from bench.pruning.evidence import Rule, replay_all, trained
from contracts.pruning.evidence import EvidencePruner

SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
METRIC = "eval/blank_accuracy"
STARTUP = 3  # conf/pruner/median_late.yaml n_startup_trials


def rules(arms: list[dict[str, Any]]) -> dict[str, Rule]:
    steps = max(t["steps"] for a in arms for t in trained(a))
    out: dict[str, Rule] = {}
    for share in SHARES:
        warmup = round(share * steps)
        out[f"median({STARTUP} startup, warmup {share:.0%}), {METRIC}"] = Rule(
            METRIC, lambda w=warmup: optuna.pruners.MedianPruner(STARTUP, w)
        )
        out[
            f"evidence(conf/pruner/evidence.yaml's audits) on median({STARTUP} startup, warmup {share:.0%}), {METRIC}"
        ] = Rule(METRIC, lambda w=warmup: EvidencePruner(optuna.pruners.MedianPruner(STARTUP, w)))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return replay_all(argv, __doc__, "pruning_warmup", rules)


if __name__ == "__main__":
    main()
