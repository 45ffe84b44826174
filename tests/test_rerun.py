"""Fix it, then run the same command (sweeps/trials/rerun.py, issue 45.2): a failure the study was told the same command
would run again is queued again, first, by that command, and resumes from its checkpoint; no other failure is."""

from __future__ import annotations

import errno
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
    assert "queued again, first, to resume from its checkpoint" in rerun.stdout + rerun.stderr
    retry = trial_dir(tmp_path / "out" / "again", 1)
    assert summary_of(retry)["steps"] == 400
    assert min(r["step"] for r in read_metrics(retry / "run")) > 10  # resumed from the step-10 checkpoint or later
    assert RUN_AGAIN_ATTR not in trials[1].user_attrs or trials[1].user_attrs[RUN_AGAIN_ATTR] is not True
