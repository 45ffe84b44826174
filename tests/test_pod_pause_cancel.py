"""A pause stops every job of a slice whose VMs died at once (sweeps.launchers.workers.cancel_all): each stop is a
gcloud ssh that a dead VM holds until launcher.ssh_timeout_s, so N jobs cost one timeout, not N (37 minutes for a
pod's 32 chip slots one at a time)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.launchers.base import JobSpec
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.launchers.workers import cancel_all
from tests.sweep_helpers import FAKE_GCLOUD, fake_pod, unique_job_name

VMS = 4


@pytest.mark.slow  # starts the stand-in's gcloud processes
def test_a_pause_stops_the_jobs_of_n_dead_vms_in_about_one_ssh_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_pod(tmp_path, monkeypatch, VMS)
    monkeypatch.setenv("FAKE_TPU_TCP_TIMEOUT_S", "120")  # a vanished VM: a connection waits for the caller's timeout
    pods = TpuPodLauncher(
        tpu_name="dead-pod", zone="z", gcloud=str(FAKE_GCLOUD), python=sys.executable, slots="vm", ssh_timeout_s=2
    )
    slots = pods.slots()
    assert len(slots) == VMS
    for w in range(VMS):  # every VM silent: its sessions hang, its stop's ssh too
        subprocess.run([str(FAKE_GCLOUD), "--fake-admin", f"hang={w}", "dead-pod"], check=True)
    name = unique_job_name(tmp_path)
    jobs = [pods.launch(JobSpec(f"{name}-{s.name}", ["train.steps=3"], tmp_path / s.name, slot=s)) for s in slots]
    # One stop: its remote pkill's ssh ends at the launcher's bound (ssh_timeout_s + grace + 10 s).
    one_stop_s = pods.ssh_timeout_s + 0 + 10
    started = time.monotonic()
    cancel_all(jobs, grace_s=0)
    took = time.monotonic() - started
    assert took < 2 * one_stop_s, f"{VMS} dead VMs' jobs took {took:.1f} s to stop: one at a time"
    assert all(job.poll() is not None for job in jobs)  # every local gcloud client of theirs is gone
