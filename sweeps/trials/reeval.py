"""The winner decided beyond the eval's noise: the top-k trials' checkpoints evaluated again on a larger eval.

A trial's value comes from a small eval (a few hundred puzzles), whose binomial standard error is as large as the
gaps between a study's best trials. At the end of a study (conf/sweep.yaml `reeval.at_end`) and on demand
(`python -m sweeps.best study=NAME reeval=true`), each of the top_k COMPLETE trials gets one job, started by the
study's launcher like a trial: `python -m trm.train <the trial's training overrides> reeval.run=true` on its
checkpoint (trm/reeval.py: the trainer's own data, model and eval). The job stores the value and its standard
error on the study (storage.record.Reeval); the trial's Optuna value stays what it reported. sweeps.best, the
report and the W&B summary rank by the re-evaluation (`ranking`) and say when the top two are within noise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from storage import exclusive
from storage.heartbeat import retried_numbers
from storage.record import (
    Reeval,
    reeval_attr,
    reevals,
    trained_trials,
)
from storage.trial_record import TrialLaunch
from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import JobSpec, Launcher
from sweeps.launchers.job_command import StudyLink, job_name
from sweeps.launchers.slots import Slot, SlotPool
from sweeps.launchers.workers import JobHandle
from sweeps.search.space import params_to_values, to_overrides
from sweeps.trials.outcome import clip_line, raised_line
from sweeps.trials.paths import StudyRoots

log = logging.getLogger("sweeps")


@dataclass(frozen=True)
class Ranked:
    """A trial beside its re-evaluation."""

    trial: FrozenTrial
    reeval: Reeval


def maximizing(study: optuna.Study) -> bool:
    return study.directions[0] == StudyDirection.MAXIMIZE


def top_trials(study: optuna.Study, k: int) -> list[FrozenTrial]:
    """The k best COMPLETE trials by their reported value (a single-objective study; [] otherwise)."""
    if len(study.directions) != 1:
        return []
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
    return sorted(done, key=lambda t: float(t.value or 0.0), reverse=maximizing(study))[:k]


def ranking(study: optuna.Study) -> list[Ranked]:
    """The re-evaluated COMPLETE trials that can be reused, best re-evaluation first: one whose latest
    re-evaluation failed (its checkpoint gone: Reeval.failed) is left out, whatever its earlier value
    (`left_out` lists them), so every reader's winner (ranking[0]) is one whose checkpoint was read last time."""
    return [r for r in _ranked(study) if r.reeval.failed is None]


def left_out(study: optuna.Study) -> list[Ranked]:
    """The re-evaluated trials `ranking` leaves out: their latest re-evaluation failed."""
    return [r for r in _ranked(study) if r.reeval.failed is not None]


def _ranked(study: optuna.Study) -> list[Ranked]:
    stored = reevals(study.user_attrs)
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    ranked = [Ranked(t, stored[t.number]) for t in trials if t.number in stored]
    return sorted(ranked, key=lambda r: r.reeval.value, reverse=maximizing(study))


def ranking_rows(ranked: Sequence[Ranked]) -> list[dict[str, Any]]:
    """The ranking as plain rows (sweeps.best's JSON, the W&B summary): the record and the reported value."""
    return [{**r.reeval.as_dict(), "reported": r.trial.value} for r in ranked]


def interval(record: Reeval) -> str:
    """`0.6120 ± 0.0215 (512 puzzles)`: the value and one standard error (none for a loss)."""
    spread = f" ± {record.stderr:.4f}" if record.stderr is not None else ""
    return f"{record.value:.4f}{spread} ({record.examples} puzzles)"


def overlap_line(ranked: Sequence[Ranked]) -> str | None:
    """One line when the top two re-evaluations are within one eval standard error of each other (their value ± one
    standard error overlap): the eval cannot tell which is better. None otherwise."""
    if len(ranked) < 2:
        return None
    first, second = ranked[0].reeval, ranked[1].reeval
    if first.stderr is None or second.stderr is None:
        return None
    if abs(first.value - second.value) > first.stderr + second.stderr:
        return None
    return (
        f"trials {first.trial} and {second.trial} overlap within one eval standard error "
        f"({interval(first)} vs {interval(second)}): this eval cannot tell them apart"
    )


def failure_line(failure: str | None, code: int | None, waited_s: float) -> str:
    """Why a re-evaluation job failed, in one line: the job's own error (`CheckpointError: no checkpoint at ...`,
    sweeps.trials.outcome.raised_line), else the launcher's account of its worker without the log tail it heads
    (`worker-0 exited with code -9`), else its exit; never the log's Hydra lines and traceback."""
    if line := raised_line(failure):
        return line
    if failure:
        return failure.splitlines()[0].removesuffix("; last log lines:")
    return f"no result in {waited_s:g} s" if code is None else f"exit code {code}"


