"""The sweep driver: one Optuna study whose trials are distributed TRM training jobs.

    validate everything -> open the study -> fail stale trials (they are re-queued) -> loop:
    ask -> search space to overrides -> launch on the workers -> heartbeat while it runs ->
    read the outcome the job stored on the trial -> tell COMPLETE / PRUNED / FAIL (reason kept)

The driver never imports the model: it talks to the job through its command line and the study record.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import sqlalchemy
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from storage import (
    HeartbeatThread,
    StorageGoneError,
    database_gone,
    exclusive,
    open_storage,
    orphaned_trials,
    redact,
    resolve_url,
    retry_callback,
    trial_id_of,
)
from storage.record import (
    CHECKPOINT_URL_ATTR,
    DETAILS_ATTR,
    DRIVERS_ATTR,
    DUPLICATE_OF_ATTR,
    OBJECTIVE_ATTR,
    PROGRESS_ATTR,
    PRUNE_METRIC_ATTR,
    PRUNER_ATTR,
    STUDY_UID_ATTR,
    TRAIN_OVERRIDES_ATTR,
    attempt_attr,
    merged_details,
    trial_detail,
)
from sweeps.launchers.base import JobHandle, JobSpec
from sweeps.outcome import job_verdict, orphan_verdict, seed_attrs, seed_prefix
from sweeps.progress import ProgressView, route_optuna_logging
from sweeps.space import SearchSpace, params_to_values, parse_space, to_overrides
from sweeps.validate import trial_length, validate_sweep
from sweeps.wandb_summary import log_study_summary, trial_wandb_overrides

log = logging.getLogger("sweeps")

# Optuna warns on every ask() once heartbeats are on (they are meant for study.optimize); the driver
# records them itself, which is what the warning asks for.
warnings.filterwarnings("ignore", message=".*Heartbeat of storage is supposed to be used with Study.optimize.*")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
MAX_DUPLICATE_DRAWS = 20  # draws in a row that repeat a configuration before the space counts as exhausted
STORAGE_ERRORS = (
    optuna.exceptions.StorageInternalError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
)

# What config may instantiate: `_target_` is code execution, so only these classes.
TARGETS = ["optuna.samplers.*", "optuna.pruners.*", "sweeps.launchers.*"]


def clip_reason(reason: str, limit: int = 2000) -> str:
    """A failure reason short enough for a trial attribute: its first line (the error) and its end (the log tail)."""
    if len(reason) <= limit:
        return reason
    head = reason.splitlines()[0][: limit // 4]
    return f"{head}\n...\n{reason[-(limit - len(head) - 5) :]}"


def build(node: DictConfig) -> Any:
    return instantiate(node, _convert_="all", _execution_whitelist_=TARGETS)


class StudyMismatchError(ValueError):
    pass


@dataclass
class RunningTrial:
    trial: optuna.Trial
    handle: JobHandle | None
    heartbeat: HeartbeatThread
    workdir: Path
    values: dict[str, Any] = field(default_factory=dict)  # the sampled training overrides
    origin: int = 0  # first trial of its retry chain: owner of the checkpoints
    seed_index: int = 0
    seed_values: list[list[float]] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    # Epoch seconds at which each seed's job was launched and seen to exit (bench/sweep_overhead.py): with
    # the job's own stamps (`timing` attribute) they split a trial's wall time into set-up, training, teardown.
    launched_at: list[float] = field(default_factory=list)
    exited_at: list[float] = field(default_factory=list)
    # The job's last reported progress and when this driver saw it change (its own clock: a pod VM's may differ).
    progress: Any = None
    progress_seen: float = field(default_factory=time.time)
    stall_reason: str | None = None  # set when the driver stopped the job for showing no progress


def study_directions(study_cfg: DictConfig) -> list[str]:
    return [study_cfg.direction, *(o.direction for o in study_cfg.get("objectives") or [])]


def pruner_spec(cfg: DictConfig, train_steps: int) -> dict[str, Any]:
    """The pruner as a resolved `_target_` dict: stored on the study so every job builds the same one."""
    spec = OmegaConf.to_container(cfg.pruner, resolve=True)
    if spec.get("max_resource") == "auto":
        spec["max_resource"] = train_steps
    return spec


class Driver:
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.study_cfg = cfg.study
        self.scale = cfg.scale
        self.space: SearchSpace = parse_space(
            self.study_cfg.space.get(self.scale),
            (self.study_cfg.get("conditional") or {}).get(self.scale),
            where=f"study.space.{self.scale}",
        )
        self.base_overrides = [*cfg.trial.overrides, *(self.study_cfg.get("fixed") or {}).get(self.scale, [])]
        self.launcher = build(cfg.launcher)
        self.storage_url = resolve_url(cfg.storage.url, Path("outputs/optuna.db").resolve())
        self.running: dict[int, RunningTrial] = {}
        self.exhausted = False  # the sampler keeps drawing configurations the study already has
        self.outage_ended = 0.0  # when the database last came back after an outage (epoch seconds)
        self.storage = None
        self.study: optuna.Study | None = None
        self.set_study_uid("UID")  # a dry run's stand-in; open_study sets the study's own

    def set_study_uid(self, uid: str) -> None:
        """Trial directories: <root>/<study name>/<first 8 of the study's uid>/trial-<n>. The uid keeps a new
        study under an old name (a new storage, a deleted study) out of the old study's directories."""
        self.study_uid = uid
        study_dir = f"{self.study_cfg.name}/{uid[:8]}"
        self.output_root = Path(self.cfg.output_root).resolve() / study_dir
        # Where the *workers* write: this machine's output_root for local launchers; on a pod a path on
        # each VM (relative to the launcher's remote_dir) and a checkpoint URL (gs://...) rank 0 can reach.
        run_root = self.cfg.trial.get("run_root")
        self.run_root = f"{run_root}/{study_dir}" if run_root else str(self.output_root)
        ckpt_root = self.cfg.trial.get("checkpoint_root")
        self.checkpoint_root = f"{ckpt_root}/{study_dir}" if ckpt_root else self.run_root

    @property
    def reported_metric(self) -> str:
        """What the trials report to the pruner at each eval (study.prune_metric, else the objective)."""
        return self.study_cfg.get("prune_metric") or self.study_cfg.objective

    # ----------------------------------------------------------------------------------- before running

    @functools.cached_property
    def train_steps(self) -> int:
        """Every trial's train.steps (from trial.overrides): the pruner's max resource and progress's 100%."""
        return trial_length(self.base_overrides)

    def validate(self) -> None:
        """Everything that can be wrong, before anything runs (see sweeps.validate)."""
        validate_sweep(self.cfg, self.space, self.base_overrides)

    def open_study(self) -> optuna.Study:
        hb = self.cfg.heartbeat
        self.storage = open_storage(
            self.storage_url,
            password_env=self.cfg.storage.password_env,
            heartbeat_interval=int(hb.interval_s),
            grace_period=int(hb.grace_s),
            failed_trial_callback=retry_callback(int(hb.max_retry)),
        )
        directions = study_directions(self.study_cfg)
        objectives = [self.study_cfg.objective, *(o.name for o in self.study_cfg.get("objectives") or [])]
        kwargs = dict(
            study_name=self.study_cfg.name,
            storage=self.storage,
            sampler=build(self.cfg.sampler),
            pruner=build(self.cfg.pruner),
        )
        study = optuna.create_study(**kwargs, directions=directions, load_if_exists=True)
        stored = study.user_attrs
        if (
            stored.get(OBJECTIVE_ATTR) not in (None, self.study_cfg.objective)
            or stored.get("objectives", objectives) != objectives
        ):
            raise StudyMismatchError(
                f"study.name={self.study_cfg.name!r} already exists with objective(s) {stored.get('objectives')} "
                f"but this config asks for {objectives}: choose another study.name"
            )
        reported = self.reported_metric
        if stored.get(PRUNE_METRIC_ATTR) not in (None, reported) and study.get_trials(deepcopy=False):
            raise StudyMismatchError(
                f"study.name={self.study_cfg.name!r} already has trials that reported {stored[PRUNE_METRIC_ATTR]!r} to the "
                f"pruner but this config reports {reported!r} (study.prune_metric): the pruner would compare the two; "
                "choose another study.name or the same prune_metric"
            )
        if [d.name.lower() for d in study.directions] != [d.lower() for d in directions]:
            raise StudyMismatchError(
                f"study.name={self.study_cfg.name!r} already exists with direction(s) "
                f"{[d.name.lower() for d in study.directions]} but this config asks for {directions}: choose another study.name"
            )
        attrs = {
            OBJECTIVE_ATTR: self.study_cfg.objective,
            "objectives": objectives,
            PRUNER_ATTR: pruner_spec(self.cfg, self.train_steps),
            PRUNE_METRIC_ATTR: reported,
            "sampler": self.cfg.sampler._target_.rsplit(".", 1)[-1],
            "launcher": self.cfg.launcher._target_.rsplit(".", 1)[-1],
            "scale": self.scale,
        }
        for key, value in attrs.items():
            if stored.get(key) != value:
                study.set_user_attr(key, value)
        if study.metric_names != objectives:
            study.set_metric_names(
                objectives
            )  # optuna-dashboard and the CLI say eval/exact_accuracy, not "Objective 0"
        with exclusive(self.storage, f"uid:{self.study_cfg.name}"):  # two drivers opening a new study agree
            uid = study.user_attrs.get(STUDY_UID_ATTR)
            if uid is None:
                uid = uuid.uuid4().hex
                study.set_user_attr(STUDY_UID_ATTR, uid)
            driver_index = int(study.user_attrs.get(DRIVERS_ATTR, 0))
            study.set_user_attr(DRIVERS_ATTR, driver_index + 1)
        self.set_study_uid(uid)
        if driver_index:
            # A restarted or second driver with the study's seed would draw the first driver's parameters again:
            # each driver of a study gets its own seed, derived from the configured one and its start order.
            seed = int(np.random.SeedSequence([int(self.cfg.seed), driver_index]).generate_state(1)[0])
            study.sampler = build(OmegaConf.merge(self.cfg.sampler, {"seed": seed}))
            log.info("driver %d of this study: sampler seed %d (from seed=%s)", driver_index, seed, self.cfg.seed)
        self.study = study
        return study

    # ------------------------------------------------------------------------------------------- budget

    def finished_count(self) -> int:
        """Trials that used the budget: finished ones, less failures that were re-queued as a retry."""
        trials = self.study.get_trials(deepcopy=False)
        retried = {n for t in trials for n in RetryHeartbeatStaleTrialCallback.retry_history(t)}
        used = [t for t in trials if DUPLICATE_OF_ATTR not in t.user_attrs]  # a refused duplicate trained nothing
        return sum(1 for t in used if t.state in FINISHED and t.number not in retried) + sum(
            1 for t in used if t.state == TrialState.RUNNING
        )

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
        params = {}
        for key, value in baseline.items():
            params[key] = value
        for cond in self.space.conditionals:
            if str(baseline.get(cond.parent)).lower() == str(cond.choice).lower():
                for key in cond.params:
                    if key in params:
                        params[f"{key}@{cond.choice}"] = params.pop(key)
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
        return f"{self.checkpoint_root}/trial-{origin}/checkpoints"

    def trial_overrides(
        self, trial: optuna.Trial, values: dict[str, Any], workdir: Path, origin: int, seed_index: int = 0
    ) -> list[str]:
        return [
            *self.training_overrides(values),
            *trial_wandb_overrides(self.cfg, self.study_uid, origin, seed_index),
            f"out_dir={self.run_root}/trial-{trial.number}/run",
            f"checkpoint.url={self.checkpoint_url(origin)}",
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
        if not params:
            return None  # nothing searched: every trial is the same configuration by design
        for other in self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
        ):
            if other.number != trial.number and other.params == params and DUPLICATE_OF_ATTR not in other.user_attrs:
                return other.number
        return None

    def start_trial(self, trial: optuna.Trial, values: dict[str, Any]) -> RunningTrial:
        frozen = self.storage.get_trial(trial_id_of(trial))
        origin = self.origin_number(frozen)
        for key, value in frozen.user_attrs.items():
            if attempt_attr(key) and value is not None:  # a retry: its predecessor's outcome is not its own
                trial.set_user_attr(key, None)
        workdir = self.output_root / f"trial-{trial.number}"
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
        """Start the job for one seed of the trial (a single job when study.seeds is 1)."""
        trial, seeds = running.trial, int(self.study_cfg.seeds)
        overrides = self.trial_overrides(trial, running.values, running.workdir, running.origin, index)
        workdir = running.workdir
        if seeds > 1:
            # Own output and checkpoint per seed; only seed 0 reports to the pruner.
            overrides = [
                o.replace("/run", f"/seed-{index}/run").replace("/checkpoints", f"/seed-{index}/checkpoints")
                if o.startswith(("out_dir=", "checkpoint.url="))
                else o
                for o in overrides
            ]
            overrides += [f"seed={index}", f"sweep.seed_index={index}"]
            workdir = running.workdir / f"seed-{index}"
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
            launcher_failure=running.handle.failure,
            cancelled=running.handle.cancelled,
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
            values = [statistics.fmean(v[i] for v in per_seed) for i in range(len(per_seed[0]))]
            if len(per_seed) > 1:  # TRM's seed variance is large: keep the spread on the trial
                trial.set_user_attr("seed_values", [v[0] for v in per_seed])
                trial.set_user_attr("seed_std", statistics.pstdev(v[0] for v in per_seed))
            self.study.tell(trial, values if len(values) > 1 else values[0])
            log.info(
                "trial %d COMPLETE: %s = %.4f%s", trial.number, self.study_cfg.objective, values[0], self.best_line()
            )
        running.heartbeat.stop()
        return state

    def objective_values(self, attrs: dict[str, Any]) -> list[float] | None:
        final = trial_detail(attrs, "final_metrics") or {}
        main = attrs.get("best_value") if self.study_cfg.value == "best" else final.get(self.study_cfg.objective)
        values = [main]
        for extra in self.study_cfg.get("objectives") or []:
            values.append(attrs.get(extra.name, final.get(extra.name)))
        if any(v is None or not math.isfinite(float(v)) for v in values):
            return None
        return [float(v) for v in values]

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
            running.handle.cancel(grace_s=0.0)

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
                            running.handle.cancel()
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
        while not out_of_time and len(self.running) < self.cfg.max_concurrent:
            asked = self.ask_within_budget()
            if asked is None:
                break
            running = self.start_trial(*asked)
            self.running[running.trial.number] = running
        for number, running in list(self.running.items()):
            code = running.handle.poll()
            if code is None:
                continue
            if not running.exited_at or running.exited_at[-1] < running.launched_at[-1]:
                running.exited_at.append(time.time())
            try:
                if running.stall_reason is not None:
                    self.finish(running, TrialState.FAIL, running.stall_reason)
                    self.requeue(running.trial)
                    settled = True
                else:
                    settled = self.on_job_end(running, code) is not None
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError) as err:
                if not self.settled_elsewhere(running):
                    raise
                log.warning(
                    "trial %d was settled by another driver (%s): it judged this driver gone; is "
                    "heartbeat.grace_s shorter than a database outage?",
                    number,
                    err,
                )
                running.heartbeat.stop()
                settled = True
            if settled:
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
            running.handle.cancel()
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
        if len(self.study.directions) == 1:
            try:
                best = self.study.best_trial
            except ValueError:
                log.info("no completed trial")
                return
            print(
                f"best trial {best.number}: {self.study_cfg.objective} = {best.value:.4f} with {params_to_values(best.params)}"
            )
        else:
            for t in self.study.best_trials:
                print(f"Pareto trial {t.number}: {t.values} with {params_to_values(t.params)}")
