"""A study survives its user: a driver that ends when its budget is used whatever is queued,
a study that remembers what defines it, Ctrl-C pressed twice, and failure lines that say what really happened."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from storage import open_storage, retry_callback, trial_id_of
from storage.record import NOT_STARTED_ATTR
from storage.study_record import StudyAttrs
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.interrupts import interrupt_once, signals_held
from sweeps.search.budget import budget_used
from sweeps.search.definition import StudyDefinitionError
from sweeps.search.draw import draw_within_budget
from sweeps.search.space import parse_space
from sweeps.status import collect
from sweeps.trials.retry import RESUMABLE, plan_retry, retry_of, visible_here
from tests.sweep_helpers import FAST_TRIAL, sweep_config, sweep_overrides, trial_file_exists
from tests.test_study_record import _date_back, _run_driver
from tests.test_sweeps import with_space
from tests.test_train import config
from trm.checkpoints import checkpoint
from trm.run_end import Outcome
from trm.train import run


def _sweep(url: str, tmp_path: Path, *extra: str, trial: list[str] | None = None, timeout: float = 150):
    """`python -m sweeps.run` to its end; TimeoutExpired (a failure) if it never ends."""
    argv = sweep_overrides(url, tmp_path / "out", "study=halting", f"hydra.run.dir={tmp_path}/h", *extra, trial=trial)
    return subprocess.run([sys.executable, "-m", "sweeps.run", *argv], capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ 1: the driver ends when its budget is used


def _finished(study: optuna.Study, value: float) -> None:
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=value))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", ["enqueued", "retry-past-a-smaller-n_trials"])
def test_the_driver_ends_when_the_budget_is_used_and_says_what_is_left_queued(path: str, tmp_path: Path) -> None:
    """Issue: a WAITING trial kept `study_done()` false while nothing would start it: the driver printed
    "... finished" every 20 s forever. Now it ends and names what is left and the n_trials that runs it."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    storage = open_storage(url)
    study = optuna.create_study(study_name="left", storage=storage, direction="maximize")
    if path == "enqueued":  # a finished 1-trial study, and a configuration enqueued by hand afterwards
        _finished(study, 0.5)
        study.enqueue_trial({}, user_attrs={"by": "hand"})
        n_trials, waiting, needed = 1, 1, 2
    else:  # an interrupted 3-trial study (its running trial failed, a retry queued), restarted with n_trials=2
        _finished(study, 0.5)
        _finished(study, 0.6)
        study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": "driver interrupted"}))
        retry_callback(2)(study, study.get_trials(deepcopy=False)[-1])
        n_trials, waiting, needed = 2, 3, 3
    proc = _sweep(url, tmp_path, "study.name=left", f"n_trials={n_trials}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = f"1 queued trial(s) left in study 'left' (trial {waiting}): the budget n_trials={n_trials} is used; "
    output = proc.stdout + proc.stderr
    assert line + f"start the driver again with n_trials={needed} to run them" in output, output[-3000:]
    states = [t.state for t in optuna.load_study(study_name="left", storage=url).trials]
    assert states[-1] == TrialState.WAITING and TrialState.RUNNING not in states  # kept, not run, not lost


# ------------------------------------------------------------------ 2: the study remembers what defines it


def _driver(url: str, tmp_path: Path, *extra: str, space: dict | None = None, trial: list[str] | None = None):
    cfg = sweep_config(url, tmp_path / "out", "study=halting", "study.name=defined", *extra, trial=trial)
    return Driver(typed_sweep(with_space(cfg, space or {"halting.exploration_prob": "interval(0.0, 0.5)"})))


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"space": {"halting.exploration_prob": "interval(0.0, 0.9)"}},
            "space halting.exploration_prob: float [0.0, 0.5] in the study, float [0.0, 0.9] here",
        ),
        (
            {"space": {"halting.exploration_prob": "interval(0.0, 0.5)", "optim.lr": "choice(0.001, 0.01)"}},
            "space optim.lr: absent in the study, choice(0.001, 0.01) here",
        ),
        ({"trial": [*FAST_TRIAL, "train.steps=40"]}, "train_steps: 20 in the study, 40 here"),
        ({"trial": [*FAST_TRIAL, "experiment=tiny_cpu", "train.steps=20"]}, 'experiment: "test_tiny" in the study'),
        ({"extra": ["pruner=median"]}, "pruner: {"),
        # A smaller eval judges trials otherwise; a wider model trains another thing (found mixed into one study).
        ({"trial": [*FAST_TRIAL, "train.eval_examples=8"]}, "overrides: none in the study, train.eval_examples=8 here"),
        ({"extra": ["study.value=last"]}, 'value: "best" in the study, "last" here'),
        ({"extra": ["study.seeds=2"]}, "seeds: 1 in the study, 2 here"),
    ],
    ids=["range", "new-parameter", "train-steps", "preset", "pruner", "overrides", "value", "seeds"],
)
def test_a_changed_definition_is_refused_naming_the_difference_and_the_ways_out(
    change: dict, expected: str, tmp_path: Path
) -> None:
    """Issue: other ranges, a new parameter, another train.steps or preset under the same study name were mixed
    into one study; the stored pruner was overwritten. Refused before any trial is asked; the override continues."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    first = _driver(url, tmp_path)
    study = first.open_study()
    stored = StudyAttrs.of(study.user_attrs)
    changed = (change.get("extra") or [], change.get("space"), change.get("trial"))
    with pytest.raises(StudyDefinitionError) as refused:
        _driver(url, tmp_path, *changed[0], space=changed[1], trial=changed[2]).open_study()
    message = str(refused.value)
    assert expected in message, message
    assert "choose a new study.name, or set study.allow_changed_definition=true" in message
    study = optuna.load_study(study_name="defined", storage=url)
    assert study.trials == []  # nothing asked
    assert StudyAttrs.of(study.user_attrs) == stored

    allowed = _driver(
        url, tmp_path, *changed[0], "study.allow_changed_definition=true", space=changed[1], trial=changed[2]
    )
    assert StudyAttrs.of(allowed.open_study().user_attrs).definition != stored.definition  # continued, as now defined
    _driver(url, tmp_path, *changed[0], space=changed[1], trial=changed[2]).open_study()  # the new one is stored


def test_where_and_how_a_job_runs_is_no_change_and_an_older_definition_continues(tmp_path: Path) -> None:
    """Progress bars, W&B, the runtime and the checkpoint place change no trial's result: not refused. A study
    stored before the overrides, value and seeds were part of its definition is compared on what it stored."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    study = _driver(url, tmp_path).open_study()
    where = [*FAST_TRIAL, "train.progress=true", "wandb.mode=disabled", "runtime.timeout_s=300"]
    _driver(url, tmp_path, trial=where).open_study()  # no StudyDefinitionError
    older = {
        k: v for k, v in StudyAttrs.of(study.user_attrs).definition.items() if k not in ("overrides", "value", "seeds")
    }
    StudyAttrs(definition=older).store(study.set_user_attr)
    _driver(url, tmp_path, "study.seeds=2").open_study()  # nothing stored to compare the seeds with


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_log_to_linear_is_refused_in_one_line_with_no_trial_left_running(tmp_path: Path) -> None:
    """Issue: a parameter changed from log to linear gave Optuna's traceback ("Cannot set different log
    configuration") after study.ask(), and the asked trial stayed RUNNING. Refused before asking, in one line;
    the override cannot help (one Optuna study cannot hold both)."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    study = _driver(url, tmp_path, space={"halting.exploration_prob": "tag(log, interval(0.01, 0.5))"}).open_study()
    log_scale = FloatDistribution(0.01, 0.5, log=True)
    study.add_trial(
        create_trial(
            state=TrialState.COMPLETE,
            value=0.5,
            params={"halting.exploration_prob": 0.1},
            distributions={"halting.exploration_prob": log_scale},
        )
    )
    for extra in ([], ["study.allow_changed_definition=true"]):  # halting's own range: interval(0.0, 0.5)
        proc = _sweep(url, tmp_path, "study.name=defined", "n_trials=2", *extra)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("error: study.name='defined' exists with another definition: "), last
        assert "space halting.exploration_prob: float [0.01, 0.5] log in the study, float [0.0, 0.5] here" in last
        assert "study.allow_changed_definition cannot help): choose a new study.name" in last
    assert [t.state for t in optuna.load_study(study_name="defined", storage=url).trials] == [TrialState.COMPLETE]


def test_a_trial_asked_and_not_sampled_is_failed_not_left_running(tmp_path: Path) -> None:
    """A study from before definitions were stored, drawn with an incompatible space (what sweeps/search/definition.py
    refuses earlier): the asked trial is FAIL with the reason, uses no budget, and the error is one line."""
    storage = open_storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    trial = study.ask({"optim.lr": FloatDistribution(1e-4, 1e-2, log=True)})
    study.tell(trial, 0.5)
    with pytest.raises(StudyDefinitionError, match=r"cannot take this search space: .*log configuration"):
        draw_within_budget(study, storage, parse_space({"optim.lr": "interval(1e-4, 1e-2)"}), 5)
    asked = study.get_trials(deepcopy=False)[-1]
    assert asked.state == TrialState.FAIL and "log configuration" in asked.user_attrs[NOT_STARTED_ATTR]
    assert asked.user_attrs["fail_reason"].startswith("asked, then not started: ")
    assert budget_used(study.get_trials(deepcopy=False)) == 1  # it trained nothing


def test_a_trial_enqueued_outside_the_space_fails_alone_and_the_draw_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An enqueued value the space does not list used to end the driver, telling the user to rename the study."""
    storage = open_storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="queued", storage=storage, direction="maximize")
    space = parse_space({"optim": "choice('adamw', 'lion')"})
    study.enqueue_trial({"optim": "sgd"})
    draw = draw_within_budget(study, storage, space, 5)
    queued, drawn = study.get_trials(deepcopy=False)
    assert queued.state == TrialState.FAIL and "'sgd'" in queued.user_attrs[NOT_STARTED_ATTR]
    assert draw.trial is not None and draw.trial.number == drawn.number == 1
    assert draw.sampled["optim"] in ("adamw", "lion")
    assert "trial 0 was enqueued with {'optim': 'sgd'}, which this study's space does not take" in caplog.text
    assert budget_used(study.get_trials(deepcopy=False)) == 1  # trial 1, RUNNING: trial 0 trained nothing


