"""Pruning ideas the 1,000-step studies pointed to, each an Optuna pruner replayed on their unpruned curves.

    python -m bench.pruning.replays                                   # reads bench/results/pruning_1000steps.json
    python -m bench.pruning.replays --results other.json --out-name pruning_replays_other

Every rule is Optuna's own pruner on an in-memory study, through bench/pruning/evidence.py's replay (the trials
asked in the unpruned study's order with their recorded parameters, each reporting its curve and asking
should_prune() at every eval), reporting as the step either the training step or the trial's cumulative GFLOPs:
1. Grouped median: MedianPruner(1 start-up trial, warm-up w) shown only the completed trials of the judged trial's
   group (recursion depth, by one of several keys), so deeper recursion, which starts slower (docs/benchmarks.md,
   Pruning), is not judged against shallow trials; no peer yet: not pruned. `GroupedPruner` below only filters the
   trials Optuna's pruner sees, as Optuna's HyperbandPruner does for its brackets. Training steps: the median
   compares values reported at the same step, and cumulative FLOPs are equal across trials only by chance.
2. Threshold: ThresholdPruner(lower=floor, n_warmup_steps=s) on blank accuracy, to drop only the hopeless (the
   attention trials of this tiny study stay at 0 exact accuracy for 1,000 steps).
3. Successive halving and Hyperband on a FLOPs budget: SuccessiveHalvingPruner / HyperbandPruner with cumulative
   GFLOPs as the step, so their rungs are FLOP budgets and a cheap configuration is judged after more training
   steps than a costly one.

Replays: the same trials in the same order as the unpruned study (TPE would have drawn differently after a
pruned trial), so they rank ideas, they do not show a goal met. Kept: within one eval standard error of the
unpruned best (bench/pruning/evidence.py). Table: bench/results/<out-name>.md.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

import optuna
from optuna.pruners import BasePruner, HyperbandPruner, MedianPruner, SuccessiveHalvingPruner, ThresholdPruner
from optuna.trial import FrozenTrial, TrialState

from bench.pruning.evidence import Rule, replay_all, trained

Key = Callable[[dict[str, Any]], tuple[Any, ...]]
GROUPS: dict[str, Key] = {
    "the same H and L cycles": lambda p: (p["arch.H_cycles"], p["arch.L_cycles"]),
    "the same H cycles": lambda p: (p["arch.H_cycles"],),
    "the same mixer and H cycles": lambda p: (p["arch.mixer"], p["arch.H_cycles"]),
}
METRICS = ("eval/blank_accuracy", "eval/exact_accuracy")


class GroupedPruner(BasePruner):
    """Optuna's `wrapped` pruner, shown only the study's trials whose parameters share the judged trial's `key`."""

    def __init__(self, wrapped: BasePruner, key: Key) -> None:
        self.wrapped, self.key = wrapped, key

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        return self.wrapped.prune(_GroupStudy(study, self.key, self.key(trial.params)), trial)


class _GroupStudy(optuna.Study):
    """The study (same storage) as one group sees it: get_trials returns the group's trials only."""

    def __init__(self, study: optuna.Study, key: Key, group: tuple[Any, ...]) -> None:
        super().__init__(study_name=study.study_name, storage=study._storage, sampler=study.sampler)
        self._key, self._group = key, group

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        trials = super().get_trials(deepcopy=deepcopy, states=states)
        return [t for t in trials if self._key(t.params) == self._group]


def gflops(arms: list[dict[str, Any]]) -> int:
    """The longest trial's cumulative GFLOPs (Hyperband's max_resource when the step is GFLOPs)."""
    return round(max((t["compute_flops"] or 0) for arm in arms for t in trained(arm)) / 1e9)


def rules(arms: list[dict[str, Any]]) -> dict[str, Rule]:
    """Every rule, name -> Rule (metric, pruner factory, step reported)."""
    out: dict[str, Rule] = {}
    for metric in METRICS:
        for warmup in (100, 200, 300):
            out[f"median (Optuna's MedianPruner, all trials), {metric}, warm-up {warmup}"] = Rule(
                metric, lambda w=warmup: MedianPruner(n_startup_trials=1, n_warmup_steps=w)
            )
            for name, key in GROUPS.items():
                out[f"median within {name}, {metric}, warm-up {warmup}"] = Rule(
                    metric, lambda w=warmup, k=key: GroupedPruner(MedianPruner(n_startup_trials=1, n_warmup_steps=w), k)
                )
    for at_step in (200, 300, 400):
        for floor in (0.2, 0.3, 0.5):
            out[f"threshold eval/blank_accuracy < {floor} at step >= {at_step}"] = Rule(
                "eval/blank_accuracy", lambda a=at_step, f=floor: ThresholdPruner(lower=f, n_warmup_steps=a)
            )
    longest = gflops(arms)
    for metric in METRICS:
        for tflops in (0.5, 1, 2, 3):
            for eta in (2, 3, 4):
                out[f"successive halving in FLOPs: first rung {tflops:g} TFLOP, eta {eta}, {metric}"] = Rule(
                    metric, lambda r=tflops, e=eta: SuccessiveHalvingPruner(round(r * 1000), e), "gflops"
                )
            out[f"Hyperband in FLOPs: first rung {tflops:g} TFLOP, eta 3, {metric}"] = Rule(
                metric, lambda r=tflops: HyperbandPruner(round(r * 1000), longest, 3), "gflops"
            )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return replay_all(argv, __doc__, "pruning_replays", rules)


if __name__ == "__main__":
    main()
