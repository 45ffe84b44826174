"""A machine taken from under a study (a spot TPU slice PREEMPTED, STOPPED or REPAIRING) is a pause, not a failure.

The driver asks its launcher (`Launcher.unavailable`) when a job fails and before each launch, and while trials run
(`Launcher.watch`: a TPU slice described every launcher.watch_s), so a machine taken under jobs that still run or hang
is noticed too. When the machine is
gone, each trial of ours that runs, and one drawn but not launched yet, is set aside: FAIL, the launcher's line in
PREEMPTED_ATTR and in its fail_reason, and a retry copy queued at once that spends no retry of heartbeat.max_retry
(sweeps.trials.recovery.requeue counts it in RETRIES_NOT_SPENT_ATTR). The copy resumes its chain's checkpoint where the
new machine can read it (checkpoint.url on gs://; a VM's own disk goes with the VM). Then the launcher waits for
the machine and prepares it anew (`wait_until_available`), or ends the driver: MachineUnavailableError, exit
PREEMPTED_EXIT, the study resumable by the same command.
"""

from __future__ import annotations

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from storage import trial_id_of
from storage.record import FAIL_REASON_ATTR, NOT_STARTED_ATTR, PREEMPTED_ATTR
from storage.trial_record import TrialOutcome, seed_prefix
from sweeps.launchers.base import Launcher
from sweeps.trials.recovery import requeue
from sweeps.trials.running import RunningTrial

PREEMPTED_EXIT = 75  # sysexits' EX_TEMPFAIL: a scheduler's sign to run the same command again later


def preempted_reason(line: str) -> str:
    """A set-aside trial's fail_reason: what happened, and that it costs the configuration nothing."""
    return f"preempted: {line}; queued again, no retry spent"


def machine_gone(storage: RDBStorage, launcher: Launcher, running: RunningTrial, code: int) -> str | None:
    """The launcher's line when a job that failed, or stopped on a preemption notice (outcome PREEMPTED: a spot
    VM's SIGTERM), lost its machine; None when the machine is there (the job's own end stands). A failed job on the
    whole machine (slots=pod) whose slot fails `slot_alive` lost it too, whatever the launcher's description says
    (a slice that still reads READY after a VM died, or whose VM was recreated without the set-up: the tpu_pod
    launcher's slot check finds no id of its latest prepare there): no other slot could take its trials, and the
    launcher's recovery sets the machine up again and checks it before any trial starts again."""
    if code == 0:
        attrs = storage.get_trial(trial_id_of(running.trial)).user_attrs
        if TrialOutcome.of(attrs, seed_prefix(running.seed_index)).outcome != "PREEMPTED":
            return None
    if (gone := launcher.unavailable()) is not None:
        return gone
    if code != 0 and running.slot.whole and not launcher.slot_alive(running.slot):
        return (
            f"slot {running.slot.name} failed its check after the job (a VM gone or recreated without its set-up, "
            "or its chips still held), though the machine reads as available"
        )
    return None


def mark_preempted(trial: optuna.Trial, line: str) -> None:
    trial.set_user_attr(PREEMPTED_ATTR, line)


def queue_copy(study: optuna.Study, storage: RDBStorage, trial: optuna.Trial) -> None:
    """Queue the set-aside trial again, first in line (a WAITING trial is drawn before the sampler asks)."""
    requeue(study, storage, trial_id_of(trial), None, spends_retry=False)


def set_aside_unstarted(study: optuna.Study, storage: RDBStorage, trial: optuna.Trial, line: str) -> None:
    """A drawn trial whose launch found the machine gone: failed untrained (NOT_STARTED_ATTR: no budget), marked
    preempted, and queued again."""
    mark_preempted(trial, line)
    trial.set_user_attr(NOT_STARTED_ATTR, preempted_reason(line))
    trial.set_user_attr(FAIL_REASON_ATTR, preempted_reason(line))
    study.tell(trial, state=TrialState.FAIL)
    queue_copy(study, storage, trial)