def test_a_trial_enqueued_outside_a_numeric_range_fails_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Optuna trains an enqueued number outside the range with only a warning: the study's record would hold a
    trial its space never searched. A value inside the range (the second one) trains as enqueued."""
    storage = open_storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="queued", storage=storage, direction="maximize")
    space = parse_space({"optim.lr": "interval(1e-4, 1e-2)", "arch.L_cycles": "range(2, 6, 2)"})
    study.enqueue_trial({"optim.lr": 0.1, "arch.L_cycles": 4})
    study.enqueue_trial({"optim.lr": 1e-3, "arch.L_cycles": 3})  # off the range's step
    study.enqueue_trial({"optim.lr": 1e-3, "arch.L_cycles": 4})
    draw = draw_within_budget(study, storage, space, 5)
    outside, off_step, inside = study.get_trials(deepcopy=False)
    assert outside.state == TrialState.FAIL and "0.1" in outside.user_attrs[NOT_STARTED_ATTR]
    assert off_step.state == TrialState.FAIL and "{'arch.L_cycles': 3}" in off_step.user_attrs[NOT_STARTED_ATTR]
    assert (
        "trial 0 was enqueued with {'optim.lr': 0.1}, outside this study's space (optim.lr: float [0.0001, 0.01])"
        in (caplog.text)
    )
    assert draw.trial is not None and draw.trial.number == inside.number == 2
    assert draw.sampled == {"optim.lr": 1e-3, "arch.L_cycles": 4}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_driver_ending_on_an_error_stops_and_records_its_running_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch that fails while another trial trains ends the driver: its job used to train on with no driver,
    its trial RUNNING until another driver found it orphaned."""
    from sweeps.launchers.local import LocalLauncher

    launch = LocalLauncher.launch
    calls = []

    def second_refused(self: LocalLauncher, spec: object) -> object:
        calls.append(spec)
        if len(calls) == 2:
            raise FileExistsError("the trial's directory is a file")
        return launch(self, spec)  # type: ignore[arg-type]

    monkeypatch.setattr(LocalLauncher, "launch", second_refused)
    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=5000"]
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with pytest.raises(FileExistsError):
        _driver(url, tmp_path, "n_trials=2", "max_concurrent=2", "study.enqueue_baseline=false", trial=slow).run()
    assert not _jobs("defined")
    first, second, retry = optuna.load_study(study_name="defined", storage=url).trials
    assert first.state == TrialState.FAIL and first.user_attrs["fail_reason"].startswith(
        "driver ending on FileExistsError; queued again (retry 1 of 2)"
    )
    assert second.state == TrialState.FAIL and NOT_STARTED_ATTR in second.user_attrs
    assert retry.state == TrialState.WAITING and retry.params == first.params  # the same command continues it


