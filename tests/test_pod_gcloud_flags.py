"""gcloud's release tracks and per-command flags (sweeps/launchers/tpu/gcloud.py) against the stand-in gcloud,
which checks them as gcloud's source does: GA's ssh and scp have no --tunnel-through-iap, scp takes --scp-flag and
not --ssh-flag, ssh the reverse."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sweeps.launchers.base import LauncherConfigError
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from tests.sweep_helpers import fake_pod

FAKE_GCLOUD = Path(__file__).parent / "fake_gcloud" / "gcloud"


def launcher(**kw: object) -> TpuPodLauncher:
    args: dict[str, object] = dict(
        tpu_name="test-pod", zone="us-central2-b", gcloud=str(FAKE_GCLOUD), env={}, remote_dir="~/trm"
    )
    return TpuPodLauncher(**{**args, **kw})  # type: ignore[arg-type]


def gcloud(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FAKE_GCLOUD), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_the_stand_in_checks_flags_per_track_and_per_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the launcher used to send: --tunnel-through-iap on GA, --ssh-flag to scp. Both are refused, as gcloud
    refuses them; the alpha track takes IAP, and each command its own pass-through flag."""
    fake_pod(tmp_path, monkeypatch, 2)
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"")
    ssh = ["compute", "tpus", "tpu-vm", "ssh", "test-pod", "--zone=z", "--quiet", "--worker=0", "--command=true"]
    scp = ["compute", "tpus", "tpu-vm", "scp", str(wheel), "test-pod:~/trm/", "--zone=z", "--quiet", "--worker=all"]
    refused = {
        "ga ssh --tunnel-through-iap": gcloud(*ssh, "--tunnel-through-iap"),
        "ga scp --tunnel-through-iap": gcloud(*scp, "--tunnel-through-iap"),
        "scp --ssh-flag": gcloud("alpha", *scp, "--ssh-flag=-v"),
        "ssh --scp-flag": gcloud("alpha", *ssh, "--scp-flag=-v"),
        "alpha --internal-ip with IAP": gcloud("alpha", *ssh, "--internal-ip", "--tunnel-through-iap"),
    }
    for what, proc in refused.items():
        assert proc.returncode == 2 and "ERROR: (gcloud.compute.tpus.tpu-vm)" in proc.stderr, (what, proc.stderr)
    assert "unrecognized arguments: --tunnel-through-iap" in refused["ga ssh --tunnel-through-iap"].stderr
    accepted = [
        gcloud("alpha", *ssh, "--tunnel-through-iap", "--ssh-flag=-v"),
        gcloud("alpha", *scp, "--tunnel-through-iap", "--scp-flag=-v"),
        gcloud(*ssh, "--internal-ip", "--ssh-flag=-v"),
        gcloud(*scp, "--internal-ip", "--scp-flag=-v"),
    ]
    assert [p.returncode for p in accepted] == [0, 0, 0, 0], [p.stderr for p in accepted]


@pytest.mark.slow
def test_iap_on_the_alpha_track_reaches_ssh_and_scp_with_each_commands_own_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcloud_track=alpha puts `alpha` in every call; --tunnel-through-iap goes to ssh and scp, --ssh-flag only to
    ssh, launcher.scp_flags only to scp. Before: GA calls with IAP, and ssh_flags (a --ssh-flag too) on scp."""
    pod = fake_pod(tmp_path, monkeypatch, 2)
    wheel = tmp_path / "trm_sweeps-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    pods = launcher(
        gcloud_track="alpha",
        ssh_flags=["--tunnel-through-iap", "--ssh-flag=-oServerAliveInterval=30"],
        deploy=True,
        wheel=str(wheel),
        python="true",  # the stand-in VMs run it for the interpreter check and the install: the calls are the test
    )
    pods.prepare()  # every call succeeds against the stricter stand-in
    calls = [eval(line) for line in (pod / "calls.log").read_text().splitlines()]
    assert {c[4] for c in calls} == {"ssh", "scp"} and all(c[0] == "alpha" for c in calls), calls
    assert all("--tunnel-through-iap" in c for c in calls), calls
    assert all(("--ssh-flag=-oServerAliveInterval=30" in c) == (c[4] == "ssh") for c in calls), calls

    (pod / "calls.log").unlink()
    launcher(ssh_flags=["--internal-ip"], scp_flags=["--internal-ip", "--scp-flag=-l 8000"], deploy=True,
             wheel=str(wheel), python="true").prepare()  # fmt: skip
    calls = [eval(line) for line in (pod / "calls.log").read_text().splitlines()]
    assert all(c[:3] == ["compute", "tpus", "tpu-vm"] for c in calls), calls  # GA: no track word
    assert all(("--scp-flag=-l 8000" in c) == (c[3] == "scp") for c in calls), calls


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_flags_a_call_would_refuse_are_named_before_any_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pod(tmp_path, monkeypatch, 2)
    with pytest.raises(LauncherConfigError) as iap:
        launcher(ssh_flags=["--tunnel-through-iap"]).validate()
    assert str(iap.value).startswith(
        "launcher.ssh_flags=['--tunnel-through-iap']: --tunnel-through-iap exists only on gcloud's alpha track of "
        "`tpu-vm ssh/scp` (GA has _ENABLE_IAP = False); set launcher.gcloud_track=alpha"
    )
    with pytest.raises(LauncherConfigError, match=r"launcher.gcloud_track='beta': expected one of ga, alpha"):
        launcher(gcloud_track="beta").validate()
    with pytest.raises(LauncherConfigError, match=r"launcher.scp_flags=\['--ssh-flag=-v'\]: --ssh-flag is a flag of "
                       r"`tpu-vm ssh` only.*put it in launcher.ssh_flags"):  # fmt: skip
        launcher(scp_flags=["--ssh-flag=-v"]).validate()
    with pytest.raises(LauncherConfigError, match=r"launcher.ssh_flags=\['--scp-flag=-v'\]: --scp-flag is a flag of "
                       r"`tpu-vm scp` only.*put it in launcher.scp_flags"):  # fmt: skip
        launcher(ssh_flags=["--scp-flag=-v"]).validate()
    with pytest.raises(LauncherConfigError, match=r"launcher.ssh_flags=\['internal-ip'\]: expected gcloud flags"):
        launcher(ssh_flags=["internal-ip"]).validate()
    launcher(gcloud_track="alpha", ssh_flags=["--tunnel-through-iap"]).validate()  # accepted on alpha
