"""A study's progress while the driver runs it: how many of `n_trials` are done and how, the best so far, an ETA.

Following a sweep needs the study at a glance ("k of n", the best, when it ends), in one log format (Optuna's
lines in the driver's):

    measure(trials, ...)      the numbers, from the study's trials alone (a pure function): complete / pruned /
                              failed / running of n_trials, the best so far and its trial, elapsed, ETA
    ProgressView              shows them. In a terminal: one line that updates in place (tqdm), redrawn at most
                              every `refresh_s`. Elsewhere (a scheduler's log, `nohup`, CI): one quiet log line
                              every `interval_s` (`progress_interval_s`). Each trial's state change (started,
                              COMPLETE, PRUNED, FAIL) stays one line of the driver's, ended by `note()`.
    route_optuna_logging()    Optuna's records through the driver's handlers (Hydra's format, console and log file).

Counting follows the driver's budget (sweeps.search.budget.budget_used): a draw refused as a duplicate trained nothing and
is not counted; a failure that was queued again is shown as retried, not failed (its retry carries the budget).
The ETA is the mean wall time of the finished trials times the work left (trials not yet started, plus what a
running trial has left: at its own pace where its job has logged twice, from its progress record, else what is
left of that mean), divided over the trials that run at once (max_concurrent of this driver, or more when other
drivers run some); before the first finished trial it is unknown.

Why ~300 lines: the pure measure, the two ways of showing it (terminal, log) and Optuna's log routing belong
together; measure() is tested alone.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, TextIO

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from storage.heartbeat import retried_numbers
from storage.record import PROGRESS_ATTR, ProgressRecord, trained_trials
from sweeps.search.space import params_to_values

log = logging.getLogger("sweeps")

REFRESH_S = 2.0  # a terminal's line is redrawn at most this often (each redraw reads the study's trials once)


def route_optuna_logging() -> None:
    """Send Optuna's log records through the handlers the driver's own go to (under Hydra: its job logging,
    i.e. its format, the console and the run's log file) instead of Optuna's default stderr handler and format.
    Only where the root logger has handlers: elsewhere Optuna keeps its own, or its lines would vanish."""
    if logging.getLogger().handlers:
        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()


def duration(seconds: float) -> str:
    """`42s`, `5m07s`, `2h03m`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@dataclass(frozen=True)
class Progress:
    n_trials: int
    complete: int
    pruned: int
    failed: int  # failed for good (a failure queued again is counted in `retried`)
    retried: int
    running: int
    best_number: int | None  # single objective: the best complete trial
    best_value: float | None
    pareto: int | None  # several objectives: trials on the Pareto front
    elapsed_s: float
    eta_s: float | None  # None: no trial has finished yet
    stopped: str | None = None  # why no new trial starts (a timeout): said where the ETA would be, which is moot

    @property
    def done(self) -> int:
        return self.complete + self.pruned + self.failed

    @property
    def finished(self) -> bool:
        """The budget is spent and nothing runs: the study is over."""
        return self.done >= self.n_trials and not self.running

    def best(self) -> str:
        if self.pareto is not None:
            return f"Pareto front {self.pareto} trial{'s' if self.pareto != 1 else ''}"
        if self.best_number is None:
            return "no complete trial yet"
        return f"best trial {self.best_number}: {self.best_value:.4f}"

    def eta(self) -> str:
        if self.finished:
            return "finished"
        if self.stopped is not None:
            return self.stopped
        return "ETA unknown" if self.eta_s is None else f"ETA {duration(self.eta_s)}"

    def counts(self) -> str:
        retried = f" (+{self.retried} retried)" if self.retried else ""
        return f"complete {self.complete}, pruned {self.pruned}, failed {self.failed}{retried}, running {self.running}"

    def of_budget(self) -> str:
        """`3/8 done`. The count is the study's (every driver's and every earlier run's trials), so it can pass this
        driver's n_trials (a second driver started with a smaller budget): then it says so, never `3/2 done`."""
        if self.done <= self.n_trials:
            return f"{self.done}/{self.n_trials} done"
        return f"{self.done} done (the study's, past this driver's n_trials={self.n_trials})"

    def line(self, study_name: str, ended: str | None = None) -> str:
        """The periodic (and final) log line; `ended`: why the study stopped short (a timeout), instead of an ETA."""
        return (
            f"study {study_name}: {self.of_budget()} ({self.counts()}), {self.best()}; "
            f"elapsed {duration(self.elapsed_s)}, {ended or self.eta()}"
        )

    def short(self) -> str:
        """What ends a trial's state-change line."""
        return f"{self.of_budget()}, running {self.running}, {self.best()}, {self.eta()}"


def _pareto_size(trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]) -> int:
    signs = [1.0 if d == StudyDirection.MAXIMIZE else -1.0 for d in directions]
    points = [[s * v for s, v in zip(signs, t.values)] for t in trials]  # larger is better in every objective

    def dominated(p: list[float]) -> bool:
        return any(all(a >= b for a, b in zip(q, p)) and q != p for q in points)

    return sum(1 for p in points if not dominated(p))


