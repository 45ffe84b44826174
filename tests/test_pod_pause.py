"""A pause (the slice taken from under a study: sweeps/trials/preemption.py) stops the running jobs as a stop does:
SIGTERM, then the launcher's kill grace for their save and upload, not SIGTERM and SIGKILL back to back (issue 56.2).
On the stand-in gcloud's pod: a maintenance event (`health` UNHEALTHY_MAINTENANCE) while two trials run, one per VM."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from omegaconf import DictConfig
from optuna.trial import TrialState

from storage.record import PREEMPTED_ATTR, RETRIES_NOT_SPENT_ATTR
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import MachineUnavailableError
from tests.sweep_helpers import POD_TRIAL, fake_pod, stand_in_pod_study

SAVE_S = 2  # the stand-in job's save after SIGTERM: SIGKILL at once (grace 0) cuts it short


def saving_python(tmp_path: Path) -> Path:
    """The VMs' interpreter: this one, except that a training job (`-m trm.train`) is a stand-in that saves for
    SAVE_S seconds on SIGTERM (writing `saved` in its directory) and fails where `fail-now` appears."""
    job = (
        "import pathlib, signal, sys, time\n"
        "def save(*_):\n"
        f"    time.sleep({SAVE_S}); pathlib.Path('saved').write_text('checkpoint'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "pathlib.Path('started').touch()\n"
        "while not pathlib.Path('fail-now').exists():\n"
        "    time.sleep(0.1)\n"
        "sys.exit(1)\n"
    )
    (tmp_path / "job.py").write_text(job)
    script = tmp_path / "python-saving"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = trm.train ]; then exec {sys.executable} {tmp_path / "job.py"} "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return script


def two_vm_study(tmp_path: Path, db: str, *extra: str) -> DictConfig:
    """Two trials at once on the stand-in pod, one per VM, whose jobs save on SIGTERM (saving_python); the study ends
    when the slice is taken (on_preempted=exit); `extra` last."""
    return compose_sweep_config(
        [
            *stand_in_pod_study(db, tmp_path / "out", str(saving_python(tmp_path)), POD_TRIAL),
            "launcher.slots=vm",
            "launcher.ssh_timeout_s=20",
            "launcher.on_preempted=exit",
            "n_trials=2",
            "wandb.enabled=false",
            "preflight.enabled=false",
            *extra,
        ]
    )


@pytest.mark.slow
def test_a_pause_gives_the_running_jobs_their_grace_to_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    cfg = two_vm_study(tmp_path, fresh_pg_url)
    vms = [pod / "test-pod" / f"worker-{w}" / "trm" for w in (0, 1)]

    def maintenance_then_a_vm_fails() -> None:
        deadline = time.monotonic() + 120
        while not all((vm / "started").exists() for vm in vms):
            assert time.monotonic() < deadline, "the two trials did not start"
            time.sleep(0.1)
        (pod / "test-pod.health").write_text("UNHEALTHY_MAINTENANCE")
        (vms[1] / "fail-now").touch()

    hand = threading.Thread(target=maintenance_then_a_vm_fails)
    hand.start()
    with pytest.raises(MachineUnavailableError, match=r"is READY but UNHEALTHY_MAINTENANCE.*on_preempted=exit"):
        Driver(typed_sweep(cfg)).run()
    hand.join()
    assert (vms[0] / "saved").read_text() == "checkpoint"  # SIGTERM, and the grace to save: not SIGKILL at once
    trials = optuna.load_study(study_name="halting", storage=fresh_pg_url).trials
    aside = [t for t in trials if t.state == TrialState.FAIL]
    assert len(aside) == 2 and all(t.user_attrs[PREEMPTED_ATTR].endswith("UNHEALTHY_MAINTENANCE") for t in aside)
    copies = [t for t in trials if t.state == TrialState.WAITING]
    assert len(copies) == 2 and all(t.user_attrs[RETRIES_NOT_SPENT_ATTR] == 1 for t in copies)
