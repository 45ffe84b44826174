"""The sweep driver: one Optuna study whose trials are distributed TRM training jobs.

    validate everything -> open the study -> fail stale trials (they are re-queued) -> loop:
    ask -> search space to overrides -> launch on the workers -> heartbeat while it runs ->
    read the outcome the job stored on the trial -> tell COMPLETE / PRUNED / FAIL (reason kept)

The driver never imports the model: it talks to the job through its command line and the study record.
This module is the loop; the rest lives apart: opening and checking the study (sweeps.study), the budget and
the baseline (sweeps.budget), trial paths (sweeps.paths), outcome decisions (sweeps.outcome), a running trial's
state (sweeps.running), building Optuna objects (sweeps.optuna_parts), launchers (sweeps.launchers.base.Launcher)
and progress (sweeps.progress).
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

from storage import (
    HeartbeatThread,
    StorageGoneError,
    database_gone,
    exclusive,
    orphaned_trials,
    redact,
    resolve_url,
    retry_callback,
    trial_id_of,
)
from storage.record import (
    CHECKPOINT_URL_ATTR,
    DETAILS_ATTR,
    DUPLICATE_OF_ATTR,
    PROGRESS_ATTR,
    TRAIN_OVERRIDES_ATTR,
    attempt_attr,
    merged_details,
)
from sweeps.budget import TRAINS, baseline_params, budget_used, twin_of
from sweeps.launchers.base import LAUNCHER_MEMBERS, JobSpec, Launcher, LauncherConfigError
from sweeps.optuna_parts import build
from sweeps.outcome import (
    clip_reason,
    job_verdict,
    objective_values,
    orphan_verdict,
    seed_attrs,
    seed_mean,
    seed_prefix,
)
from sweeps.paths import StudyRoots, TrialPaths
from sweeps.progress import ProgressView, print_best, route_optuna_logging
from sweeps.running import RunningTrial
from sweeps.space import SearchSpace, parse_space, to_overrides
from sweeps.study import OpenStudy, StudyNotOpenError, open_study, quiet_optuna_warnings, reported_metric
from sweeps.validate import trial_length, validate_sweep
from sweeps.wandb_summary import log_study_summary, trial_wandb_overrides

log = logging.getLogger("sweeps")

MAX_DUPLICATE_DRAWS = 20  # draws in a row that repeat a configuration before the space counts as exhausted
STORAGE_ERRORS = (
    optuna.exceptions.StorageInternalError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
)


def build_launcher(node: DictConfig) -> Launcher:
    """The configured launcher, refused here unless it has the interface the driver uses (sweeps.launchers.base)."""
    launcher = build(node)
    # Looked up on the class: reading world_size on the instance would evaluate config that prepare() checks later.
    missing = [name for name in LAUNCHER_MEMBERS if not hasattr(type(launcher), name)]
    if missing:
        raise LauncherConfigError(f"launcher._target_={node.get('_target_')!r}: not a launcher (it lacks {missing})")
    return launcher


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
        self.storage_url = resolve_url(cfg.storage.url, Path("outputs/optuna.db").resolve())
        self.running: dict[int, RunningTrial] = {}
        self.exhausted = False  # the sampler keeps drawing configurations the study already has
        self.outage_ended = 0.0  # when the database last came back after an outage (epoch seconds)
        self.last_recover = 0.0  # when recover() and stop_stalled() last ran (epoch seconds)
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

    @property
    def output_root(self) -> Path:
        return self.roots.output_root

    @property
    def reported_metric(self) -> str:
        """What the trials report to the pruner at each eval (study.prune_metric, else the objective)."""
        return reported_metric(self.study_cfg)

    # ----------------------------------------------------------------------------------- before running

    @functools.cached_property
    def train_steps(self) -> int:
        """Every trial's train.steps (from trial.overrides): the pruner's max resource and progress's 100%."""
        return trial_length(self.base_overrides)

    def validate(self) -> None:
        """Everything that can be wrong, before anything runs (see sweeps.validate)."""
        validate_sweep(self.cfg, self.space, self.base_overrides, self.launcher)

    def open_study(self) -> optuna.Study:
        """Open and check the study (sweeps.study); its uid places the trial directories."""
        self.opened = open_study(self.cfg, self.storage_url, self.train_steps)
        self.set_study_uid(self.opened.uid)
        return self.opened.study

    # ------------------------------------------------------------------------------------------- budget

    def finished_count(self) -> int:
        """Trials that used the budget (sweeps.budget.budget_used)."""
        return budget_used(self.study.get_trials(deepcopy=False))

    def study_done(self) -> bool:
        """Budget spent and nothing running anywhere: a trial RUNNING elsewhere may belong to a dead driver,
        so we wait for it to finish or go stale (and then run its retry ourselves)."""
        if self.finished_count() < self.cfg.n_trials:
            return False
        return not self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))

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

    def training_overrides(self, values: dict[str, Any]) -> list[str]:
        """What a trial trains: pasted after `python -m trm.train` they re-train it (sweeps/best.py)."""
        return [
            *self.base_overrides,
            *to_overrides(values),
            f"train.objective={self.study_cfg.objective}",
            f"train.objective_direction={str(self.study_cfg.direction).lower()}",
        ]

    def checkpoint_url(self, origin: int) -> str:
        """A retry chain's checkpoints: under its first trial's directory."""
        return self.roots.checkpoint_url(origin)

    def trial_paths(self, number: int, origin: int, seed_index: int = 0) -> TrialPaths:
        """Where the job of seed `seed_index` of trial `number` writes (its own directories when seeds > 1)."""
        return self.roots.trial(number, origin, seed_index, int(self.study_cfg.seeds))

    def trial_overrides(
        self, trial: optuna.Trial, values: dict[str, Any], workdir: Path, origin: int, seed_index: int = 0
    ) -> list[str]:
        """The job's command line for one seed of a trial (`workdir` is the launcher's, not the job's)."""
        paths = self.trial_paths(trial.number, origin, seed_index)
        return [
            *self.training_overrides(values),
            *trial_wandb_overrides(self.cfg, self.study_uid, origin, seed_index),
            f"out_dir={paths.run_dir}",
            f"checkpoint.url={paths.checkpoint_url}",
            f"sweep.study={self.study_cfg.name}",
            f"sweep.study_uid={self.study_uid}",
            f"sweep.trial_number={trial.number}",
            f"sweep.storage={self.storage_url}",
            *([f"sweep.password_env={self.cfg.storage.password_env}"] if self.cfg.storage.password_env else []),
        ]

    def ask_within_budget(self) -> tuple[optuna.Trial, dict[str, Any]] | None:
        """Ask for a trial and its sampled values unless the study's budget is spent, refusing configurations
        the study already has; atomic across drivers sharing the study (the check sees their running trials)."""
        with exclusive(self.storage, f"budget:{self.study_cfg.name}"):
            for _ in range(MAX_DUPLICATE_DRAWS):
                if self.finished_count() >= self.cfg.n_trials:
                    return None
                trial = self.study.ask()
                values = self.space.sample(trial)
                twin = self.same_configuration(trial)
                if twin is None:
                    return trial, values
                # Training it would spend a pod-hour on a result the study has (or will have): record why, not a value.
                trial.set_user_attr(DUPLICATE_OF_ATTR, twin)
                trial.set_user_attr(
                    "fail_reason", f"same parameters as trial {twin}: not trained (repeats are what study.seeds is for)"
                )
                self.study.tell(trial, state=TrialState.FAIL)
                log.info("trial %d drew trial %d's parameters again: not trained, drawing again", trial.number, twin)
        self.exhausted = True
        log.warning(
            "%d draws in a row repeated configurations the study has: the search space looks exhausted",
            MAX_DUPLICATE_DRAWS,
        )
        return None

    def same_configuration(self, trial: optuna.Trial) -> int | None:
        """The number of another trial with exactly these parameters that trained, trains or will train."""
        params = self.storage.get_trial(trial_id_of(trial)).params
        return twin_of(trial.number, params, self.study.get_trials(deepcopy=False, states=TRAINS) if params else [])

    def start_trial(self, trial: optuna.Trial, values: dict[str, Any]) -> RunningTrial:
        frozen = self.storage.get_trial(trial_id_of(trial))
        origin = self.origin_number(frozen)
        for key, value in frozen.user_attrs.items():
            if attempt_attr(key) and value is not None:  # a retry: its predecessor's outcome is not its own
                trial.set_user_attr(key, None)
        workdir = self.roots.workdir(trial.number)
        trial.set_user_attr("overrides", to_overrides(values))
        trial.set_user_attr("workdir", str(workdir))
        # A fresh `details` (a retry's predecessor's belong to its own attempt): the job and finish() add theirs.
        trial.set_user_attr(DETAILS_ATTR, {TRAIN_OVERRIDES_ATTR: self.training_overrides(values)})
        trial.set_user_attr(CHECKPOINT_URL_ATTR, self.checkpoint_url(origin))
        heartbeat = HeartbeatThread(self.storage, trial_id_of(trial), float(self.cfg.heartbeat.interval_s))
        heartbeat.start()
        running = RunningTrial(trial, None, heartbeat, workdir, values=values, origin=origin)
        self.launch_seed(running, 0)
        resumed = f" (retry of trial {origin}, resuming from its checkpoint)" if origin != trial.number else ""
        log.info("trial %d started%s: %s%s", trial.number, resumed, " ".join(to_overrides(values)), self.best_line())
        return running

    def launch_seed(self, running: RunningTrial, index: int) -> None:
        """Start the job for one seed of the trial (a single job when study.seeds is 1); with several seeds each
        has its own output and checkpoint directories (sweeps.paths), and only seed 0 reports to the pruner."""
        trial = running.trial
        overrides = self.trial_overrides(trial, running.values, running.workdir, running.origin, index)
        if int(self.study_cfg.seeds) > 1:
            overrides += [f"seed={index}", f"sweep.seed_index={index}"]
        workdir = self.trial_paths(trial.number, running.origin, index).workdir
        running.seed_index = index
        running.launched_at.append(time.time())
        running.progress, running.progress_seen = None, time.time()
        try:
            running.handle = self.launcher.launch(
                JobSpec(name=f"{self.study_cfg.name}-{trial.number}", overrides=overrides, workdir=workdir)
            )
        except Exception as err:
            running.heartbeat.stop()
            self.tell_fail(trial, f"launch failed: {type(err).__name__}: {err}")
            raise

    def tell_fail(self, trial: optuna.Trial, reason: str) -> None:
        trial.set_user_attr("fail_reason", clip_reason(reason))
        self.study.tell(trial, state=TrialState.FAIL)
        log.warning("trial %d FAIL: %s", trial.number, reason.splitlines()[0] if reason else "")

    def on_job_end(self, running: RunningTrial, exit_code: int) -> TrialState | None:
        """Tell Optuna what the job recorded (sweeps/outcome.py decides); None if more seeds follow."""
        trial = running.trial
        attrs = seed_attrs(self.storage.get_trial(trial_id_of(trial)).user_attrs, running.seed_index)
        values = self.objective_values(attrs) if attrs.get("outcome") == "COMPLETE" else None
        verdict = job_verdict(
            attrs,
            values,
            self.study_cfg.objective,
            exit_code=exit_code,
            launcher_failure=running.job.failure,
            cancelled=running.job.cancelled,
        )
        if verdict.state == TrialState.COMPLETE:
            if len(running.seed_values) == running.seed_index:  # not twice when a database outage made us come back
                running.seed_values.append(verdict.values)
            if running.seed_index + 1 < int(self.study_cfg.seeds):
                self.launch_seed(running, running.seed_index + 1)
                return None
        state = self.finish(running, verdict.state, verdict.reason)
        if verdict.requeue:
            self.requeue(trial)
        return state

    def finish(self, running: RunningTrial, state: TrialState, reason: str = "") -> TrialState:
        """Tell Optuna; the heartbeat stops only once that is stored (a database outage leaves the trial ours)."""
        trial = running.trial
        stored = self.storage.get_trial(trial_id_of(trial)).user_attrs
        timing = {"launched_at": running.launched_at, "exited_at": running.exited_at}
        trial.set_user_attr(DETAILS_ATTR, merged_details(stored, driver_timing=timing))
        if state == TrialState.FAIL:
            self.tell_fail(trial, reason)
        elif state == TrialState.PRUNED:
            last_step = max(self.storage.get_trial(trial_id_of(trial)).intermediate_values, default=None)
            self.study.tell(trial, state=TrialState.PRUNED)
            log.info("trial %d PRUNED at step %s%s", trial.number, last_step, self.best_line())
        else:
            per_seed = running.seed_values
            values = seed_mean(per_seed)
            if len(per_seed) > 1:  # TRM's seed variance is large: keep the spread on the trial
                trial.set_user_attr("seed_values", [v[0] for v in per_seed])
                trial.set_user_attr("seed_std", statistics.pstdev(v[0] for v in per_seed))
            self.study.tell(trial, values if len(values) > 1 else values[0])
            log.info(
                "trial %d COMPLETE: %s = %.4f%s", trial.number, self.study_cfg.objective, values[0], self.best_line()
            )
        running.heartbeat.stop()
        return state

    def objective_values(self, attrs: Mapping[str, Any]) -> list[float] | None:
        """One seed's objective value(s) as this study measures them (sweeps.outcome.objective_values)."""
        extra = [str(o.name) for o in self.study_cfg.get("objectives") or []]
        return objective_values(attrs, self.study_cfg.objective, extra, self.study_cfg.value == "best")

    # ---------------------------------------------------------------------------------------- the loop

    def recover(self) -> None:
        """Settle trials whose driver died (stale heartbeat, or none at all): tell the outcome their job stored,
        or fail them and queue them again (sweeps/outcome.py decides)."""
        if time.time() - self.outage_ended < float(self.cfg.heartbeat.grace_s):
            return  # right after a database outage every heartbeat looks stale: wait until live drivers beat again
        ours = {running.trial.number for running in self.running.values()}
        for orphan, why in orphaned_trials(self.study, float(self.cfg.heartbeat.grace_s)):
            if orphan.number in ours:
                continue  # our own trial whose beat was late (a slow database): not an orphan
            verdict = orphan_verdict(orphan.user_attrs, int(self.study_cfg.seeds), self.objective_values, why)
            try:
                if verdict.state == TrialState.FAIL:
                    self.storage.set_trial_user_attr(trial_id_of(orphan), "fail_reason", clip_reason(verdict.reason))
                    self.study.tell(orphan.number, state=TrialState.FAIL)
                elif verdict.state == TrialState.PRUNED:
                    self.study.tell(orphan.number, state=TrialState.PRUNED)
                else:
                    self.study.tell(orphan.number, verdict.values if len(verdict.values) > 1 else verdict.values[0])
            except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
                continue  # another driver settled it first
            if verdict.requeue:
                retry_callback(int(self.cfg.heartbeat.max_retry))(
                    self.study, self.storage.get_trial(trial_id_of(orphan))
                )
            log.warning(
                "trial %d: %s; told %s%s",
                orphan.number,
                why,
                verdict.state.name,
                " and queued again" if verdict.requeue else " (the outcome its job stored)",
            )

    def stop_stalled(self) -> None:
        """Stop, fail and re-queue our trials whose job showed no progress for `stall_timeout_s` (a hung or
        stopped worker: the driver's heartbeat alone would keep such a trial RUNNING forever)."""
        limit = float(self.cfg.stall_timeout_s)
        for number, running in list(self.running.items()):
            attrs = self.storage.get_trial(trial_id_of(running.trial)).user_attrs
            progress = attrs.get(seed_prefix(running.seed_index) + PROGRESS_ATTR)
            if progress != running.progress:
                running.progress, running.progress_seen = progress, time.time()
                continue
            silent = time.time() - running.progress_seen
            if silent <= limit:
                continue
            where = f"step {progress['step']}" if isinstance(progress, dict) else "start-up"
            running.stall_reason = f"no progress for {silent:.0f} s (stall_timeout_s={limit:g}; last at {where}): the job was stopped; queued again, resumes from its checkpoint"
            log.warning("trial %d: %s", number, running.stall_reason)
            # At once (no SIGTERM grace: a hung or stopped job cannot checkpoint), every worker, remote ones too.
            # The next poll sees it gone and settles the trial (step_loop): a database outage now loses nothing.
            running.job.cancel(grace_s=0.0)

    def run(self) -> optuna.Study:
        route_optuna_logging()  # Optuna's lines in the driver's format and log file (sweeps/progress.py)
        self.validate()
        self.launcher.prepare()
        study = self.open_study()
        log.info("study %r in %s: %d trials so far", study.study_name, redact(self.storage_url), len(study.trials))
        self.recover()
        self.enqueue_baseline()
        started = time.time()
        self.last_recover = time.time()
        outage = 0.0
        try:
            while True:
                try:
                    if self.step_loop(started):
                        break
                    if outage:
                        self.after_outage()
                    outage = 0.0
                except STORAGE_ERRORS as err:
                    why = database_gone(err)
                    if why:  # dropped, or its tables deleted: waiting will not bring it back, and nothing can be told
                        for running in self.running.values():
                            running.job.cancel()
                            running.heartbeat.stop()
                        self.running.clear()
                        raise StorageGoneError(
                            f"the study database {redact(self.storage_url)} is gone: {why}; its running jobs were stopped"
                        ) from None
                    # The database is restarting or unreachable: keep the jobs running (they retry their own
                    # reports) and come back with backoff; pool_pre_ping reconnects once it answers.
                    outage = min(max(2 * outage, 1.0), 30.0)
                    log.warning("storage unavailable (%s); retrying in %.0f s", type(err).__name__, outage)
                    time.sleep(outage)
        except KeyboardInterrupt:
            log.warning(
                "interrupted: stopping %d running trial(s); they will be retried on the next start", len(self.running)
            )
            self.abandon_running()
            raise
        self.log_summary()
        log_study_summary(study, self.cfg)
        return study

    def step_loop(self, started: float) -> bool:
        """One pass of the driver loop: start trials within budget, collect finished jobs, recover stale
        trials, show progress. True when the study is done (or out of time) and nothing of ours runs."""
        out_of_time = self.cfg.timeout is not None and time.time() - started > self.cfg.timeout
        if not out_of_time:
            self.start_within_budget()
        for number, running in list(self.running.items()):
            code = running.job.poll()
            if code is not None and self.settle(running, code):
                del self.running[number]
        if not self.running and (out_of_time or self.exhausted or self.study_done()):
            return True
        if time.time() - self.last_recover > self.cfg.heartbeat.interval_s:
            self.recover()  # another driver may have died meanwhile: its trials come back to us
            self.stop_stalled()
            self.last_recover = time.time()
        self.log_progress()
        time.sleep(self.cfg.poll_s)
        return False

    def start_within_budget(self) -> None:
        """Start trials until max_concurrent of ours run or the budget (or the search space) is spent."""
        while len(self.running) < self.cfg.max_concurrent:
            asked = self.ask_within_budget()
            if asked is None:
                break
            running = self.start_trial(*asked)
            self.running[running.trial.number] = running

    def settle(self, running: RunningTrial, code: int) -> bool:
        """Tell Optuna about a seed's job that exited with `code`; True when the trial is settled (no seed follows)."""
        if not running.exited_at or running.exited_at[-1] < running.launched_at[-1]:
            running.exited_at.append(time.time())
        try:
            if running.stall_reason is not None:
                self.finish(running, TrialState.FAIL, running.stall_reason)
                self.requeue(running.trial)
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
        """Stop our jobs and fail their trials with a retry queued (they resume from their checkpoints)."""
        for running in self.running.values():
            running.job.cancel()
            running.heartbeat.stop()
            self.tell_fail(
                running.trial, "driver interrupted (the trial is queued again and resumes from its checkpoint)"
            )
            self.requeue(running.trial)
        self.running.clear()

    def requeue(self, trial: optuna.Trial) -> None:
        """Queue a copy of a failed trial (same params), as Optuna's stale-trial retry does."""
        retry_callback(int(self.cfg.heartbeat.max_retry))(self.study, self.storage.get_trial(trial_id_of(trial)))

    @functools.cached_property
    def progress_view(self) -> ProgressView:
        """The study's progress display (sweeps/progress.py), started at the first pass of the loop."""
        return ProgressView(
            self.study_cfg.name,
            int(self.cfg.n_trials),
            int(self.cfg.max_concurrent),
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