def measure(
    trials: Sequence[FrozenTrial],
    directions: Sequence[StudyDirection],
    n_trials: int,
    max_concurrent: int,
    elapsed_s: float,
    now: datetime,
    steps: int | None = None,
) -> Progress:
    """The study's progress from its trials. `now` is on the clock the trials' datetimes were stamped with
    (Optuna's: the local time of the process that told them, naive)."""
    used = trained_trials(trials)
    requeued = retried_numbers(trials)
    complete = [t for t in used if t.state == TrialState.COMPLETE and t.values]
    pruned = [t for t in used if t.state == TrialState.PRUNED]
    failed = [t for t in used if t.state == TrialState.FAIL and t.number not in requeued]
    retried = sum(1 for t in used if t.state == TrialState.FAIL and t.number in requeued)
    running = [t for t in used if t.state == TrialState.RUNNING]

    best_number = best_value = pareto = None
    if len(directions) > 1:
        pareto = _pareto_size(complete, directions)
    elif complete:
        pick = max if directions[0] == StudyDirection.MAXIMIZE else min
        best = pick(complete, key=lambda t: t.values[0])
        best_number, best_value = best.number, best.values[0]

    finished = [*complete, *pruned, *failed]
    took = [
        (t.datetime_complete - t.datetime_start).total_seconds()
        for t in finished
        if t.datetime_start and t.datetime_complete
    ]
    eta_s = None
    if len(finished) >= n_trials and not running:
        eta_s = 0.0  # nothing left
    elif took:
        mean = statistics.fmean(took)
        left = [_left_s(t, mean, (now - t.datetime_start).total_seconds(), steps) for t in running if t.datetime_start]
        not_started = max(0, n_trials - len(finished) - len(running))
        work = not_started * mean + sum(left)
        eta_s = work / max(1, max_concurrent, len(running))
    return Progress(
        n_trials=n_trials,
        complete=len(complete),
        pruned=len(pruned),
        failed=len(failed),
        retried=retried,
        running=len(running),
        best_number=best_number,
        best_value=best_value,
        pareto=pareto,
        elapsed_s=elapsed_s,
        eta_s=eta_s,
    )


def _left_s(trial: FrozenTrial, mean: float, age_s: float, steps: int | None) -> float:
    """A running trial's seconds left: its steps left at its job's own pace since its first log point (a retry
    that resumed late in a long run is not "nearly done" because it outlived the mean); else the mean less its age."""
    progress: ProgressRecord | None = trial.user_attrs.get(PROGRESS_ATTR)
    if steps and isinstance(progress, dict) and "first_step" in progress and "first_at" in progress:
        done, took = progress["step"] - progress["first_step"], progress["at"] - progress["first_at"]
        if done > 0 and took > 0:
            return float(max(0.0, steps - progress["step"]) * took / done)
    return max(0.0, mean - age_s)