@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["first-heartbeat", "launch"])
def test_a_trial_drawn_and_then_not_launched_is_failed_once(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error between the draw and the job's start (the first heartbeat cannot be written) fails the asked trial
    at once, with the error, instead of leaving it RUNNING until it is found orphaned; a failed launch, which tells
    its own reason, is told once."""
    from storage import HeartbeatThread
    from sweeps.launchers.local import LocalLauncher

    def refused(*args: object) -> None:
        raise RuntimeError(f"refused at the {where}")

    monkeypatch.setattr(
        HeartbeatThread if where == "first-heartbeat" else LocalLauncher,
        "start" if where == "first-heartbeat" else "launch",
        refused,
    )
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with pytest.raises(RuntimeError, match=f"refused at the {where}"):
        _driver(url, tmp_path, "n_trials=1").run()
    (trial,) = optuna.load_study(study_name="defined", storage=url).trials
    assert trial.state == TrialState.FAIL
    if where == "launch":
        assert trial.user_attrs["fail_reason"] == f"launch failed: RuntimeError: refused at the {where}"
    assert f"refused at the {where}" in trial.user_attrs[NOT_STARTED_ATTR] and budget_used([trial]) == 0
    (shown,) = collect(open_storage(url), "defined")
    assert shown["counts"]["FAIL"] == 0 and shown["trials"] == []  # it trained nothing: not in our counts


# ------------------------------------------------------------------ 3: Ctrl-C, twice


def _jobs(study_name: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"trm.train.*sweep.study={study_name}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_quick_ctrl_c_leave_no_job_and_no_trial_running(tmp_path: Path) -> None:
    """Issue: a second SIGINT interrupted the stop (`process.wait` in JobHandle._stop_all): a job trained on in its
    own session and both trials stayed RUNNING with nothing recorded. Now the stop cannot be cut short, and the
    driver ends with one line instead of a traceback. CI: a SIGINT that came as the driver exited killed it (-2);
    once the stop is done, further ones are ignored and the exit is 130."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=5000"]
    argv = sweep_overrides(
        url, tmp_path / "out", "study=halting", "study.name=twice", "n_trials=2", "max_concurrent=2",
        "pruner=none", "study.enqueue_baseline=false", f"hydra.run.dir={tmp_path}/h", trial=slow,
    )  # fmt: skip
    log = tmp_path / "driver.log"
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweeps.run", *argv], stdout=open(log, "w"), stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 240
        while not all(trial_file_exists(tmp_path / "out" / "twice", n, "run/metrics.jsonl") for n in (0, 1)):
            assert time.monotonic() < deadline and driver.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert len(_jobs("twice")) == 2
        driver.send_signal(signal.SIGINT)
        # Ctrl-C held down: while the jobs are waited on after their SIGTERM, while the trials are recorded, and
        # while the driver exits (a SIGINT in Python's finalization once killed it with -2 instead of 130).
        deadline = time.monotonic() + 180
        while driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
            if driver.poll() is None:
                driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=5) == 130, log.read_text()[-3000:]
    finally:
        driver.kill()
        left = _jobs("twice")
        for pid in left:  # never leave them training on the machine, whatever the assertions say
            os.kill(pid, signal.SIGKILL)
    assert not left, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and text.strip().splitlines()[-1].startswith("interrupted (SIGINT): every job"), (
        text[-3000:]
    )
    trials = optuna.load_study(study_name="twice", storage=url).trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.WAITING, TrialState.WAITING]
    for trial in trials[:2]:
        assert trial.user_attrs["fail_reason"].startswith("driver interrupted; queued again (retry 1 of 2), ")


