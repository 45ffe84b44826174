"""The study record stays true when a driver dies: no trial stuck RUNNING, no finished work thrown away.

Orphaned trials are settled by a pure function of their record (sweeps/trials/outcome.py), tested branch by branch,
and by a real driver on a real PostgreSQL study (the states a dead driver leaves, made by hand).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from storage import open_storage, orphaned_trials, retry_callback, trial_id_of
from storage.heartbeat import NO_FIRST_HEARTBEAT
from storage.record import HEARTBEAT_GRACE_ATTR, NOT_STARTED_ATTR, trained_trials
from storage.trial_record import attempt_attr
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.search.budget import budget_used
from sweeps.search.space import Conditional, SearchSpace
from sweeps.status import collect
from sweeps.trials.outcome import job_verdict, orphan_verdict, seed_attrs
from sweeps.trials.recovery import CUT_DRAW, settle_orphans
from tests.sweep_helpers import FAST_TRIAL, sweep_config, sweep_overrides

WHY = "its driver died"


def values_of(attrs: Mapping[str, Any]) -> list[float] | None:
    value = attrs.get("best_value")
    return None if value is None else [float(value)]


@pytest.mark.parametrize(
    "attrs, seeds, state, values, requeue",
    [
        ({}, 1, TrialState.FAIL, [], True),  # the job stored nothing: run it again
        ({"outcome": "COMPLETE", "best_value": 0.75}, 1, TrialState.COMPLETE, [0.75], False),  # finished work kept
        ({"outcome": "COMPLETE", "best_value": None}, 1, TrialState.FAIL, [], True),  # no value: not a result
        ({"outcome": "PRUNED"}, 1, TrialState.PRUNED, [], False),
        ({"outcome": "PREEMPTED", "steps": 40}, 1, TrialState.FAIL, [], True),
        ({"outcome": "FAIL", "error": "ValueError: bad", "retryable": False}, 1, TrialState.FAIL, [], False),
        ({"outcome": "FAIL", "error": "OSError: gone", "retryable": True}, 1, TrialState.FAIL, [], True),
        (
            {"outcome": "COMPLETE", "best_value": 0.5, "seed1/outcome": "COMPLETE", "seed1/best_value": 0.7},
            2,
            TrialState.COMPLETE,
            [0.6],
            False,
        ),
        ({"outcome": "COMPLETE", "best_value": 0.5}, 2, TrialState.FAIL, [], True),  # seed 1 never finished
    ],
    ids=[
        "nothing",
        "complete",
        "complete-no-value",
        "pruned",
        "preempted",
        "config-fail",
        "retryable-fail",
        "two-seeds",
        "one-of-two-seeds",
    ],
)
def test_orphan_verdict_from_the_record(
    attrs: dict, seeds: int, state: TrialState, values: list, requeue: bool
) -> None:
    verdict = orphan_verdict(attrs, seeds, values_of, WHY)
    assert (verdict.state, verdict.requeue) == (state, requeue)
    assert verdict.values == pytest.approx(values)
    if state == TrialState.FAIL:
        assert verdict.reason and (
            "ValueError: bad" in verdict.reason if attrs.get("error") == "ValueError: bad" else WHY in verdict.reason
        )


@pytest.mark.parametrize(
    "attrs, values, failure, cancelled, state, requeue, reason",
    [
        ({"outcome": "COMPLETE"}, [0.5], None, False, TrialState.COMPLETE, False, ""),
        ({"outcome": "COMPLETE"}, None, None, False, TrialState.FAIL, False, "without a finite eval/exact_accuracy"),
        ({"outcome": "PRUNED"}, None, None, False, TrialState.PRUNED, False, ""),
        ({"outcome": "PREEMPTED", "steps": 40}, None, None, False, TrialState.FAIL, True, "preempted at step 40"),
        (
            {"outcome": "FAIL", "error": "OSError: peer gone", "retryable": True},
            None,
            "worker-1 exited",
            False,
            TrialState.FAIL,
            True,
            "OSError: peer gone\nworker-1 exited",
        ),
        (
            {"outcome": "FAIL", "error": "OSError: peer gone", "retryable": True},
            None,
            None,
            True,
            TrialState.FAIL,
            False,
            "OSError",
        ),  # we stopped it
        (
            {"outcome": "FAIL", "error": "ValueError: arch.mixer='conv'", "retryable": False},
            None,
            None,
            False,
            TrialState.FAIL,
            False,
            "arch.mixer",
        ),
        ({}, None, "node-1 exited with code -9", False, TrialState.FAIL, True, "node-1 exited with code -9"),
        ({}, None, None, False, TrialState.FAIL, True, "exited with code 3 without recording an outcome"),
        ({}, None, None, True, TrialState.FAIL, False, "exited with code 3"),  # cancelled: already handled
    ],
    ids=[
        "complete",
        "complete-no-value",
        "pruned",
        "preempted",
        "retryable-fail",
        "retryable-fail-cancelled",
        "config-fail",
        "killed-worker",
        "no-outcome",
        "no-outcome-cancelled",
    ],
)
def test_job_verdict_from_the_record(
    attrs: dict,
    values: list | None,
    failure: str | None,
    cancelled: bool,
    state: TrialState,
    requeue: bool,
    reason: str,
) -> None:
    verdict = job_verdict(
        attrs, values, "eval/exact_accuracy", exit_code=3, launcher_failure=failure, cancelled=cancelled
    )
    assert (verdict.state, verdict.requeue) == (state, requeue)
    assert reason in verdict.reason
    assert verdict.values == (values if state == TrialState.COMPLETE else [])


def test_seed_attrs_strip_their_prefix() -> None:
    attrs = {"outcome": "COMPLETE", "best_value": 0.5, "seed1/outcome": "FAIL", "seed1/error": "x"}
    assert seed_attrs(attrs, 1) == {"outcome": "FAIL", "error": "x"}
    assert seed_attrs(attrs, 0)["outcome"] == "COMPLETE"


def test_attempt_attributes_are_recognised_under_seed_prefixes() -> None:
    assert attempt_attr("outcome") and attempt_attr("seed1/outcome") and attempt_attr("fail_reason")
    assert not attempt_attr("overrides") and not attempt_attr("workdir") and not attempt_attr("baseline")


def _storage(url: str):
    return open_storage(url, heartbeat_interval=1, grace_period=2)


@pytest.mark.slow
def test_a_trial_without_any_heartbeat_is_found_orphaned(pg_url: str) -> None:
    """Optuna's own stale check skips a RUNNING trial with no heartbeat row: it stayed RUNNING forever."""
    storage = _storage(pg_url)
    study = optuna.create_study(study_name="orphans-found", storage=storage)
    silent = study.ask()  # a driver that died before its first beat
    beating = study.ask()
    storage.record_heartbeat(trial_id_of(beating))
    assert orphaned_trials(study, grace_s=1.0) == []  # too young to judge
    time.sleep(1.5)
    storage.record_heartbeat(trial_id_of(beating))
    found = orphaned_trials(study, grace_s=1.0)
    assert [(t.number, why) for t, why in found] == [(silent.number, "its driver died before its first heartbeat")]
    time.sleep(1.5)  # now the beating one's driver has gone quiet too
    assert {t.number for t, _ in orphaned_trials(study, grace_s=1.0)} == {silent.number, beating.number}