class ProgressView:
    """The driver's display of its study's progress: `tick` every pass of its loop (cheap unless something is
    due), `note` at each trial state change, `close` at the end. Never raises: a display problem is logged once
    and the study goes on."""

    def __init__(
        self,
        study_name: str,
        n_trials: int,
        max_concurrent: int,
        interval_s: float,
        *,
        tty: bool | None = None,
        stream: TextIO | None = None,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = datetime.now,
        steps: int | None = None,
    ):
        self.study_name = study_name
        self.n_trials = int(n_trials)
        self.max_concurrent = int(max_concurrent)
        self.interval_s = float(interval_s)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(self.stream.isatty()) if tty is None else tty
        self.refresh_s = refresh_s
        self.clock = clock
        self.now = now
        self.started = clock()
        self.last_line = self.started  # the first quiet line comes one interval in
        self.last_draw = -math.inf
        self.bar: Any = None
        self.redirect = ExitStack()
        self.failed_once = False
        self.steps = steps  # a trial's training steps: a running trial's ETA at its own pace
        self.stopped: str | None = None  # set by the driver when no new trial starts (a timeout): no ETA after it

    def measure(self, study: optuna.Study) -> Progress:
        progress = measure(
            study.get_trials(deepcopy=False),
            study.directions,
            self.n_trials,
            self.max_concurrent,
            self.clock() - self.started,
            self.now(),
            self.steps,
        )
        return replace(progress, stopped=self.stopped)

    def tick(self, study: optuna.Study) -> None:
        """A terminal's line redrawn when `refresh_s` has passed; a log's quiet line when `interval_s` has."""
        now = self.clock()
        try:
            if self.tty:
                if now - self.last_draw >= self.refresh_s:
                    self.draw(self.measure(study))
            elif now - self.last_line >= self.interval_s:
                self.last_line = now
                log.info("%s", self.measure(study).line(self.study_name))
        except Exception as err:  # noqa: BLE001 - the display is never worth the study
            self.gave_up(err)

    def note(self, study: optuna.Study) -> str:
        """` [3/8 done, running 1, best trial 2: 0.8125, ETA 4m10s]`, to end a trial's state-change line (the
        terminal's line is redrawn at once); empty if the study cannot be read now."""
        try:
            progress = self.measure(study)
            if self.tty:
                self.draw(progress)
            return f" [{progress.short()}]"
        except Exception as err:  # noqa: BLE001 - the progress line never stops the driver
            self.gave_up(err)
            return ""

    def close(self, study: optuna.Study, ended: str | None = None) -> None:
        """The final state: the terminal's line completed and left in place, and one log line in either case
        (`ended`: why the study stopped short, said where the ETA would be)."""
        try:
            progress = self.measure(study)
            if self.bar is not None:
                self.draw(progress)
                self.bar.close()
                self.bar = None
            self.redirect.close()  # the console handlers write directly again
            log.info("%s", progress.line(self.study_name, ended))
        except Exception as err:  # noqa: BLE001 - the progress line never stops the driver
            self.gave_up(err)

    def draw(self, progress: Progress) -> None:
        if self.bar is None:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            # Log lines (the driver's, Optuna's) are written above the line instead of through it.
            self.redirect.enter_context(logging_redirect_tqdm())
            self.bar = tqdm(
                total=self.n_trials,
                desc=f"study {self.study_name}",
                unit="trial",
                file=self.stream,
                dynamic_ncols=True,
                mininterval=0,
            )
        status = f"{progress.counts()} | {progress.best()} | elapsed {duration(progress.elapsed_s)}, {progress.eta()}"
        # Our own fields instead of tqdm's rate and time left, which know nothing of pruning or parallel trials.
        text = f"{progress.of_budget()} |{{bar:20}}| " + status.replace("{", "{{").replace("}", "}}")
        self.bar.bar_format = "{desc}: " + text
        self.bar.n = min(progress.done, self.n_trials)
        self.bar.refresh()
        self.last_draw = self.clock()

    def gave_up(self, err: BaseException) -> None:
        if not self.failed_once:
            self.failed_once = True
            log.warning("study progress not shown (%s: %s)", type(err).__name__, err)


def print_best(study: optuna.Study, objective: str) -> None:
    """The study's result at the driver's end: its best trial by the value it reported (the re-evaluation of the
    top trials follows: sweeps/trials/reeval.py), or (several objectives) its Pareto front."""
    if len(study.directions) == 1:
        try:
            best = study.best_trial
        except ValueError:
            log.info("no completed trial")
            return
        values = params_to_values(best.params)
        print(f"best trial {best.number} by its own eval: {objective} = {best.value:.4f} with {values}")
    else:
        for t in study.best_trials:
            print(f"Pareto trial {t.number}: {t.values} with {params_to_values(t.params)}")
