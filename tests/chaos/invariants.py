"""The invariants of a faulted study's record, one function each: each returns a `Check` whose problems name every
trial (or driver, or process) that breaks it. The record is held against the processes and the files the trials
left; docs/reliability.md (Soak) says them in words."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from optuna.trial import TrialState

from storage.record import DUPLICATE_OF_ATTR, trial_detail
from sweeps.search.space import params_to_values
from tests.chaos.faults import Fault
from tests.chaos.injector import Soaked
from tests.chaos.record import FINISHED, StudyRecord, eval_values, first_line, reason, resumed_from

SETTLED = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass(frozen=True)
class Check:
    name: str
    problems: list[str]
    held: str  # what was found to hold, said when there is no problem

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def detail(self) -> str:
        if not self.problems:
            return self.held
        more = f"; and {len(self.problems) - 8} more" if len(self.problems) > 8 else ""
        return "; ".join(self.problems[:8]) + more


def faulted_trials(faults: list[Fault]) -> dict[int, str]:
    """Each trial an injected fault hit -> the fault's kind (a killed driver's: every trial it ran then)."""
    hit: dict[int, str] = {}
    for f in faults:
        if not f.injected:
            continue
        if f.kind in ("kill_job", "stop_job") and f.trial is not None:
            hit[f.trial] = f.kind
        elif f.kind == "kill_driver":
            for n in f.trials:
                hit.setdefault(n, "kill_driver")
    return hit


def faults_injected(soaked: Soaked, record: StudyRecord) -> Check:
    """Every planned fault found a target and was injected."""
    missed = [f"{f.kind}@{f.after_starts}: {f.note}" for f in soaked.faults if not f.injected]
    return Check("faults injected", missed, f"{sum(f.injected for f in soaked.faults)} of {len(soaked.faults)}")


def drivers_exit_0(soaked: Soaked, record: StudyRecord) -> Check:
    """Every driver the soak did not kill finished the study and exited 0."""
    bad = [f"{r.name} exited {r.returncode}" for r in soaked.runs if not r.killed and r.returncode != 0]
    if soaked.timed_out:
        bad.insert(0, f"drivers still running after {soaked.settings.timeout_s:g} s (stopped)")
    ends = ", ".join(f"{r.name}: {'SIGKILL (injected)' if r.killed else r.returncode}" for r in soaked.runs)
    return Check("drivers exit 0", bad, ends)


def all_settled(soaked: Soaked, record: StudyRecord) -> Check:
    """Every trial COMPLETE, PRUNED or FAIL; none RUNNING or WAITING."""
    trials = record.trials
    counts = ", ".join(f"{s.name} {sum(t.state == s for t in trials)}" for s in FINISHED)
    return Check(
        "all settled",
        [f"trial {t.number} {t.state.name}" for t in trials if t.state not in FINISHED],
        f"{len(trials)} trials: {counts}",
    )


def fail_reasons(soaked: Soaked, record: StudyRecord) -> Check:
    """Every FAIL has a non-empty `fail_reason`."""
    failed = [t for t in record.trials if t.state == TrialState.FAIL]
    return Check(
        "fail reasons",
        [f"trial {t.number} FAIL without a reason" for t in failed if not reason(t).strip()],
        f"{len(failed)} FAIL, each with a reason",
    )


def true_reasons(soaked: Soaked, record: StudyRecord) -> Check:
    """A faulted trial's record says what happened to it: killed, exit code -9; stopped, no progress for
    stall_timeout_s; its driver killed, the outcome its job stored or "its driver died"."""
    hit = faulted_trials(soaked.faults)
    untrue = []
    for n, kind in sorted(hit.items()):
        t = record.by_number.get(n)
        if t is None:
            untrue.append(f"trial {n} ({kind}) is not in the study")
            continue
        text = reason(t)
        if kind == "kill_job":
            ok = t.state == TrialState.FAIL and "exited with code -9" in text
        elif kind == "stop_job":
            stall = f"stall_timeout_s={soaked.settings.stall_timeout_s:g}"
            ok = t.state == TrialState.FAIL and "no progress for" in text and stall in text
        else:  # its driver was killed: the outcome its job stored, or failed as orphaned
            stored = t.user_attrs.get("outcome")
            ok = (t.state == TrialState.FAIL and "driver died" in text) or (
                t.state.name == stored and t.state in SETTLED
            )
        if not ok:
            untrue.append(f"trial {n} ({kind}): {t.state.name} {first_line(text)!r}")
    return Check("true reasons", untrue, f"{len(hit)} faulted trials, each says what happened to it")


def recovered(soaked: Soaked, record: StudyRecord) -> Check:
    """Every failed faulted trial's retry chain ends COMPLETE or PRUNED."""
    unrecovered = []
    for n, kind in sorted(faulted_trials(soaked.faults).items()):
        t = record.by_number.get(n)
        if t is None:  # true_reasons says so
            continue
        last = record.by_number[record.chain[n][-1]]
        if t.state == TrialState.FAIL and last.state not in SETTLED:
            unrecovered.append(
                f"trial {n} ({kind}): chain {record.chain[n]} ends {last.state.name} {first_line(reason(last))!r}"
            )
    return Check("recovered", unrecovered, "every failed faulted trial's retry chain ends COMPLETE or PRUNED")


