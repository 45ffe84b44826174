"""Drawing a trial: ask the sampler for a configuration the study has not trained, within the study's budget.

Several drivers may share one study, so the budget check and the draw happen under one lock in the database
(storage.exclusive): the count sees every driver's running trials, and no two drivers draw past n_trials.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from storage import exclusive, trial_id_of
from storage.record import DUPLICATE_OF_ATTR
from sweeps.budget import TRAINS, budget_used, twin_of
from sweeps.distinct_draws import space_exhausted
from sweeps.space import SearchSpace

log = logging.getLogger("sweeps")

MAX_DUPLICATE_DRAWS = (
    20  # refused repeats in a row before the space counts as exhausted (after DistinctSampler's redraws)
)


@dataclass(frozen=True)
class Draw:
    """A new trial and its sampled values ({override key: value}); `exhausted` when the space ran dry instead."""

    trial: optuna.Trial | None
    sampled: dict[str, Any]
    exhausted: bool = False


def draw_within_budget(study: optuna.Study, storage: RDBStorage, space: SearchSpace, n_trials: int) -> Draw:
    """Ask for a trial unless `n_trials` are used or every configuration of a finite space is taken (`exhausted`).
    The study's sampler draws a repeat again (sweeps.distinct_draws.DistinctSampler); a repeat it could not avoid
    is refused: recorded FAIL with `duplicate_of` (it trains nothing and costs no budget), since training it would
    spend a pod-hour on a result the study has, or will have."""
    with exclusive(storage, f"budget:{study.study_name}"):
        for _ in range(MAX_DUPLICATE_DRAWS):
            trials = study.get_trials(deepcopy=False)
            if budget_used(trials) >= n_trials:
                return Draw(None, {})
            waiting = any(t.state == TrialState.WAITING for t in trials)  # a queued retry or baseline runs first
            if not waiting and space_exhausted(trials, space) is not None:
                return Draw(None, {}, exhausted=True)
            trial = study.ask()
            sampled = space.sample(trial)
            twin = same_configuration(study, storage, trial)
            if twin is None:
                return Draw(trial, sampled)
            trial.set_user_attr(DUPLICATE_OF_ATTR, twin)
            trial.set_user_attr(
                "fail_reason", f"same parameters as trial {twin}: not trained (repeats are what study.seeds is for)"
            )
            study.tell(trial, state=TrialState.FAIL)
            log.info("trial %d drew trial %d's parameters again: not trained, drawing again", trial.number, twin)
    log.warning(
        "%d draws in a row repeated configurations the study has: the search space looks exhausted",
        MAX_DUPLICATE_DRAWS,
    )
    return Draw(None, {}, exhausted=True)


def same_configuration(study: optuna.Study, storage: RDBStorage, trial: optuna.Trial) -> int | None:
    """The number of another trial with exactly these parameters that trained, trains or will train."""
    params = storage.get_trial(trial_id_of(trial)).params
    return twin_of(trial.number, params, study.get_trials(deepcopy=False, states=TRAINS) if params else [])
