"""What the report knows about one study: its objective, its trials, and how a trial's steps map to time.

Every figure and table reads the study through a StudyView, so that "which value", "which trials" and "how many
chips" are decided once. A trial's facts (steps, timing, the training overrides) are read only through its records
(storage/trial_record.py TrialLaunch, TrialOutcome): where they are stored is the record's business, not the report's.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState

from storage.record import trained_trials
from storage.study_record import StudyAttrs
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps.search.space import params_to_values
from sweeps.trials.confirmed import confirmed_ranking
from sweeps.trials.reeval import ranking


@dataclass
class Section:
    """One figure of the report, or the note saying why it is left out."""

    fig_id: str
    title: str
    figure: go.Figure | None = None
    note: str | None = None  # why the figure was left out
    caption: str | None = None  # what to keep in mind when reading a drawn figure


@dataclass(frozen=True)
class Clock:
    """A trial's steps on the wall clock: the job records when its first and last steps ran, not each step's
    time, so a step's time is placed linearly between them (an estimate the figures say they use)."""

    offset_s: float  # from the run's start to its first step
    span_s: float  # from the first step to the end of the last
    steps: int
    chips: int | None

    def seconds(self, step: float) -> float:
        return self.offset_s + self.span_s * min(step, self.steps) / self.steps

    def chip_hours(self, step: float) -> float | None:
        return None if self.chips is None else self.seconds(step) * self.chips / 3600


class StudyView:
    """One study as the figures see it: objective, direction, trials by state, chips per trial."""

    def __init__(self, study: optuna.Study, chips: int | None = None, prefix: str = ""):
        self.study = study
        self.name = study.study_name
        self.prefix = prefix  # element ids of this study's figures (several studies on one page)
        self.chips_arg = chips
        self.trials = trained_trials(
            study.get_trials(deepcopy=False)
        )  # refused repeats, trials never started: not shown
        self.multi = len(study.directions) > 1
        self.attrs = StudyAttrs.of(study.user_attrs)
        objectives = self.attrs.objective_names or ["objective"]
        self.objective = objectives[0]
        self.objectives = objectives
        self.reported = str(self.attrs.reported or self.objective)  # what the intermediate values are
        self.maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
        self.complete = [t for t in self.trials if t.state == TrialState.COMPLETE and t.values]
        self.pruned = [t for t in self.trials if t.state == TrialState.PRUNED]

    def value(self, trial: FrozenTrial) -> float:
        return float(trial.values[0])

    def optuna_kwargs(self) -> dict[str, Any]:
        """Optuna's plots need an explicit target for multi-objective studies (the first objective)."""
        return {"target": self.value, "target_name": self.objective} if self.multi else {"target_name": self.objective}

    def last_report(self, trial: FrozenTrial) -> float | None:
        if not trial.intermediate_values:
            return None
        return trial.intermediate_values[max(trial.intermediate_values)]

    def best(self) -> list[FrozenTrial]:
        """The best trial (single objective: the confirmed winner where the top configurations were trained again,
        sweeps/trials/confirm.py, else by the re-evaluation where there is one, sweeps/trials/reeval.py) or the
        Pareto front, best first; empty before any completes."""
        if not self.complete:
            return []
        if self.multi:
            return list(self.study.best_trials)
        confirmed = confirmed_ranking(self.study)
        if confirmed:
            return [self.study.get_trials(deepcopy=False)[confirmed[0].trial]]
        ranked = ranking(self.study)  # the re-evaluated winner where the top trials were evaluated again
        return [ranked[0].trial if ranked else self.study.best_trial]

    def chips(self, trial: FrozenTrial) -> int | None:
        """Chips the trial trained on: `chips=` on the command line, else the pod's expected device count."""
        return self.chips_arg if self.chips_arg is not None else TrialLaunch.of(trial.user_attrs).chips

    def clock(self, trial: FrozenTrial) -> Clock | None:
        """The trial's step -> seconds map, from its job's `timing` (else `train_seconds`); None if not recorded."""
        record = TrialOutcome.of(trial.user_attrs)
        steps = record.steps
        if not isinstance(steps, int) or steps <= 0:
            return None
        timing = record.timing
        if isinstance(timing, dict) and all(
            isinstance(timing.get(k), (int, float)) for k in ("run_start", "first_step_start", "last_step_end")
        ):
            span = timing["last_step_end"] - timing["first_step_start"]
            if span > 0:
                return Clock(timing["first_step_start"] - timing["run_start"], span, steps, self.chips(trial))
        seconds = record.train_seconds
        if isinstance(seconds, (int, float)) and seconds > 0:
            return Clock(0.0, float(seconds), steps, self.chips(trial))
        return None

    def train_seconds(self, trial: FrozenTrial) -> float | None:
        seconds = TrialOutcome.of(trial.user_attrs).train_seconds
        return float(seconds) if isinstance(seconds, (int, float)) else None

    def chip_hours(self, trial: FrozenTrial) -> float | None:
        seconds, chips = self.train_seconds(trial), self.chips(trial)
        return None if seconds is None or chips is None else seconds * chips / 3600


def duration(trial: FrozenTrial) -> dt.timedelta | None:
    """Start to finish as Optuna recorded it (queueing and launch included)."""
    if trial.datetime_start is None or trial.datetime_complete is None:
        return None
    return trial.datetime_complete - trial.datetime_start


def fmt_seconds(seconds: float | None) -> str:
    """`3 h 05 min`, `4 min 12 s`, `9.5 s`: durations a reader compares at a glance."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def plain_params(trial: FrozenTrial) -> dict[str, Any]:
    """The trial's parameters under their training keys (`optim.lr@lion` -> `optim.lr`), sorted."""
    return dict(sorted(params_to_values(trial.params).items()))


def param_label(param: str) -> str:
    """`optim.lr@lion` -> `optim.lr [lion]`: a conditional parameter names the choice it belongs to."""
    name, _, choice = param.partition("@")
    return f"{name} [{choice}]" if choice else name


def base_name(param: str) -> str:
    """`optim.lr@lion` (a conditional parameter) -> `optim.lr`."""
    return param.split("@", 1)[0]


def hover(trial: FrozenTrial, view: StudyView) -> str:
    params = "<br>".join(f"{k}={fmt_value(v)}" for k, v in plain_params(trial).items())
    value = f"{view.value(trial):.4g}" if trial.values else "-"
    return f"trial {trial.number} ({trial.state.name.lower()})<br>{view.objective}={value}<br>{params}"


def varying_params(trials: list[FrozenTrial]) -> list[str]:
    values: dict[str, set[str]] = {}
    for t in trials:
        for k, v in t.params.items():
            values.setdefault(k, set()).add(repr(v))
    return sorted(k for k, vs in values.items() if len(vs) > 1)


def pareto(points: list[tuple[float, float, FrozenTrial]], maximize: bool) -> list[tuple[float, float, FrozenTrial]]:
    """Non-dominated points: smaller x (cost) and better y (objective). Sorted by x."""
    front, best = [], -math.inf
    for x, y, t in sorted(points, key=lambda p: (p[0], -p[1] if maximize else p[1])):
        score = y if maximize else -y
        if score > best:
            front.append((x, y, t))
            best = score
    return front
