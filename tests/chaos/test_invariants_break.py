"""Each invariant of the chaos suite can fail: held against a small record built in memory (Optuna's
`create_trial`, no process, no database), it names the trial that breaks it, and passes on the record mended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from tests.chaos import invariants
from tests.chaos.faults import Fault
from tests.chaos.injector import DriverRun, Soaked
from tests.chaos.record import StudyRecord, chains
from tests.chaos.settings import SoakSettings

LR = FloatDistribution(1e-5, 1e-2, log=True)


def trial(number: int, state: TrialState, lr: float = 1e-3, value: float | None = None, **attrs: Any) -> FrozenTrial:
    t = optuna.trial.create_trial(
        state=state,
        value=value if state == TrialState.COMPLETE else None,
        params={"optim.lr": lr},
        distributions={"optim.lr": LR},
        user_attrs=attrs,
    )
    t.number = number
    return t


def record(*trials: FrozenTrial) -> StudyRecord:
    return StudyRecord(
        trials=list(trials),
        study_attrs={"objective": "eval/accuracy"},
        by_number={t.number: t for t in trials},
        chain=chains(list(trials)),
        retried=set(),
        duplicates=[t for t in trials if "duplicate_of" in t.user_attrs],
        ran=[t for t in trials if "duplicate_of" not in t.user_attrs],
    )


def soaked(tmp_path: Path, n_trials: int = 2, faults: list[Fault] | None = None, **kw: Any) -> Soaked:
    settings = SoakSettings(work=tmp_path, n_trials=n_trials, train_steps=20, eval_interval=10)
    kw = {"runs": [], "t0": 0.0, "wall_s": 1.0, "timed_out": False, **kw}
    return Soaked(settings, faults or [], "sqlite://", **kw)


def killed(trial_number: int) -> Fault:
    return Fault("kill_job", 1, injected=True, trial=trial_number)


def test_a_fault_that_found_no_target_is_named(tmp_path: Path) -> None:
    missed = Fault("stop_job", 3, note="no target found")
    check = invariants.faults_injected(soaked(tmp_path, faults=[killed(0), missed]), record())
    assert check.problems == ["stop_job@3: no target found"]
    assert invariants.faults_injected(soaked(tmp_path, faults=[killed(0)]), record()).ok


def test_a_driver_that_exited_non_zero_or_ran_past_the_timeout_is_named(tmp_path: Path) -> None:
    # The verdict reads a driver's name and how it ended, never its process.
    runs = [
        DriverRun("driver0", 0, None, tmp_path / "d0.log", 0.0, returncode=1),
        DriverRun("driver1", 1, None, tmp_path / "d1.log", 0.0, killed=True, returncode=-9),
    ]
    check = invariants.drivers_exit_0(soaked(tmp_path, runs=runs, timed_out=True), record())
    assert check.problems == ["drivers still running after 1800 s (stopped)", "driver0 exited 1"]
    runs[0].returncode = 0
    assert invariants.drivers_exit_0(soaked(tmp_path, runs=runs, timed_out=False), record()).ok


def test_a_running_trial_and_a_fail_without_reason_are_named(tmp_path: Path) -> None:
    rec = record(trial(0, TrialState.RUNNING), trial(1, TrialState.FAIL, lr=1e-4))
    assert invariants.all_settled(soaked(tmp_path), rec).problems == ["trial 0 RUNNING"]
    assert invariants.fail_reasons(soaked(tmp_path), rec).problems == ["trial 1 FAIL without a reason"]
    mended = record(trial(1, TrialState.FAIL, lr=1e-4, fail_reason="worker-0 exited with code -9"))
    assert invariants.all_settled(soaked(tmp_path), mended).ok
    assert invariants.fail_reasons(soaked(tmp_path), mended).ok


def test_a_killed_job_must_say_so_and_be_recovered(tmp_path: Path) -> None:
    untrue = record(trial(0, TrialState.FAIL, fail_reason="the job exited with code 1"))
    assert invariants.true_reasons(soaked(tmp_path, faults=[killed(0)]), untrue).problems == [
        "trial 0 (kill_job): FAIL 'the job exited with code 1'"
    ]
    # Its chain is itself: nothing recovered it.
    assert invariants.recovered(soaked(tmp_path, faults=[killed(0)]), untrue).problems == [
        "trial 0 (kill_job): chain [0] ends FAIL 'the job exited with code 1'"
    ]
    true = record(trial(0, TrialState.FAIL, fail_reason="worker-0 exited with code -9"))
    assert invariants.true_reasons(soaked(tmp_path, faults=[killed(0)]), true).ok


def test_a_failure_nobody_injected_is_named(tmp_path: Path) -> None:
    rec = record(
        trial(0, TrialState.FAIL, fail_reason="CUDA error"), trial(1, TrialState.FAIL, lr=1e-4, fail_reason="x")
    )
    check = invariants.no_other_failures(soaked(tmp_path, faults=[killed(1)]), rec)
    assert check.problems == ["trial 0: 'CUDA error'"]


def test_the_budget_and_configurations_trained_twice(tmp_path: Path) -> None:
    twice = record(trial(0, TrialState.COMPLETE, value=0.5), trial(1, TrialState.PRUNED))
    assert invariants.budget(soaked(tmp_path, n_trials=3), twice).problems == ["2 trials used the budget, not 3"]
    assert invariants.budget(soaked(tmp_path, n_trials=2), twice).ok
    assert invariants.trained_once(soaked(tmp_path), twice).problems == ["trials 0 and 1: {'optim.lr': 0.001}"]
    once = record(trial(0, TrialState.COMPLETE, value=0.5), trial(1, TrialState.PRUNED, lr=1e-4))
    assert invariants.trained_once(soaked(tmp_path), once).ok


def test_a_duplicate_that_launched_a_job_is_named(tmp_path: Path) -> None:
    workdir = tmp_path / "trial-1"
    workdir.mkdir()
    (workdir / "worker-0.log").write_text("started\n")
    rec = record(
        trial(0, TrialState.COMPLETE, value=0.5), trial(1, TrialState.FAIL, duplicate_of=0, workdir=str(workdir))
    )
    assert invariants.duplicates_untrained(soaked(tmp_path), rec).problems == [
        f"trial 1 (duplicate of 0): FAIL, workdir {workdir}"
    ]
    (workdir / "worker-0.log").unlink()
    assert invariants.duplicates_untrained(soaked(tmp_path), rec).ok


def run_files(workdir: Path, summary: dict[str, Any], ckpt: dict[str, Any], metrics: list[dict[str, Any]]) -> None:
    (workdir / "run").mkdir(parents=True)
    (workdir / "run" / "summary.json").write_text(json.dumps(summary))
    (workdir / "run" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (workdir / "worker-0.log").write_text(json.dumps({"event": "start", "resumed_from": 0}) + "\n")
    (workdir / "checkpoints").mkdir()
    torch.save(ckpt, workdir / "checkpoints" / "latest.pt")


@pytest.mark.parametrize("told", [0.5, 0.25])
def test_a_complete_value_must_be_its_runs_and_every_eval_reported(tmp_path: Path, told: float) -> None:
    workdir = tmp_path / "trial-0"
    summary = {"outcome": "COMPLETE", "best_value": 0.5, "steps": 20, "final": {}}
    ckpt = {"step": 20, "best": {"value": 0.5}, "identity": {"config": {"optim.lr": 1e-3}}}
    run_files(workdir, summary, ckpt, [{"step": 10, "eval/accuracy": 0.4}, {"step": 20, "eval/accuracy": 0.5}])
    t = trial(0, TrialState.COMPLETE, value=told, workdir=str(workdir))
    t.intermediate_values = {10: 0.4, 20: 0.5 if told == 0.5 else 0.3}
    traceable = invariants.values_traceable(soaked(tmp_path), record(t))
    reported = invariants.reports_complete(soaked(tmp_path), record(t))
    if told == 0.5:
        assert traceable.ok and reported.ok, traceable.problems + reported.problems
    else:
        assert traceable.problems == ["trial 0: told 0.25, summary best_value 0.5"]
        assert reported.problems == ["trial 0: reported {10: 0.4, 20: 0.3}, its run logged {10: 0.4, 20: 0.5}"]


def test_a_pruned_trial_whose_run_completed_is_named(tmp_path: Path) -> None:
    workdir = tmp_path / "trial-0"
    (workdir / "run").mkdir(parents=True)
    (workdir / "run" / "summary.json").write_text(json.dumps({"outcome": "COMPLETE"}))
    rec = record(trial(0, TrialState.PRUNED, workdir=str(workdir)))
    assert invariants.pruned_as_their_runs_said(soaked(tmp_path), rec).problems == [
        "trial 0: PRUNED, its run's summary says COMPLETE"
    ]


def test_a_process_left_behind_is_named(tmp_path: Path) -> None:
    left = [{"trial": 3, "pid": 99, "state": "T", "step": 10}]
    assert invariants.no_job_left(soaked(tmp_path, leftover_jobs=left), record()).problems == [
        "trial 3 pid 99 state T at step 10"
    ]
    assert invariants.no_job_left(soaked(tmp_path), record()).ok


def test_a_checkpoint_of_other_parameters_is_named(tmp_path: Path) -> None:
    workdir = tmp_path / "trial-0"
    summary = {"outcome": "COMPLETE", "best_value": 0.5, "steps": 20, "final": {}}
    ckpt = {"step": 20, "best": {"value": 0.5}, "identity": {"config": {"optim.lr": 1e-4}}}
    run_files(workdir, summary, ckpt, [{"step": 10, "eval/accuracy": 0.5}])
    rec = record(trial(0, TrialState.COMPLETE, value=0.5, workdir=str(workdir)))
    assert invariants.values_traceable(soaked(tmp_path), rec).problems == [
        "trial 0: checkpoint optim.lr=0.0001, trial 0.001"
    ]
