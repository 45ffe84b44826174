"""The sweep driver: one Optuna study whose trials are distributed TRM training jobs.

    validate everything -> open the study -> fail stale trials (they are re-queued) -> loop:
    ask -> search space to overrides -> launch on the workers -> heartbeat while it runs ->
    read the outcome the job stored on the trial -> tell COMPLETE / PRUNED / FAIL (reason kept)

The driver never imports the model: it talks to the job through its command line and the study record. This
module is the loop, its database outages and its pauses; it holds a TrialRunner (sweeps.trials.trial_runner) that takes
one trial from start to tell, and TrialStarts (sweeps.trials.starts) that starts trials on free slots within the
budget. The rest lives apart: the study (sweeps.search.study), the budget and the baseline (sweeps.search.budget),
outcome decisions (sweeps.trials.outcome), launchers (sweeps.launchers.base.Launcher), progress (sweeps.trials.progress), slots
(sweeps.launchers.slots), drawing within budget (sweeps.search.draw), orphans and stalled jobs (sweeps.trials.recovery),
what runs once the loop ends: re-evaluation, confirm stage, W&B summary (sweeps.trials.study_end).

Invariant: the loop's trials and its database-outage handling are one state machine over `self.running`; each
decision in it is a pure function elsewhere (sweeps/trials/outcome.py).
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import NoReturn

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from storage import redact, resolve_url
from storage.errors import storage_failure
from storage.record import RUN_AGAIN_ATTR
from storage.sqlite_file import SqliteFile
from storage.url import DEFAULT_SQLITE_PATH
from sweeps.config.optuna_parts import pruner_spec
from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import build_launcher
from sweeps.launchers.interrupts import signals_held
from sweeps.launchers.slots import SlotPool
from sweeps.launchers.workers import cancel_all
from sweeps.preflight import check_before_study
from sweeps.search.budget import enqueue_baseline, study_done
from sweeps.search.definition import study_definition
from sweeps.search.distinct_draws import choose_sampler, exhausted_line
from sweeps.search.queued import log_left_queued
from sweeps.search.space import SearchSpace, parse_space
from sweeps.search.study import OpenStudy, open_study, quiet_optuna_warnings
from sweeps.trials.paths import StudyRoots
from sweeps.trials.preemption import machine_gone, mark_preempted, preempted_reason, queue_copy
from sweeps.trials.progress import ProgressView, duration, print_best, route_optuna_logging
from sweeps.trials.recovery import abandon, settle_orphans, stop_stalled
from sweeps.trials.rerun import queue_failed_again
from sweeps.trials.retry import StudyStoppedByJobError
from sweeps.trials.running import STORAGE_ERRORS, RunningTrial, explain_heartbeat_warnings, storage_fatal
from sweeps.trials.starts import TrialStarts
from sweeps.trials.study_end import run_end_stages
from sweeps.trials.trial_runner import TrialRunner
from sweeps.validation.validate import trial_length, validate_sweep

log = logging.getLogger("sweeps")


class Driver:
    """The study's loop over a TrialRunner: what to start, when the study is done, and how it survives outages."""

    def __init__(self, sweep: SweepConfig):
        """`sweep`: the typed config (sweeps.config.typed_config.typed_sweep, where every block's own checks ran)."""
        quiet_optuna_warnings()
        self.sweep = sweep
        self.scale = self.sweep.scale
        self.space: SearchSpace = parse_space(
            self.sweep.study.space.get(self.scale),
            self.sweep.study.conditional.get(self.scale),
            where=f"study.space.{self.scale}",
        )
        self.base_overrides = [*self.sweep.trial.overrides, *self.sweep.study.fixed.get(self.scale, [])]
        self.launcher = build_launcher(self.sweep.launcher)
        self.storage_url = resolve_url(self.sweep.storage.url, Path(DEFAULT_SQLITE_PATH).resolve())
        self.trials = self.runner()  # a dry run's until open_study gives it the study
        self.running: dict[int, RunningTrial] = {}
        self.outage_ended = 0.0  # when the database last came back after an outage (epoch seconds)
        self.last_recover = 0.0  # when recover() last ran (epoch seconds)
        self.timed_out: str | None = None  # set when `timeout` stopped new trials: what the last lines say
        self.storage_file: SqliteFile | None = None  # a SQLite study's file as opened: checked every pass

    def runner(self, opened: OpenStudy | None = None, study_uid: str | None = None) -> TrialRunner:
        """A TrialRunner over `opened` (None: commands only, under `study_uid` or a stand-in uid)."""
        return TrialRunner(
            self.sweep, self.base_overrides, self.launcher, self.storage_url, self.best_line, opened, study_uid
        )

    @property
    def study(self) -> optuna.Study:
        return self.trials.study

    @property
    def storage(self) -> RDBStorage:
        return self.trials.storage

    @property
    def roots(self) -> StudyRoots:
        return self.trials.roots

    @functools.cached_property
    def train_steps(self) -> int:
        """Every trial's train.steps (from trial.overrides): the pruner's max resource and progress's 100%."""
        return trial_length(self.base_overrides)

    def validate(self) -> None:
        """Everything that can be wrong, before anything runs (see sweeps.validation.validate)."""
        validate_sweep(self.sweep, self.space, self.base_overrides, self.launcher)

    def open_study(self) -> optuna.Study:
        """Open and check the study (sweeps.search.study); its uid places the trial directories."""
        pruner = pruner_spec(self.sweep.pruner, self.train_steps)
        definition = study_definition(self.sweep.study, pruner, self.space, self.train_steps, self.base_overrides)
        opened = open_study(self.sweep, self.storage_url, self.train_steps, definition)
        self.storage_file = SqliteFile.of(self.storage_url)
        self.trials = self.runner(opened)
        seed = self.sweep.seed + opened.driver_index  # repeats are drawn again (sweeps.search.distinct_draws)
        opened.study.sampler = choose_sampler(
            opened.study.sampler, self.space, self.sweep.n_trials, self.sweep.draws, seed
        )
        return opened.study

    def enqueue_baseline(self) -> None:
        baseline = dict(self.sweep.study.baseline.get(self.scale) or {})
        if self.sweep.study.enqueue_baseline and enqueue_baseline(self.study, baseline, self.space.conditionals):
            log.info("enqueued the baseline configuration as the first trial: %s", baseline)

    # ------------------------------------------------------------------------------------------ the loop

    def recover(self) -> None:
        """Settle trials whose driver died, and stop our jobs that stalled (sweeps/trials/recovery.py)."""
        if time.time() - self.outage_ended < self.sweep.heartbeat.grace_s:
            return  # right after a database outage every heartbeat looks stale: wait until live drivers beat again
        settle_orphans(
            self.study,
            self.storage,
            grace_s=self.sweep.heartbeat.grace_s,
            max_retry=self.sweep.heartbeat.max_retry,
            seeds=self.sweep.study.seeds,
            objective_values=self.trials.objective_values,
            ours=self.running.keys(),
            shares_filesystem=self.launcher.shares_filesystem,
            space=self.space,
        )

    def run(self) -> optuna.Study:
        route_optuna_logging()  # Optuna's lines in the driver's format and log file (sweeps/trials/progress.py)
        explain_heartbeat_warnings()  # "database unreachable", not Optuna's "invalid data in the commit"
        self.validate()
        self.launcher.prepare()
        check_before_study(self.sweep, self.launcher)  # a tpu_pod study: the preflight, or no trial starts
        study = self.open_study()
        log.info("study %r in %s: %d trials so far", study.study_name, redact(self.storage_url), len(study.trials))
        self.recover()
        queue_failed_again(study, self.storage, self.launcher.shares_filesystem)  # "fix it, then run the same command"
        self.enqueue_baseline()
        started = time.time()
        self.last_recover = time.time()
        outage = 0.0
        backoff = self.sweep.storage_outage_backoff
        try:
            while True:
                try:
                    self.check_storage()
                    if self.loop_once(started):
                        break
                    if outage:
                        self.after_outage()
                    outage = 0.0
                except STORAGE_ERRORS as err:
                    if fatal := storage_fatal(err, self.storage_url, self.storage_file):
                        self.stop_on(fatal)
                    # The database is restarting or unreachable: keep the jobs running (they retry their own
                    # reports) and come back with backoff; pool_pre_ping reconnects once it answers.
                    outage = min(max(2 * outage, float(backoff.first_s)), float(backoff.max_s))
                    log.warning("storage unavailable (%s); retrying in %g s", storage_failure(err), outage)
                    time.sleep(outage)
        except BaseException as err:  # Ctrl-C, or any error the loop does not settle itself (a failed launch)
            # Never end with a job of ours training on: stop each, then record its trial (queued again while it
            # has retries), so the study stays true and the same command continues it.
            why = "interrupted" if isinstance(err, KeyboardInterrupt) else f"ending on {type(err).__name__}"
            if self.running:
                log.warning("%s: stopping %d running trial(s), then recording them", why, len(self.running))
            # Ctrl-C, and a job's error every configuration meets, are run again by the same command (once fixed).
            self.abandon_running(why, run_again=isinstance(err, (KeyboardInterrupt, StudyStoppedByJobError)))
            raise
        if self.starts.exhausted:
            log.info(exhausted_line(study.get_trials(deepcopy=False), self.space, self.sweep.n_trials))
        self.log_summary()
        run_end_stages(self.trials, self.storage_url, started + self.sweep.timeout if self.sweep.timeout else None)
        return study

    def check_storage(self) -> None:
        """End the study (stop_on) when its storage is lost for good: a SQLite file gone, replaced or read-only
        (a stat per pass: reads still answer from a moved file, so only the heartbeats' writes would fail), or a
        heartbeat's last error that no wait gets past. An outage is waited out where the loop meets it."""
        beats = [r.heartbeat.last_error for r in self.running.values() if r.heartbeat.last_error is not None]
        if fatal := storage_fatal(beats[0] if beats else None, self.storage_url, self.storage_file):
            self.stop_on(fatal)

    def stop_on(self, fatal: Exception) -> NoReturn:
        """Waiting will not help: stop our jobs, each with the launcher's grace (a checkpoint), and end on `fatal`
        (sweeps.run: its one line, exit 2). Their trials stay RUNNING where they were stored: the same command, on
        the study's storage again, finds them orphaned and queues them to resume (sweeps/trials/recovery.py)."""
        cancel_all([running.job for running in self.running.values()])
        for running in self.running.values():
            running.heartbeat.stop()
        self.running.clear()
        raise fatal from None

    def loop_once(self, started: float) -> bool:
        """One pass of the driver loop: start trials within budget, collect finished jobs, recover stale
        trials, show progress. True when the study is done (or out of time) and nothing of ours runs."""
        out_of_time = self.sweep.timeout is not None and time.time() - started > self.sweep.timeout
        if not out_of_time:
            self.start_within_budget()
        elif self.timed_out is None:  # said once, when it first stops the study drawing
            self.timed_out = f"stopped by timeout={self.sweep.timeout:g}s"
            self.progress_view.stopped = self.timed_out  # no ETA from here: the running trials are the last
            log.warning(
                "timeout=%gs reached after %s: no new trial starts; %s",
                self.sweep.timeout,
                duration(time.time() - started),
                f"waiting for {len(self.running)} running trial(s)" if self.running else "the study stops here",
            )
        for number, running in list(self.running.items()):
            code = running.job.poll()
            if code is not None and (gone := machine_gone(self.storage, self.launcher, running, code)) is not None:
                self.pause(gone)  # its machine was taken: no verdict on the trial (sweeps/trials/preemption.py)
                return False
            with signals_held():  # Ctrl-C waits until a trial being told is told and out of self.running
                if code is not None and self.trials.settle(running, code):
                    del self.running[number]
                    self.starts.free_slot(running, code)
                    self.starts.exhausted = False  # it may have queued a retry: the next draw decides again
        if self.running and (gone := self.launcher.watch()) is not None:
            self.pause(gone)  # the machine taken while its jobs still run (a maintenance event, a spot stop)
            return False
        if self.trials.stopped_by is not None:  # a job's error every configuration meets: nothing more is started
            number, line, why = self.trials.stopped_by
            log.error(
                "the study stops on trial %d's error, spending no retry (%s); fix it, then run the same command: it "
                "runs the configurations that failed on it again, first: %s",
                number,
                why,
                line,
            )
            raise StudyStoppedByJobError(line)
        if not self.running and (out_of_time or self.starts.exhausted or study_done(self.study, self.sweep.n_trials)):
            return True
        if time.time() - self.last_recover > self.sweep.heartbeat.interval_s:
            self.recover()  # another driver may have died meanwhile: its trials come back to us
            stop_stalled(self.storage, self.running, self.sweep.stall_timeout_s)
            self.last_recover = time.time()
        self.progress_view.tick(self.study)  # a terminal's line redrawn, or a log line every progress_interval_s
        time.sleep(self.sweep.poll_s)
        return False

    @functools.cached_property
    def starts(self) -> TrialStarts:
        """Trials started on free slots within the budget (sweeps/trials/starts.py): first used in the loop, over the
        runner of the study open_study opened."""
        return TrialStarts(self.trials, self.space, self.running)

    @property
    def slot_pool(self) -> SlotPool:
        return self.starts.pool

    def start_within_budget(self) -> None:
        if (gone := self.starts.start_within_budget()) is not None:
            self.pause(gone)  # outside signals_held: Ctrl-C ends a wait that may last hours

    def pause(self, line: str) -> None:
        """The launcher's machine is gone (sweeps/trials/preemption.py): stop our running jobs with the launcher's kill
        grace (SIGTERM: a job still running, as under a maintenance event or a spot notice, saves and uploads its
        checkpoint; on VMs already gone the stop ends at once), set their trials aside, wait until the machine is
        back and prepared anew, check it as at the start, fresh slots."""
        log.warning("%s: %d running trial(s) set aside: queued again, no retry spent", line, len(self.running))

        def record(running: RunningTrial) -> None:
            mark_preempted(running.trial, line)
            self.trials.tell_outcome(running, TrialState.FAIL, preempted_reason(line))
            queue_copy(self.study, self.storage, running.trial)

        abandon(self.running, record)
        self.running.clear()
        self.launcher.wait_until_available(line)
        check_before_study(self.sweep, self.launcher)  # a tpu_pod study: the preflight on the new VMs
        self.starts.new_slots()

    def after_outage(self) -> None:
        """The database answers again. During the outage no heartbeat and no job progress could be stored: give
        every driver's trials a grace period to beat again before any is judged orphaned, and our jobs a fresh
        stall window (their progress writes failed too)."""
        self.outage_ended = time.time()
        for running in self.running.values():
            running.progress_seen = time.time()

    def abandon_running(self, why: str, run_again: bool = False) -> None:
        """Stop our jobs, then fail their trials, each queued again while it has retries (sweeps.trials.recovery.abandon);
        `run_again`: the driver's last line says to run the same command, which then runs them again first."""
        reason = f"driver {why}"

        def record(running: RunningTrial) -> None:
            if run_again:  # sweeps/trials/rerun.py queues it at the next start, retries left or not
                running.trial.set_user_attr(RUN_AGAIN_ATTR, True)
            self.trials.tell_outcome(running, TrialState.FAIL, reason, True)

        abandon(self.running, record)
        self.running.clear()

    # ------------------------------------------------------------------------------ progress and the end

    @functools.cached_property
    def progress_view(self) -> ProgressView:
        """The study's progress display (sweeps/trials/progress.py), started at the first pass of the loop."""
        return ProgressView(
            str(self.sweep.study.name),
            self.sweep.n_trials,
            self.slot_pool.limit,
            self.sweep.progress_interval_s,
            steps=self.train_steps,
        )

    def best_line(self) -> str:
        """` [3/8 done, running 1, best trial 2: 0.8125, ETA 4m10s]`: ends each trial's state-change line."""
        return self.progress_view.note(self.study)

    def log_summary(self) -> None:
        self.progress_view.close(self.study, self.timed_out)
        print_best(self.study, self.sweep.study.objective)
        log_left_queued(self.study, self.sweep.n_trials)
