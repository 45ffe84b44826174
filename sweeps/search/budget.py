"""What counts against a study's n_trials, when a study is done, which configuration a draw repeats, and the
baseline's parameters.

Functions of the study's trials: several drivers share one budget, so each decides from the record alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from storage.heartbeat import retried_numbers
from storage.record import DUPLICATE_OF_ATTR, trained_trials
from sweeps.search.space import Conditional

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# States of a trial that trained, trains or will train: a draw with its parameters repeats it.
TRAINS = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


def budget_used(trials: Sequence[FrozenTrial]) -> int:
    """Trials that used the budget: finished or running ones, less failures re-queued as a retry, refused
    duplicates and trials failed before they started (they trained nothing)."""
    retried = retried_numbers(trials)
    used = trained_trials(trials)
    return sum(1 for t in used if t.state in FINISHED and t.number not in retried) + sum(
        1 for t in used if t.state == TrialState.RUNNING
    )


def study_done(study: optuna.Study, n_trials: int) -> bool:
    """Budget spent and nothing running anywhere: a trial RUNNING elsewhere may belong to a dead driver, so the
    driver waits for it to finish or go stale (and then runs its retry). A queued (WAITING) one would not start."""
    if budget_used(study.get_trials(deepcopy=False)) < n_trials:
        return False
    return not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))


def twin_of(number: int, params: Mapping[str, Any], others: Iterable[FrozenTrial]) -> int | None:
    """The number of another trial (from `others`, those in TRAINS) with exactly these parameters."""
    if not params:
        return None  # nothing searched: every trial is the same configuration by design
    for other in others:
        if other.number != number and other.params == params and DUPLICATE_OF_ATTR not in other.user_attrs:
            return other.number
    return None


def baseline_params(baseline: Mapping[str, Any], conditionals: Iterable[Conditional]) -> dict[str, Any]:
    """The baseline's values as Optuna parameters: a conditional one is named `key@choice` under its choice."""
    params = dict(baseline)
    for cond in conditionals:
        if str(baseline.get(cond.parent)).lower() == str(cond.choice).lower():
            for key in cond.params:
                if key in params:
                    params[f"{key}@{cond.choice}"] = params.pop(key)
    return params


def enqueue_baseline(study: optuna.Study, baseline: Mapping[str, Any], conditionals: Iterable[Conditional]) -> bool:
    """Queue `baseline` as a new study's first trial (a study with any trial keeps its own); True if queued."""
    if study.get_trials(deepcopy=False):
        return False
    study.enqueue_trial(baseline_params(baseline, conditionals), user_attrs={"baseline": True})
    return True
