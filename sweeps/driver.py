"""The sweep driver: one Optuna study whose trials are distributed TRM training jobs.

    validate everything -> open the study -> fail stale trials (they are re-queued) -> loop:
    ask -> search space to overrides -> launch on the workers -> heartbeat while it runs ->
    read the outcome the job stored on the trial -> tell COMPLETE / PRUNED / FAIL (reason kept)

The driver never imports the model: it talks to the job through its command line and the study record.
This module is the loop; the rest lives apart: opening and checking the study (sweeps.study), the budget and
the baseline (sweeps.budget), trial paths (sweeps.paths), outcome decisions (sweeps.outcome), a running trial's
state (sweeps.running), building Optuna objects (sweeps.optuna_parts), launchers (sweeps.launchers.base.Launcher)
and progress (sweeps.progress), slots (sweeps.slots), the job's command line (sweeps.job_command), drawing a
trial within budget (sweeps.draw) and settling orphans and stalled jobs (sweeps.recovery).

Invariant: a trial's life from draw to tell (start, one job per seed, the job's verdict, tell, retry, its slot)
and the loop's database-outage handling are one state machine over `self.running`; each decision in it is a
pure function elsewhere (sweeps/outcome.py).
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from omegaconf import DictConfig
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from storage import HeartbeatThread, StorageGoneError, database_gone, redact, resolve_url, trial_id_of
from storage.errors import StoragePermissionError, permission_denied
from storage.record import (
    CHECKPOINT_URL_ATTR,
    DETAILS_ATTR,
    NOT_STARTED_ATTR,
    SLOT_ATTR,
    TRAIN_OVERRIDES_ATTR,
    attempt_attr,
    merged_details,
)
from storage.url import DEFAULT_SQLITE_PATH
from sweeps.budget import baseline_params, budget_used
from sweeps.definition import study_definition
from sweeps.distinct_draws import check_draws, choose_sampler, exhausted_line
from sweeps.draw import draw_within_budget, failed_unless_started
from sweeps.interrupts import signals_held
from sweeps.job_command import JobCommand, StudyLink, job_name, training_overrides
from sweeps.launchers.base import JobSpec
from sweeps.optuna_parts import build_launcher
from sweeps.outcome import clip_reason, job_verdict, objective_values, seed_attrs, seed_mean
from sweeps.paths import StudyRoots, TrialPaths
from sweeps.preflight import check_before_study
from sweeps.progress import ProgressView, print_best, route_optuna_logging
from sweeps.queued import log_left_queued
from sweeps.recovery import abandon, requeue, settle_orphans, stop_stalled
from sweeps.reeval import ReevalSettings, reevaluate
from sweeps.retry import plan_retry, retry_of, with_note
from sweeps.running import RunningTrial
from sweeps.slots import Slot, SlotPool
from sweeps.space import SearchSpace, parse_space, to_overrides
from sweeps.study import OpenStudy, StudyNotOpenError, open_study, quiet_optuna_warnings
from sweeps.validate import trial_length, validate_sweep
from sweeps.wandb_summary import log_study_summary, trial_wandb_overrides

log = logging.getLogger("sweeps")

STORAGE_ERRORS = (
    optuna.exceptions.StorageInternalError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
)


class Driver:
    def __init__(self, cfg: DictConfig):
        quiet_optuna_warnings()
        self.cfg = cfg
        self.study_cfg = cfg.study
        self.scale = cfg.scale
        self.space: SearchSpace = parse_space(
            self.study_cfg.space.get(self.scale),
            (self.study_cfg.get("conditional") or {}).get(self.scale),
            where=f"study.space.{self.scale}",
        )
        self.base_overrides = [*cfg.trial.overrides, *(self.study_cfg.get("fixed") or {}).get(self.scale, [])]
        self.launcher = build_launcher(cfg.launcher)
        self.storage_url = resolve_url(cfg.storage.url, Path(DEFAULT_SQLITE_PATH).resolve())
        self.running: dict[int, RunningTrial] = {}
        self.exhausted = False  # the sampler keeps drawing configurations the study already has
        self.outage_ended = 0.0  # when the database last came back after an outage (epoch seconds)
        self.last_recover = 0.0  # when recover() last ran (epoch seconds)
        self.opened: OpenStudy | None = None
        self.set_study_uid("UID")  # a dry run's stand-in; open_study sets the study's own

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

    def set_study_uid(self, uid: str) -> None:
        """Trial directories: <root>/<study name>/<first 8 of the study's uid>/trial-<n> (sweeps.paths)."""
        self.study_uid = uid
        self.roots = StudyRoots.of(
            str(self.cfg.output_root),
            self.cfg.trial.get("run_root"),
            self.cfg.trial.get("checkpoint_root"),
            str(self.study_cfg.name),
            uid,
        )

    # ----------------------------------------------------------------------------------- before running

    @functools.cached_property
    def train_steps(self) -> int:
        """Every trial's train.steps (from trial.overrides): the pruner's max resource and progress's 100%."""
        return trial_length(self.base_overrides)

    def validate(self) -> None:
        """Everything that can be wrong, before anything runs (see sweeps.validate)."""
        validate_sweep(self.cfg, self.space, self.base_overrides, self.launcher)
        check_draws(self.cfg.draws)
        ReevalSettings.of(self.cfg.reeval)

    def open_study(self) -> optuna.Study:
        """Open and check the study (sweeps.study); its uid places the trial directories."""
        definition = study_definition(self.cfg, self.space, self.train_steps, self.base_overrides)
        self.opened = open_study(self.cfg, self.storage_url, self.train_steps, definition)
        self.set_study_uid(self.opened.uid)
        seed = int(self.cfg.seed) + self.opened.driver_index  # repeats are drawn again (sweeps.distinct_draws)
        sampler = choose_sampler(self.opened.study.sampler, self.space, int(self.cfg.n_trials), self.cfg.draws, seed)
        self.opened.study.sampler = sampler
        return self.opened.study

    # ------------------------------------------------------------------------------------------- budget

    def study_done(self) -> bool:
        """Budget spent and nothing running anywhere: a trial RUNNING elsewhere may belong to a dead driver, so we
        wait for it to finish or go stale (and then run its retry). A queued (WAITING) one would not start: ignored."""
        if budget_used(self.study.get_trials(deepcopy=False)) < self.cfg.n_trials:
            return False
        return not self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    def enqueue_baseline(self) -> None:
        if not self.study_cfg.get("enqueue_baseline") or self.study.get_trials(deepcopy=False):
            return
        baseline = dict((self.study_cfg.get("baseline") or {}).get(self.scale) or {})
        params = baseline_params(baseline, self.space.conditionals)
        self.study.enqueue_trial(params, user_attrs={"baseline": True})
        log.info("enqueued the baseline configuration as the first trial: %s", baseline)

    # ------------------------------------------------------------------------------------------ a trial

    def origin_number(self, trial: FrozenTrial) -> int:
        """The first trial of a retry chain: its checkpoint directory is the one to resume from."""
        history = RetryHeartbeatStaleTrialCallback.retry_history(trial)
        return history[0] if history else trial.number

    def training_overrides(self, sampled: dict[str, Any]) -> list[str]:
        """What a trial trains: pasted after `python -m trm.train` they re-train it (sweeps/best.py)."""
        return training_overrides(
            self.base_overrides, sampled, str(self.study_cfg.objective), str(self.study_cfg.direction)
        )

    def checkpoint_url(self, origin: int) -> str:
        """A retry chain's checkpoints: under its first trial's directory."""
        return self.roots.checkpoint_url(origin)

    def trial_paths(self, number: int, origin: int, seed_index: int = 0) -> TrialPaths:
        """Where the job of seed `seed_index` of trial `number` writes (its own directories when seeds > 1)."""
        return self.roots.trial(number, origin, seed_index, int(self.study_cfg.seeds))

    def job_command(
        self, number: int, sampled: dict[str, Any], origin: int, seed_index: int = 0, slot: Slot | None = None
    ) -> JobCommand:
        """The job's command line for one seed of trial `number` on `slot` (sweeps/job_command.py)."""
        paths = self.trial_paths(number, origin, seed_index)
        link = StudyLink(
            study=str(self.study_cfg.name),
            study_uid=self.study_uid,
            trial_number=number,
            storage=self.storage_url,
            password_env=self.cfg.storage.password_env or None,
            seed_index=seed_index if int(self.study_cfg.seeds) > 1 else None,
        )
        return JobCommand(
            training=self.training_overrides(sampled),
            tracking=trial_wandb_overrides(self.cfg, self.study_uid, origin, seed_index),
            out_dir=paths.run_dir,
            checkpoint_url=paths.checkpoint_url,
            link=link,
            extra=slot.overrides if slot else (),
        )

    def start_trial(self, trial: optuna.Trial, sampled: dict[str, Any], slot: Slot) -> RunningTrial:
        frozen = self.storage.get_trial(trial_id_of(trial))
        origin = self.origin_number(frozen)
        for key, value in frozen.user_attrs.items():
            if attempt_attr(key) and value is not None:  # a retry: its predecessor's outcome is not its own
                trial.set_user_attr(key, None)
        workdir = self.roots.workdir(trial.number)
        trial.set_user_attr("overrides", to_overrides(sampled))
        trial.set_user_attr("workdir", str(workdir))
        # A fresh `details` (a retry's predecessor's belong to its own attempt): the job and finish() add theirs.
        trial.set_user_attr(DETAILS_ATTR, {TRAIN_OVERRIDES_ATTR: self.training_overrides(sampled)})
        trial.set_user_attr(CHECKPOINT_URL_ATTR, self.checkpoint_url(origin))
        trial.set_user_attr(SLOT_ATTR, slot.name)
        heartbeat = HeartbeatThread(self.storage, trial_id_of(trial), float(self.cfg.heartbeat.interval_s))
        heartbeat.start()
        running = RunningTrial(trial, None, heartbeat, workdir, sampled=sampled, origin=origin, slot=slot)
        self.launch_seed(running, 0)
        resumed = retry_of(trial.number, origin, self.trial_paths(origin, origin).checkpoint_url)
        where = "" if slot.whole else f" on {slot.name}"
        log.info(
            "trial %d started%s%s: %s%s",
            trial.number,
            where,
            resumed,
            " ".join(to_overrides(sampled)),
            self.best_line(),
        )
        return running

    def launch_seed(self, running: RunningTrial, index: int) -> None:
        """Start the job for one seed of the trial (a single job when study.seeds is 1); with several seeds each
        has its own output and checkpoint directories (sweeps.paths), and only seed 0 reports to the pruner."""
        trial = running.trial
        overrides = self.job_command(trial.number, running.sampled, running.origin, index, running.slot).overrides()
        workdir = self.trial_paths(trial.number, running.origin, index).workdir
        running.seed_index = index
        running.launched_at.append(time.time())
        running.progress, running.progress_seen = None, time.time()
        try:
            running.handle = self.launcher.launch(
                JobSpec(
                    job_name(self.study_cfg.name, self.study_uid, trial.number), overrides, workdir, slot=running.slot
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
        trial.set_user_attr("fail_reason", clip_reason(reason))
        self.study.tell(trial, state=TrialState.FAIL)
        log.warning("trial %d FAIL: %s", trial.number, reason.splitlines()[0] if reason else "")

    def on_job_end(self, running: RunningTrial, exit_code: int) -> TrialState | None:
        """Tell Optuna what the job recorded (sweeps/outcome.py decides); None if more seeds follow."""
        trial = running.trial
        attrs = seed_attrs(self.storage.get_trial(trial_id_of(trial)).user_attrs, running.seed_index)
        measured = self.objective_values(attrs) if attrs.get("outcome") == "COMPLETE" else None
        verdict = job_verdict(
            attrs,
            measured,
            self.study_cfg.objective,
            exit_code=exit_code,
            launcher_failure=running.job.failure,
            cancelled=running.job.cancelled,
        )
        if verdict.state == TrialState.COMPLETE:
            if len(running.seed_objectives) == running.seed_index:  # not twice after a database outage
                running.seed_objectives.append(verdict.values)
            if running.seed_index + 1 < int(self.study_cfg.seeds):
                self.launch_seed(running, running.seed_index + 1)
                return None
        return self.tell_outcome(running, verdict.state, verdict.reason, retry=verdict.requeue)

    def tell_outcome(
        self, running: RunningTrial, state: TrialState, reason: str = "", retry: bool = False
    ) -> TrialState:
        """Tell Optuna; the heartbeat stops only once that is stored (a database outage leaves the trial ours).
        `retry`: a FAIL worth a retry, queued while retries are left; the reason says which (sweeps/retry.py)."""
        trial = running.trial
        frozen, max_retry = self.storage.get_trial(trial_id_of(trial)), int(self.cfg.heartbeat.max_retry)
        checkpoints = self.trial_paths(trial.number, running.origin).checkpoint_url
        plan = plan_retry(frozen, max_retry, checkpoints) if retry else None
        stored = frozen.user_attrs
        timing = {"launched_at": running.launched_at, "exited_at": running.exited_at}
        trial.set_user_attr(DETAILS_ATTR, merged_details(stored, driver_timing=timing))
        if state == TrialState.FAIL:
            self.tell_fail(trial, with_note(reason, plan.note) if plan else reason)
            if plan and plan.queued:
                requeue(self.study, self.storage, trial_id_of(trial), max_retry)
        elif state == TrialState.PRUNED:
            last_step = max(self.storage.get_trial(trial_id_of(trial)).intermediate_values, default=None)
            self.study.tell(trial, state=TrialState.PRUNED)
            log.info("trial %d PRUNED at step %s%s", trial.number, last_step, self.best_line())
        else:
            per_seed = running.seed_objectives
            mean = seed_mean(per_seed)
            if len(per_seed) > 1:  # TRM's seed variance is large: keep the spread on the trial
                trial.set_user_attr("seed_values", [v[0] for v in per_seed])
                trial.set_user_attr("seed_std", statistics.pstdev(v[0] for v in per_seed))
            self.study.tell(trial, mean if len(mean) > 1 else mean[0])
            log.info(
                "trial %d COMPLETE: %s = %.4f%s", trial.number, self.study_cfg.objective, mean[0], self.best_line()
            )
        running.heartbeat.stop()
        return state

    def objective_values(self, attrs: Mapping[str, Any]) -> list[float] | None:
        """One seed's objective value(s) as this study measures them (sweeps.outcome.objective_values)."""
        extra = [str(o.name) for o in self.study_cfg.get("objectives") or []]
        return objective_values(attrs, self.study_cfg.objective, extra, self.study_cfg.value == "best")

    # ---------------------------------------------------------------------------------------- the loop

    def recover(self) -> None:
        """Settle trials whose driver died, and stop our jobs that stalled (sweeps/recovery.py)."""
        if time.time() - self.outage_ended < float(self.cfg.heartbeat.grace_s):
            return  # right after a database outage every heartbeat looks stale: wait until live drivers beat again
        settle_orphans(
            self.study,
            self.storage,
            grace_s=float(self.cfg.heartbeat.grace_s),
            max_retry=int(self.cfg.heartbeat.max_retry),
            seeds=int(self.study_cfg.seeds),
            objective_values=self.objective_values,
            ours=self.running.keys(),
        )

    def run(self) -> optuna.Study:
        route_optuna_logging()  # Optuna's lines in the driver's format and log file (sweeps/progress.py)
        self.validate()
        self.launcher.prepare()
        check_before_study(self.cfg, self.launcher)  # a tpu_pod study: the preflight, or no trial starts
        study = self.open_study()
        log.info("study %r in %s: %d trials so far", study.study_name, redact(self.storage_url), len(study.trials))
        self.recover()
        self.enqueue_baseline()
        started = time.time()
        self.last_recover = time.time()
        outage = 0.0
        backoff = self.cfg.storage_outage_backoff
        try:
            while True:
                try:
                    if self.loop_once(started):
                        break
                    if outage:
                        self.after_outage()
                    outage = 0.0
                except STORAGE_ERRORS as err:
                    why, denied = database_gone(err), permission_denied(err)
                    if why or denied:  # dropped, its tables deleted, or not ours to write: waiting will not help
                        for running in self.running.values():
                            running.job.cancel()
                            running.heartbeat.stop()
                        self.running.clear()
                        if denied:
                            raise StoragePermissionError(f"{denied}; its running jobs were stopped") from None
                        raise StorageGoneError(
                            f"the study database {redact(self.storage_url)} is gone: {why}; its running jobs were stopped"
                        ) from None
                    # The database is restarting or unreachable: keep the jobs running (they retry their own
                    # reports) and come back with backoff; pool_pre_ping reconnects once it answers.
                    outage = min(max(2 * outage, float(backoff.first_s)), float(backoff.max_s))
                    log.warning("storage unavailable (%s); retrying in %g s", type(err).__name__, outage)
                    time.sleep(outage)
        except KeyboardInterrupt:
            log.warning("interrupted: stopping %d running trial(s), then recording them", len(self.running))
            self.abandon_running()
            raise
        if self.exhausted:
            log.info(exhausted_line(study.get_trials(deepcopy=False), self.space, int(self.cfg.n_trials)))
        self.log_summary()
        reeval = ReevalSettings.of(self.cfg.reeval)
        if reeval.at_end:  # the top trials' checkpoints on a larger eval (sweeps/reeval.py)
            reevaluate(study, self.cfg, self.launcher, self.roots, self.study_uid, self.storage_url, reeval, True)
        log_study_summary(study, self.cfg)
        return study

    def loop_once(self, started: float) -> bool:
        """One pass of the driver loop: start trials within budget, collect finished jobs, recover stale
        trials, show progress. True when the study is done (or out of time) and nothing of ours runs."""
        out_of_time = self.cfg.timeout is not None and time.time() - started > self.cfg.timeout
        if not out_of_time:
            self.start_within_budget()
        for number, running in list(self.running.items()):
            code = running.job.poll()
            with signals_held():  # Ctrl-C waits until a trial being told is told and out of self.running
                if code is not None and self.settle(running, code):
                    del self.running[number]
                    self.free_slot(running, code)
                    self.exhausted = False  # it may have queued a retry: the next draw decides again
        if not self.running and (out_of_time or self.exhausted or self.study_done()):
            return True
        if time.time() - self.last_recover > self.cfg.heartbeat.interval_s:
            self.recover()  # another driver may have died meanwhile: its trials come back to us
            stop_stalled(self.storage, self.running, float(self.cfg.stall_timeout_s))
            self.last_recover = time.time()
        self.log_progress()
        time.sleep(self.cfg.poll_s)
        return False

    @functools.cached_property
    def slot_pool(self) -> SlotPool:
        """Where trials run (sweeps/slots.py): one per slot of launcher.slots, at most max_concurrent at once."""
        return SlotPool(self.launcher.slots(), self.cfg.max_concurrent)

    def start_within_budget(self) -> None:
        """Start a trial on every free slot until the budget (or the search space) is spent."""
        while (slot := self.slot_pool.take()) is not None:
            # Ctrl-C waits until a drawn trial's job is ours to stop (sweeps.interrupts): none is left untracked.
            with signals_held():
                try:  # a failed draw (the database restarting) or launch hands the slot back, or no trial starts again
                    draw = draw_within_budget(self.study, self.storage, self.space, int(self.cfg.n_trials))
                    self.exhausted = draw.exhausted
                    if draw.trial is None:
                        self.slot_pool.give_back(slot)
                        break
                    with failed_unless_started(self.study, self.storage, draw.trial):
                        running = self.start_trial(draw.trial, draw.sampled, slot)
                except BaseException:
                    self.slot_pool.give_back(slot)
                    raise
                self.running[running.trial.number] = running

    def free_slot(self, running: RunningTrial, code: int) -> None:
        """A settled trial's slot takes the next trial, unless its job failed because its machine is gone."""
        if code != 0 and not self.launcher.slot_alive(running.slot):
            log.warning("%s no longer answers: its slot takes no more trials", running.slot.name)
            self.slot_pool.retire(running.slot)
        else:
            self.slot_pool.give_back(running.slot)

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

    def after_outage(self) -> None:
        """The database answers again. During the outage no heartbeat and no job progress could be stored: give
        every driver's trials a grace period to beat again before any is judged orphaned, and our jobs a fresh
        stall window (their progress writes failed too)."""
        self.outage_ended = time.time()
        for running in self.running.values():
            running.progress_seen = time.time()

    def settled_elsewhere(self, running: RunningTrial) -> bool:
        """Whether our running trial was finished by someone else (another driver that found it orphaned)."""
        return self.storage.get_trial(trial_id_of(running.trial)).state.is_finished()

    def abandon_running(self) -> None:
        """Stop our jobs, then fail their trials, each queued again while it has retries (sweeps.recovery.abandon)."""
        abandon(self.running, lambda running: self.tell_outcome(running, TrialState.FAIL, "driver interrupted", True))
        self.running.clear()

    @functools.cached_property
    def progress_view(self) -> ProgressView:
        """The study's progress display (sweeps/progress.py), started at the first pass of the loop."""
        return ProgressView(
            self.study_cfg.name,
            int(self.cfg.n_trials),
            self.slot_pool.limit,
            float(self.cfg.progress_interval_s),
        )

    def log_progress(self) -> None:
        """Each pass of the loop: a terminal's progress line redrawn every few seconds, or (not a terminal) one
        quiet log line every progress_interval_s."""
        self.progress_view.tick(self.study)

    def best_line(self) -> str:
        """` [3/8 done, running 1, best trial 2: 0.8125, ETA 4m10s]`: ends each trial's state-change line."""
        return self.progress_view.note(self.study)

    def log_summary(self) -> None:
        self.progress_view.close(self.study)
        print_best(self.study, str(self.study_cfg.objective))
        log_left_queued(self.study, int(self.cfg.n_trials))
