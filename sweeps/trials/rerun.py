"""Fix it, then run the same command: a driver starting on a study queues again, first, each failed trial the
study was told the same command would run again, and it resumes from its last checkpoint.

Which: a FAIL trial that no later attempt stands for and that carries `run_again` (storage.record.RUN_AGAIN_ATTR):
its job stored it when its machine failed it (a disk full, missing rights: "... then run it again"), and the
driver when a Ctrl-C stopped it ("run the same command to continue the study") with no retry left to queue. No
other failure: a job's own error would repeat, and one whose retries `heartbeat.max_retry` spent stays spent.

The copy is Optuna's retry copy (same parameters, the failed trial in its retry history), so the failed attempt
no longer counts against n_trials (sweeps.search.budget) and the copy resumes its chain's checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from storage import exclusive, trial_id_of
from storage.heartbeat import retried_numbers
from storage.record import DUPLICATE_OF_ATTR, FAIL_REASON_ATTR, NOT_STARTED_ATTR, RUN_AGAIN_ATTR
from storage.trial_record import TrialOutcome
from sweeps.trials.recovery import requeue

log = logging.getLogger("sweeps")


def to_run_again(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The failed trials the same command runs again (see the module's docstring), in number order."""
    retried = retried_numbers(trials)
    out = []
    for trial in trials:
        attrs = trial.user_attrs
        if trial.state != TrialState.FAIL or trial.number in retried or not trial.params:
            continue
        if DUPLICATE_OF_ATTR in attrs or NOT_STARTED_ATTR in attrs:
            continue  # trained nothing: a refused repeat, or failed before its job started
        if attrs.get(RUN_AGAIN_ATTR):
            out.append(trial)
    return out


def queue_failed_again(study: optuna.Study, storage: RDBStorage) -> list[int]:
    """Queue a copy of each of `to_run_again`'s trials (resuming its checkpoint); the numbers queued again."""
    queued = []
    with exclusive(storage, f"budget:{study.study_name}"):  # drivers starting at once queue each failure once
        failed = to_run_again(study.get_trials(deepcopy=False))
        for trial in failed:
            requeue(study, storage, trial_id_of(trial), max_retry=None)  # a new run of the command: no retry cap
    for trial in failed:
        reason = str(trial.user_attrs.get(FAIL_REASON_ATTR) or TrialOutcome.of(trial.user_attrs).error or "failed")
        log.warning("trial %d failed (%s): queued again, first, to resume from its checkpoint", trial.number,
                    reason.splitlines()[0][:200])  # fmt: skip
        queued.append(trial.number)
    return queued
