"""A slice that is not usable at the start, a recovery that meets VMs not up yet, and a VM gone under a slice that
still reads READY (issue 56.3, 56.4): the study ends with 75 or waits, never with 2 or a traceback, and spends no
retry. On the stand-in gcloud's pod, whose ssh refuses a PREEMPTED slice (exit 1) as gcloud does."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from storage.record import PREEMPTED_ATTR, RETRIES_NOT_SPENT_ATTR
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import LauncherConfigError, MachineUnavailableError
from sweeps.launchers.slots import NoSlotLeftError
from sweeps.launchers.torchrun import free_port
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.run import exit_for
from sweeps.trials.retry import retries_used
from tests.sweep_helpers import (
    FAKE_GCLOUD,
    FAST_TRIAL,
    FRESH_VM_PYTHON,
    POD_TRIAL,
    fake_pod,
    stand_in_pod_study,
    venv_setup,
)


def admin(*action: str) -> None:
    subprocess.run([str(FAKE_GCLOUD), "--fake-admin", *action, "test-pod"], check=True)


def launcher(**kw: object) -> TpuPodLauncher:
    args: dict = dict(tpu_name="test-pod", zone="us-central2-b", gcloud=str(FAKE_GCLOUD), python=sys.executable,
                      state_poll_s=0.2, describe_backoff_s=0.01)  # fmt: skip
    return TpuPodLauncher(**{**args, **kw})


def looping_python(tmp_path: Path) -> Path:
    """The VMs' interpreter: this one, except that a training job (`-m trm.train`) is a stand-in that runs until
    stopped (SIGTERM ends it at once)."""
    (tmp_path / "job.py").write_text("import pathlib, time\npathlib.Path('started').touch()\ntime.sleep(600)\n")
    script = tmp_path / "python-looping"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = trm.train ]; then exec {sys.executable} {tmp_path / "job.py"} "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return script


def pod_study(tmp_path: Path, db: str, *extra: str) -> Driver:
    cfg = compose_sweep_config(
        [
            *stand_in_pod_study(db, tmp_path / "out", str(looping_python(tmp_path)), POD_TRIAL),
            "launcher.ssh_timeout_s=20",
            "launcher.on_preempted=exit",
            "wandb.enabled=false",
            "preflight.enabled=false",
            *extra,
        ]
    )
    return Driver(typed_sweep(cfg))


@pytest.mark.slow  # runs the gcloud stand-in: a process per call
def test_starting_on_a_slice_that_is_not_ready_exits_75_before_any_vm_is_contacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    admin("preempt")
    with pytest.raises(MachineUnavailableError) as gone:
        pod_study(tmp_path, fresh_pg_url).run()
    code, line = exit_for(gone.value) or (None, "")
    assert code == 75 and line.startswith("slice test-pod (v4-16) is PREEMPTED: the driver ends"), line
    assert not (pod / "calls.log").exists()  # no check, no prepare, no ssh: the state came first

    (pod / "test-pod.state").write_text("CREATING")  # on_preempted=wait: the shape waits for READY
    threading.Timer(1.0, lambda: (pod / "test-pod.state").write_text("READY")).start()
    began = time.monotonic()
    assert launcher().shape().workers == 2 and time.monotonic() - began >= 1.0
    assert exit_for(NoSlotLeftError("every slot is out (vm-0, vm-1)")) == (75, "every slot is out (vm-0, vm-1)")


@pytest.mark.slow
def test_a_recovery_whose_vms_do_not_answer_yet_tries_again_until_they_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    tpu = launcher()
    admin("preempt")
    line = tpu.unavailable()
    assert line == "slice test-pod (v4-16) is PREEMPTED"
    ssh = subprocess.run(tpu.ssh_argv("0", "true"), capture_output=True, text=True)  # gcloud refuses, no ssh
    assert ssh.returncode == 1 and 'terminal state "PREEMPTED"' in ssh.stderr
    monkeypatch.setenv("FAKE_TPU_RECREATE_SSH_S", "2")  # READY before the fresh VMs' sshd answers
    threading.Timer(0.5, admin, args=("recreate",)).start()
    began = time.monotonic()
    tpu.wait_until_available(line)  # was: the first prepare's error, and the driver's exit 2
    assert time.monotonic() - began >= 2.5
    assert (pod / "calls.log").read_text().count("--command=true") >= 2  # reached again until it answered

    admin("preempt")
    admin("recreate")
    (pod / "test-pod.ssh-up-at").write_text(f"{time.time() + 600}\n")  # never up within the bound
    with pytest.raises(LauncherConfigError, match=r"^reaching the workers failed \(exit 255\)"):
        launcher(recover_timeout_s=0.5).wait_until_available(line)


@pytest.mark.slow
def test_a_vm_gone_under_a_ready_slice_pauses_a_pod_study_spending_no_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    """slots=pod: the job fails, the slice still reads READY; the slot's check fails. Was: a retry spent on the
    trial, then NoSlotLeftError's traceback."""
    pod = fake_pod(tmp_path, monkeypatch, 2)
    vm0 = pod / "test-pod" / "worker-0" / "trm"

    def vanish() -> None:
        deadline = time.monotonic() + 120
        while not (vm0 / "started").exists():
            assert time.monotonic() < deadline, "the trial did not start"
            time.sleep(0.1)
        admin("vanish=1")

    hand = threading.Thread(target=vanish)
    hand.start()
    with pytest.raises(MachineUnavailableError, match=r"^slot pod failed its check after the job"):
        pod_study(tmp_path, fresh_pg_url, "heartbeat.max_retry=1").run()
    hand.join()
    first, copy = optuna.load_study(study_name="halting", storage=fresh_pg_url).trials
    assert first.state == TrialState.FAIL and first.user_attrs[PREEMPTED_ATTR].startswith("slot pod failed its check")
    assert copy.state == TrialState.WAITING and copy.user_attrs[RETRIES_NOT_SPENT_ATTR] == 1


