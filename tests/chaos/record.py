"""The faulted study's record read back (its trials, their retry chains, duplicates), and the files a trial's job
left (where it started, what it logged at each eval)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from storage import open_storage
from storage.heartbeat import retried_numbers, retry_history
from storage.record import DUPLICATE_OF_ATTR

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def chains(trials: list[FrozenTrial]) -> dict[int, list[int]]:
    """Each trial number -> the numbers of its whole retry chain, first attempt first."""
    origin = {}
    for t in trials:
        history = retry_history(t)
        origin[t.number] = history[0] if history else t.number
    members: dict[int, list[int]] = {}
    for number in sorted(origin):
        members.setdefault(origin[number], []).append(number)
    return {n: members[origin[n]] for n in origin}


@dataclass
class StudyRecord:
    trials: list[FrozenTrial]
    study_attrs: dict[str, Any]
    by_number: dict[int, FrozenTrial]
    chain: dict[int, list[int]]  # trial number -> its retry chain, first attempt first
    retried: set[int]  # attempts a later trial retries
    duplicates: list[FrozenTrial]  # refused duplicates (user attr `duplicate_of`): never trained
    ran: list[FrozenTrial]  # every other trial

    @classmethod
    def load(cls, url: str, study: str) -> StudyRecord:
        loaded = optuna.load_study(study_name=study, storage=open_storage(url))
        trials = loaded.get_trials(deepcopy=False)
        return cls(
            trials=trials,
            study_attrs=loaded.user_attrs,
            by_number={t.number: t for t in trials},
            chain=chains(trials),
            retried=retried_numbers(trials),
            duplicates=[t for t in trials if DUPLICATE_OF_ATTR in t.user_attrs],
            ran=[t for t in trials if DUPLICATE_OF_ATTR not in t.user_attrs],
        )


def reason(t: FrozenTrial) -> str:
    """A trial's `fail_reason` ('' when it has none)."""
    return str(t.user_attrs.get("fail_reason") or "")


def first_line(text: str) -> str:
    return next(iter(text.splitlines()), "")[:160]


def eval_values(metrics_file: Path, metric: str) -> dict[int, float]:
    """{step: value} of `metric` in a run's metrics.jsonl (what the job logged at each eval)."""
    values: dict[int, float] = {}
    try:
        lines = metrics_file.read_text().splitlines()
    except OSError:
        return values
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if metric in record:
            values[int(record["step"])] = record[metric]
    return values


def resumed_from(workdir: Path) -> int | None:
    """The step the trial's job started from (its `start` event in worker-0.log); None if it never started."""
    try:
        lines = (workdir / "worker-0.log").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith('{"event": "start"'):
            try:
                return int(json.loads(line)["resumed_from"])
            except (ValueError, KeyError):
                return None
    return None
