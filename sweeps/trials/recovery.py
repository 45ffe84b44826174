"""Trials nobody is moving along: orphans of a dead driver, and our own jobs that stopped making progress.

Both end the same way as a failed job: the outcome the job stored is told if it has one (sweeps/trials/outcome.py
decides), otherwise the trial is failed and, while it has retries left, queued again (sweeps/trials/retry.py).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from storage import orphaned_trials, retry_callback, trial_id_of
from storage.heartbeat import NO_FIRST_HEARTBEAT
from storage.record import (
    FAIL_REASON_ATTR,
    NOT_STARTED_ATTR,
    PROGRESS_ATTR,
    RETRIES_NOT_SPENT_ATTR,
    UNTRAINED_ATTRS,
)
from storage.trial_record import TrialLaunch, seed_prefix
from sweeps.launchers.workers import cancel_all
from sweeps.search.space import SearchSpace
from sweeps.trials.outcome import clip_reason, orphan_verdict
from sweeps.trials.retry import plan_retry, visible_here, with_note
from sweeps.trials.running import RunningTrial

log = logging.getLogger("sweeps")

ObjectiveValues = Callable[[Mapping[str, Any]], list[float] | None]  # one seed's objective value(s) from its record


def requeue(
    study: optuna.Study, storage: RDBStorage, trial_id: int, max_retry: int | None, spends_retry: bool = True
) -> None:
    """Queue a copy of a failed trial (same params), as Optuna's stale-trial retry does, within `max_retry`
    retries spent (sweeps.trials.retry.retries_used; None: no cap). Optuna's copy takes the user attributes; the untrained
    marks (storage.record.UNTRAINED_ATTRS) are left out: the copy is to train. `spends_retry=False`: an attempt
    whose machine was taken from it (sweeps/trials/preemption.py): the copy counts it in RETRIES_NOT_SPENT_ATTR."""
    failed = copy.copy(storage.get_trial(trial_id))
    attrs = {k: v for k, v in failed.user_attrs.items() if k not in UNTRAINED_ATTRS}
    not_spent = int(attrs.get(RETRIES_NOT_SPENT_ATTR) or 0)
    if not spends_retry:
        attrs[RETRIES_NOT_SPENT_ATTR] = not_spent = not_spent + 1
        max_retry = None
    failed.user_attrs = attrs
    # Optuna's callback caps the chain's whole length: the attempts that spent no retry are added to its cap.
    retry_callback(None if max_retry is None else max_retry + not_spent)(study, failed)


def settle_orphans(
    study: optuna.Study,
    storage: RDBStorage,
    *,
    grace_s: float,
    max_retry: int,
    seeds: int,
    objective_values: ObjectiveValues,
    ours: Collection[int],
    shares_filesystem: bool,
    space: SearchSpace,
) -> None:
    """Settle trials whose driver died (stale heartbeat, or none at all): tell the outcome their job stored, or
    fail them and queue them again. `ours` are this driver's running trials: a late beat of ours is no orphan. An
    orphan whose draw was cut (not all of `space`'s parameters stored) trained nothing and is not queued again: its
    retry would draw the missing ones anew, under the name of a retry of a configuration that never existed."""
    for orphan, why in orphaned_trials(study, grace_s):
        if orphan.number in ours:
            continue
        if not space.drawn_whole(orphan.params):
            fail_cut_draw(study, storage, orphan, why)
            continue
        verdict = orphan_verdict(orphan.user_attrs, seeds, objective_values, why)
        checkpoints = visible_here(TrialLaunch.of(orphan.user_attrs).checkpoint_url, shares_filesystem)
        plan = plan_retry(orphan, max_retry, checkpoints) if verdict.requeue else None
        try:
            if verdict.state == TrialState.FAIL:
                reason = with_note(verdict.reason, plan.note) if plan else verdict.reason
                storage.set_trial_user_attr(trial_id_of(orphan), FAIL_REASON_ATTR, clip_reason(reason))
                if why == NO_FIRST_HEARTBEAT:  # no job of it started: it trained nothing
                    storage.set_trial_user_attr(trial_id_of(orphan), NOT_STARTED_ATTR, why)
                study.tell(orphan.number, state=TrialState.FAIL)
            elif verdict.state == TrialState.PRUNED:
                study.tell(orphan.number, state=TrialState.PRUNED)
            else:
                study.tell(orphan.number, verdict.values if len(verdict.values) > 1 else verdict.values[0])
        except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another driver settled it first
        if plan and plan.queued:
            requeue(study, storage, trial_id_of(orphan), max_retry)
        log.warning(
            "trial %d: %s; told %s%s",
            orphan.number,
            why,
            verdict.state.name,
            f"; {plan.note}" if plan else " (the outcome its job stored)",
        )


# Why an orphan whose draw was cut trained nothing (sweeps/search/draw.py starts no job before the whole draw is stored).
CUT_DRAW = "its draw was cut before all its parameters were stored (no job started; a new trial is drawn)"


def fail_cut_draw(study: optuna.Study, storage: RDBStorage, orphan: FrozenTrial, why: str) -> None:
    """Fail an orphan whose draw was cut, as untrained (NOT_STARTED_ATTR: no budget, no retry)."""
    try:
        storage.set_trial_user_attr(trial_id_of(orphan), NOT_STARTED_ATTR, CUT_DRAW)
        storage.set_trial_user_attr(trial_id_of(orphan), FAIL_REASON_ATTR, f"{why}; {CUT_DRAW}")
        study.tell(orphan.number, state=TrialState.FAIL)
    except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
        return  # another driver settled it first
    log.warning("trial %d: %s; %s", orphan.number, why, CUT_DRAW)


def stop_stalled(storage: RDBStorage, running: Mapping[int, RunningTrial], limit_s: float) -> None:
    """Stop our jobs that showed no progress for `limit_s` (a hung or stopped worker: the driver's heartbeat alone
    would keep such a trial RUNNING forever). The loop's next poll sees the job gone and settles the trial with
    the `stall_reason` set here, so a database outage in between loses nothing."""
    for number, trial in running.items():
        attrs = storage.get_trial(trial_id_of(trial.trial)).user_attrs
        progress = attrs.get(seed_prefix(trial.seed_index) + PROGRESS_ATTR)
        if progress != trial.progress:
            trial.progress, trial.progress_seen = progress, time.time()
            continue
        silent = time.time() - trial.progress_seen
        if silent <= limit_s:
            continue
        where = f"step {progress['step']}" if isinstance(progress, dict) else "start-up"
        trial.stall_reason = (
            f"no progress for {silent:.0f} s (stall_timeout_s={limit_s:g}; last at {where}): the job was stopped"
        )
        log.warning("trial %d: %s", number, trial.stall_reason)
        # At once (no SIGTERM grace: a hung or stopped job cannot checkpoint), every worker, remote ones too.
        trial.job.cancel(grace_s=0.0)


def abandon(
    running: Mapping[int, RunningTrial], record: Callable[[RunningTrial], object], grace_s: float | None = None
) -> None:
    """The driver is interrupted: stop every job of ours first (a stop nothing interrupts: sweeps.launchers.interrupts;
    `grace_s`: the launcher's kill grace unless given), then `record` each trial. One that cannot be recorded (the database gone) leaves the others to be: the next driver
    finds it orphaned, its job stopped, and settles it."""
    cancel_all([trial.job for trial in running.values()], grace_s)  # at once: a dead VM's stop waits its timeout
    for number, trial in running.items():
        trial.exited_at.append(time.time())
        try:
            record(trial)
        except Exception as err:  # noqa: BLE001 (any storage error: the next driver settles the trial)
            log.warning("trial %d could not be recorded (%s): the next driver settles it", number, err)
