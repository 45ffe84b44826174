"""The confirm stage: the top-k configurations trained again on n fresh training seeds, so that the winner a study
names is one that holds when it is trained again (conf/sweep.yaml `confirm`; docs/usage.md, "Confirming the winner").

At a study's end (`confirm.at_end`, after the re-evaluation) and on demand (`python -m sweeps.best study=NAME
confirm=true`), each of the top_k configurations (the re-evaluated ranking's first, then the best reported) gets
`seeds` jobs started by the study's launcher like trials, up to max_concurrent at once on its slots:
`python -m trm.train <the trial's training overrides> seed=S sweep.confirm=true ...` (trm/links/confirm.py), each
with its own run and checkpoint directories. Seed S is one of the first `seeds` integers from `first_seed` that no
job of the trial trained with. Each job stores its end on the study (storage/confirm_record.py), and the ranking is
sweeps/trials/confirmed.py's.

Resumable: the plan is what the records lack, so the same command after an interruption starts only the seeds not
yet COMPLETE (a stopped one resumes from its checkpoint); no seed is trained twice. The budget: no job starts
after `deadline` (the sweep's `timeout`), and the jobs are no trials (they spend no n_trials).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from hydra.errors import HydraException
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial

from contracts.overrides import override_values
from storage import exclusive
from storage.confirm_record import (
    COMPLETE,
    CONFIRM_STAGE_ATTR,
    ConfirmStage,
    confirm_progress_attr,
    confirmations,
    trained_seeds,
)
from storage.record import reevals
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps.config.schema import ConfirmSettings
from sweeps.launchers.base import JobSpec
from sweeps.launchers.job_command import StudyLink, job_name
from sweeps.launchers.slots import Slot, SlotPool
from sweeps.launchers.workers import JobHandle
from sweeps.trials.confirm_rank import Confirmed
from sweeps.trials.confirmed import confirmed_lines, confirmed_ranking, study_rule
from sweeps.trials.paths import StudyRoots
from sweeps.trials.reeval import StageRun, ranking, top_trials
from sweeps.trials.wandb_summary import trial_wandb_overrides

log = logging.getLogger("sweeps")


def trial_seeds(trial: FrozenTrial, study_seeds: int) -> set[int]:
    """The training seeds the trial's jobs used, where the record says: 0..seeds-1 with several seeds, else the
    `seed=` its training overrides set (none set: the training config's default, below any first_seed)."""
    if study_seeds > 1:
        return set(range(study_seeds))
    try:
        seed = override_values(TrialLaunch.of(trial.user_attrs).train_overrides or []).get("seed")
    except HydraException:
        return set()
    return {seed} if isinstance(seed, int) else set()


def fresh_seeds(trial: FrozenTrial, n: int, first_seed: int, study_seeds: int) -> list[int]:
    """The trial's confirm seeds: the first `n` integers from `first_seed` that none of its jobs trained with. The
    same for every run of the stage, so a resumed stage (or a larger n) keeps the seeds already trained."""
    used, seed = trial_seeds(trial, study_seeds), first_seed
    out: list[int] = []
    while len(out) < n:
        if seed not in used:
            out.append(seed)
        seed += 1
    return out


def candidates(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The top-k configurations: the re-evaluated ranking's first (a larger eval chose them), then the best by
    reported value."""
    chosen = [r.trial for r in ranking(study)]
    numbers = {t.number for t in chosen}
    chosen += [t for t in top_trials(study, k) if t.number not in numbers]
    return chosen[:k]


def reeval_examples(study: optuna.Study, trials: Sequence[FrozenTrial]) -> int | None:
    """The puzzles the study re-evaluated these trials on (sweeps/trials/reeval.py; the most common count, the
    larger on a tie), which their confirm seeds are re-evaluated on too; None where none of them was."""
    stored = reevals(study.user_attrs)
    counts = Counter(r.examples for t in trials if (r := stored.get(t.number)) is not None and r.failed is None)
    return max(counts, key=lambda n: (counts[n], n)) if counts else None


@dataclass(frozen=True)
class Planned:
    """One confirm seed to run: trial `trial`'s configuration trained on `seed` (`train`), then its checkpoint
    evaluated again where the study was re-evaluated; `train` False: trained already, only that is left."""

    trial: FrozenTrial
    seed: int
    train: bool = True


@dataclass(frozen=True)
class Plan:
    """What the stage still has to run; how many seeds are done; the puzzles of their re-evaluation (None: none)."""

    jobs: list[Planned]
    done: int
    examples: int | None


def plan(study: optuna.Study, settings: ConfirmSettings) -> Plan:
    """The seeds the records lack: untrained ones, and trained ones not re-evaluated where the study re-evaluates."""
    _, study_seeds = study_rule(study)
    chosen = candidates(study, settings.top_k)
    examples = reeval_examples(study, chosen)
    records = confirmations(study.user_attrs)
    todo, done = [], 0
    for trial in chosen:
        trained = trained_seeds(study.user_attrs, trial.number)
        for seed in fresh_seeds(trial, settings.seeds, settings.first_seed, study_seeds):
            if seed not in trained:
                todo.append(Planned(trial, seed))
            elif examples is not None and records[trial.number][seed].reeval_examples != examples:
                todo.append(Planned(trial, seed, train=False))
            else:
                done += 1
    return Plan(todo, done, examples)


def cost_lines(study: optuna.Study, settings: ConfirmSettings) -> list[str]:
    """What the stage would run now, priced by the trials' own training times (a dry run: nothing starts)."""
    planned = plan(study, settings)
    todo = planned.jobs
    trainings = [job for job in todo if job.train]
    again = (
        f", each re-evaluated on {planned.examples} puzzles as its trial was ({len(todo)} re-evaluation job(s))"
        if planned.examples is not None
        else ""
    )
    lines = [
        f"confirm stage: top {settings.top_k} configurations x {settings.seeds} fresh seed(s): {len(trainings)} "
        f"training job(s) to run, {planned.done} done already{again}"
    ]
    seconds = 0.0
    for job in trainings:
        trained = TrialOutcome.of(job.trial.user_attrs).train_seconds
        seconds += float(trained or 0.0)
        lines.append(f"  trial {job.trial.number} seed {job.seed}: as long as the trial ({_seconds(trained)})")
    study_s = sum(float(TrialOutcome.of(t.user_attrs).train_seconds or 0.0) for t in study.get_trials(deepcopy=False))
    share = f", {seconds / study_s:.0%} of the study's {study_s:.0f} s" if study_s else ""
    lines.append(f"confirm stage cost: about {seconds:.0f} s of training{share} (the trials' own job times)")
    return lines


def _seconds(value: float | None) -> str:
    return f"{value:.0f} s" if value is not None else "time not recorded"


def job_paths(roots: StudyRoots, trial: int, seed: int) -> tuple[str, str, Any]:
    """A confirm job's run directory, checkpoint URL and local working directory: its own, per trial and seed."""
    part = f"trial-{trial}/confirm/seed-{seed}"
    return f"{roots.run_root}/{part}/run", f"{roots.checkpoint_root}/{part}/checkpoints", roots.output_root / part


@dataclass
class Running:
    """One confirm job on its slot, and the last progress seen of it (a stall stops it)."""

    job: Planned
    handle: JobHandle
    slot: Slot
    reeval: bool = False  # the job evaluates the seed's checkpoint again (its training is done)
    progress: Any = None
    progress_seen: float = field(default_factory=time.time)


class ConfirmStageRun(StageRun):
    """One run of the stage over a study: its launcher, directories and link to the study."""

    def overrides(self, job: Planned, slot: Slot, examples: int | None = None) -> list[str] | None:
        """The job's command line: training, or with `examples` the re-evaluation of the seed's checkpoint on that
        many puzzles (trm/reeval.py); None when its trial recorded no training overrides."""
        training = TrialLaunch.of(job.trial.user_attrs).train_overrides
        if not training:
            return None
        run_dir, checkpoints, _ = job_paths(self.roots, job.trial.number, job.seed)
        checkpoint = "best.pt" if study_rule(self.study)[0] else "latest.pt"
        again = ["reeval.run=true", f"reeval.checkpoint={checkpoint}", f"reeval.examples={examples}"]
        link = StudyLink(
            str(self.study.study_name),
            self.uid,
            job.trial.number,
            self.storage_url,
            self.sweep.storage.password_env or None,
            confirm_seed=job.seed,
        )
        return [
            *training,
            *trial_wandb_overrides(self.sweep.wandb),
            f"out_dir={run_dir.removesuffix('/run') + '/reeval' if examples is not None else run_dir}",
            f"checkpoint.url={checkpoints}",
            *link.overrides(),
            *slot.overrides,
            *(again if examples is not None else []),
        ]

    def start(self, job: Planned, slot: Slot, examples: int | None = None) -> Running | None:
        """Start the seed's training, or with `examples` its re-evaluation, on `slot` (the one it trained on: its
        checkpoint may be on that machine's disk); None when it cannot start (a warning)."""
        overrides = self.overrides(job, slot, examples)
        number = job.trial.number
        if overrides is None:
            log.warning("trial %d recorded no training overrides: not confirmed", number)
            return None
        _, _, workdir = job_paths(self.roots, number, job.seed)
        what = "reeval" if examples is not None else "confirm"
        name = f"{job_name(str(self.study.study_name), self.uid, number)}-{what}-{job.seed}"
        try:
            handle = self.launcher.launch(
                JobSpec(name, overrides, workdir / "reeval" if examples is not None else workdir, slot=slot)
            )
        except Exception as err:  # noqa: BLE001 (the study is done and stays so: a job that cannot start is a warning)
            log.warning(
                "%s job of trial %d seed %d could not start: %s: %s", what, number, job.seed, type(err).__name__, err
            )
            return None
        where = "" if slot.whole else f" on {slot.name}"
        if examples is None:
            log.info("confirming trial %d on seed %d%s", number, job.seed, where)
        else:
            log.info("re-evaluating trial %d's seed %d on %d puzzles%s", number, job.seed, examples, where)
        return Running(job, handle, slot, reeval=examples is not None)

    def stalled(self, running: Running) -> bool:
        """Whether the job showed no progress for stall_timeout_s (then it is stopped: the next run resumes it)."""
        progress = self.study.user_attrs.get(confirm_progress_attr(running.job.trial.number, running.job.seed))
        if progress != running.progress:
            running.progress, running.progress_seen = progress, time.time()
            return False
        return time.time() - running.progress_seen > self.sweep.stall_timeout_s

    def settle(self, running: Running, code: int) -> bool:
        """Log how the job ended; True when it did what it was for (a COMPLETE record, or its re-evaluation added)."""
        number, seed = running.job.trial.number, running.job.seed
        record = confirmations(self.study.user_attrs).get(number, {}).get(seed)
        if running.reeval and code == 0 and record is not None and record.reeval_value is not None:
            log.info("trial %d's seed %d re-evaluated: %.4f on %s puzzles", number, seed, record.reeval_value,
                     record.reeval_examples)  # fmt: skip
            return True
        if not running.reeval and code == 0 and record is not None and record.outcome == COMPLETE:
            value = record.best_value if study_rule(self.study)[0] else record.final_value
            shown = f"{value:.4f}" if value is not None else "none"
            log.info("trial %d confirmed on seed %d: %s = %s", number, seed, record.metric, shown)
            return True
        why = running.handle.failure or (record.error if record is not None else None) or f"exit code {code}"
        what = "re-evaluation" if running.reeval else "confirm job"
        log.warning("%s of trial %d seed %d failed: %s", what, number, seed, why.splitlines()[0][:300])
        return False

    def run(self, deadline: float | None = None) -> list[Confirmed]:
        """Run what the plan lacks, up to max_concurrent jobs at once on the launcher's slots; no job starts after
        `deadline` (epoch seconds). Ctrl-C stops the running jobs (each checkpoints on SIGTERM) and raises."""
        settings = self.sweep.confirm
        stage = ConfirmStage(settings.top_k, settings.seeds, settings.first_seed, settings.own_variance_at)
        self.study.set_user_attr(CONFIRM_STAGE_ATTR, stage.as_dict())  # before any job: the readers' settings
        planned = plan(self.study, settings)
        todo = list(planned.jobs)
        log.info("confirm stage: %d seed(s) to run, %d done already", len(todo), planned.done)
        pool = SlotPool(self.launcher.slots(), self.sweep.max_concurrent)
        running: list[Running] = []
        try:
            while todo or running:
                self.start_on_free_slots(todo, pool, running, deadline, planned.examples)
                for job in list(running):
                    code = self.poll(job)
                    if code is None:
                        continue
                    running.remove(job)
                    then = self.settle(job, code) and not job.reeval and planned.examples is not None
                    follow = self.start(job.job, job.slot, planned.examples) if then else None  # the seed's machine
                    if follow is None:
                        pool.give_back(job.slot)
                    else:
                        running.append(follow)
                if running:
                    time.sleep(self.sweep.poll_s)
        except BaseException:
            for job in running:  # each checkpoints on SIGTERM; the same command resumes it
                job.handle.cancel()
            raise
        for line in confirmed_lines(self.study):
            log.info(line)
        return confirmed_ranking(self.study)

    def start_on_free_slots(
        self, todo: list[Planned], pool: SlotPool, running: list[Running], deadline: float | None, examples: int | None
    ) -> None:
        """Start the next planned seeds on the free slots; past `deadline`, drop the rest (the same command runs them)."""
        while todo and (slot := pool.take()) is not None:
            if deadline is not None and time.time() > deadline:
                log.warning("confirm stage: timeout reached, %d seed(s) not started (run it again)", len(todo))
                todo.clear()
                pool.give_back(slot)
                return
            job = todo.pop(0)
            started = self.start(job, slot, None if job.train else examples)
            if started is None:
                pool.give_back(slot)
            else:
                running.append(started)

    def poll(self, job: Running) -> int | None:
        """The job's exit code; a job stalled past stall_timeout_s is stopped first. None while it runs."""
        code = job.handle.poll()
        if code is None and self.stalled(job):
            log.warning(
                "confirm job of trial %d seed %d: no progress for %g s: stopped",
                job.job.trial.number,
                job.job.seed,
                self.sweep.stall_timeout_s,
            )
            job.handle.cancel(grace_s=0.0)
            code = job.handle.poll()
        return code


def confirm_at_end(
    study: optuna.Study,
    storage: RDBStorage,
    stage: ConfirmStageRun,
    deadline: float | None,
) -> list[Confirmed]:
    """A driver's end of study: one driver at a time (a lock on the study's storage), each running what the records
    still lack, so drivers ending together train each seed once."""
    with exclusive(storage, f"confirm:{study.study_name}"):
        return stage.run(deadline)