def test_a_held_signal_arrives_after_the_block_and_only_the_first_interrupts(
    capsys: pytest.CaptureFixture,
) -> None:
    """signals_held: a Ctrl-C during the block is delivered when it ends, never inside it. InterruptOnce: the
    first signal raises KeyboardInterrupt, later ones print one line and return."""
    finished = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Python's own handler before the block. A run started in the background by a shell without job control
        # (`make test &`) inherits SIGINT ignored, and the signal held would then be delivered to SIG_IGN.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.raises(KeyboardInterrupt), signals_held():
            signal.raise_signal(signal.SIGINT)
            finished.append("the block ran to its end")
        assert finished == ["the block ran to its end"]
        handler = interrupt_once()
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)  # ignored: no exception
        signal.raise_signal(signal.SIGINT)
        assert handler is not None and handler.received == 3
        assert capsys.readouterr().err.count("SIGINT ignored: the driver is already stopping") == 1
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ------------------------------------------------------------------ 4: lines that say what really happened


@pytest.mark.parametrize("max_retry, used, queued", [(0, 0, False), (2, 0, True), (2, 1, True), (2, 2, False)])
def test_a_retry_plan_says_what_optunas_callback_does(max_retry: int, used: int, queued: bool, tmp_path: Path) -> None:
    """The note is decided by the rule of Optuna's retry callback, which then runs: the two must agree."""
    study = optuna.create_study(storage=open_storage(f"sqlite:///{tmp_path}/db.sqlite"))
    for _ in range(used + 1):  # a chain of `used` retries, its last attempt failed
        study.add_trial(create_trial(state=TrialState.FAIL, system_attrs=_chain_attrs(study)))
    failed = study.trials[-1]  # a copy: Optuna's callback appends to the retry history of the trial it is given
    (tmp_path / "ckpt").mkdir()
    plan = plan_retry(failed, max_retry, str(tmp_path / "ckpt"))
    retry_callback(max_retry)(study, study.trials[-1])
    assert plan.queued == queued == (study.get_trials(deepcopy=False)[-1].state == TrialState.WAITING)
    if not queued:
        expected = "heartbeat.max_retry=0" if max_retry == 0 else f"retried {used} time(s) (heartbeat.max_retry=2)"
        assert plan.note == f"not queued again: {expected}"
    else:
        assert plan.note == f"queued again (retry {used + 1} of 2), starts over (no checkpoint was written)"
        (tmp_path / "ckpt" / checkpoint.PREVIOUS).write_bytes(b"")
        assert plan_retry(failed, max_retry, str(tmp_path / "ckpt")).note.endswith(", resumes from its checkpoint")


