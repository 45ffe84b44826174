"""A stop on a pod (SIGTERM: the job checkpoints, SIGKILL after launcher.kill_grace_s) gives a paper-scale save time
to finish: the tpu_pod launcher's own grace, not the 10 s of a local job (conf/launcher/_base.yaml)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sweeps.launchers.base import JobSpec
from tests.sweep_helpers import fake_pod, pod_launcher, stand_in_vms, unique_job_name

BASE = Path(__file__).resolve().parent.parent / "conf" / "launcher" / "_base.yaml"
SAVE_S = 14  # the stand-in job's save: longer than _base's grace, far shorter than the pod's


def test_the_pod_launcher_resolves_a_pod_sized_grace_and_its_stop_waits_that_long() -> None:
    base = float(OmegaConf.load(BASE).kill_grace_s)
    pods = pod_launcher()
    assert pods.kill_grace_s >= 120 > base
    stop = pods.cancel_command(JobSpec("study-3", [], Path(".")))
    # SIGTERM, then up to kill_grace_s / 0.2 s polls while the job's processes remain, then SIGKILL.
    assert f"[ $i -lt {round(pods.kill_grace_s / 0.2)} ]; do sleep 0.2" in stop
    assert stop.index("pkill -TERM") < stop.index(f"-lt {round(pods.kill_grace_s / 0.2)} ]") < stop.index("pkill -KILL")


@pytest.mark.slow
def test_a_stop_lets_a_slow_save_finish_on_every_vm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in's job saves for SAVE_S seconds after SIGTERM: with the pod's resolved grace it finishes on every
    VM (with _base's 10 s it was SIGKILLed mid-save, keeping the previous checkpoint)."""
    pod = fake_pod(tmp_path, monkeypatch, 2)
    slow = tmp_path / "python-slow-save"
    code = (
        "import pathlib, signal, sys, time\n"
        "def save(*_):\n"
        f'    time.sleep({SAVE_S}); pathlib.Path("saved").write_text("ok"); sys.exit(0)\n'
        "signal.signal(signal.SIGTERM, save)\n"
        'pathlib.Path("started").touch()\n'
        "time.sleep(600)\n"
    )
    slow.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{code}' \"$@\"\n")
    slow.chmod(0o755)
    pods = pod_launcher(*stand_in_vms(str(slow)))
    handle = pods.launch(JobSpec(unique_job_name(tmp_path), ["out_dir=run"], tmp_path / "local"))
    vms = [pod / "test-pod" / f"worker-{w}" / "trm" for w in (0, 1)]
    deadline = time.monotonic() + 60
    while not all((vm / "started").exists() for vm in vms):
        assert time.monotonic() < deadline and handle.poll() is None, handle.failure
        time.sleep(0.2)
    began = time.monotonic()
    handle.cancel()
    assert [(vm / "saved").exists() for vm in vms] == [True, True]
    assert time.monotonic() - began >= SAVE_S