def test_a_driver_with_a_shorter_grace_waits_out_the_running_drivers_grace(tmp_path: Path) -> None:
    """A second driver started with heartbeat.grace_s=3 failed a live driver's trials (beating every 5 s) between
    two beats, three times over, until the configuration had used its retries. A trial now carries its own
    driver's grace (HEARTBEAT_GRACE_ATTR), and another driver waits the longer of the two."""
    storage = _storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="graces", storage=storage)
    patient, unmarked = study.ask(), study.ask()
    storage.set_trial_system_attr(trial_id_of(patient), HEARTBEAT_GRACE_ATTR, 30.0)  # its driver beats slowly
    for trial in (patient, unmarked):
        storage.record_heartbeat(trial_id_of(trial))
    time.sleep(2.1)  # the database's clock (SQLite: whole seconds) more than a second past the beats
    found = orphaned_trials(study, grace_s=1.0)
    assert [(t.number, why) for t, why in found] == [(unmarked.number, "its driver died (no heartbeat for over 1 s)")]


def test_an_orphan_that_never_beat_trained_nothing_and_its_retry_carries_no_mark(tmp_path: Path) -> None:
    """A driver writes a trial's first heartbeat before its job starts: an orphan without one trained nothing. It is
    FAIL marked not_started (no budget, left out of sweeps.status), and its retry, queued with the same parameters
    and Optuna's copy of its attributes, carries no mark (it is to train). An orphan that beat keeps its FAIL."""
    storage = _storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="never-beat", storage=storage, direction="maximize")
    lr = {"optim.lr": optuna.distributions.CategoricalDistribution([0.01, 0.02])}
    silent, beating = study.ask(lr), study.ask(lr)
    storage.record_heartbeat(trial_id_of(beating))
    time.sleep(1.1)  # the database's clock (SQLite: whole seconds) past the beat
    settle(study, storage, SearchSpace(dict(lr)))
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.WAITING, TrialState.WAITING]
    assert trials[silent.number].user_attrs[NOT_STARTED_ATTR] == NO_FIRST_HEARTBEAT
    assert NOT_STARTED_ATTR not in trials[beating.number].user_attrs  # its job may have trained
    retry = next(t for t in trials[2:] if silent.number in t.system_attrs["retry_history"])
    assert retry.params == trials[silent.number].params and NOT_STARTED_ATTR not in retry.user_attrs
    assert [t.number for t in trained_trials(trials)] == [beating.number, 2, 3] and budget_used(trials) == 0
    (shown,) = collect(storage, "never-beat")
    assert shown["counts"] == {"COMPLETE": 0, "PRUNED": 0, "FAIL": 1, "RUNNING": 0, "WAITING": 2}