def test_a_retrys_start_line_says_whether_it_resumes(tmp_path: Path) -> None:
    """Issue: every retry's line said "resuming from its checkpoint", also where none was written."""
    assert retry_of(4, 4, str(tmp_path)) == ""  # a chain's first trial is no retry
    assert retry_of(5, 4, str(tmp_path)) == " (retry of trial 4, starts over (no checkpoint was written))"
    (tmp_path / checkpoint.LATEST).write_bytes(b"")
    assert retry_of(5, 4, str(tmp_path)) == " (retry of trial 4, resumes from its checkpoint)"
    assert retry_of(5, 4, "nosuchprotocol://x").endswith("resumes from its checkpoint if one was written)")


def test_a_pods_local_checkpoints_are_not_judged_from_the_drivers_disk(tmp_path: Path) -> None:
    """site=pod keeps checkpoints on worker 0's disk (checkpoint_root: runs): the driver, looking on its own disk,
    said "starts over (no checkpoint was written)" of every retry. A path is looked into only where the workers
    share this machine's disk; a store's URL always."""
    assert visible_here("runs/halting/0123abcd/trial-3/checkpoints", shares_filesystem=False) is None
    assert visible_here(str(tmp_path), shares_filesystem=True) == str(tmp_path)
    assert visible_here("gs://bucket/ck", shares_filesystem=False) == "gs://bucket/ck"
    assert visible_here(f"file://{tmp_path}", shares_filesystem=False) is None
    assert retry_of(5, 4, visible_here("runs/x", shares_filesystem=False)).endswith(
        "resumes from its checkpoint if one was written)"
    )


def _chain_attrs(study: optuna.Study) -> dict:
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return {}
    return {"failed_trial": trials[0].number, "retry_history": [t.number for t in trials]}


def test_the_driver_looks_for_the_files_a_run_resumes_from() -> None:
    assert set(RESUMABLE) == {checkpoint.LATEST, checkpoint.PREVIOUS}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("max_retry", [0, 1])
def test_an_orphan_with_no_retry_left_is_not_said_to_be_queued(max_retry: int, pg_url: str, tmp_path: Path) -> None:
    """Issue: with no retry left the line said "queued again, resumes from its checkpoint"; nothing was queued."""
    name = f"no-retry-left-{max_retry}"
    storage = open_storage(pg_url, heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    if max_retry:  # the dead driver's trial is the first retry of trial 0
        study.add_trial(create_trial(state=TrialState.FAIL))
    trial = study.ask({"optim.lr": optuna.distributions.CategoricalDistribution([0.01])})
    trial.set_user_attr("checkpoint_url", str(tmp_path / "none"))
    if max_retry:
        storage.set_trial_system_attr(trial_id_of(trial), "failed_trial", 0)
        storage.set_trial_system_attr(trial_id_of(trial), "retry_history", [0])
    storage.record_heartbeat(trial_id_of(trial))
    number = trial.number
    _date_back(storage, trial_id_of(trial), timedelta(seconds=10))  # past the driver's grace (heartbeat.grace_s=2)
    study = _run_driver(pg_url, tmp_path, name, f"heartbeat.max_retry={max_retry}")
    trials = study.get_trials(deepcopy=False)
    expected = "heartbeat.max_retry=0" if max_retry == 0 else "retried 1 time(s) (heartbeat.max_retry=1)"
    assert (
        trials[number]
        .user_attrs["fail_reason"]
        .endswith(f"its job recorded no outcome to keep; not queued again: {expected}")
    )
    assert not [t for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)]


