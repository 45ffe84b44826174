"""The `gcloud [alpha] compute tpus tpu-vm ssh|scp` command lines of the tpu_pod launcher, and their flags' checks.

What gcloud's own source says (googlecloudsdk/surface/compute/tpus/tpu_vm/ssh.py and scp.py, and
command_lib/compute/tpus/tpu_vm/ssh.py: AddTPUSSHArgs):
- Both commands exist on two release tracks: `Ssh`/`Scp` are GA with `_ENABLE_IAP = False` and
  `_ENABLE_BATCHING = False` ("IAP and Batching are not available for GA"); `SshAlpha`/`ScpAlpha` set both True.
  `--tunnel-through-iap` (and `--batch-size`) is added only when IAP is enabled, so the GA commands refuse it as
  an unrecognized argument: VMs without an external IP reached through IAP need `gcloud alpha` (`launcher.
  gcloud_track=alpha`). On the alpha track `--internal-ip` and `--tunnel-through-iap` are one mutually
  exclusive group.
- Each command takes its own pass-through flag: ssh takes `--ssh-flag` (and `--command`, `--output-directory`),
  scp takes `--scp-flag` (and `--recurse`, `--compress`); neither accepts the other's. Both take the routing
  and key flags (`--internal-ip`, `--strict-host-key-checking`, `--ssh-key-file`, `--plain`, `--dry-run`).
So `launcher.ssh_flags` go on every ssh, `launcher.scp_flags` on every scp; with scp_flags null, scp gets the
ssh_flags except ssh's own (a `--ssh-flag=...` is never handed to scp).
"""

from __future__ import annotations

from collections.abc import Sequence

from sweeps.launchers.base import LauncherConfigError

TRACKS = ("ga", "alpha")  # the release tracks that have `tpu-vm ssh` and `tpu-vm scp` (gcloud's ReleaseTracks)
ALPHA_ONLY = ("--tunnel-through-iap", "--batch-size")  # added by AddTPUSSHArgs only where IAP/batching is enabled
SSH_ONLY = ("--ssh-flag", "--command", "--output-directory")  # AddSSHArgs / AddCommandArgGroup: not scp's
SCP_ONLY = ("--scp-flag", "--recurse", "--compress")  # AddSCPArgs: not ssh's
OWN = ("--worker", "--zone", "--quiet")  # the launcher sets these itself on every call


def flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def check_flags(track: str, ssh_flags: Sequence[str], scp_flags: Sequence[str] | None) -> None:
    """One line naming the key, the value and what is accepted, for a flag gcloud would refuse on some call."""
    if track not in TRACKS:
        raise LauncherConfigError(
            f"launcher.gcloud_track={track!r}: expected one of {', '.join(TRACKS)} (the release tracks of gcloud that "
            "have `compute tpus tpu-vm ssh` and `scp`)"
        )
    keys = {"launcher.ssh_flags": (list(ssh_flags), SCP_ONLY, "launcher.scp_flags", "scp")}
    if scp_flags is not None:
        keys["launcher.scp_flags"] = (list(scp_flags), SSH_ONLY, "launcher.ssh_flags", "ssh")
    for key, (flags, foreign, other_key, other) in keys.items():
        bad = [f for f in flags if not f.startswith("--")]
        if bad:
            raise LauncherConfigError(
                f"{key}={flags!r}: expected gcloud flags such as --internal-ip (each starting with --); got {bad}"
            )
        for flag in flags:
            name = flag_name(flag)
            if name in OWN:
                raise LauncherConfigError(
                    f"{key}={flags!r}: {name} is set by the launcher itself (launcher.zone, launcher.workers); "
                    "remove it"
                )
            if name in foreign:
                raise LauncherConfigError(
                    f"{key}={flags!r}: {name} is a flag of `tpu-vm {other}` only, which the other command refuses; "
                    f"put it in {other_key}"
                )
            if name in ALPHA_ONLY and track != "alpha":
                raise LauncherConfigError(
                    f"{key}={flags!r}: {name} exists only on gcloud's alpha track of `tpu-vm ssh/scp` (GA has "
                    f"_ENABLE_IAP = False); set launcher.gcloud_track=alpha, or reach the VMs with --internal-ip "
                    "from a machine in their VPC"
                )


def track_args(gcloud: str, track: str, verb: str) -> list[str]:
    """`gcloud [alpha] compute tpus tpu-vm VERB`."""
    return [gcloud, *([track] if track != "ga" else []), "compute", "tpus", "tpu-vm", verb]


def scp_flags_of(ssh_flags: Sequence[str], scp_flags: Sequence[str] | None) -> list[str]:
    """The flags every scp gets: launcher.scp_flags, else the ssh_flags that scp takes too."""
    if scp_flags is not None:
        return list(scp_flags)
    return [f for f in ssh_flags if flag_name(f) not in SSH_ONLY]


def keepalive_flags(interval_s: int, count: int) -> list[str]:
    """OpenSSH's keep-alive on every ssh (launcher.ssh_alive_interval_s, launcher.ssh_alive_count; 0: none): a
    session to a VM that vanished without closing its connection ends with 255 after about interval x count
    seconds, instead of waiting out the TCP timeout or the driver's stall_timeout_s. gcloud sets no
    ServerAliveInterval of its own (578.0.0: BaseSSHCLIHelper's GetConfig) and splits each `--ssh-flag` on
    whitespace (command_lib/util/ssh/ssh.py: ParseAndSubstituteSSHFlags); these go after launcher.ssh_flags, and
    OpenSSH keeps the first value it reads of an option, so a user's own -o ServerAliveInterval wins."""
    if interval_s <= 0:
        return []
    return [f"--ssh-flag=-o ServerAliveInterval={interval_s}", f"--ssh-flag=-o ServerAliveCountMax={count}"]
