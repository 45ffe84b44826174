"""Driver-side heartbeats on top of Optuna's own heartbeat machinery.

Optuna only records heartbeats inside ``Study.optimize``; ask/tell trials (our driver launches
jobs and tells results later) get none, so a dead driver would leave trials RUNNING forever.
The driver wraps each running trial in :class:`HeartbeatThread`, and on start calls
:func:`fail_stale_trials` so trials of a dead driver become FAIL and (with
:func:`retry_callback` set on the storage) are queued again as WAITING with the same params.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterable
from datetime import datetime, timedelta
from types import TracebackType

import optuna
import sqlalchemy
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import BaseTrial, FrozenTrial, TrialState

from storage.record import HEARTBEAT_GRACE_ATTR

_log = logging.getLogger(__name__)


def trial_id_of(trial: BaseTrial | FrozenTrial) -> int:
    """Storage id of a trial (what ``record_heartbeat`` wants; Optuna keeps it private)."""
    return int(trial._trial_id)  # type: ignore[union-attr]  # both kinds have it; Optuna keeps it private


def retry_callback(max_retry: int | None = 3) -> RetryHeartbeatStaleTrialCallback:
    """Callback for ``open_storage(failed_trial_callback=...)``: re-queue a stale trial.

    Optuna 4.9 renamed ``RetryFailedTrialCallback`` to ``RetryHeartbeatStaleTrialCallback``
    (the old name warns). The copy is WAITING, same params and user attrs, and records the
    original in ``system_attrs["failed_trial"]`` / ``["retry_history"]``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback(max_retry=max_retry)


def retry_history(trial: FrozenTrial) -> list[int]:
    """The numbers of the attempts before `trial` in its retry chain, first first (Optuna's record of the
    callback's copies), without the experimental warning: it is noise in a CLI's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback.retry_history(trial)


def chain_origin(trial: FrozenTrial) -> int:
    """The number of the first trial of `trial`'s retry chain (its own number when it is no retry)."""
    history = retry_history(trial)
    return history[0] if history else trial.number


def retried_numbers(trials: Iterable[FrozenTrial]) -> set[int]:
    """The numbers of the trials that were queued again as a retry: a later attempt stands for them."""
    return {number for trial in trials for number in retry_history(trial)}


def fail_stale_trials(study: optuna.Study) -> list[int]:
    """Fail this study's RUNNING trials whose heartbeat is older than the grace period.

    Thin wrapper over ``optuna.storages.fail_stale_trials`` (which also runs the storage's
    stale-trial callback) that silences its experimental warning and returns the numbers of
    trials that were RUNNING before and are FAIL now, for the driver's log. Does nothing
    unless the storage was opened with ``heartbeat_interval``.
    """
    running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not running:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    return sorted(t.number for t in failed if t.number in running)


# Why a trial whose driver never wrote its first heartbeat is orphaned: the driver writes it before the trial's job
# starts (HeartbeatThread.start, synchronously), so such a trial trained nothing.
NO_FIRST_HEARTBEAT = "its driver died before its first heartbeat"


def orphaned_trials(study: optuna.Study, grace_s: float) -> list[tuple[FrozenTrial, str]]:
    """This study's RUNNING trials whose driver is gone: a heartbeat older than ``grace_s`` (or than the grace
    of the driver that runs it, HEARTBEAT_GRACE_ATTR, if longer), or no heartbeat at all and a start older than
    that; each with a few words on how its driver was found gone.

    Why not ``optuna.storages.fail_stale_trials``: it skips trials without a heartbeat row, so a driver that
    died between ``ask()`` and its first beat left a trial RUNNING forever, which every later driver counted
    and waited on. And it fails every stale trial, while a trial whose job stored its outcome before the
    driver died must be told that outcome (the driver decides: sweeps/trials/outcome.py). Heartbeats are compared
    on the database's clock, as Optuna does; a start without a heartbeat on this machine's (Optuna stamps
    ``datetime_start`` with the client's local time).
    """
    storage = getattr(study._storage, "_backend", study._storage)  # Optuna wraps an RDBStorage in a cache
    if not isinstance(storage, RDBStorage):
        return []
    from optuna.storages._rdb import models  # Optuna's own tables; its heartbeat query reads the same

    running = {trial_id_of(t): t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not running:
        return []
    with storage.engine.connect() as conn:
        now = conn.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar_one()  # the database's clock
        rows = conn.execute(
            sqlalchemy.select(models.TrialHeartbeatModel.trial_id, models.TrialHeartbeatModel.heartbeat).where(
                models.TrialHeartbeatModel.trial_id.in_(list(running))
            )
        ).all()
    beats = dict(rows)
    orphans = []
    for trial_id, trial in running.items():
        waited = max(grace_s, float(trial.system_attrs.get(HEARTBEAT_GRACE_ATTR, 0.0)))
        grace, beat = timedelta(seconds=waited), beats.get(trial_id)
        if beat is not None:
            if now.replace(tzinfo=None) - beat.replace(tzinfo=None) > grace:
                orphans.append((trial, f"its driver died (no heartbeat for over {waited:g} s)"))
        elif trial.datetime_start is not None and datetime.now() - trial.datetime_start > grace:
            orphans.append((trial, NO_FIRST_HEARTBEAT))
    return orphans


class HeartbeatThread:
    """Record a trial's heartbeat every ``interval_s`` seconds in a daemon thread.

    Use as a context manager around the time a trial's job runs. The first beat is recorded
    synchronously on enter (so a trial is never RUNNING without one); errors while beating
    are logged and retried at the next interval, because a short database outage must not
    kill the driver. ``interval_s`` defaults to the storage's ``heartbeat_interval``.
    """

    def __init__(self, storage: RDBStorage, trial_id: int, interval_s: float | None = None) -> None:
        interval = interval_s if interval_s is not None else storage.get_heartbeat_interval()
        if interval is None or interval <= 0:
            raise ValueError("HeartbeatThread needs interval_s > 0 or a storage opened with heartbeat_interval")
        self._storage = storage
        self._trial_id = trial_id
        self._interval = float(interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0
        self.last_error: BaseException | None = None

    def start(self) -> None:
        """Record one heartbeat now, then keep beating in the background."""
        if self._thread is not None:
            raise RuntimeError("HeartbeatThread already started")
        self._storage.record_heartbeat(self._trial_id)
        self.beats += 1
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-trial-{self._trial_id}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop beating and wait for the thread (at most ``timeout_s``, default 2 intervals + 10 s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s if timeout_s is not None else 2 * self._interval + 10)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> HeartbeatThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                try:
                    self._storage.record_heartbeat(self._trial_id)
                    self.beats += 1
                    self.last_error = None
                except Exception as e:  # noqa: BLE001 (keep beating; the driver decides what an outage means)
                    self.last_error = e
                    _log.warning("heartbeat for trial id %s failed: %s", self._trial_id, e)
        finally:
            # RDBStorage sessions are thread-local; give this thread's connection back.
            self._storage.remove_session()
