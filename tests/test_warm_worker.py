"""launcher.warm=true: jobs forked from one warm worker (trm/warm_worker.py), each still its own process with its
own directory, environment, log and exit code; cancel and failures as with a fresh interpreter."""

from __future__ import annotations

import os
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import JobSpec
from sweeps.launchers.local import LocalLauncher
from tests.sweep_helpers import FAST_TRIAL, sweep_config, trial_list

pytestmark = pytest.mark.slow  # every test here starts processes or trains


def print_config_job(workdir: Path, **env: str) -> JobSpec:
    """A job that only composes and prints its config (seconds): it shows what environment the job saw."""
    return JobSpec("warm-test", ["--cfg", "job", "--resolve", "+note=${oc.env:WARM_TEST,unset}"], workdir, env=env)


def test_each_job_is_its_own_process_with_its_own_environment(tmp_path: Path) -> None:
    launcher = LocalLauncher(warm=True)
    first = launcher.launch(print_config_job(tmp_path / "a", WARM_TEST="from-a"))
    assert first.wait(120) == 0, first.failure
    second = launcher.launch(print_config_job(tmp_path / "b"))
    assert second.wait(120) == 0, second.failure
    assert "note: from-a" in (tmp_path / "a" / "worker-0.log").read_text()
    assert "note: unset" in (tmp_path / "b" / "worker-0.log").read_text()  # nothing left over from job a
    pids = {first.workers[0].process.pid, second.workers[0].process.pid}
    server = launcher._warm_worker
    assert server is not None and len(pids) == 2 and server.process.pid not in pids
    assert server.alive  # one worker served both
    server.close()


def test_a_failing_job_is_named_with_its_log_and_cancel_stops_a_running_one(tmp_path: Path) -> None:
    launcher = LocalLauncher(warm=True)
    bad = launcher.launch(JobSpec("warm-bad", ["no_such_key=1"], tmp_path / "bad"))
    assert bad.wait(120) not in (None, 0)
    assert bad.failure is not None and "worker-0 exited with code" in bad.failure and "no_such_key" in bad.failure
    long = launcher.launch(
        JobSpec(
            "warm-long", [*FAST_TRIAL, "train.steps=100000", "hydra.run.dir=hydra", "out_dir=run"], tmp_path / "long"
        )
    )
    metrics = tmp_path / "long" / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text()):
        assert time.monotonic() < deadline and long.poll() is None, long.failure
        time.sleep(0.2)
    pid = long.workers[0].process.pid
    long.cancel(grace_s=30)
    assert long.poll() is not None
    time.sleep(0.5)
    assert not _running(pid)  # the forked job is gone, not only forgotten
    assert launcher._warm_worker is not None and launcher._warm_worker.alive  # the worker stays for the next job


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")  # a zombie is ended (its parent, the warm worker, reaps it)


def test_a_study_with_warm_jobs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/optuna.db"
    cfg = sweep_config(
        db,
        tmp_path / "out",
        "launcher.warm=true",
        "n_trials=3",
        "max_concurrent=2",
        "pruner=none",
        "study=halting",
        f"trial.overrides={trial_list(FAST_TRIAL)}",
        "wandb.enabled=false",
    )
    Driver(typed_sweep(cfg)).run()
    trials = optuna.load_study(study_name="halting", storage=db).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3, [t.user_attrs.get("fail_reason") for t in trials]
    assert all(t.user_attrs["best_value"] is not None for t in trials)
    assert len(list((tmp_path / "out" / "halting").glob("*/warm-worker.log"))) == 1  # one worker for the study