def ranking_lines(study: optuna.Study) -> list[str]:
    """The re-evaluated ranking as text lines (sweeps.best, the driver's log); [] when nothing was re-evaluated."""
    ranked = ranking(study)
    gone = [
        f"trial {r.trial.number} left out: its re-evaluation failed ({r.reeval.failed}); an earlier one read "
        f"{interval(r.reeval)}"
        for r in left_out(study)
    ]
    if not ranked:
        return gone
    metric = ranked[0].reeval.metric
    winner = ranked[0].trial
    shown = " ".join(to_overrides(params_to_values(winner.params)))
    lines = [f"re-evaluated winner: trial {winner.number} ({shown}), {metric} = {interval(ranked[0].reeval)}"]
    for place, r in enumerate(ranked, 1):
        reported = f"{r.trial.value:.4f}" if r.trial.value is not None else "none"
        lines.append(
            f"  {place}. trial {r.trial.number}: {interval(r.reeval)}, reported {reported} "
            f"(checkpoint of step {r.reeval.step})"
        )
    overlap = overlap_line(ranked)
    if overlap:
        lines.append(overlap)
    return lines + gone


def paired_lines(study: optuna.Study, other: optuna.Study) -> list[str]:
    """Whether two studies of the same draws (the demo and its pruned twin, `make demo-unpruned`) agree: whether
    they trained the same configurations, and whether their re-evaluated winners are the same configuration or
    within one standard error of each other (the overlap rule of `overlap_line`)."""
    mine, theirs = trained_params(study), trained_params(other)
    names = f"studies {study.study_name!r} and {other.study_name!r}"
    if mine == theirs:
        draws = f"{names} trained the same {len(mine)} configurations in the same order"
    else:
        missing = sum(1 for p in mine if p not in theirs)
        draws = f"{names} trained different configurations: {missing} of the {len(mine)} of the first not in the second"
    ranked = {s.study_name: ranking(s) for s in (study, other)}
    empty = [name for name, r in ranked.items() if not r]
    if empty:
        return [
            draws,
            f"no re-evaluated trial in {empty[0]!r}: run `python -m sweeps.best study={empty[0]} reeval=true`",
        ]
    first, second = ranked[study.study_name][0], ranked[other.study_name][0]
    both = (
        f"trial {first.trial.number} {interval(first.reeval)} vs trial {second.trial.number} {interval(second.reeval)}"
    )
    if first.trial.params == second.trial.params:
        shown = " ".join(to_overrides(params_to_values(first.trial.params)))
        return [draws, f"the same re-evaluated winner ({shown}): {both}"]
    a, b = first.reeval, second.reeval
    if a.stderr is not None and b.stderr is not None and abs(a.value - b.value) <= a.stderr + b.stderr:
        verdict = "different re-evaluated winners, within one eval standard error of each other (agree)"
    else:
        verdict = "different re-evaluated winners, further apart than one eval standard error (disagree)"
    return [draws, f"{verdict}: {both}"]


def trained_params(study: optuna.Study) -> list[dict[str, Any]]:
    """The parameters of the study's trials that trained (in trial order; a retry's failed attempts left out)."""
    trials = trained_trials(study.get_trials(deepcopy=False))
    retried = retried_numbers(trials)
    return [dict(t.params) for t in trials if t.number not in retried and t.state != TrialState.WAITING]


def seed0_checkpoint_url(chain_url: str, seeds: int) -> str:
    """Seed 0's checkpoints, from the chain's TrialLaunch.checkpoint_url (<root>/trial-<origin>/checkpoints): with several
    seeds each has its own directory (sweeps.trials.paths.TrialPaths), and seed 0's is the one re-evaluated."""
    if seeds <= 1:
        return chain_url
    base = chain_url.rstrip("/").rsplit("/", 1)[0]
    return f"{base}/seed-0/checkpoints"


def reeval_overrides(
    trial: FrozenTrial, link: StudyLink, out_dir: str, seeds: int, examples: int | None, checkpoint: str
) -> list[str] | None:
    """The re-eval job's command line for `trial`; None when the trial recorded no overrides or checkpoint."""
    launch = TrialLaunch.of(trial.user_attrs)
    training, chain_url = launch.train_overrides, launch.checkpoint_url
    if not training or not chain_url:
        return None
    return [
        *training,
        f"out_dir={out_dir}",
        f"checkpoint.url={seed0_checkpoint_url(str(chain_url), seeds)}",
        *link.overrides(),
        "reeval.run=true",
        f"reeval.checkpoint={checkpoint}",
        f"reeval.examples={'null' if examples is None else examples}",
    ]


@dataclass
class ReevalJob:
    """One trial's re-eval job, running on its slot since `started` (time.monotonic())."""

    trial: FrozenTrial
    slot: Slot
    handle: JobHandle
    started: float = field(default_factory=time.monotonic)