def _real_errno(code: int) -> OSError:
    """An OSError from a real system call where one gives it (a write to /dev/full), else built with the code."""
    if code == errno.ENOSPC:
        try:
            with open("/dev/full", "wb") as full:
                full.write(b"x")
        except OSError as err:
            return err
    return OSError(code, os.strerror(code))


@pytest.mark.parametrize(
    "code, said", [(errno.ENOSPC, "no space left on the device (ENOSPC)"), (errno.EACCES, "permission denied (EACCES)"),
                   (errno.EPERM, "operation not permitted (EPERM)"), (errno.ENOTDIR, "not a directory (ENOTDIR)")],
)  # fmt: skip
def test_an_error_a_retry_would_meet_again_is_not_retried_and_says_so(code: int, said: str) -> None:
    outcome = Outcome()
    try:
        try:
            raise _real_errno(code)
        except OSError as err:
            raise checkpoint.CheckpointError(f"could not write checkpoint x/latest.pt: {err}") from err
    except checkpoint.CheckpointError as err:
        outcome.failed(err)
    assert not outcome.retryable
    assert outcome.error is not None and f"(not retried: {said} fails again on a retry" in outcome.error
    fix = "fix the path" if code == errno.ENOTDIR else "free space or fix the rights"
    assert outcome.error.endswith(f"; {fix}, then run it again)")
    transient = Outcome()
    transient.failed(ConnectionResetError(errno.ECONNRESET, "peer gone"))
    assert transient.retryable and "not retried" not in str(transient.error)


def test_a_full_disk_at_a_checkpoint_write_is_a_failure_not_worth_a_retry(tmp_path: Path, data_root: Path) -> None:
    """Issue: on a full disk each configuration was retried (a deterministic error), each retry "resuming from its
    checkpoint" where there was none. The checkpoint's temporary file is /dev/full: the kernel's ENOSPC."""
    (tmp_path / "checkpoints").mkdir(parents=True)
    (tmp_path / "checkpoints" / f"{checkpoint.LATEST}.tmp-{os.getpid()}").symlink_to("/dev/full")
    with pytest.raises(checkpoint.CheckpointError, match=r"No space left on device"):
        run(config(tmp_path, data_root, "train.steps=20"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["outcome"] == "FAIL" and summary["retryable"] is False
    assert "(not retried: no space left on the device (ENOSPC) fails again on a retry" in summary["error"]


def test_a_trial_another_driver_settles_before_it_starts_is_drawn_again_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Between a draw and its start another driver may settle the trial (it saw no heartbeat within its grace,
    on a loaded machine): writing the start then raised UpdateFinishedTrialError and ended this driver."""
    import sweeps.trials.starts as starts_module
    from sweeps.search.draw import Draw

    db = f"sqlite:///{tmp_path}/db.sqlite"
    driver = Driver(typed_sweep(sweep_config(db, tmp_path, "study=halting", "n_trials=2")))
    study = driver.open_study()
    draws = []

    def draw_settled_by_another(*args: object) -> Draw:
        if draws:
            return Draw(None, {})  # the budget is spent: no second job is started here
        draws.append(draw := draw_within_budget(*args))  # type: ignore[arg-type]
        assert draw.trial is not None
        optuna.load_study(study_name=study.study_name, storage=db).tell(draw.trial.number, state=TrialState.FAIL)
        return draw

    monkeypatch.setattr(starts_module, "draw_within_budget", draw_settled_by_another)
    with caplog.at_level("WARNING", logger="sweeps"):
        driver.start_within_budget()
    assert not driver.running and len(draws) == 1
    assert f"trial {draws[0].trial.number} was settled by another driver before it started" in caplog.text
    assert driver.slot_pool.take() is not None  # the slot was handed back
