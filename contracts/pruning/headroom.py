"""A pruner that reads the horizon from the study's own curves: a trial is stopped at a step only when it could not
reach the study's best even if it gained, from that step to its end, as much as the finished trial that gained the
most from that step did.

Why: a rule whose first verdict is a fixed share of `train.steps` (the median from 50%) was tuned at one horizon;
at a longer one the deep configurations that start slow and end best are still behind at that share, and are cut
(docs/benchmarks.md, "At a longer horizon"). The gains from a step to the end grow with the horizon and with the
recursion depth, and the study's finished trials measure them at the horizon the study runs: so this rule prunes
late where late starters win and early where they do not, with no share to tune. Optuna has no rule of this kind
(its pruners compare values at a step: median, percentile, successive halving, Wilcoxon, threshold), hence this one.

The rule, at a trial's report of value v at step s (maximize; mirrored for minimize), over the study's COMPLETE
trials that reported at or before s (a trial's value at s is its last report at or before s; its end is its last
report): with at least `n_startup_trials` of them, prune when v + max(end - value at s) < max(end) - margin.
Pruned trials do not count: they have no end.
"""

from __future__ import annotations

import math

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState


def value_at(trial: FrozenTrial, step: int) -> float | None:
    """The trial's last reported value at or before `step` (None: it reported nothing by then)."""
    reported = [s for s in trial.intermediate_values if s <= step and math.isfinite(trial.intermediate_values[s])]
    return trial.intermediate_values[max(reported)] if reported else None


def end_value(trial: FrozenTrial) -> float | None:
    """The trial's last reported value (None: it reported nothing finite)."""
    finite = [s for s, v in trial.intermediate_values.items() if math.isfinite(v)]
    return trial.intermediate_values[max(finite)] if finite else None


class HeadroomPruner(BasePruner):
    """Prunes a trial only when the most any finished trial gained from the same step would still leave it short of
    the finished trials' best end by more than `margin` (in the prune metric's units)."""

    def __init__(self, n_startup_trials: int = 4, margin: float = 0.0) -> None:
        if n_startup_trials < 1:
            raise ValueError(
                f"n_startup_trials={n_startup_trials}: expected an integer >= 1 (the gains are measured on "
                "finished trials)"
            )
        if not math.isfinite(margin) or margin < 0:
            raise ValueError(f"margin={margin}: expected a finite number >= 0, in the prune metric's units")
        self.n_startup_trials = n_startup_trials
        self.margin = margin

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        if not math.isfinite(value):
            return False
        sign = 1.0 if study.direction == StudyDirection.MAXIMIZE else -1.0
        gains, ends = [], []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            at, end = value_at(t, step), end_value(t)
            if at is None or end is None:
                continue
            gains.append(sign * (end - at))
            ends.append(sign * end)
        if len(gains) < self.n_startup_trials:
            return False
        return sign * value + max(gains) < max(ends) - self.margin
