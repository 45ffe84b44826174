"""A trial's life from draw to tell: the TrialRunner the driver holds, with its dependencies given explicitly.

    start_trial -> launch_seed (one job per seed) -> settle / on_job_end (the job's verdict, sweeps/trials/outcome.py)
    -> tell_outcome: COMPLETE (the seeds' mean) / PRUNED / FAIL (a retry queued while retries are left)

The driver (sweeps/driver.py) owns the loop, and TrialStarts (sweeps/trials/starts.py) the budget and the slots; the
runner owns what one trial is: its directories and its jobs' command lines (`jobs`: sweeps/trials/trial_jobs.py, which
the dry run builds too), its heartbeat, and what Optuna is told.
It reads the study, the typed sweep config, the launcher and the storage URL it is given, and calls `progress` for
the note that ends each state-change line; it never reaches back into the driver.
Invariant: the heartbeat of a trial stops only once its state is stored (a database outage leaves it ours).
"""

from __future__ import annotations

import logging
import signal
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from contracts.out_of_memory import killed_for_memory, oom_kills
from storage import HeartbeatThread, trial_id_of
from storage.heartbeat import chain_origin, retry_history
from storage.record import (
    DETAILS_ATTR,
    DRIVER_TIMING_DETAIL,
    FAIL_REASON_ATTR,
    HEARTBEAT_GRACE_ATTR,
    INFEASIBLE_ATTR,
    JOB_ERROR_ATTR,
    MEMORY_ATTR,
    NOT_STARTED_ATTR,
    PROGRESS_ATTR,
    RUN_AGAIN_ATTR,
    SEED_STD_ATTR,
    SEED_VALUES_ATTR,
    merged_details,
)
from storage.trial_record import TrialLaunch, TrialOutcome, attempt_attr, seed_prefix
from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import JobSpec, Launcher
from sweeps.launchers.job_command import job_name
from sweeps.launchers.slots import Slot
from sweeps.search.space import to_overrides
from sweeps.search.study import OpenStudy, StudyNotOpenError
from sweeps.trials.outcome import Verdict, clip_reason, job_verdict, objective_values, seed_attrs, seed_mean
from sweeps.trials.recovery import requeue
from sweeps.trials.retry import plan_retry, retry_of, stop_reason, with_note
from sweeps.trials.running import RunningTrial
from sweeps.trials.trial_jobs import TrialJobs

log = logging.getLogger("sweeps")

DRY_RUN_UID = "UID"  # the study uid a runner without an open study places its trial directories under