def test_an_orphan_whose_draw_was_cut_trained_nothing_and_is_not_retried(tmp_path: Path) -> None:
    """The chaos suite's database restart cut a draw: the trial held one of the space's two parameters, was found
    orphaned, and its retry drew the other anew ("retry 9 of 3 has other parameters"). Such an orphan is FAIL,
    untrained (no budget), and not queued again; an orphan drawn whole is still retried with its parameters."""
    storage = _storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="cut-draw", storage=storage, direction="maximize")
    dists = {
        "optim.lr": optuna.distributions.CategoricalDistribution([0.01, 0.02]),
        "arch.H_cycles": optuna.distributions.CategoricalDistribution([1, 2]),
    }
    cut, whole = study.ask({"optim.lr": dists["optim.lr"]}), study.ask(dists)
    for trial in (cut, whole):
        storage.record_heartbeat(trial_id_of(trial))
    time.sleep(1.1)  # the database's clock (SQLite: whole seconds) past the beats
    settle(study, storage, SearchSpace(dists))
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.WAITING]
    assert trials[cut.number].user_attrs[NOT_STARTED_ATTR] == CUT_DRAW
    assert CUT_DRAW in trials[cut.number].user_attrs["fail_reason"]
    assert trials[2].system_attrs["retry_history"] == [whole.number] and trials[2].params == trials[whole.number].params
    assert budget_used(trials) == 0


def test_a_draw_is_whole_only_with_every_parameter_its_branch_takes() -> None:
    lr = optuna.distributions.CategoricalDistribution([0.01])
    mixer = optuna.distributions.CategoricalDistribution(["mlp", "attn"])
    heads = optuna.distributions.CategoricalDistribution([2, 4])
    space = SearchSpace(
        {"optim.lr": lr, "arch.mixer": mixer}, [Conditional("arch.mixer", "attn", {"arch.heads": heads})]
    )
    assert space.drawn_whole({"optim.lr": 0.01, "arch.mixer": "mlp"})
    assert space.drawn_whole({"optim.lr": 0.01, "arch.mixer": "attn", "arch.heads@attn": 2})
    assert not space.drawn_whole({"optim.lr": 0.01, "arch.mixer": "attn"})
    assert not space.drawn_whole({"arch.mixer": "mlp"}) and not space.drawn_whole({})


def settle(study: optuna.Study, storage: Any, space: SearchSpace) -> None:
    settle_orphans(
        study, storage, grace_s=0.0, max_retry=2, seeds=1, objective_values=values_of, ours=(), shares_filesystem=True,
        space=space,
    )  # fmt: skip


