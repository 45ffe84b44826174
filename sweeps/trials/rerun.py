"""Fix it, then run the same command: a driver starting on a study queues again, first, each failed trial the
study was told the same command would run again, and it resumes from its last checkpoint.

Which: a FAIL trial that no later attempt stands for and that carries `run_again` (storage.record.RUN_AGAIN_ATTR):
its job stored it when its machine failed it (a disk full, missing rights: "... then run it again"), the driver
when a Ctrl-C stopped it ("run the same command to continue the study") with no retry left to queue, and when a
job's error stopped the study (sweeps/trials/retry.py stop_reason: an error every configuration meets, a set-up
the user fixes, e.g. `runtime.device=cuda` without a GPU), both on the trial whose error stopped it and on the
trials the stop cut short; and a FAIL trial whose job error line (storage.record.JOB_ERROR_ATTR) is that of a
trial told `run_again`: the same cause, fixed once (the baseline that met a device check first, before the study
knew the error was everyone's). No other failure: a configuration's own error would repeat (a divergence, out of
memory), and one whose retries `heartbeat.max_retry` spent stays spent. Run while the cause is still there, the
copy meets it again in its set-up, one job, and the study stops again, told to run it again.

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
from storage.record import DUPLICATE_OF_ATTR, FAIL_REASON_ATTR, JOB_ERROR_ATTR, NOT_STARTED_ATTR, RUN_AGAIN_ATTR
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps.trials.outcome import clip_line
from sweeps.trials.recovery import requeue
from sweeps.trials.retry import checkpoint_written, resume_note, visible_here, without_note

log = logging.getLogger("sweeps")


def to_run_again(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The failed trials the same command runs again (see the module's docstring), in number order."""
    retried = retried_numbers(trials)
    failed = [t for t in trials if t.state == TrialState.FAIL and t.number not in retried and t.params]
    # Not a refused repeat or a trial failed before its job started: those trained nothing.
    failed = [t for t in failed if DUPLICATE_OF_ATTR not in t.user_attrs and NOT_STARTED_ATTR not in t.user_attrs]
    fixed = {t.user_attrs.get(JOB_ERROR_ATTR) for t in failed if t.user_attrs.get(RUN_AGAIN_ATTR)} - {None}
    return [t for t in failed if t.user_attrs.get(RUN_AGAIN_ATTR) or t.user_attrs.get(JOB_ERROR_ATTR) in fixed]


def queue_failed_again(study: optuna.Study, storage: RDBStorage, shares_filesystem: bool = True) -> list[int]:
    """Queue a copy of each of `to_run_again`'s trials (resuming its checkpoint); the numbers queued again.
    `shares_filesystem`: the launcher's, whether this machine can tell if a checkpoint was written (the line says)."""
    queued = []
    with exclusive(storage, f"budget:{study.study_name}"):  # drivers starting at once queue each failure once
        failed = to_run_again(study.get_trials(deepcopy=False))
        for trial in failed:
            requeue(study, storage, trial_id_of(trial), max_retry=None)  # a new run of the command: no retry cap
    for trial in failed:
        reason = str(trial.user_attrs.get(FAIL_REASON_ATTR) or TrialOutcome.of(trial.user_attrs).error or "failed")
        # What failed, without the note of what was done then ("not queued again: ..."): it is queued now.
        what = clip_line(without_note(reason.splitlines()[0]), 400)
        checkpoints = visible_here(TrialLaunch.of(trial.user_attrs).checkpoint_url, shares_filesystem)
        how = resume_note(checkpoint_written(checkpoints))
        log.warning("trial %d failed (%s): queued again, first: %s", trial.number, what, how)
        queued.append(trial.number)
    return queued
