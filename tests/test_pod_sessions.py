"""A large slice's VMs over few gcloud processes (launcher.ssh_sessions, sweeps/launchers/tpu/sessions.py): a
v5e-256's 64 VMs in 8 sessions, each VM still with its own log and exit status, and a stop that reaches them all."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.launchers.base import JobSpec, LauncherConfigError
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.launchers.tpu.sessions import groups
from tests.sweep_helpers import FAKE_GCLOUD, fake_pod, unique_job_name

# A training stand-in for the VMs (launcher.python): says where it runs, ends at once where the VM has a `done`
# file, fails once it has a `fail` file, and leaves `stopped` on a SIGTERM (where a job saves).
STUB = """#!/bin/sh
w=$(basename "$HOME")
echo "$w started"
[ -e "$HOME/done" ] && exit 0
trap 'echo "$w stopped" > "$HOME/stopped"; exit 143' TERM
while [ ! -e "$HOME/fail" ]; do sleep 0.5 & wait $!; done
echo "$w failing"
exit 3
"""
STUB_IGNORING_SIGTERM = """#!/bin/sh
echo "$(basename "$HOME") started"
exec "{python}" -c "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)" "$@"
"""


def test_workers_are_grouped_into_at_most_the_knobs_sessions() -> None:
    assert groups(list(range(64)), 8) == [list(range(8 * g, 8 * g + 8)) for g in range(8)]
    assert groups([0, 1, 2], 8) == [[0], [1], [2]]  # up to the knob: a session per VM, as before
    assert [len(g) for g in groups(list(range(9)), 8)] == [2, 1, 1, 1, 1, 1, 1, 1]
    assert sum(groups(list(range(20)), 3), []) == list(range(20))


def stub(tmp_path: Path, text: str) -> str:
    path = tmp_path / "python-stub"
    path.write_text(text.replace("{python}", sys.executable))
    path.chmod(0o755)
    return str(path)


def launcher(tpu: str, python: str, **kw) -> TpuPodLauncher:
    return TpuPodLauncher(
        tpu_name=tpu, zone="us-central2-b", gcloud=str(FAKE_GCLOUD), python=python, env={}, remote_dir="~/trm", **kw
    )


def session_processes(tpu: str) -> list[int]:
    """The local gcloud processes of ssh sessions to `tpu`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and str(FAKE_GCLOUD).encode() in argv[:3] and tpu.encode() in argv and b"ssh" in argv:
            found.append(int(proc.name))
    return found


