"""Rank 0's link to its Optuna trial: report each eval, ask the pruner, store the outcome.

The study record is the channel back to the driver: with ssh fan-out to many VMs, exit codes
and logs are not reliable, so the job writes `outcome`, metrics, best step and the error tail as trial user
attributes, and the driver trusts those. The job never `tell`s: the driver does, after reading them.

The pruner is rebuilt here from the spec the driver stored on the study (`pruner` study attribute), so
the job asks the same pruner the driver configured.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any, TypeVar

import optuna
from hydra.utils import instantiate
from optuna.trial import TrialState

from contracts.code_version import git_commit
from contracts.out_of_memory import INFEASIBLE_OOM, out_of_memory
from contracts.pruners import PRUNER_TARGETS, current_pruner_spec
from contracts.run_summary import RunSummary
from contracts.train_config import RetryPolicy, SweepLink
from storage import EngineSettings, StorageError, engine_settings, open_storage
from storage.errors import sqlite_file_lost, storage_failure
from storage.record import (
    MEMORY_ATTR,
    PROGRESS_ATTR,
    MemoryRecord,
    ProgressRecord,
)
from storage.study_record import StudyAttrs
from storage.trial_record import seed_prefix
from trm.fingerprint import code_fingerprint
from trm.measures.memory_watch import MemoryWatch

__all__ = ["RetryPolicy", "TrialLink", "TrialLinkError", "link_from_config", "retry"]  # RetryPolicy: the schema's

T = TypeVar("T")
log = logging.getLogger(__name__)


class TrialLinkError(RuntimeError):
    pass


DEFAULT_RETRY = RetryPolicy()


def retry(action: Callable[[], T], what: str, policy: RetryPolicy = DEFAULT_RETRY) -> T:
    """Run a storage call, retrying with exponential backoff: a database restart must not lose a report. A SQLite
    file lost under this process's connection (moved, deleted, replaced, read-only) is not retried: no write on it
    can succeed again. The error says the cause (storage.errors.storage_failure), never Optuna's "invalid data"."""
    delay = policy.first_delay_s
    for attempt in range(policy.attempts):
        try:
            return action()
        except (StorageError, optuna.exceptions.StorageInternalError, OSError) as err:
            if sqlite_file_lost(err):
                raise TrialLinkError(f"{what} failed: {storage_failure(err)}") from None
            if attempt == policy.attempts - 1:
                raise TrialLinkError(
                    f"{what} failed after {policy.attempts} attempts: {storage_failure(err)}"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, policy.max_delay_s)
    raise AssertionError("unreachable")


def open_linked_study(sweep: SweepLink, who: str) -> tuple[Any, int, dict[str, Any]]:
    """The sweep's storage, its study's id and attributes, each read retried through a database outage, for a job
    that stores outside a trial (a re-evaluation, a confirm seed). A study of that name with another uid is
    refused: `who` says which job does not write to it."""
    policy = sweep.report_retry
    engine = engine_settings(sweep.storage_engine, "sweep.storage_engine")
    storage = retry(
        functools.partial(
            open_storage, str(sweep.storage), password_env=sweep.password_env, create_schema=False, **engine
        ),
        "opening the study storage",
        policy,
    )
    name = str(sweep.study)
    study_id = retry(lambda: storage.get_study_id_from_name(name), "finding the study", policy)
    attrs = retry(lambda: storage.get_study_user_attrs(study_id), "reading the study", policy)
    uid = StudyAttrs.of(attrs).uid
    if sweep.study_uid is not None and uid != sweep.study_uid:
        raise TrialLinkError(
            f"sweep.study={name!r} has uid {uid!r}, not sweep.study_uid={sweep.study_uid!r}: another study of "
            f"that name; {who}"
        )
    return storage, study_id, attrs