def no_other_failures(soaked: Soaked, record: StudyRecord) -> Check:
    """Every FAIL is an injected fault or a refused duplicate (a retry that fails again counts too)."""
    explained = set(faulted_trials(soaked.faults)) | {d.number for d in record.duplicates}
    other = [t for t in record.ran if t.state == TrialState.FAIL and t.number not in explained]
    return Check(
        "no other failures",
        [f"trial {t.number}: {first_line(reason(t))!r}" for t in other],
        "every FAIL is an injected fault or a refused duplicate",
    )


def budget(soaked: Soaked, record: StudyRecord) -> Check:
    """The trials that used the budget (not retried, not refused duplicates) number exactly n_trials."""
    n_trials = soaked.settings.n_trials
    used = [t for t in record.ran if t.state in FINISHED and t.number not in record.retried]
    return Check(
        "budget",
        [] if len(used) == n_trials else [f"{len(used)} trials used the budget, not {n_trials}"],
        f"{len(used)} trials used the budget ({len(record.ran) - len(used)} attempts retried, "
        f"{len(record.duplicates)} refused duplicates)",
    )


def retries(soaked: Soaked, record: StudyRecord) -> Check:
    """A retry has exactly the parameters of the trial it retries."""
    chain, by_number = record.chain, record.by_number
    retry = [t for t in record.trials if chain[t.number][0] != t.number]
    return Check(
        "retries",
        [
            f"retry {t.number} of {chain[t.number][0]} has other parameters"
            for t in retry
            if t.params != by_number[chain[t.number][0]].params
        ],
        f"{len(retry)} retries, each with its first attempt's parameters",
    )


def trained_once(soaked: Soaked, record: StudyRecord) -> Check:
    """No two COMPLETE/PRUNED trials have the same parameters."""
    seen: dict[str, int] = {}
    twice = []
    for t in record.ran:
        if t.state in SETTLED:
            key = json.dumps(t.params, sort_keys=True, default=str)
            if key in seen:
                twice.append(f"trials {seen[key]} and {t.number}: {params_to_values(t.params)}")
            seen.setdefault(key, t.number)
    return Check("trained once", twice, f"{len(seen)} COMPLETE/PRUNED trials, all with different parameters")


def duplicates_untrained(soaked: Soaked, record: StudyRecord) -> Check:
    """A refused duplicate (user attr `duplicate_of`) FAILed, launched no job, and has its twin's parameters."""
    untrained = []
    for d in record.duplicates:
        workdir = Path(str(d.user_attrs.get("workdir") or ""))
        twin = record.by_number.get(d.user_attrs[DUPLICATE_OF_ATTR])
        if (
            d.state != TrialState.FAIL
            or (workdir.name and (workdir / "worker-0.log").exists())
            or twin is None
            or twin.params != d.params
        ):
            untrained.append(
                f"trial {d.number} (duplicate of {d.user_attrs[DUPLICATE_OF_ATTR]}): {d.state.name}, workdir {workdir}"
            )
    return Check("duplicates untrained", untrained, f"{len(record.duplicates)} refused duplicate(s), none launched")


def _summary(workdir: Path) -> dict:
    return json.loads((workdir / "run" / "summary.json").read_text())


def pruned_as_their_runs_said(soaked: Soaked, record: StudyRecord) -> Check:
    """A PRUNED trial's run said so: <trial dir>/run/summary.json has outcome PRUNED (its job's verdict, or the
    outcome an orphaned job stored)."""
    pruned = [t for t in record.ran if t.state == TrialState.PRUNED]
    untrue = []
    for t in pruned:
        try:
            said = _summary(Path(str(t.user_attrs.get("workdir")))).get("outcome")
        except (OSError, ValueError) as err:
            said = f"no summary.json ({type(err).__name__})"
        if said != "PRUNED":
            untrue.append(f"trial {t.number}: PRUNED, its run's summary says {said}")
    return Check("pruned as their runs said", untrue, f"{len(pruned)} PRUNED trials, each its run's summary's")