def job_processes(name: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"[s]weep.job={name}$"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def wait_for(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def big_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKE_TPU_RUNTIME", "0")
    return fake_pod(tmp_path, monkeypatch, 0, "v5litepod-256")  # 64 VMs of 4 chips


@pytest.mark.slow
def test_64_vms_run_in_8_sessions_and_a_failure_is_named_by_its_worker_and_stops_every_vm(
    big_pod: Path, tmp_path: Path
) -> None:
    """Before, each VM was a gcloud process of its own: 64 for a v5e-256. With ssh_sessions=8 the job holds 8;
    worker 37 fails (in gcloud's session 32..39, whose own exit status cannot tell it), and the handle names it
    with its last lines, and the stop reaches the other 63 VMs' processes (their SIGTERM: a save)."""
    tpu, name = "sessions-fail", unique_job_name(tmp_path)
    vms = big_pod / tpu
    pods = launcher(tpu, stub(tmp_path, STUB), ssh_sessions=8, kill_grace_s=10)
    handle = pods.launch(JobSpec(name, ["train.steps=1"], tmp_path / "local"))
    try:
        assert len(handle.workers) == 64 and len({w.process.pid for w in handle.workers}) == 8
        logs = [tmp_path / "local" / f"worker-{w}.log" for w in range(64)]
        wait_for(lambda: all(p.exists() and "started" in p.read_text() for p in logs), 120, "every VM's start")
        assert handle.poll() is None and len(session_processes(tpu)) == 8  # 64 VMs running: 8 gcloud processes
        calls = [line for line in (big_pod / "calls.log").read_text().splitlines() if "'ssh'" in line and name in line]
        assert sorted(len(c.split("--worker=")[1].split("'")[0].split(",")) for c in calls) == [8] * 8
        (vms / "worker-37" / "fail").touch()
        assert handle.wait(120) == 3, handle.failure
        assert handle.failed_worker == "worker-37"
        assert handle.failure is not None and "worker-37 failing" in handle.failure
        for w in range(64):  # each VM's lines in its own log, untagged
            log = (tmp_path / "local" / f"worker-{w}.log").read_text()
            assert f"worker-{w} started" in log and "trm-worker" not in log, log
            assert not any(f"worker-{o} started" in log for o in range(64) if o != w)
        stopped = [w for w in range(64) if (vms / f"worker-{w}" / "stopped").exists()]
        assert stopped == [w for w in range(64) if w != 37]  # the stop's SIGTERM reached every other VM
        wait_for(lambda: not job_processes(name), 30, "no job process left on any VM")
        wait_for(lambda: not session_processes(tpu), 30, "no gcloud session left")
    finally:
        handle.cancel(0)


@pytest.mark.slow  # the stand-in gcloud describes the slice: a process
def test_a_dry_run_shows_the_sessions_the_launch_starts(big_pod: Path, tmp_path: Path) -> None:
    """The dry run printed one `--worker=all` ssh with the bare command, while a launch on 64 VMs starts 8 grouped
    sessions of tagged commands: it now shows the first session as launched and the workers of the others."""
    pods = launcher("sessions-dry", "python3", ssh_sessions=8)
    shown = pods.describe(JobSpec("dry-job", ["train.steps=1"], tmp_path / "local"))
    first, rest = shown.split("\n")
    assert "--worker=0,1,2,3,4,5,6,7" in first and "trm-worker" in first and "--worker=all" not in first
    assert rest == "  and 7 more session(s), the same job on " + " ".join(
        "--worker=" + ",".join(str(w) for w in range(8 * g, 8 * g + 8)) for g in range(1, 8)
    )
    each = launcher("sessions-dry", "python3", ssh_sessions=64).describe(JobSpec("dry-job", [], tmp_path / "l"))
    first, rest = each.split("\n")  # a session per VM: its command untagged
    assert "--worker=0 " in first and "trm-worker" not in first and rest.endswith(" --worker=62 --worker=63")


@pytest.mark.slow
def test_a_cancel_kills_every_vms_job_that_ignores_sigterm_over_grouped_sessions(big_pod: Path, tmp_path: Path) -> None:
    """A job stuck where it cannot act on SIGTERM is killed after the grace on all 64 VMs, and the 8 local
    sessions end with it."""
    tpu, name = "sessions-kill", unique_job_name(tmp_path)
    pods = launcher(tpu, stub(tmp_path, STUB_IGNORING_SIGTERM), ssh_sessions=8, kill_grace_s=1)
    handle = pods.launch(JobSpec(name, ["train.steps=1"], tmp_path / "local"))
    try:
        logs = [tmp_path / "local" / f"worker-{w}.log" for w in range(64)]
        wait_for(lambda: all(p.exists() and "started" in p.read_text() for p in logs), 120, "every VM's start")
        wait_for(lambda: len(job_processes(name)) >= 64, 30, "a job process on every VM")
        assert len(session_processes(tpu)) == 8
        handle.cancel()
        assert not job_processes(name)
        wait_for(lambda: not session_processes(tpu), 30, "no gcloud session left")
    finally:
        for pid in job_processes(name):
            os.kill(pid, 9)


@pytest.mark.slow
def test_a_vm_tells_its_worker_number_from_the_metadata_server_and_gcloud_loses_the_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TPU VM's ssh session has no TPU_WORKER_ID: the VM's tag comes from the metadata server. gcloud 578 exits 0
    for `--worker=2,3` when worker 3 fails (its status list is sized by the group, indexed by worker id); the
    handle still names worker 3, from the VM's own exit tag."""
    monkeypatch.setenv("FAKE_TPU_RUNTIME", "0")
    monkeypatch.setenv("FAKE_TPU_WORKER_ENV", "0")
    pod = fake_pod(tmp_path, monkeypatch, 4)
    tpu, name = "sessions-metadata", unique_job_name(tmp_path)
    for w, mark in ((0, "done"), (1, "done"), (2, "done"), (3, "fail")):
        (pod / tpu / f"worker-{w}").mkdir(parents=True)
        (pod / tpu / f"worker-{w}" / mark).touch()
    base = [str(FAKE_GCLOUD), "compute", "tpus", "tpu-vm", "ssh", tpu, "--zone=z", "--quiet"]
    fails_on_3 = '[ "$(basename "$HOME")" = worker-3 ] && exit 3; exit 0'
    lost = subprocess.run([*base, "--worker=2,3", f"--command={fails_on_3}"], capture_output=True, text=True)
    assert lost.returncode == 0 and "IndexError" in lost.stderr  # gcloud's own status says nothing
    told = subprocess.run([*base, "--worker=0-3", f"--command={fails_on_3}"], capture_output=True, text=True)
    assert told.returncode == 3  # within range of the list: told
    handle = launcher(tpu, stub(tmp_path, STUB), ssh_sessions=2).launch(JobSpec(name, ["a=1"], tmp_path / "local"))
    assert handle.wait(120) == 3, handle.failure
    assert handle.failed_worker == "worker-3"
    log = (tmp_path / "local" / "worker-3.log").read_text()
    assert "worker-3 failing" in log and "Command execution on worker 3 failed with exit status 3" in log
    assert "worker-2 started" in (tmp_path / "local" / "worker-2.log").read_text()


@pytest.mark.slow
def test_ssh_sessions_below_one_is_refused_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pod(tmp_path, monkeypatch, 2)
    with pytest.raises(LauncherConfigError, match=r"launcher.ssh_sessions=0: expected an integer >= 1"):
        launcher("test-pod", sys.executable, ssh_sessions=0).validate()