class TrialLink:
    """Implements trm.train.Reporter for rank 0 of a sweep trial."""

    def __init__(
        self,
        study_name: str,
        trial_number: int,
        storage_url: str,
        password_env: str | None = None,
        seed_index: int = 0,
        retry_policy: RetryPolicy = DEFAULT_RETRY,
        engine: EngineSettings | None = None,
        memory_sample_s: float | None = None,
    ):
        # `retry_policy` and `engine`: the job's sweep.report_retry and sweep.storage_engine (link_from_config).
        self.retry_policy = retry_policy
        self.engine: EngineSettings = engine or {}
        self._retry(lambda: self._attach(study_name, trial_number, storage_url, password_env), "attaching to the trial")
        self.finished = False
        # With repeated seeds, seed 0 alone reports to the pruner; seed i > 0 stores its outcome under "seed{i}/".
        self.seed_index = seed_index
        self.prefix = seed_prefix(seed_index)
        self.first_progress: tuple[int, float] | None = None  # this job's first log point: its own rate from there
        # The host memory sampled from here on, set-up included (sweep.memory_sample_s; None: not sampled): what a
        # job the kernel's OOM killer ends leaves on its trial (trm/measures/memory_watch.py).
        self.memory = None if memory_sample_s is None else MemoryWatch(self._store_memory, memory_sample_s).start()

    def _store_memory(self, record: MemoryRecord) -> None:
        self.storage.set_trial_user_attr(self.trial_id, self.prefix + MEMORY_ATTR, record)

    def _attach(self, study_name: str, trial_number: int, storage_url: str, password_env: str | None) -> None:
        # The driver created the schema and checked its version: the job skips both (storage.open_storage).
        self.storage = open_storage(storage_url, password_env=password_env, create_schema=False, **self.engine)
        study_id = self.storage.get_study_id_from_name(study_name)
        attrs = StudyAttrs.of(self.storage.get_study_user_attrs(study_id))
        # The spec comes from the database: only Optuna's pruners (and the evidence wrapper) may be built from it.
        spec = current_pruner_spec(attrs.pruner)  # a moved class by its name now
        pruner = instantiate(spec, _execution_whitelist_=PRUNER_TARGETS) if spec else optuna.pruners.NopPruner()
        self.study = optuna.load_study(study_name=study_name, storage=self.storage, pruner=pruner)
        self.trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, trial_number)
        self.trial = optuna.trial.Trial(self.study, self.trial_id)
        self.multi_objective = len(self.study.directions) > 1
        self.objective = attrs.objective
        self.reported = attrs.reported

    def _retry(self, action: Callable[[], T], what: str) -> T:
        return retry(action, what, self.retry_policy)

    def _still_running(self) -> bool:
        return self.storage.get_trial(self.trial_id).state == TrialState.RUNNING

    def report(self, step: int, metrics: dict[str, float]) -> str:
        """Report the study's prune metric (the objective unless set) at `step`; the verdict is "continue",
        "prune" or "abandon".

        "abandon": the trial is no longer RUNNING (its driver died and it was failed and re-queued), so this
        orphaned job stops without writing anything more; the retry resumes from the last checkpoint.

        The report itself tells a finished trial (Optuna refuses the write): reading the whole trial first to see
        its state made this slower than plain Optuna's report + should_prune (docs/benchmarks.md, "Storage")."""
        value = metrics.get(self.reported) if self.reported else None
        if self.multi_objective or self.seed_index or value is None or not math.isfinite(value):
            # Optuna prunes single-objective studies only, later seeds never prune, and NaN is not reported: no
            # write to tell us the trial's state, so read it.
            return "continue" if self._retry(self._still_running, "reading the trial state") else "abandon"
        try:
            self._retry(lambda: self.trial.report(value, step), f"reporting step {step}")
        except optuna.exceptions.UpdateFinishedTrialError:
            return "abandon"
        return "prune" if self._retry(self.trial.should_prune, "asking the pruner") else "continue"

    def progress(self, step: int) -> None:
        """Show the driver this job is alive and moving: one write, never retried (a database outage must
        not hold training up; the next log point writes again)."""
        now = time.time()
        first_step, first_at = self.first_progress = self.first_progress or (step, now)
        record = ProgressRecord(step=step, at=now, first_step=first_step, first_at=first_at)
        try:
            self.storage.set_trial_user_attr(self.trial_id, self.prefix + PROGRESS_ATTR, record)
        except Exception as err:  # noqa: BLE001 (the trial finished elsewhere, or the database is briefly away)
            log.warning("could not record progress at step %d: %s", step, storage_failure(err))

    def record_outcome(self, summary: RunSummary) -> None:
        """Store the outcome on the trial as a TrialOutcome (the driver reads it and tells Optuna); only the first
        call counts."""
        if self.finished:
            return
        self.finished = True
        if self.memory is not None:
            self.memory.stop()  # the outcome carries the peak from here (trm/measures/memory.py)
        trial = self._retry(lambda: self.storage.get_trial(self.trial_id), "reading the trial")
        if trial.state != TrialState.RUNNING:
            return  # already finished by the driver: nothing may be written to a finished trial
        git = git_commit()  # None: the code is not a git checkout's
        error = str(summary.error or "")
        record = summary.trial_outcome(
            code=(code_fingerprint(), git.commit if git else None, git.dirty if git else None),
            infeasible=INFEASIBLE_OOM if error and out_of_memory(error) else None,
        )
        for key, value in record.as_attrs(trial.user_attrs, self.prefix).items():  # `details` first, then `outcome`
            store = functools.partial(self.storage.set_trial_user_attr, self.trial_id, key, value)
            self._retry(store, f"storing {key}")


def link_from_config(sweep: SweepLink) -> TrialLink | None:
    """A TrialLink when the run is a sweep trial (sweep.study set), else None. The block's keys, types and ranges
    are its schema's (contracts/train_config.py SweepLink)."""
    if sweep.study is None:
        return None
    if sweep.trial_number is None or sweep.storage is None:
        raise ValueError(
            f"sweep.study={sweep.study!r} needs sweep.trial_number and sweep.storage too "
            f"(got trial_number={sweep.trial_number!r}, storage set: {sweep.storage is not None})"
        )
    return TrialLink(
        sweep.study,
        sweep.trial_number,
        sweep.storage,
        sweep.password_env,
        sweep.seed_index,
        retry_policy=sweep.report_retry,
        engine=engine_settings(sweep.storage_engine, "sweep.storage_engine"),
        memory_sample_s=sweep.memory_sample_s,
    )