def values_traceable(soaked: Soaked, record: StudyRecord) -> Check:
    """Every COMPLETE value is its run's: <trial dir>/run/summary.json has outcome COMPLETE, best_value = the told
    value (study.value=best) and the stored final metrics; the checkpoint of its retry chain
    (<study dir>/trial-<origin>/checkpoints/latest.pt) is at train.steps, has the same best value, and an identity
    whose config values are the trial's parameters."""
    import torch

    train_steps = soaked.settings.train_steps
    complete = [t for t in record.ran if t.state == TrialState.COMPLETE]
    untraceable = []
    for t in complete:
        workdir = Path(str(t.user_attrs.get("workdir")))
        try:
            summary = _summary(workdir)
        except (OSError, ValueError) as err:
            untraceable.append(f"trial {t.number}: no summary.json ({err})")
            continue
        problems = []
        told = summary.get("best_value")
        if summary.get("outcome") != "COMPLETE":
            problems.append(f"summary outcome {summary.get('outcome')}")
        if told is None or float(told) != t.value:
            problems.append(f"told {t.value}, summary best_value {told}")
        if (summary.get("final") or {}) != (trial_detail(t.user_attrs, "final_metrics") or {}):
            problems.append("final metrics differ from the summary's")
        ckpt_path = workdir.parent / f"trial-{record.chain[t.number][0]}" / "checkpoints" / "latest.pt"
        try:
            state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        except Exception as err:
            untraceable.append(f"trial {t.number}: checkpoint {ckpt_path} unreadable ({type(err).__name__}: {err})")
            continue
        config = (state.get("identity") or {}).get("config") or {}
        for key, value in params_to_values(t.params).items():
            if config.get(key, "<absent>") != value:
                problems.append(f"checkpoint {key}={config.get(key, '<absent>')!r}, trial {value!r}")
        if state.get("step") != summary.get("steps") or state.get("step") != train_steps:
            problems.append(
                f"checkpoint at step {state.get('step')}, summary {summary.get('steps')}, train.steps {train_steps}"
            )
        best = (state.get("best") or {}).get("value")
        if best != summary.get("best_value"):
            problems.append(f"checkpoint best {best}, summary {summary.get('best_value')}")
        if problems:
            untraceable.append(f"trial {t.number}: " + ", ".join(problems))
    return Check(
        "values traceable",
        untraceable,
        f"{len(complete)} COMPLETE values = their summary.json and their chain's checkpoint (identity = params)",
    )


def reports_complete(soaked: Soaked, record: StudyRecord) -> Check:
    """Every COMPLETE trial has every eval report from where its job started (0 or its resume step), each the
    value its run logged in metrics.jsonl."""
    s = soaked.settings
    metric = record.study_attrs.get("prune_metric") or record.study_attrs.get("objective", s.objective)
    complete = [t for t in record.ran if t.state == TrialState.COMPLETE]
    gaps = []
    for t in complete:
        workdir = Path(str(t.user_attrs.get("workdir")))
        start = resumed_from(workdir)
        want = list(range((start or 0) + s.eval_interval, s.train_steps + 1, s.eval_interval))
        logged = eval_values(workdir / "run" / "metrics.jsonl", metric)
        if start is None or sorted(t.intermediate_values) != want:
            gaps.append(
                f"trial {t.number}: reports at {sorted(t.intermediate_values)}, job started at step {start}, expected {want}"
            )
        elif any(logged.get(step) != value for step, value in t.intermediate_values.items()):
            gaps.append(
                f"trial {t.number}: reported {dict(sorted(t.intermediate_values.items()))}, its run logged {logged}"
            )
    return Check(
        "reports complete",
        gaps,
        f"{len(complete)} COMPLETE trials: every eval from their start step reported, each the value their run logged",
    )


def no_job_left(soaked: Soaked, record: StudyRecord) -> Check:
    """No training process of the study is alive once the drivers are done."""
    return Check(
        "no job left",
        [f"trial {j['trial']} pid {j['pid']} state {j['state']} at step {j['step']}" for j in soaked.leftover_jobs],
        "no training process of the study alive after the drivers",
    )


INVARIANTS: tuple[Callable[[Soaked, StudyRecord], Check], ...] = (
    faults_injected,
    drivers_exit_0,
    all_settled,
    fail_reasons,
    true_reasons,
    recovered,
    no_other_failures,
    budget,
    retries,
    trained_once,
    duplicates_untrained,
    pruned_as_their_runs_said,
    values_traceable,
    reports_complete,
    no_job_left,
)


def check_all(soaked: Soaked, record: StudyRecord) -> list[Check]:
    return [invariant(soaked, record) for invariant in INVARIANTS]
