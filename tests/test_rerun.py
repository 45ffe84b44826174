"""Fix it, then run the same command (sweeps/trials/rerun.py, issue 45.2): a failure the study was told the same command
would run again is queued again, first, by that command, and resumes from its checkpoint; no other failure is."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from contracts.metrics_log import read_metrics
from storage import open_storage
from storage.record import DUPLICATE_OF_ATTR, JOB_ERROR_ATTR, NOT_STARTED_ATTR, RUN_AGAIN_ATTR
from sweeps.search.budget import budget_used
from sweeps.trials.rerun import queue_failed_again, to_run_again
from tests.sweep_helpers import FAST_TRIAL, summary_of, sweep_overrides, trial_dir, trial_file_exists
from trm.run_end import Outcome

DIST = {"optim.lr": CategoricalDistribution([0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007])}


def test_only_a_failure_told_to_run_again_is_queued_again_and_no_longer_counted(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")

    def add(lr: float, state: TrialState, **attrs: object) -> None:
        value = 0.5 if state == TrialState.COMPLETE else None
        study.add_trial(
            create_trial(params={"optim.lr": lr}, distributions=DIST, state=state, value=value, user_attrs=attrs)
        )

    add(0.001, TrialState.COMPLETE)
    add(0.002, TrialState.FAIL, **{RUN_AGAIN_ATTR: True, "error": "OSError: [Errno 28] ... then run it again"})
    add(0.003, TrialState.FAIL, **{RUN_AGAIN_ATTR: True, "fail_reason": "driver interrupted; not queued again"})
    add(0.004, TrialState.FAIL, **{"outcome": "FAIL", "retryable": False, RUN_AGAIN_ATTR: False})  # its own error
    add(0.005, TrialState.FAIL, **{JOB_ERROR_ATTR: "ValueError: runtime.device=cuda"})  # would repeat
    add(0.006, TrialState.FAIL, **{"fail_reason": "stalled; not queued again: retried 2 time(s)"})  # retries spent
    add(0.007, TrialState.FAIL, **{RUN_AGAIN_ATTR: True, DUPLICATE_OF_ATTR: 0})  # trained nothing
    add(0.007, TrialState.FAIL, **{RUN_AGAIN_ATTR: True, NOT_STARTED_ATTR: "outside the space"})
    assert [t.number for t in to_run_again(study.get_trials())] == [1, 2]
    used = budget_used(study.get_trials())
    assert queue_failed_again(study, storage) == [1, 2]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.params for t in waiting] == [{"optim.lr": 0.002}, {"optim.lr": 0.003}]
    assert budget_used(study.get_trials()) == used - 2  # the copies stand for them: not counted twice
    assert queue_failed_again(study, storage) == []  # the next start: they are retried already


NO_GPU = "ValueError: runtime.device=cuda but torch sees no GPU (torch.cuda.is_available() is False)"


def test_a_failure_that_stopped_the_study_is_run_again_with_every_trial_that_met_its_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 57.4: after `runtime.device=cuda` stopped the study, the same command with the device fixed started at
    `[2/4 done]`: the baseline, which met the error first, and the trial that stopped the study were never trained.
    The stopping trial is told `run_again`; a trial that failed on the same line is the same cause, fixed once."""
    storage = open_storage(f"sqlite:///{tmp_path}/db.sqlite")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")

    def add(lr: float, **attrs: object) -> None:
        study.add_trial(
            create_trial(params={"optim.lr": lr}, distributions=DIST, state=TrialState.FAIL, user_attrs=attrs)
        )

    add(0.001, **{JOB_ERROR_ATTR: NO_GPU, "fail_reason": f"{NO_GPU}; not queued again: heartbeat.max_retry=0"})
    add(0.002, **{JOB_ERROR_ATTR: NO_GPU, RUN_AGAIN_ATTR: True,
                  "fail_reason": f"{NO_GPU}; not queued again: the job raised it before its first step, ..."})  # fmt: skip
    add(0.003, **{JOB_ERROR_ATTR: "ValueError: another line"})  # not the cause fixed: it would repeat
    add(0.004, **{"fail_reason": "driver interrupted; not queued again: heartbeat.max_retry=0", RUN_AGAIN_ATTR: True})
    assert [t.number for t in to_run_again(study.get_trials())] == [0, 1, 3]
    caplog.set_level("WARNING", logger="sweeps")
    assert queue_failed_again(study, storage) == [0, 1, 3]
    said = [r.getMessage() for r in caplog.records if r.name == "sweeps"]
    # What failed, without what was done then ("not queued again"): it is queued now; no checkpoint was recorded.
    assert said == [
        f"trial 0 failed ({NO_GPU}): queued again, first: resumes from its checkpoint if one was written",
        f"trial 1 failed ({NO_GPU}): queued again, first: resumes from its checkpoint if one was written",
        "trial 3 failed (driver interrupted): queued again, first: resumes from its checkpoint if one was written",
    ]