def reevaluate(
    study: optuna.Study,
    sweep: SweepConfig,
    launcher: Launcher,
    roots: StudyRoots,
    uid: str,
    storage_url: str,
    only_missing: bool = False,
) -> list[Ranked]:
    """Run the re-eval job of each of `sweep.reeval`'s top_k trials, up to max_concurrent at once (as trials run: a
    laptop's other core is not left idle), and return the ranking. Each job runs on the slot its trial trained on (its
    checkpoint may be on that slot's own disk: a pod has no shared filesystem), or the first slot where the trial's is
    not one of this launcher's. `only_missing`: skip trials already re-evaluated (a restarted driver's end of study)."""
    stored = reevals(study.user_attrs)
    slots = {slot.name: slot for slot in launcher.slots()}
    todo = [
        (trial, slots.get(str(TrialLaunch.of(trial.user_attrs).slot), next(iter(slots.values()))))
        for trial in top_trials(study, sweep.reeval.top_k)
        if not (only_missing and trial.number in stored)
    ]
    pool = SlotPool(list(slots.values()), sweep.max_concurrent)
    launch = ReevalLaunch(study, sweep, launcher, roots, uid, storage_url)
    running: list[ReevalJob] = []
    try:
        while todo or running:
            for trial, slot in list(todo):  # in rank order, each on its own slot once that one is free
                if take(pool, slot):
                    todo.remove((trial, slot))
                    if (handle := launch.start(trial, slot)) is None:
                        pool.give_back(slot)
                    else:
                        running.append(ReevalJob(trial, slot, handle))
            for job in list(running):
                code = job.handle.poll()
                if code is None and time.monotonic() - job.started < sweep.stall_timeout_s:
                    continue
                if code is None:
                    job.handle.cancel(grace_s=0)
                running.remove(job)
                pool.give_back(job.slot)
                settle(study, job, code, sweep.stall_timeout_s)
            if running:
                time.sleep(sweep.poll_s)
    except BaseException:
        for job in running:
            job.handle.cancel()
        raise
    for line in ranking_lines(study):
        log.info(line)
    return ranking(study)


def take(pool: SlotPool, slot: Slot) -> bool:
    """Take `slot` (its trial's) from `pool` when it is free; False leaves the pool as it was."""
    if (taken := pool.take()) is None:
        return False
    if pool.prefer(taken, slot.name).name == slot.name:
        return True
    pool.give_back(taken)
    return False


@dataclass
class StageRun:
    """A stage at a study's end that starts jobs like trials (the re-evaluation; the confirm stage, confirm.py): the
    study, its sweep config and launcher, its directories and the jobs' link to the study."""

    study: optuna.Study
    sweep: SweepConfig
    launcher: Launcher
    roots: StudyRoots
    uid: str
    storage_url: str


class ReevalLaunch(StageRun):
    """Starts the re-evaluation's jobs."""

    def start(self, trial: FrozenTrial, slot: Slot) -> JobHandle | None:
        """Start `trial`'s re-eval job on `slot`; None (a warning) when it recorded no overrides or cannot start."""
        sweep, roots, name = self.sweep, self.roots, str(self.study.study_name)
        checkpoint = "best.pt" if sweep.study.value == "best" else "latest.pt"
        link = StudyLink(name, self.uid, trial.number, self.storage_url, sweep.storage.password_env or None)
        out_dir = f"{roots.run_root}/trial-{trial.number}/reeval"
        overrides = reeval_overrides(trial, link, out_dir, sweep.study.seeds, sweep.reeval.examples, checkpoint)
        if overrides is None:
            log.warning("trial %d recorded no training overrides or checkpoint: not re-evaluated", trial.number)
            return None
        spec = JobSpec(f"{job_name(name, self.uid, trial.number)}-reeval", [*overrides, *slot.overrides],
                       roots.workdir(trial.number) / "reeval", slot=slot)  # fmt: skip
        try:
            return self.launcher.launch(spec)
        except Exception as err:  # noqa: BLE001 (the study is done and stays so: a re-eval that cannot start is one warning)
            log.warning("re-evaluation of trial %d could not start: %s: %s", trial.number, type(err).__name__, err)
            return None


def settle(study: optuna.Study, job: ReevalJob, code: int | None, waited_s: float) -> None:
    """Log how the job ended (`code` None: stopped after `waited_s`); a failed one marks the earlier record."""
    number = job.trial.number
    record = reevals(study.user_attrs).get(number)
    if code != 0 or record is None:
        why = failure_line(job.handle.failure, code, waited_s)
        log.warning("re-evaluation of trial %d failed: %s", number, why)
        if record is not None:  # an earlier one's value stays, marked: the ranking puts it after reusable ones
            study.set_user_attr(reeval_attr(number), {**record.as_dict(), "failed": clip_line(why, 300)})
        return
    log.info("trial %d re-evaluated: %s = %s", number, record.metric, interval(record))


def reevaluate_at_end(
    study: optuna.Study,
    storage: RDBStorage,
    sweep: SweepConfig,
    launcher: Launcher,
    roots: StudyRoots,
    uid: str,
    storage_url: str,
) -> list[Ranked]:
    """A driver's end of study: one driver at a time (a lock on the study's storage), each re-evaluating only the
    trials none has yet. Several drivers of one study end together; each ran every top trial's job before."""
    with exclusive(storage, f"reeval:{study.study_name}"):
        return reevaluate(study, sweep, launcher, roots, uid, storage_url, only_missing=True)
