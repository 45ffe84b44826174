"""The study progress view (sweeps/trials/progress.py): its numbers from real Optuna studies, its quiet log lines and
terminal line, and what a real two-trial study logs."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from contracts.wandb_runs import summary_run_id, trial_run_id
from storage.record import DUPLICATE_OF_ATTR, PROGRESS_ATTR
from storage.study_record import StudyAttrs
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.trials.progress import ProgressView, duration, measure, route_optuna_logging
from tests.sweep_helpers import sweep_config
from tests.wandb_offline import find_runs, read_offline_run

T0 = datetime(2026, 1, 1, 12, 0, 0)
MAX, MIN = [StudyDirection.MAXIMIZE], [StudyDirection.MINIMIZE]


def trial(
    state: TrialState,
    start_s: float | None = None,
    took_s: float | None = None,
    value: float | list[float] | None = None,
    **attrs: Any,
) -> FrozenTrial:
    t = create_trial(
        state=state,
        value=value if not isinstance(value, list) else None,
        values=value if isinstance(value, list) else None,
        user_attrs=attrs.pop("user_attrs", {}),
        system_attrs=attrs.pop("system_attrs", {}),
    )
    t.datetime_start = T0 + timedelta(seconds=start_s) if start_s is not None else None
    t.datetime_complete = t.datetime_start + timedelta(seconds=took_s) if took_s is not None else None
    return t


def stored(*trials: FrozenTrial, directions: list[str] | None = None) -> list[FrozenTrial]:
    """The trials as a real in-memory study stores them (numbered, validated)."""
    study = optuna.create_study(directions=directions or ["maximize"])
    for t in trials:
        study.add_trial(t)
    return study.get_trials()


@pytest.fixture
def study_in_each_state() -> optuna.Study:
    """A real in-memory study with a trial in every state the driver leaves: complete, pruned, failed, a failure
    queued again (and its waiting retry), a refused duplicate draw, a running trial."""
    study = optuna.create_study(direction="maximize")
    for t in [
        trial(TrialState.COMPLETE, 0, 100, 0.5),  # 0
        trial(TrialState.COMPLETE, 100, 200, 0.8),  # 1
        trial(TrialState.PRUNED, 300, 60),  # 2
        trial(TrialState.FAIL, 360, 40),  # 3: failed for good
        trial(TrialState.FAIL, 400, 10),  # 4: failed, then queued again as trial 6
        trial(TrialState.FAIL, 405, 0, user_attrs={DUPLICATE_OF_ATTR: 1}),  # 5: a refused duplicate: trained nothing
        trial(TrialState.WAITING, system_attrs={"failed_trial": 4, "retry_history": [4]}),  # 6: the retry of 4
        trial(TrialState.RUNNING, 410),  # 7: running for 30 s at T0 + 440 s
    ]:
        study.add_trial(t)
    return study


def test_counts_best_and_eta_of_a_study_with_trials_in_every_state(study_in_each_state: optuna.Study) -> None:
    trials = study_in_each_state.get_trials()
    p = measure(trials, MAX, n_trials=8, max_concurrent=2, elapsed_s=440, now=T0 + timedelta(seconds=440))
    assert (p.complete, p.pruned, p.failed, p.retried, p.running, p.done) == (2, 1, 1, 1, 1, 4)
    assert (p.best_number, p.best_value, p.pareto) == (1, 0.8, None)
    # Mean of the finished trials (0-3): (100 + 200 + 60 + 40) / 4 = 100 s. Left: 8 - 4 done - 1 running = 3 not
    # started (300 s) and the running trial's 100 - 30 s; over 2 at once.
    assert p.eta_s == pytest.approx((3 * 100 + 70) / 2)
    assert p.line("s") == (
        "study s: 4/8 done (complete 2, pruned 1, failed 1 (+1 retried), running 1), best trial 1: 0.8000; "
        "elapsed 7m20s, ETA 3m05s"
    )
    assert p.short() == "4/8 done, running 1, best trial 1: 0.8000, ETA 3m05s"

    # Minimizing, the best is the other complete trial; one at a time, the same work takes twice as long.
    p = measure(trials, MIN, n_trials=8, max_concurrent=1, elapsed_s=440, now=T0 + timedelta(seconds=440))
    assert (p.best_number, p.best_value) == (0, 0.5) and p.eta_s == pytest.approx(370)
    # A running trial past the mean adds nothing; more trials running (other drivers) than max_concurrent share the work.
    p = measure(trials, MAX, n_trials=8, max_concurrent=1, elapsed_s=0, now=T0 + timedelta(seconds=410 + 500))
    assert p.eta_s == pytest.approx(300)


def test_a_long_retry_past_the_mean_is_timed_at_its_own_pace_not_as_nearly_done(
    study_in_each_state: optuna.Study,
) -> None:
    """The ETA read "0s" for minutes while a 1,500-step retry trained: it had outlived the mean of short trials."""
    trials = study_in_each_state.get_trials()
    running = trials[7]  # resumed at step 1,000 of 1,500; 100 steps in its first 50 s of logging
    running.user_attrs[PROGRESS_ATTR] = {"step": 1100, "at": 1050.0, "first_step": 1000, "first_at": 1000.0}
    now = T0 + timedelta(seconds=410 + 500)  # 500 s in: past the 100 s mean
    p = measure(trials, MAX, n_trials=8, max_concurrent=1, elapsed_s=0, now=now, steps=1500)
    assert p.eta_s == pytest.approx(300 + 400 * 50 / 100)  # 3 not started + its 400 steps at 2 steps/s
    assert measure(trials, MAX, n_trials=8, max_concurrent=1, elapsed_s=0, now=now).eta_s == pytest.approx(300)


def test_eta_is_unknown_before_the_first_finished_trial_and_the_end_says_finished() -> None:
    running = stored(trial(TrialState.RUNNING, 0), trial(TrialState.RUNNING, 5))
    p = measure(running, MAX, n_trials=4, max_concurrent=2, elapsed_s=12, now=T0 + timedelta(seconds=12))
    assert p.eta_s is None and p.best_number is None
    assert (
        p.line("s")
        == "study s: 0/4 done (complete 0, pruned 0, failed 0, running 2), no complete trial yet; elapsed 12s, ETA unknown"
    )

    done = stored(trial(TrialState.COMPLETE, 0, 30, 0.1), trial(TrialState.PRUNED, 30, 10))
    p = measure(done, MAX, n_trials=2, max_concurrent=1, elapsed_s=40, now=T0 + timedelta(seconds=40))
    assert p.finished and p.eta_s == 0 and p.short() == "2/2 done, running 0, best trial 0: 0.1000, finished"


def test_a_pareto_study_shows_its_front() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values in ([0.9, 10.0], [0.8, 5.0], [0.7, 20.0], [0.8, 5.0]):  # the third is dominated by both first
        study.add_trial(trial(TrialState.COMPLETE, 0, 10, values))
    p = measure(study.get_trials(), study.directions, n_trials=4, max_concurrent=1, elapsed_s=40, now=T0)
    assert p.pareto == len(study.best_trials) == 3  # optuna agrees (the repeated point is on the front twice)
    assert "Pareto front 3 trials" in p.line("s")


def test_durations() -> None:
    assert [duration(s) for s in (0, 42.4, 60, 307, 3599, 3600, 7380)] == [
        "0s",
        "42s",
        "1m00s",
        "5m07s",
        "59m59s",
        "1h00m",
        "2h03m",
    ]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class CountingStudy:
    """A real study that counts how often the view reads its trials (each read is a database query)."""

    def __init__(self, study: optuna.Study):
        self.study, self.reads = study, 0

    @property
    def directions(self) -> list[StudyDirection]:
        return self.study.directions

    def get_trials(self, deepcopy: bool = True) -> list[FrozenTrial]:
        self.reads += 1
        return self.study.get_trials(deepcopy=deepcopy)


def sweeps_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sweeps"]


def test_not_a_terminal_one_quiet_line_per_interval(
    study_in_each_state: optuna.Study, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sweeps")
    clock, study = Clock(), CountingStudy(study_in_each_state)
    view = ProgressView("s", 8, 2, interval_s=60, tty=False, clock=clock, now=lambda: T0 + timedelta(seconds=440))
    seen = []
    for t in (0, 1, 30, 59.9, 60.1, 61, 100, 120.2, 121):
        clock.t = 1000.0 + t
        view.tick(study)
        seen.append(len(sweeps_lines(caplog)))
    assert seen == [0, 0, 0, 0, 1, 1, 1, 2, 2]
    assert study.reads == 2  # the study is read only when a line is due
    assert sweeps_lines(caplog)[0].startswith(
        "study s: 4/8 done (complete 2, pruned 1, failed 1 (+1 retried), running 1)"
    )

    # A state change: the driver's line gets the study's state; the view logs nothing of its own.
    assert view.note(study) == " [4/8 done, running 1, best trial 1: 0.8000, ETA 3m05s]"
    assert len(sweeps_lines(caplog)) == 2
    # The end: one final line.
    view.close(study)
    assert len(sweeps_lines(caplog)) == 3 and sweeps_lines(caplog)[-1].startswith("study s: 4/8 done")


def test_in_a_terminal_one_line_redrawn_at_most_every_refresh(
    study_in_each_state: optuna.Study, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sweeps")
    clock, study, out = Clock(), CountingStudy(study_in_each_state), io.StringIO()
    handlers = list(logging.getLogger().handlers)
    view = ProgressView(
        "s",
        8,
        2,
        interval_s=60,
        tty=True,
        stream=out,
        refresh_s=2.0,
        clock=clock,
        now=lambda: T0 + timedelta(seconds=440),
    )
    for t in (0, 0.5, 1.9, 2.1, 3, 200):
        clock.t = 1000.0 + t
        view.tick(study)
    assert study.reads == 3  # drawn at 0, 2.1 and 200: never a log line for it
    assert sweeps_lines(caplog) == []
    drawn = out.getvalue()
    assert "\n" not in drawn and drawn.count("\r") >= 3  # one line, redrawn in place
    last = drawn.rsplit("\r", 1)[-1]
    assert re.search(
        r"study s: 4/8 done \|\S+\s*\| complete 2, pruned 1, failed 1 \(\+1 retried\), running 1 \| best trial 1: 0.8000 \| "
        r"elapsed 3m20s, ETA 3m05s",
        last,
    ), last
    view.close(study)
    assert logging.getLogger().handlers == handlers  # the console handlers write directly again
    assert out.getvalue().endswith("\n") and len(sweeps_lines(caplog)) == 1  # the line is left, and one log line


class Collect(logging.Handler):
    """A handler on the root logger, as Hydra's console and log-file handlers are."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def root_handler() -> Iterator[Collect]:
    """A root handler for the test, with Optuna's logging as Optuna sets it up before and after (an earlier
    test's driver may have routed it, another may have lowered its verbosity)."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    optuna.logging.disable_propagation()
    optuna.logging.enable_default_handler()
    handler, root = Collect(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)
    optuna.logging.disable_propagation()
    optuna.logging.enable_default_handler()
    optuna.logging.set_verbosity(verbosity)


def optuna_lines(handler: Collect) -> list[str]:
    return [r.getMessage() for r in handler.records if r.name.startswith("optuna")]


def test_optuna_lines_go_through_the_drivers_handlers(root_handler: Collect, capfd: pytest.CaptureFixture) -> None:
    optuna.create_study(study_name="before")
    assert optuna_lines(root_handler) == []  # Optuna's own handler printed it, in its own format
    assert "] A new study created in memory with name: before" in capfd.readouterr().err
    route_optuna_logging()
    optuna.create_study(study_name="after")
    assert optuna_lines(root_handler) == ["A new study created in memory with name: after"]
    assert "A new study created" not in capfd.readouterr().err  # and only there


@pytest.fixture
def offline_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.slow
def test_a_study_logs_one_line_per_trial_state_change_and_quiet_progress_lines(
    tmp_path: Path,
    data_root: Path,
    offline_env: None,
    root_handler: Collect,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
) -> None:
    """A real two-trial study, not in a terminal: what its log says, and the W&B runs a restarted driver leaves."""
    monkeypatch.setenv("TRM_DATA_DIR", str(data_root))
    caplog.set_level(logging.INFO)
    cfg = sweep_config(
        f"sqlite:///{tmp_path}/optuna.db",
        tmp_path,
        "study=halting",
        "study.name=progress",
        "wandb.enabled=true",  # sweep_overrides turns W&B off: this test reads the runs
        "n_trials=2",
        "pruner=none",
        "progress_interval_s=1",
    )
    study = Driver(typed_sweep(cfg)).run()
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE], [
        t.user_attrs for t in study.trials
    ]

    lines = sweeps_lines(caplog)
    started = [line for line in lines if re.match(r"trial \d+ started", line)]
    ended = [line for line in lines if re.match(r"trial \d+ (COMPLETE|PRUNED|FAIL)", line)]
    assert [line.split()[1] for line in started] == ["0", "1"] and [line.split()[1] for line in ended] == ["0", "1"]
    assert started[0].endswith("[0/2 done, running 1, no complete trial yet, ETA unknown]")
    assert re.search(r"\[1/2 done, running 0, best trial 0: \d\.\d{4}, ETA \w+\]$", ended[0]), ended[0]
    assert re.search(r"\[2/2 done, running 0, best trial \d: \d\.\d{4}, finished\]$", ended[1]), ended[1]
    assert not [line for line in lines if line.startswith("  trial")]  # no per-running-trial lines any more
    progress = [line for line in lines if line.startswith("study progress: ")]
    assert progress and all(
        re.match(r"study progress: [0-2]/2 done \(complete [0-2], pruned 0, failed 0, running [01]\), ", p)
        for p in progress
    )
    assert lines[-1].startswith("study progress: 2/2 done (complete 2, pruned 0, failed 0, running 0)") and lines[
        -1
    ].endswith("finished")
    # Optuna's line came through the driver's handlers, not printed to stderr in Optuna's own format.
    assert any("A new study created in RDB with name: progress" in line for line in optuna_lines(root_handler))
    assert "A new study created" not in capfd.readouterr().err

    # W&B: each trial's run has its deterministic id; a restarted driver logs the same summary run again.
    uid = StudyAttrs.of(study.user_attrs).uid
    Driver(typed_sweep(cfg)).run()  # the budget is spent: it trains nothing and updates the summary
    runs = {p: read_offline_run(p) for p in find_runs(tmp_path)}
    ids = sorted(run.run_id for run in runs.values())
    assert ids == sorted([trial_run_id(uid, 0), trial_run_id(uid, 1), summary_run_id(uid), summary_run_id(uid)]), ids
    summaries = [run for run in runs.values() if run.job_type == "study-summary"]
    assert len({run.path for run in summaries}) == 2 and {run.name for run in summaries} == {"progress-summary"}