class TrialRunner:
    """Each trial's state machine over the study it is given (None: a dry run's, which only builds commands)."""

    def __init__(
        self,
        sweep: SweepConfig,
        base_overrides: Sequence[str],
        launcher: Launcher,
        storage_url: str,
        progress: Callable[[], str],
        opened: OpenStudy | None = None,
        study_uid: str | None = None,
    ):
        self.sweep = sweep
        self.launcher = launcher
        self.progress = progress  # the driver's ` [3/8 done, ...]` note that ends each state-change line
        self.opened = opened
        self.study_uid = study_uid or (opened.uid if opened else DRY_RUN_UID)
        self.jobs = TrialJobs.of(sweep, base_overrides, launcher, storage_url, self.study_uid)  # dirs, commands
        self.roots = self.jobs.roots
        self.stopped_by: tuple[int, str, str] | None = None  # (trial, the job's error line, why it stops the study)

    @property
    def study(self) -> optuna.Study:
        return self._open().study

    @property
    def storage(self) -> RDBStorage:
        return self._open().storage

    def _open(self) -> OpenStudy:
        if self.opened is None:
            raise StudyNotOpenError("the driver's study is not open yet: call open_study() (run() does) first")
        return self.opened

    def origin_number(self, trial: FrozenTrial) -> int:
        """The first trial of a retry chain: its checkpoint directory is the one to resume from."""
        return chain_origin(trial)

    def chain_logged_through(self, earlier: Iterable[int], seed_index: int = 0) -> int | None:
        """The last step the `earlier` attempts of a retry chain (retry_history) reached a log point at (their
        progress, written where they also log to W&B): the retry logs only the steps after it to the chain's run."""
        earlier = set(earlier)
        if not earlier:
            return None
        key = seed_prefix(seed_index) + PROGRESS_ATTR
        steps = [
            t.user_attrs[key]["step"]
            for t in self.study.get_trials(deepcopy=False)
            if t.number in earlier and isinstance(t.user_attrs.get(key), dict)
        ]
        return max(steps) if steps else None

    def start_trial(self, trial: optuna.Trial, sampled: dict[str, Any], slot: Slot) -> RunningTrial:
        frozen = self.storage.get_trial(trial_id_of(trial))
        origin = self.origin_number(frozen)
        for key, value in frozen.user_attrs.items():
            if attempt_attr(key) and value is not None:  # a retry: its predecessor's outcome is not its own
                trial.set_user_attr(key, None)
        workdir = self.roots.workdir(trial.number)
        # A whole-machine slot's own overrides (a pod's device count, from the slice) are part of what it trained
        # with: the report's chip-hours and the re-train command read them there.
        launch = TrialLaunch(
            overrides=to_overrides(sampled),
            workdir=str(workdir),
            checkpoint_url=self.jobs.checkpoint_url(origin),
            slot=slot.name,
            train_overrides=[*self.jobs.training_overrides(sampled), *(slot.overrides if slot.whole else ())],
            chips=slot.chips,
        )
        # A fresh `details` (a retry's predecessor's belong to its own attempt): the job and finish() add theirs.
        for key, value in launch.as_attrs().items():
            trial.set_user_attr(key, value)
        self.storage.set_trial_system_attr(
            trial_id_of(trial), HEARTBEAT_GRACE_ATTR, float(self.sweep.heartbeat.grace_s)
        )  # before the first beat: another driver waits this long on it
        heartbeat = HeartbeatThread(self.storage, trial_id_of(trial), self.sweep.heartbeat.interval_s)
        heartbeat.start()
        running = RunningTrial(
            trial,
            None,
            heartbeat,
            workdir,
            sampled=sampled,
            origin=origin,
            slot=slot,
            earlier=tuple(retry_history(frozen)),
        )
        self.launch_seed(running, 0)
        resumed = retry_of(trial.number, origin, self.jobs.visible_checkpoints(origin))
        where = "" if slot.whole else f" on {slot.name}"
        log.info(
            "trial %d started%s%s: %s%s",
            trial.number,
            where,
            resumed,
            " ".join(to_overrides(sampled)),
            self.progress(),
        )
        return running

    def launch_seed(self, running: RunningTrial, index: int) -> None:
        """Start the job for one seed of the trial (a single job when study.seeds is 1); with several seeds each
        has its own output and checkpoint directories (sweeps.trials.paths), and only seed 0 reports to the pruner."""
        trial = running.trial
        logged = self.chain_logged_through(running.earlier, index)
        overrides = self.jobs.job_command(
            trial.number, running.sampled, running.origin, index, running.slot, logged
        ).overrides()
        workdir = self.jobs.trial_paths(trial.number, running.origin, index).workdir
        running.seed_index = index
        running.launched_at.append(time.time())
        running.progress, running.progress_seen = None, time.time()
        try:
            running.handle = self.launcher.launch(
                JobSpec(
                    job_name(str(self.sweep.study.name), self.study_uid, trial.number),
                    overrides,
                    workdir,
                    slot=running.slot,
                )
            )
        except Exception as err:
            running.heartbeat.stop()
            reason = f"launch failed: {type(err).__name__}: {err}"
            if index == 0:  # no job of the trial ran: it trained nothing (no budget, not in our counts)
                trial.set_user_attr(NOT_STARTED_ATTR, reason)
            self.tell_fail(trial, reason)
            raise

    def tell_fail(self, trial: optuna.Trial, reason: str) -> None:
        trial.set_user_attr(FAIL_REASON_ATTR, clip_reason(reason))
        self.study.tell(trial, state=TrialState.FAIL)
        log.warning("trial %d FAIL: %s", trial.number, reason.splitlines()[0] if reason else "")

    def on_job_end(self, running: RunningTrial, exit_code: int) -> TrialState | None:
        """Tell Optuna what the job recorded (sweeps/trials/outcome.py decides); None if more seeds follow."""
        trial = running.trial
        attrs = seed_attrs(self.storage.get_trial(trial_id_of(trial)).user_attrs, running.seed_index)
        measured = self.objective_values(attrs) if TrialOutcome.of(attrs).outcome == "COMPLETE" else None
        verdict = job_verdict(
            attrs,
            measured,
            self.sweep.study.objective,
            exit_code=exit_code,
            launcher_failure=running.job.failure,
            cancelled=running.job.cancelled,
            memory_killed=self.memory_killed(attrs, exit_code, running.job.failure),
        )
        if verdict.state == TrialState.COMPLETE:
            if len(running.seed_objectives) == running.seed_index:  # not twice after a database outage
                running.seed_objectives.append(verdict.values)
            if running.seed_index + 1 < self.sweep.study.seeds:
                self.launch_seed(running, running.seed_index + 1)
                return None
        if verdict.state == TrialState.FAIL and verdict.error_line and not running.job.cancelled:
            return self.tell_job_error(running, verdict, verdict.error_line)
        return self.tell_outcome(running, verdict.state, verdict.reason, retry=verdict.requeue)

    def memory_killed(self, attrs: Mapping[str, Any], exit_code: int, failure: str | None) -> str | None:
        """The kernel's OOM killer's evidence for a job that ended by SIGKILL (contracts.out_of_memory
        killed_for_memory) from the memory record its job sampled (storage.record.MemoryRecord, `attrs` unprefixed):
        its cgroup's OOM kill count read again here where its jobs run on this machine, else its peak at its limit."""
        sampled = attrs.get(MEMORY_ATTR)
        if TrialOutcome.of(attrs).outcome is not None or not isinstance(sampled, dict):
            return None
        sigkill = exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL) or "SIGKILL" in (failure or "")
        events = sampled.get("cgroup_events") if self.launcher.shares_filesystem else None
        return killed_for_memory(
            sigkill,
            sampled.get("peak_mb"),
            sampled.get("limit_mb"),
            sampled.get("oom_kills"),
            oom_kills(Path(events)) if events else None,
        )

    def tell_job_error(self, running: RunningTrial, verdict: Verdict, line: str) -> TrialState:
        """A FAIL on an error the job raised: its line stored (JOB_ERROR_ATTR), and the study stopped (no retry:
        `stopped_by`, which the loop acts on; `run_again` for the same command once fixed) when
        sweeps.trials.retry.stop_reason says every configuration meets it."""
        trial = running.trial
        failed = self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        others = [t for t in failed if t.number != trial.number]
        why = stop_reason(line, verdict.before_first_step, verdict.requeue, trial.params, others)
        trial.set_user_attr(JOB_ERROR_ATTR, line)
        prefix = seed_prefix(running.seed_index)
        if verdict.infeasible:  # the kernel killed it: the driver stores what the job could not
            trial.set_user_attr(prefix + INFEASIBLE_ATTR, verdict.infeasible)
            if verdict.peak_memory_mb is not None:
                (peak,) = TrialOutcome.names_of(lambda o: (o.peak_memory_mb,))  # the one fact, not the record
                trial.set_user_attr(prefix + peak, verdict.peak_memory_mb)
        if why is None:
            return self.tell_outcome(running, TrialState.FAIL, verdict.reason, retry=verdict.requeue)
        self.stopped_by = (trial.number, line, why)
        # The user fixes what every configuration meets (a device, a path, a package): the same command then runs
        # this configuration again, first, and every other that failed with this line (sweeps/trials/rerun.py).
        trial.set_user_attr(RUN_AGAIN_ATTR, True)
        note = f"not queued again: {why}; fix it, then the same command runs it again"
        return self.tell_outcome(running, TrialState.FAIL, with_note(verdict.reason, note))

    def tell_outcome(
        self, running: RunningTrial, state: TrialState, reason: str = "", retry: bool = False
    ) -> TrialState:
        """Tell Optuna; the heartbeat stops only once that is stored (a database outage leaves the trial ours).
        `retry`: a FAIL worth a retry, queued while retries are left; the reason says which (sweeps/trials/retry.py)."""
        trial = running.trial
        frozen, max_retry = self.storage.get_trial(trial_id_of(trial)), self.sweep.heartbeat.max_retry
        plan = plan_retry(frozen, max_retry, self.jobs.visible_checkpoints(running.origin)) if retry else None
        stored = frozen.user_attrs
        timing = {"launched_at": running.launched_at, "exited_at": running.exited_at}
        trial.set_user_attr(DETAILS_ATTR, {**merged_details(stored), DRIVER_TIMING_DETAIL: timing})
        if state == TrialState.FAIL:
            self.tell_fail(trial, with_note(reason, plan.note) if plan else reason)
            if plan and plan.queued:
                requeue(self.study, self.storage, trial_id_of(trial), max_retry)
        elif state == TrialState.PRUNED:
            last_step = max(self.storage.get_trial(trial_id_of(trial)).intermediate_values, default=None)
            self.study.tell(trial, state=TrialState.PRUNED)
            log.info("trial %d PRUNED at step %s%s", trial.number, last_step, self.progress())
        else:
            per_seed = running.seed_objectives
            mean = seed_mean(per_seed)
            if len(per_seed) > 1:  # TRM's seed variance is large: keep the spread on the trial
                trial.set_user_attr(SEED_VALUES_ATTR, [v[0] for v in per_seed])
                trial.set_user_attr(SEED_STD_ATTR, statistics.pstdev(v[0] for v in per_seed))
            self.study.tell(trial, mean if len(mean) > 1 else mean[0])
            log.info(
                "trial %d COMPLETE: %s = %.4f%s", trial.number, self.sweep.study.objective, mean[0], self.progress()
            )
        running.heartbeat.stop()
        return state

    def objective_values(self, attrs: Mapping[str, Any]) -> list[float] | None:
        """One seed's objective value(s) as this study measures them (sweeps.trials.outcome.objective_values)."""
        extra = [o.name for o in self.sweep.study.objectives]
        return objective_values(attrs, self.sweep.study.objective, extra, self.sweep.study.value == "best")

    def settle(self, running: RunningTrial, code: int) -> bool:
        """Tell Optuna about a seed's job that exited with `code`; True when the trial is settled (no seed follows)."""
        if not running.exited_at or running.exited_at[-1] < running.launched_at[-1]:
            running.exited_at.append(time.time())
        try:
            if running.stall_reason is not None:
                self.tell_outcome(running, TrialState.FAIL, running.stall_reason, retry=True)
                return True
            return self.on_job_end(running, code) is not None
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as err:
            if not self.settled_elsewhere(running):
                raise
            log.warning(
                "trial %d was settled by another driver (%s): it judged this driver gone; is "
                "heartbeat.grace_s shorter than a database outage?",
                running.trial.number,
                err,
            )
            running.heartbeat.stop()
            return True

    def settled_elsewhere(self, running: RunningTrial) -> bool:
        """Whether our running trial was finished by someone else (another driver that found it orphaned)."""
        return self.storage.get_trial(trial_id_of(running.trial)).state.is_finished()
