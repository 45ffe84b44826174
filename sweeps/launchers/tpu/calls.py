"""The pod launcher's config and its calls to gcloud: the knobs (conf/launcher/tpu_pod.yaml), the slice as
`tpu-vm describe` gives it, and the ssh command lines to its VMs.

Quoting: the remote command is one argv element for gcloud (no local shell); the remote shell parses it,
so every piece is `shlex.quote`d once: overrides with spaces, quotes, brackets or `$` arrive intact, and a path
under `~` keeps its `~` for that shell (sweeps/launchers/tpu/shell.py). (The values the driver builds from
names and paths are quoted for Hydra first: sweeps.launchers.quoting.quote_literals.)

Every gcloud call has `--quiet`: its stdin is closed, so a prompt (the first ssh's key passphrase) could only
fail; `launcher.ssh_flags` adds gcloud's own to every ssh (`--internal-ip`, or `--tunnel-through-iap` on
`launcher.gcloud_track=alpha`, for VMs without an external IP) and `launcher.scp_flags` to every scp (null: the
ssh_flags scp takes too); sweeps/launchers/tpu/gcloud.py says what gcloud's source settles about both.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence

from sweeps.launchers.base import LauncherConfigError, require
from sweeps.launchers.slots import Slot, tpu_slots
from sweeps.launchers.tpu.describe import Answer, describe, refuse_unknown, unknown_line, wait_for_ready
from sweeps.launchers.tpu.gcloud import keepalive_flags, scp_flags_of, track_args
from sweeps.launchers.tpu.slice import SliceShape, check_configured, parse_node, shape_of_type

# Environment a worker needs that the VM does not give (TPU runtime, control-plane port).
DEFAULT_ENV = {"PJRT_DEVICE": "TPU"}
# A stop's SIGTERM to SIGKILL on the VMs (conf/launcher/tpu_pod.yaml kill_grace_s): a paper-scale save to gs://
# rarely fits the local launchers' 10 s, and a kill mid-save keeps only the previous checkpoint.
POD_TERMINATE_GRACE_S = 120.0


class PodCalls:
    """The launcher's knobs, the slice they name, and a command run over ssh on some or all of its VMs."""

    def __init__(
        self,
        tpu_name: str | None = None,
        zone: str | None = None,
        project: str | None = None,
        num_workers: int | None = None,
        workers: str | Sequence[int] = "all",
        gcloud: str = "gcloud",
        python: str = "python3",
        remote_dir: str = "~/trm-sweeps",
        env: Mapping[str, str] | None = None,
        deploy: bool = False,
        wheel: str | None = None,
        ssh_flags: Sequence[str] | None = None,
        scp_flags: Sequence[str] | None = None,
        gcloud_track: str = "ga",
        connect_timeout_s: int = 300,
        ssh_timeout_s: int = 60,
        copy_timeout_s: int = 600,
        slots: str = "pod",
        chips_per_vm: int | None = None,
        kill_grace_s: float = POD_TERMINATE_GRACE_S,
        setup: str | None = None,
        on_preempted: str = "wait",
        state_poll_s: float = 60.0,
        describe_attempts: int = 4,
        describe_backoff_s: float = 5.0,
        recover_timeout_s: float = 1800.0,
        watch_s: float = 60.0,
        ssh_alive_interval_s: int = 30,
        ssh_alive_count: int = 4,
        ssh_sessions: int = 8,
        accelerator_type: str | None = None,
        dry_run: bool = False,
    ):
        self.tpu_name, self.zone, self.project = tpu_name, zone, project
        self.num_workers, self.workers = num_workers, workers
        self.gcloud, self.python, self.remote_dir = gcloud, python, remote_dir
        self.env = dict(DEFAULT_ENV if env is None else env)
        self.deploy, self.wheel, self.ssh_timeout_s = deploy, wheel, ssh_timeout_s
        self.ssh_flags, self.connect_timeout_s = [str(f) for f in ssh_flags or ()], connect_timeout_s
        self.copy_timeout_s, self.slot_kind, self.chips_per_vm = copy_timeout_s, slots, chips_per_vm
        self.kill_grace_s = kill_grace_s
        self.scp_flags = None if scp_flags is None else [str(f) for f in scp_flags]
        self.gcloud_track = str(gcloud_track)
        self.setup, self.on_preempted, self.state_poll_s = setup, on_preempted, state_poll_s
        self.describe_attempts, self.describe_backoff_s = describe_attempts, describe_backoff_s
        self.recover_timeout_s, self.watch_s = recover_timeout_s, watch_s
        self.watched_at = time.monotonic()  # when `watch` last described the slice
        self.ssh_alive_interval_s, self.ssh_alive_count = ssh_alive_interval_s, ssh_alive_count
        self.ssh_sessions = ssh_sessions  # the most gcloud processes one job's workers run in
        # A dry run with launcher.accelerator_type prices the study on that type: no slice need exist yet.
        self.accelerator_type, self.planning = accelerator_type, bool(dry_run and accelerator_type)
        self._shape: SliceShape | None = None
        # The latest prepare's id, left on every VM (PodSetup.prepare); None before the first: nothing to check.
        self.prepare_id: str | None = None

    def shape(self) -> SliceShape:
        """The slice as `tpu-vm describe` gives it (asked once, once it is usable: before anything is checked or
        contacted, a slice that is not waits, or ends the driver with exit 75 where launcher.on_preempted=exit, so a
        scheduler that runs the command again on 75 does): its workers, chips per VM and device count are the
        launcher's. A configured launcher.num_workers or launcher.chips_per_vm must agree with it."""
        if self._shape is None and self.planning:
            self._shape = shape_of_type(str(self.tpu_name), str(self.accelerator_type))
        if self._shape is None:
            require(self.tpu_name, "launcher.tpu_name", "the TPU VM name, as in `gcloud compute tpus tpu-vm list`")
            require(self.zone, "launcher.zone", "the TPU's zone, e.g. us-central2-b")
            answer = self.ask()
            while (gone := answer.gone(str(self.tpu_name))) is not None:
                wait_for_ready(gone, self.not_ready, self.on_preempted, self.state_poll_s)
                answer = self.ask()
            if answer.node is None:
                refuse_unknown(str(self.tpu_name), answer, self.describe_attempts)
            shape = parse_node(str(self.tpu_name), answer.node or {})
            configured = {
                "launcher.num_workers": self.num_workers,
                "launcher.chips_per_vm": self.chips_per_vm,
                "launcher.accelerator_type": self.accelerator_type,
            }
            check_configured(shape, configured)
            self._shape = shape
        return self._shape

    def not_ready(self) -> str | None:
        """None once the slice is usable; else why not: its state or health, NOT_FOUND, or no answer at all."""
        answer = self.ask()
        if answer.error is not None:
            return unknown_line(str(self.tpu_name), answer, self.describe_attempts)
        return answer.gone(str(self.tpu_name))

    def describe_argv(self) -> list[str]:
        return [*self.base_args("describe"), str(self.tpu_name), *self._location_flags("describe"), "--format=json"]

    def ask(self) -> Answer:
        """One `tpu-vm describe`, its errors retried (sweeps/launchers/tpu/describe.py)."""
        return describe(self.describe_argv(), self.ssh_timeout_s, self.describe_attempts, self.describe_backoff_s)

    def worker_ids(self) -> list[int]:
        count = self.shape().workers
        if self.workers == "all":
            return list(range(count))
        ids = [int(w) for w in (self.workers.split(",") if isinstance(self.workers, str) else self.workers)]
        bad = [w for w in ids if not 0 <= w < count]
        if bad or not ids:
            raise LauncherConfigError(
                f"launcher.workers={self.workers!r}: expected 'all' or worker ids in 0..{count - 1} (slice "
                f"{self.shape().label()} has {count} workers)"
            )
        return ids

    def slots(self, kind: str | None = None) -> list[Slot]:
        """pod: every VM runs each trial; vm: a trial per VM; chips:N: a trial per N chips of a VM."""
        shape = self.shape()
        return tpu_slots(
            kind or self.slot_kind, self.worker_ids(), shape.chips_per_vm, shape.chip_family.accelerator_type
        )

    def base_args(self, verb: str) -> list[str]:
        return track_args(self.gcloud, self.gcloud_track, verb)

    def _location_flags(self, verb: str = "ssh") -> list[str]:
        flags = [f"--zone={self.zone}"]
        if self.project:
            flags.append(f"--project={self.project}")
        if verb == "describe":  # no ssh: the routing and key flags are ssh's and scp's, not describe's
            return [*flags, "--quiet"]
        if verb == "ssh":
            return [
                *flags,
                "--quiet",
                *self.ssh_flags,
                *keepalive_flags(self.ssh_alive_interval_s, self.ssh_alive_count),
            ]
        return [*flags, "--quiet", *scp_flags_of(self.ssh_flags, self.scp_flags)]

    def ssh_argv(self, worker: str, remote_command: str) -> list[str]:
        return [
            *self.base_args("ssh"),
            str(self.tpu_name),
            *self._location_flags(),
            f"--worker={worker}",
            f"--command={remote_command}",
        ]

    def _run_all(self, remote_command: str, what: str, timeout_s: float | None = None) -> None:
        self._run_on("all", remote_command, what, timeout_s)

    def _run_on(self, workers: str, remote_command: str, what: str, timeout_s: float | None = None) -> None:
        argv = self.ssh_argv(workers, remote_command)
        timeout_s = self.ssh_timeout_s if timeout_s is None else timeout_s
        try:
            proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            key = "launcher.connect_timeout_s" if timeout_s == self.connect_timeout_s else "launcher.ssh_timeout_s"
            raise LauncherConfigError(
                f"{what}: `gcloud ... ssh --worker={workers}` did not answer in {timeout_s:g} s ({key})"
            ) from None
        if proc.returncode != 0:
            raise LauncherConfigError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()[-1000:]}")