def _dead_driver_trial(url: str, study_name: str, attrs: dict[str, Any], beat: bool) -> int:
    """What a driver that died mid-trial leaves: a RUNNING trial with the study's params, maybe a heartbeat,
    and whatever its job stored."""
    storage = _storage(url)
    study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize")
    trial = study.ask({"optim.lr": optuna.distributions.CategoricalDistribution([0.01])})
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    if beat:
        storage.record_heartbeat(trial_id_of(trial))
    _date_back(storage, trial_id_of(trial), timedelta(seconds=10))  # past the driver's below (heartbeat.grace_s=2)
    return trial.number


def _date_back(storage: RDBStorage, trial_id: int, by: timedelta) -> None:
    """The trial's start and heartbeat moved `by` into the past, in Optuna's own tables (the columns that
    storage.heartbeat.orphaned_trials reads): a driver that died that long ago, without waiting that long. On
    PostgreSQL (interval arithmetic in SQL), as every caller's study is."""
    from optuna.storages._rdb import models

    trials, beats = models.TrialModel.__table__, models.TrialHeartbeatModel.__table__
    with storage.engine.begin() as conn:
        start = trials.c.datetime_start
        conn.execute(sqlalchemy.update(trials).where(trials.c.trial_id == trial_id).values(datetime_start=start - by))
        beat = beats.c.heartbeat
        conn.execute(sqlalchemy.update(beats).where(beats.c.trial_id == trial_id).values(heartbeat=beat - by))