@pytest.mark.slow  # trains two trials on the stand-in pod
def test_a_vm_recreated_under_a_ready_slice_is_set_up_again_and_charges_no_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    """VM 1 vanishes mid-trial and the slice is recreated while it reads READY (the pod soak's fault): the slot's
    check finds no id of the latest prepare on the fresh VMs, so the study pauses, prepares the slice again and
    resumes. Was: the slot's check passed on the fresh VM (ssh answers, no chip held), the failed job was charged
    a retry and every later job met VMs without launcher.setup's venv (exit 127)."""
    pod = fake_pod(tmp_path, monkeypatch, 2)
    bucket = tmp_path / "bucket"  # the checkpoints' store outside the VMs (gs:// on a real pod): survives them
    trial = [o for o in FAST_TRIAL if not o.startswith("train.steps")]
    # 100 steps: the vanish comes once the step-10 save is in the bucket (10-20 steps later here), the job still
    # training (200 cost ~10 s more).
    trial += ["train.steps=100", "runtime.backend=torch", f"runtime.port={free_port()}"]
    cfg = compose_sweep_config(
        [
            *stand_in_pod_study(fresh_pg_url, tmp_path / "out", FRESH_VM_PYTHON, trial),
            "n_trials=2",
            f"trial.checkpoint_root={bucket}",
            "heartbeat.max_retry=0",  # a retry charged would leave its configuration failed
            "wandb.enabled=false",
            "preflight.enabled=false",
            "launcher.state_poll_s=0.3",
        ]
    )
    cfg.launcher.setup = venv_setup()  # a fresh VM has no venv: every prepare makes one

    def vanish_then_recreate() -> None:
        deadline = time.monotonic() + 240
        while not any(bucket.rglob("latest.pt")):
            assert time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.1)
        admin("vanish=1")
        admin("recreate")  # the slice reads READY throughout: only the VMs are new

    hand = threading.Thread(target=vanish_then_recreate)
    hand.start()
    Driver(typed_sweep(cfg)).run()
    hand.join()
    trials = optuna.load_study(study_name="halting", storage=fresh_pg_url).trials
    by_params: dict[str, list[optuna.trial.FrozenTrial]] = {}
    for t in trials:
        by_params.setdefault(repr(sorted(t.params.items())), []).append(t)
    assert len(by_params) == 2, [(t.state, t.params) for t in trials]
    for chain in by_params.values():  # each configuration's last attempt COMPLETE, no retry charged on any
        assert chain[-1].state == TrialState.COMPLETE, [t.user_attrs.get("fail_reason") for t in chain]
        assert all(retries_used(t) == 0 for t in chain)
    set_aside = [t for t in trials if t.state == TrialState.FAIL]
    assert set_aside and all(t.user_attrs[PREEMPTED_ATTR].startswith("slot pod failed its check") for t in set_aside)
    setups = (pod / "calls.log").read_text().count("mkdir -p ~/venv/bin")
    assert setups >= 2, setups  # prepared again after the recreate
    assert (pod / "test-pod" / "worker-1" / "venv" / "bin" / "python").exists()  # the fresh VM set up anew
