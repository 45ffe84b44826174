"""A trial this driver runs: its job, heartbeat and what the loop has seen of it (seeds, progress, timings).

The driver's per-trial state, kept apart from the loop that moves it along; and what its heartbeat's warnings say
when the study database fails (storage.errors.storage_failure: the cause, not Optuna's wrapper).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy

from storage import HeartbeatThread, StorageGoneError, database_gone, redact
from storage.errors import StoragePermissionError, permission_denied, sqlite_file_lost, storage_failure
from storage.sqlite_file import SqliteFile
from sweeps.launchers.slots import WHOLE, Slot
from sweeps.launchers.workers import JobHandle

# What a storage call raises while the database is restarting, unreachable, or gone (storage_fatal tells which).
STORAGE_ERRORS = (
    optuna.exceptions.StorageInternalError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
)


class JobNotLaunchedError(RuntimeError):
    """A running trial's job was asked for before it was launched."""


@dataclass
class RunningTrial:
    trial: optuna.Trial
    handle: JobHandle | None
    heartbeat: HeartbeatThread
    workdir: Path
    sampled: dict[str, Any] = field(default_factory=dict)  # the sampled values: {override key: value}
    origin: int = 0  # first trial of its retry chain: owner of the checkpoints
    earlier: tuple[int, ...] = ()  # the attempts before it in its retry chain, first first
    slot: Slot = WHOLE  # where its jobs run (sweeps/launchers/slots.py); every seed of the trial runs there
    seed_index: int = 0
    seed_objectives: list[list[float]] = field(default_factory=list)  # each finished seed's objective value(s)
    started: float = field(default_factory=time.time)
    # Epoch seconds at which each seed's job was launched and seen to exit (bench/sweep_overhead.py): with
    # the job's own stamps (`timing` attribute) they split a trial's wall time into set-up, training, teardown.
    launched_at: list[float] = field(default_factory=list)
    exited_at: list[float] = field(default_factory=list)
    # The job's last reported progress and when this driver saw it change (its own clock: a pod VM's may differ).
    progress: Any = None
    progress_seen: float = field(default_factory=time.time)
    stall_reason: str | None = None  # set when the driver stopped the job for showing no progress

    @property
    def job(self) -> JobHandle:
        """The current seed's job (launch_seed sets it before the trial joins the loop)."""
        if self.handle is None:
            raise JobNotLaunchedError(f"trial {self.trial.number}: no job launched yet")
        return self.handle


HEARTBEAT_LOGGER = "storage.heartbeat"  # storage/heartbeat.py's: "heartbeat for trial id %s failed: %s"


def storage_fatal(err: BaseException | None, storage_url: str, file: SqliteFile | None = None) -> Exception | None:
    """The error to end the study on, where waiting will not help: the study's SQLite `file` gone, replaced or
    read-only (checked whatever `err` is: None checks the file alone), `err` saying the database is gone (dropped,
    its tables deleted, a SQLite file lost under its connection) or not ours to write; None for an outage to wait
    out. The caller stops its running jobs first."""
    if file is not None and (lost := file.problem("its running jobs were stopped")) is not None:
        return lost
    if err is None:
        return None
    if denied := permission_denied(err):
        return StoragePermissionError(f"{denied}; its running jobs were stopped")
    if why := database_gone(err) or sqlite_file_lost(err):
        return StorageGoneError(
            f"the study database {redact(storage_url)} is gone: {why}; its running jobs were stopped"
        )
    return None


class HeartbeatWords(logging.Filter):
    """On the heartbeat's logger: an exception in a warning's arguments is shown as `storage_failure` says."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(storage_failure(a) if isinstance(a, BaseException) else a for a in record.args)
        return True


def explain_heartbeat_warnings() -> None:
    """Install HeartbeatWords on the heartbeat's logger (once: the driver calls it at each run)."""
    logger = logging.getLogger(HEARTBEAT_LOGGER)
    if not any(isinstance(f, HeartbeatWords) for f in logger.filters):
        logger.addFilter(HeartbeatWords())