def test_a_machine_error_says_run_it_again_and_a_configuration_error_does_not() -> None:
    disk, config = Outcome(), Outcome()
    disk.failed(OSError(errno.ENOSPC, "No space left on device"))
    config.failed(ValueError("arch.hidden_size=7"))
    assert (disk.retryable, disk.run_again) == (False, True) and disk.error.endswith("then run it again)")
    assert (config.retryable, config.run_again) == (False, False)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_ctrl_c_with_no_retry_left_then_the_same_command_resumes_the_interrupted_trial(tmp_path: Path) -> None:
    """Issue 45.2: after a Ctrl-C with heartbeat.max_retry=0 the line says "run the same command to continue the
    study"; that command trained new configurations and never the interrupted one."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=400"]
    argv = sweep_overrides(
        url, tmp_path / "out", "study=halting", "study.name=again", "n_trials=1", "pruner=none",
        "heartbeat.max_retry=0", "reeval.at_end=false", f"hydra.run.dir={tmp_path}/h", trial=slow,
    )  # fmt: skip
    cmd = [sys.executable, "-m", "sweeps.run", *argv]
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while not (trial_file_exists(tmp_path / "out" / "again", 0, "run/metrics.jsonl")
                   and "eval/" in (trial_dir(tmp_path / "out" / "again", 0) / "run" / "metrics.jsonl").read_text()):  # fmt: skip
            assert time.monotonic() < deadline and driver.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        assert driver.wait(timeout=180) == 130
    first = (tmp_path / "first.log").read_text()
    assert "run the same command to continue the study" in first and "not queued again" in first, first[-3000:]
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    trials = optuna.load_study(study_name="again", storage=url).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]  # no new configuration drawn
    assert trials[1].params == trials[0].params
    assert "trial 0 failed (driver interrupted): queued again, first: resumes from its checkpoint" in (
        rerun.stdout + rerun.stderr
    )
    retry = trial_dir(tmp_path / "out" / "again", 1)
    assert summary_of(retry)["steps"] == 400
    assert min(r["step"] for r in read_metrics(retry / "run")) > 10  # resumed from the step-10 checkpoint or later
    assert RUN_AGAIN_ATTR not in trials[1].user_attrs or trials[1].user_attrs[RUN_AGAIN_ATTR] is not True


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_setup_error_fixed_between_two_runs_trains_every_configuration_of_the_first(tmp_path: Path) -> None:
    """Done when (issue 57): a deterministic stop (`runtime.device=cuda` without a GPU), then the same command with
    the device fixed: the second run trains every configuration of the first, the baseline among them."""
    url = f"sqlite:///{tmp_path}/db.sqlite"

    def run(device: str) -> subprocess.CompletedProcess[str]:
        argv = sweep_overrides(
            url, tmp_path / "out", "study=halting", "study.name=fixed", "n_trials=4", "pruner=none",
            "max_concurrent=2", "heartbeat.max_retry=0", f"hydra.run.dir={tmp_path}/h",
            trial=[*FAST_TRIAL, f"runtime.device={device}"],
        )  # fmt: skip
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        return subprocess.run(
            [sys.executable, "-m", "sweeps.run", *argv], capture_output=True, text=True, timeout=280, env=env
        )

    first = run("cuda")
    assert first.returncode == 2, first.stderr[-3000:]
    assert first.stderr.strip().splitlines()[-1].startswith("error: ValueError: runtime.device=cuda"), first.stderr[
        -2000:
    ]
    tried = optuna.load_study(study_name="fixed", storage=url).get_trials()
    assert tried and all(t.state == TrialState.FAIL for t in tried), [t.state for t in tried]
    assert tried[0].params == {"arch.halt_max_steps": 4, "halting.exploration_prob": 0.1, "halting.adaptive": False}

    second = run("cpu")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    trials = optuna.load_study(study_name="fixed", storage=url).get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    for failed in tried:  # every configuration of the first run trained in the second, each once
        assert [t.params for t in complete].count(failed.params) == 1, (failed.number, failed.params)
    assert len(complete) == 4  # and the budget is whole: the failed attempts no longer count against it
    out = second.stdout + second.stderr
    queued = [line for line in out.splitlines() if "): queued again, first: " in line]
    assert len(queued) == len(tried), out[-3000:]  # one line each, naming what failed (not "not queued again")
    assert any("failed (ValueError: runtime.device=cuda" in line for line in queued), queued
    assert not any("not queued again" in line for line in queued), queued
