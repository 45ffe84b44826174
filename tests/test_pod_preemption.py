"""A preempted slice is a pause, not a failure (sweeps/trials/preemption.py), on the stand-in gcloud's pod: its slice
states, a preemption that kills every process of its VMs, and a recreate that gives fresh, empty VMs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from storage.record import PREEMPTED_ATTR, RETRIES_NOT_SPENT_ATTR
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import LauncherConfigError, MachineUnavailableError
from sweeps.launchers.torchrun import free_port
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.trials.recovery import requeue
from sweeps.trials.retry import plan_retry, retries_used
from tests.sweep_helpers import (
    FAKE_GCLOUD,
    FAST_TRIAL,
    FRESH_VM_PYTHON,
    fake_pod,
    stand_in_pod_study,
    venv_setup,
)


def admin(action: str) -> None:
    subprocess.run([str(FAKE_GCLOUD), "--fake-admin", action, "test-pod"], check=True)


def launcher(**kw: object) -> TpuPodLauncher:
    args: dict = dict(tpu_name="test-pod", zone="us-central2-b", gcloud=str(FAKE_GCLOUD), python=sys.executable)
    return TpuPodLauncher(**{**args, **kw})


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_the_launcher_reads_the_slice_state_afresh_and_exit_leaves_the_study_to_the_same_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_pod(tmp_path, monkeypatch, 2)
    pod = launcher(on_preempted="exit")
    assert pod.unavailable() is None
    admin("preempt")
    line = pod.unavailable()
    assert line == "slice test-pod (v4-16) is PREEMPTED"
    with pytest.raises(MachineUnavailableError, match=r"launcher.on_preempted=exit.*run the same command"):
        pod.wait_until_available(line)
    admin("recreate")
    assert pod.unavailable() is None
    monkeypatch.setenv("FAKE_TPU_ROOT", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", "/nonexistent")
    unknown = launcher(gcloud="/nonexistent/gcloud", describe_backoff_s=0)
    assert unknown.unavailable() is None  # no answer says nothing of the slice: the study goes on ...
    assert "could not be described" in str(unknown.not_ready())  # ... and a waiting one waits on
    with pytest.raises(LauncherConfigError, match=r"launcher.on_preempted='later'.*wait, exit"):
        launcher(on_preempted="later").validate()


def test_a_study_stopped_for_a_preempted_slice_exits_75_in_one_line() -> None:
    """`launcher.on_preempted=exit` ended `python -m sweeps.run` with a traceback and exit 1: the handler of every
    other error came first and passed it on. EX_TEMPFAIL (75) is the scheduler's sign to run the command again."""
    from sweeps.config.config_values import SweepConfigError
    from sweeps.run import exit_for
    from sweeps.trials.preemption import PREEMPTED_EXIT

    gone = MachineUnavailableError(
        "slice test-pod (v4-16) is PREEMPTED (launcher.on_preempted=exit): run the same command"
    )
    assert exit_for(gone) == (PREEMPTED_EXIT, str(gone)) and PREEMPTED_EXIT == 75
    assert exit_for(SweepConfigError("n_trials=0: expected >= 1")) == (2, "n_trials=0: expected >= 1")
    assert exit_for(RuntimeError("a bug")) is None  # not ours: Hydra prints its traceback


def test_an_attempt_set_aside_spends_no_retry_and_the_cap_still_holds(tmp_path: Path) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")
    study = optuna.create_study(storage=storage, study_name="s")
    dist = {"x": optuna.distributions.IntDistribution(0, 3)}
    study.add_trial(optuna.trial.create_trial(params={"x": 1}, distributions=dist, state=TrialState.FAIL))
    requeue(study, storage, study.trials[0]._trial_id, None, spends_retry=False)  # preempted: free
    copy = study.trials[1]
    assert copy.user_attrs[RETRIES_NOT_SPENT_ATTR] == 1 and retries_used(copy) == 0
    assert plan_retry(copy, 1, None).queued  # its one retry is still there ...
    failed = optuna.trial.create_trial(params={"x": 1}, distributions=dist, state=TrialState.FAIL)
    failed.user_attrs.update(copy.user_attrs)
    failed.system_attrs.update(copy.system_attrs)
    study.add_trial(failed)
    requeue(study, storage, study.trials[2]._trial_id, 1)  # ... and Optuna's callback honours it
    assert len(study.trials) == 4 and retries_used(study.trials[3]) == 1
    assert not plan_retry(study.trials[3], 1, None).queued  # then the cap holds


@pytest.mark.slow
def test_a_preemption_mid_trial_pauses_the_study_and_the_trial_resumes_on_the_recreated_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    bucket = tmp_path / "bucket"  # the checkpoints' store outside the VMs (gs:// on a real pod): survives them
    trial = [o for o in FAST_TRIAL if not o.startswith("train.steps")]
    trial += ["train.steps=100", "runtime.backend=torch", f"runtime.port={free_port()}"]
    cfg = compose_sweep_config(
        [
            *stand_in_pod_study(fresh_pg_url, tmp_path / "out", FRESH_VM_PYTHON, trial),
            f"trial.checkpoint_root={bucket}",
            "heartbeat.max_retry=0",  # a retry spent would leave the trial failed
            "launcher.state_poll_s=0.3",
            f"preflight.expect={{torch: '{torch.__version__}', torch_xla: null}}",
            "preflight.chips_glob='~/dev/accel*'",
            "preflight.min_free_gb=0",
        ]
    )
    cfg.launcher.setup = venv_setup()  # a fresh VM has no venv: every prepare makes one

    def preempt_then_recreate() -> None:
        deadline = time.monotonic() + 240
        while not any(bucket.rglob("latest.pt")):
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.1)
        admin("preempt")
        while optuna.load_study(study_name="halting", storage=fresh_pg_url).trials[0].state != TrialState.FAIL:
            assert time.monotonic() < deadline, "the trial was not set aside"
            time.sleep(0.2)
        time.sleep(1.0)  # the study waits on a PREEMPTED slice: nothing starts
        assert len(optuna.load_study(study_name="halting", storage=fresh_pg_url).trials) == 2
        admin("recreate")

    hand = threading.Thread(target=preempt_then_recreate)
    hand.start()
    Driver(typed_sweep(cfg)).run()
    hand.join()
    trials = optuna.load_study(study_name="halting", storage=fresh_pg_url).trials
    first, second = trials
    assert first.state == TrialState.FAIL and first.user_attrs[PREEMPTED_ATTR] == "slice test-pod (v4-16) is PREEMPTED"
    assert first.user_attrs["fail_reason"].startswith(
        "preempted: slice test-pod (v4-16) is PREEMPTED; queued again, no retry spent"
    )
    assert second.state == TrialState.COMPLETE, second.user_attrs.get("fail_reason")
    assert second.params == first.params and second.user_attrs[RETRIES_NOT_SPENT_ATTR] == 1
    assert second.user_attrs.get(PREEMPTED_ATTR) is None  # the copy's own attempt was not preempted
    log = (Path(second.user_attrs["workdir"]) / "worker-0.log").read_text()
    starts = [line for line in log.splitlines() if line.startswith('{"event": "start"')]
    assert starts and '"resumed_from": 0' not in starts[0], log[-2000:]  # from the checkpoint in the bucket
    assert (pod / "test-pod" / "worker-1" / "venv" / "bin" / "python").exists()  # set up anew on the fresh VM
