"""Drawing a trial: ask the sampler for a configuration the study has not trained, within the study's budget.

Several drivers may share one study, so the budget check and the draw happen under one lock in the database
(storage.exclusive): the count sees every driver's running trials, and no two drivers draw past n_trials.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from storage import exclusive, trial_id_of
from storage.record import DUPLICATE_OF_ATTR, FAIL_REASON_ATTR, NOT_STARTED_ATTR
from sweeps.search.budget import TRAINS, budget_used, twin_of
from sweeps.search.definition import StudyDefinitionError, describe
from sweeps.search.distinct_draws import space_exhausted
from sweeps.search.space import SearchSpace, takes

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
    The study's sampler draws a repeat again (sweeps.search.distinct_draws.DistinctSampler); a repeat it could not avoid
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
            # A beat at once: until its first one another driver judges the trial by its start, and the draw and
            # start_trial's writes may outlast heartbeat.grace_s on a loaded machine (the driver then handles it).
            storage.record_heartbeat(trial_id_of(trial))
            try:
                with failed_unless_started(study, storage, trial):
                    sampled = sample(study, storage, trial, space)
                    twin = same_configuration(study, storage, trial)
            except EnqueuedOutsideSpace as err:  # that one trial is failed (not started); the study goes on
                log.warning("%s", err)
                continue
            if twin is None:
                return Draw(trial, sampled)
            trial.set_user_attr(DUPLICATE_OF_ATTR, twin)
            trial.set_user_attr(
                FAIL_REASON_ATTR, f"same parameters as trial {twin}: not trained (repeats are what study.seeds is for)"
            )
            study.tell(trial, state=TrialState.FAIL)
            log.info("trial %d drew trial %d's parameters again: not trained, drawing again", trial.number, twin)
    log.warning(
        "%d draws in a row repeated configurations the study has: the search space looks exhausted",
        MAX_DUPLICATE_DRAWS,
    )
    return Draw(None, {}, exhausted=True)


@contextmanager
def failed_unless_started(study: optuna.Study, storage: RDBStorage, trial: optuna.Trial) -> Iterator[None]:
    """A trial asked and then not started (an error in the block) is failed at once unless already told: it
    trained nothing, so it uses no budget (NOT_STARTED_ATTR), and is never left RUNNING for every later driver to
    wait on."""
    try:
        yield
    except BaseException as err:
        if not storage.get_trial(trial_id_of(trial)).state.is_finished():
            why = f"{type(err).__name__}: {err}".strip()
            trial.set_user_attr(NOT_STARTED_ATTR, why)
            trial.set_user_attr(FAIL_REASON_ATTR, f"asked, then not started: {why}")
            study.tell(trial, state=TrialState.FAIL)
        raise


class EnqueuedOutsideSpace(ValueError):
    """A trial enqueued (`study.enqueue_trial`) with a value the search space does not take, e.g. a choice it does
    not list: that trial fails before it starts; the space and the study are fine."""


def sample(study: optuna.Study, storage: RDBStorage, trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    """The trial's values; Optuna refuses a parameter whose distribution the study holds otherwise ("Cannot set
    different log configuration ...") only once a trial was asked: one error line, not a traceback
    (sweeps/search/definition.py refuses such a study earlier, where it has its definition)."""
    try:
        values = space.sample(trial)
    except ValueError as err:
        fixed = storage.get_trial_system_attrs(trial_id_of(trial)).get("fixed_params")
        if fixed:
            raise EnqueuedOutsideSpace(
                f"trial {trial.number} was enqueued with {fixed}, which this study's space does not take ({err}): "
                "failed before it started; enqueue values from study.space"
            ) from None
        raise StudyDefinitionError(
            f"study {study.study_name!r} cannot take this search space: {err} (trial {trial.number} was failed "
            "before it started): choose a new study.name"
        ) from None
    frozen = storage.get_trial(trial_id_of(trial))
    outside = fixed_outside_range(frozen)
    if outside:
        spans = ", ".join(f"{name}: {describe(frozen.distributions[name])}" for name in outside)
        raise EnqueuedOutsideSpace(
            f"trial {trial.number} was enqueued with {outside}, outside this study's space ({spans}): failed "
            "before it started; enqueue values from study.space"
        )
    return values


def fixed_outside_range(frozen: FrozenTrial) -> dict[str, Any]:
    """The enqueued values their distribution does not contain (a number outside its range: Optuna trains it with
    a warning, and the trial would enter the record as if drawn from the space)."""
    fixed = frozen.system_attrs.get("fixed_params") or {}
    return {
        name: fixed[name]
        for name, dist in frozen.distributions.items()
        if name in fixed and not takes(dist, fixed[name])
    }


def same_configuration(study: optuna.Study, storage: RDBStorage, trial: optuna.Trial) -> int | None:
    """The number of another trial with exactly these parameters that trained, trains or will train."""
    params = storage.get_trial(trial_id_of(trial)).params
    return twin_of(trial.number, params, study.get_trials(deepcopy=False, states=TRAINS) if params else [])
