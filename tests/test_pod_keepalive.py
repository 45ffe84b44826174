"""ssh's keep-alive is on by default (issue 56.7): a session to a VM that vanished without closing its connection
(the stand-in gcloud's `--fake-admin hang=W`: nothing answers, nothing is reset) ends with 255 in about
ServerAliveInterval x ServerAliveCountMax seconds; without it the job's session waited for ever (until the driver's
stall_timeout_s, 30 minutes)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.launchers.base import JobSpec, LauncherConfigError
from tests.sweep_helpers import FAKE_GCLOUD, fake_pod, pod_launcher, stand_in_vms, unique_job_name


def test_every_ssh_has_a_keep_alive_by_default_and_a_users_own_option_comes_first() -> None:
    argv = pod_launcher().ssh_argv("0", "true")
    assert argv[-4:-2] == ["--ssh-flag=-o ServerAliveInterval=30", "--ssh-flag=-o ServerAliveCountMax=4"]
    own = pod_launcher("launcher.ssh_flags=['--ssh-flag=-o ServerAliveInterval=5']").ssh_argv("0", "true")
    assert own.index("--ssh-flag=-o ServerAliveInterval=5") < own.index("--ssh-flag=-o ServerAliveInterval=30")
    assert not any("ServerAlive" in a for a in pod_launcher("launcher.ssh_alive_interval_s=0").ssh_argv("0", "t"))
    with pytest.raises(LauncherConfigError, match=r"launcher.ssh_alive_interval_s=-1.*expected whole seconds"):
        pod_launcher(f"launcher.gcloud={FAKE_GCLOUD}", "launcher.ssh_alive_interval_s=-1").validate()


@pytest.mark.slow  # runs the gcloud stand-in and a job on each of its VMs
def test_a_session_to_a_silent_vm_ends_within_the_keep_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    monkeypatch.setenv("FAKE_TPU_TCP_TIMEOUT_S", "0.2")  # gcloud's reconnects to the silent VM time out
    (tmp_path / "job.py").write_text("import pathlib, time\npathlib.Path('started').touch()\ntime.sleep(600)\n")
    python = tmp_path / "python-job"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "job.py"} "$@"\n')
    python.chmod(0o755)
    pods = pod_launcher(
        *stand_in_vms(str(python)),
        "launcher.ssh_alive_interval_s=1",
        "launcher.ssh_alive_count=2",
        "launcher.kill_grace_s=1",
    )
    handle = pods.launch(JobSpec(unique_job_name(tmp_path), ["out_dir=run"], tmp_path / "local"))
    vms = [pod / "test-pod" / f"worker-{w}" / "trm" for w in (0, 1)]
    deadline = time.monotonic() + 60
    while not all((vm / "started").exists() for vm in vms):
        assert time.monotonic() < deadline and handle.poll() is None, handle.failure
        time.sleep(0.2)
    subprocess.run([str(FAKE_GCLOUD), "--fake-admin", "hang=1", "test-pod"], check=True)
    began = time.monotonic()
    try:
        code = handle.wait(timeout_s=40)
        assert code == 255 and handle.failed_worker == "worker-1", handle.failure  # was: None, still waiting
        assert time.monotonic() - began < 20
        assert "Timeout, server worker-1 not responding." in (tmp_path / "local" / "worker-1.log").read_text()
    finally:
        handle.cancel()
        subprocess.run([str(FAKE_GCLOUD), "--fake-admin", "vanish=1", "test-pod"], check=True)  # its job, too