def _run_driver(url: str, tmp_path: Path, study_name: str, *extra: str, space: dict | None = None) -> optuna.Study:
    cfg = sweep_config(
        url, tmp_path, f"study.name={study_name}", "n_trials=1", "pruner=none", "heartbeat.grace_s=2", *extra
    )
    from tests.test_sweeps import with_space

    Driver(typed_sweep(with_space(cfg, space or {"optim.lr": "choice(0.01)"}))).run()
    return optuna.load_study(study_name=study_name, storage=open_storage(url))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_trial_whose_driver_died_before_its_first_heartbeat_does_not_block_the_next_driver(
    pg_url: str, tmp_path: Path
) -> None:
    """Issue: the next, correct driver counted the silent RUNNING trial and looped forever."""
    number = _dead_driver_trial(pg_url, "silent-orphan", {}, beat=False)
    study = _run_driver(pg_url, tmp_path, "silent-orphan")
    trials = study.get_trials(deepcopy=False)
    assert trials[number].state == TrialState.FAIL
    assert "before its first heartbeat" in trials[number].user_attrs["fail_reason"]
    assert trials[number].user_attrs[NOT_STARTED_ATTR] == NO_FIRST_HEARTBEAT  # no job started: trained nothing
    retry = trials[number + 1]
    assert retry.state == TrialState.COMPLETE and retry.params == trials[number].params
    assert retry.user_attrs.get(NOT_STARTED_ATTR) is None and budget_used(trials) == 1
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("value_mode", ["best", "last"])
def test_an_outcome_stored_before_the_driver_died_is_told_not_retrained(
    value_mode: str, pg_url: str, tmp_path: Path
) -> None:
    """Issue: with study.value=last the new driver failed the finished trial as stale, the retry resumed at its
    last step with no eval and was told FAIL, and the study ended with no completed trial."""
    stored = {"outcome": "COMPLETE", "best_value": 0.625, "final_metrics": {"eval/exact_accuracy": 0.5}, "steps": 20}
    number = _dead_driver_trial(pg_url, f"finished-orphan-{value_mode}", stored, beat=True)
    study = _run_driver(pg_url, tmp_path, f"finished-orphan-{value_mode}", f"study.value={value_mode}")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 1  # nothing re-queued, nothing trained again
    assert trials[number].state == TrialState.COMPLETE
    assert trials[number].value == (0.625 if value_mode == "best" else 0.5)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_retry_does_not_inherit_its_predecessors_outcome(pg_url: str, tmp_path: Path) -> None:
    """Issue: a retry showed the first attempt's `outcome` and `fail_reason`; a COMPLETE retry kept a stale
    fail_reason."""
    stored = {"outcome": "PREEMPTED", "steps": 10, "error": "preempted at step 10"}
    number = _dead_driver_trial(pg_url, "inherited", stored, beat=True)
    study = _run_driver(pg_url, tmp_path, "inherited")
    retry = study.get_trials(deepcopy=False)[number + 1]
    assert retry.state == TrialState.COMPLETE
    assert retry.user_attrs["outcome"] == "COMPLETE"
    assert retry.user_attrs.get("fail_reason") is None and retry.user_attrs.get("error") is None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_hung_job_is_stopped_failed_and_requeued(pg_url: str, tmp_path: Path) -> None:
    """Issue: a SIGSTOPped training process kept its trial RUNNING forever (the driver, not the job, beats).
    The job shows progress at start and at every log point; a job silent for stall_timeout_s is stopped (every
    worker), its trial failed with the reason, and a retry runs."""
    stopped: list[int] = []

    def stop_the_first_job() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not stopped:
            found = subprocess.run(
                ["pgrep", "-f", "trm.train.*sweep.study=hung"], capture_output=True, text=True
            ).stdout.split()
            if found:
                os.kill(int(found[0]), signal.SIGSTOP)
                stopped.append(int(found[0]))
            time.sleep(0.1)

    stopper = threading.Thread(target=stop_the_first_job, daemon=True)
    stopper.start()
    study = _run_driver(pg_url, tmp_path, "hung", "stall_timeout_s=20", "heartbeat.interval_s=1")
    stopper.join()
    assert stopped, "the job was never seen"
    first, retry = study.get_trials(deepcopy=False)[:2]
    assert first.state == TrialState.FAIL and "no progress for" in first.user_attrs["fail_reason"]
    assert "stall_timeout_s=20" in first.user_attrs["fail_reason"]
    assert retry.state == TrialState.COMPLETE and retry.params == first.params
    with pytest.raises(ProcessLookupError):
        os.kill(stopped[0], 0)  # the stopped worker was killed, not left behind


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_restarted_driver_draws_new_configurations(pg_url: str, tmp_path: Path) -> None:
    """Issue: with the fixed default seed a restarted driver drew the same parameters again (random sampler:
    trials 3-4 repeated trials 1-2). Each driver of a study gets its own seed: one trial each is enough, the second
    driver's first draw was the first driver's."""
    space = {"optim.lr": "tag(log, interval(1e-4, 1e-2))"}
    _run_driver(pg_url, tmp_path, "restarted", "n_trials=1", "sampler=random", space=space)
    study = _run_driver(pg_url, tmp_path, "restarted", "n_trials=2", "sampler=random", space=space)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    assert len({t.params["optim.lr"] for t in trials}) == 2
    assert study.user_attrs["drivers"] == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_configuration_the_study_has_is_not_trained_again(pg_url: str, tmp_path: Path) -> None:
    """A repeat that was not drawn again (draws.max_redraws=0, no enumeration: tests/test_draws.py has the
    default's redraws) is recorded as such and not trained; it does not use the budget; a space with nothing new
    left ends the study instead of looping."""
    space = {"optim.lr": "choice(0.01, 0.02)"}
    no_redraws = ("draws.max_redraws=0", "draws.enumerate_share=null")
    study = _run_driver(pg_url, tmp_path, "twins", "n_trials=3", "sampler=random", *no_redraws, space=space)
    trials = study.get_trials(deepcopy=False)
    trained = [t for t in trials if "duplicate_of" not in t.user_attrs]
    assert sorted(t.params["optim.lr"] for t in trained) == [0.01, 0.02]  # each configuration once
    assert all(t.state == TrialState.COMPLETE for t in trained)
    twins = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert twins and all(t.state == TrialState.FAIL and "not trained" in t.user_attrs["fail_reason"] for t in twins)
    assert all(trials[t.user_attrs["duplicate_of"]].params == t.params for t in twins)
    assert not any((Path(str(t.user_attrs.get("workdir", "/nonexistent")))).exists() for t in twins)  # no job ran


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_database_outage_during_a_draw_gives_the_slot_back(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue (the soak test hung, 2026-11-25): PostgreSQL restarted while the driver was drawing the next trial. The
    draw's error left the slot taken, so the driver showed progress forever and never started another trial. The
    outage is the error a restarting server gives SQLAlchemy, raised by the second draw; the rest is a real study."""
    import sqlalchemy

    from sweeps.trials import starts as starts_module

    real_draw, draws = starts_module.draw_within_budget, []

    def draw_during_a_restart(*args: Any, **kwargs: Any) -> Any:
        draws.append(len(draws))
        if len(draws) == 2:  # trial 0 has run; the database goes away as the driver draws trial 1
            raise sqlalchemy.exc.OperationalError("SELECT ...", {}, Exception("server closed the connection"))
        return real_draw(*args, **kwargs)

    monkeypatch.setattr(starts_module, "draw_within_budget", draw_during_a_restart)
    study = _run_driver(
        pg_url, tmp_path, "outage-draw", "n_trials=2", "storage_outage_backoff.first_s=0.1",
        space={"optim.lr": "choice(0.01, 0.02)"},
    )  # fmt: skip
    trained = [t for t in study.get_trials(deepcopy=False) if "duplicate_of" not in t.user_attrs]
    assert [t.state for t in trained] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert sorted(t.params["optim.lr"] for t in trained) == [0.01, 0.02] and len(draws) >= 3


def test_all_failed_counts_a_retry_chain_once_by_what_failed(tmp_path: Path) -> None:
    """One configuration failing three times (two retries) was "all 3 trials failed; most often (1x): ... queued
    again (retry 1 of 2), starts ove": each attempt counted, grouped by its retry note."""
    from sweeps.run import all_failed

    study = optuna.create_study(study_name="chain", storage=_storage(f"sqlite:///{tmp_path}/db.sqlite"))
    for note in [
        "queued again (retry 1 of 2), starts over (no checkpoint was written)",
        "queued again (retry 2 of 2), starts over (no checkpoint was written)",
        "not queued again: retried 2 time(s) (heartbeat.max_retry=2)",
    ]:
        trial = study.ask()
        trial.set_user_attr("fail_reason", f"[Errno 20] Not a directory: 'ck'; {note}")
        study.tell(trial, state=TrialState.FAIL)
        if note.startswith("queued again"):
            retry_callback(2)(study, study.trials[trial.number])
    assert all_failed(study) == (
        "study 'chain': all 1 trials failed (3 attempts with retries); most often (1x): [Errno 20] Not a directory: 'ck'"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_study_whose_trials_all_failed_exits_non_zero_saying_why(tmp_path: Path) -> None:
    """Issue: accepted input that failed every trial, and the driver exited 0."""
    diverging = [*FAST_TRIAL, "+arch.rms_norm_eps=-1.0"]  # passes every check, then NaN at the first step
    argv = sweep_overrides(
        f"sqlite:///{tmp_path}/db.sqlite",
        tmp_path / "out",
        "study=halting",
        "study.name=doomed",
        "n_trials=1",
        "pruner=none",
        f"hydra.run.dir={tmp_path}/h",
        trial=diverging,
    )
    proc = subprocess.run([sys.executable, "-m", "sweeps.run", *argv], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: study 'doomed': all 1 trials failed; most often (1x): NonFiniteLossError"), last


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dropped_database_stops_the_driver_saying_so(fresh_pg_url: str, pg_server_url: str, tmp_path: Path) -> None:
    """Issue: a dropped database made the driver retry forever ("invalid data in the commit")."""
    from tests.conftest import _pg_drop_db

    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=400"]
    argv = sweep_overrides(
        fresh_pg_url,
        tmp_path / "out",
        "study=halting",
        "study.name=dropped",
        "n_trials=1",
        "pruner=none",
        f"hydra.run.dir={tmp_path}/h",
        trial=slow,
    )
    log = tmp_path / "driver.log"
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweeps.run", *argv], stdout=open(log, "w"), stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 120
    while "trial 0 started" not in log.read_text():
        assert time.monotonic() < deadline and driver.poll() is None, log.read_text()[-2000:]
        time.sleep(0.2)
    _pg_drop_db(pg_server_url, fresh_pg_url)
    assert driver.wait(timeout=120) == 2, log.read_text()[-2000:]
    text = log.read_text()
    assert "error: " in text and "is gone: " in text and "does not exist" in text, text[-2000:]
    left = subprocess.run(
        ["pgrep", "-f", "trm.train.*sweep.study=dropped"], capture_output=True, text=True
    ).stdout.split()
    assert not left  # its job was stopped, not left training for a study that no longer exists
