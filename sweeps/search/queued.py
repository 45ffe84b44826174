"""The line a driver ends with when queued trials are left: what is queued, and how to run it.

A queued (WAITING) trial runs only when the driver draws within the budget (sweeps.search.draw): an enqueued
configuration, or a retry queued when a study was interrupted and then restarted with a smaller n_trials, is
left waiting once n_trials are used. The driver ends then, rather than wait on them; this line says what is left.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import TrialState

from sweeps.search.budget import budget_used

log = logging.getLogger("sweeps")


def left_queued(study: optuna.Study, n_trials: int) -> str | None:
    """One line naming the study's WAITING trials and the n_trials that runs them; None when none is left."""
    trials = study.get_trials(deepcopy=False)
    waiting = [t.number for t in trials if t.state == TrialState.WAITING]
    if not waiting:
        return None
    shown = ", ".join(map(str, waiting[:10])) + (f" and {len(waiting) - 10} more" if len(waiting) > 10 else "")
    used = budget_used(trials)
    how = (
        f"the budget n_trials={n_trials} is used; start the driver again with n_trials={used + len(waiting)} to run them"
        if used >= n_trials
        else "start the driver again to run them"
    )
    return f"{len(waiting)} queued trial(s) left in study {study.study_name!r} (trial {shown}): {how}"


def log_left_queued(study: optuna.Study, n_trials: int) -> None:
    """Log left_queued's line, if any: the driver's last word on what it did not run."""
    line = left_queued(study, n_trials)
    if line:
        log.warning("%s", line)
