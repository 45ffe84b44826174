"""A trial on every worker VM of a Cloud TPU pod through `gcloud compute tpus tpu-vm ssh`.

One ssh session per worker (`--worker=i`), not one `--worker=all` session, so each worker has its own log
and exit code: when one fails the handle names it and stops the others. Cancel also runs `pkill` on every
VM (`--worker=all`), because killing the local ssh client does not stop the remote python.

Quoting: the remote command is one argv element for gcloud (no local shell); the remote shell parses it,
so every piece is `shlex.quote`d once: overrides with spaces, quotes, brackets or `$` arrive intact, and a path
under `~` keeps its `~` for that shell (sweeps/launchers/tpu/shell.py). (The values the driver builds from
names and paths are quoted for Hydra first: sweeps.launchers.base.quote_literals.)

Every gcloud call has `--quiet`: its stdin is closed, so a prompt (the first ssh's key passphrase) could only
fail; `launcher.ssh_flags` adds gcloud's own to every ssh (`--internal-ip`, or `--tunnel-through-iap` on
`launcher.gcloud_track=alpha`, for VMs without an external IP) and `launcher.scp_flags` to every scp (null: the
ssh_flags scp takes too); sweeps/launchers/tpu/gcloud.py says what gcloud's source settles about both.
"""

from __future__ import annotations

import glob
import logging
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeps.config.schema import SweepConfig
from sweeps.launchers.base import (
    JobHandle,
    JobSpec,
    LauncherConfigError,
    Machine,
    PreflightReport,
    quote_literals,
    require,
    start_worker,
    worker_env,
)
from sweeps.launchers.job_command import JOB_TAG_KEY
from sweeps.launchers.slots import Slot, tpu_slots
from sweeps.launchers.tpu.describe import (
    ON_PREEMPTED,
    Answer,
    describe,
    refuse_unknown,
    unknown_line,
    wait_for_ready,
)
from sweeps.launchers.tpu.gcloud import check_flags, keepalive_flags, scp_flags_of, track_args
from sweeps.launchers.tpu.preflight import preflight as pod_preflight
from sweeps.launchers.tpu.shell import (
    chips_free_check,
    job_command,
    job_pattern,
    python_check,
    python_refusal,
    shell_path,
    stop_command,
)
from sweeps.launchers.tpu.slice import SliceShape, check_configured, parse_node, shape_of_type

log = logging.getLogger(__name__)

# Where this code runs from: a checkout (pyproject.toml beside the packages) or an installed wheel.
CHECKOUT = Path(__file__).resolve().parents[3]

# Environment a worker needs that the VM does not give (TPU runtime, control-plane port).
DEFAULT_ENV = {"PJRT_DEVICE": "TPU"}
# A stop's SIGTERM to SIGKILL on the VMs (conf/launcher/tpu_pod.yaml kill_grace_s): a paper-scale save to gs://
# rarely fits the local launchers' 10 s, and a kill mid-save keeps only the previous checkpoint.
POD_TERMINATE_GRACE_S = 120.0


class TpuPodLauncher:
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
        ssh_alive_interval_s: int = 30,
        ssh_alive_count: int = 4,
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
        self.recover_timeout_s = recover_timeout_s
        self.ssh_alive_interval_s, self.ssh_alive_count = ssh_alive_interval_s, ssh_alive_count
        # A dry run with launcher.accelerator_type prices the study on that type: no slice need exist yet.
        self.accelerator_type, self.planning = accelerator_type, bool(dry_run and accelerator_type)
        self._shape: SliceShape | None = None

    # ------------------------------------------------------------------------------------------- the slice

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

    def machine(self) -> Machine:
        """The slice, for a dry run's header and its price (launcher.accelerator_type's plan in a dry run)."""
        shape = self.shape()
        return Machine(shape.line(), shape.accelerator_type, shape.chips)

    def preflight(self, sweep: SweepConfig, train: Mapping[str, Any] | None = None) -> PreflightReport:
        """The probe on every VM and what its answers show (sweeps/launchers/tpu/preflight.py), once the launcher's
        own config is checked (validate: nothing else is asked of gcloud before it)."""
        self.validate()
        return pod_preflight(sweep, self, train)

    def describe_argv(self) -> list[str]:
        return [*self.base_args("describe"), str(self.tpu_name), *self._location_flags("describe"), "--format=json"]

    def ask(self) -> Answer:
        """One `tpu-vm describe`, its errors retried (sweeps/launchers/tpu/describe.py)."""
        return describe(self.describe_argv(), self.ssh_timeout_s, self.describe_attempts, self.describe_backoff_s)

    def not_ready(self) -> str | None:
        """None once the slice is usable; else why not: its state or health, NOT_FOUND, or no answer at all."""
        answer = self.ask()
        if answer.error is not None:
            return unknown_line(str(self.tpu_name), answer, self.describe_attempts)
        return answer.gone(str(self.tpu_name))

    def unavailable(self) -> str | None:
        """Whether the slice is gone, asked afresh: a state other than READY, an unhealthy `health` or NOT_FOUND
        (a spot slice may be PREEMPTED at any time). A describe that fails otherwise (5xx, 429, a timeout, a
        reauth) says nothing about the slice: logged, and None, so the study goes on."""
        answer = self.ask()
        if answer.error is not None:
            log.warning("%s: taken as still usable", unknown_line(str(self.tpu_name), answer, self.describe_attempts))
            return None
        return answer.gone(str(self.tpu_name))

    def wait_until_available(self, line: str) -> None:
        """Wait for READY (launcher.on_preempted), then prepare the slice anew: a recreated one has fresh VMs, new
        addresses, and none of the setup, venv or code the old ones had; no job of ours may still run there. A
        prepare or check that fails (a fresh VM's ssh not up yet, a VM gone under a slice that still reads READY,
        chips still held) waits and tries again, from the slice's state, until launcher.recover_timeout_s has passed
        since the slice first read READY; then its error ends the driver."""
        ready_since: float | None = None
        while True:
            wait_for_ready(line, self.not_ready, self.on_preempted, self.state_poll_s)
            ready_since = time.monotonic() if ready_since is None else ready_since
            log.warning("the slice is READY: setting up its VMs anew (launcher.setup, the Python check, deploy)")
            self._shape = None
            try:
                self.prepare()
                # The pause stopped every job of ours: a training process still there would hold the chips.
                self._run_all(chips_free_check(None), "checking that no job of ours still runs on the VMs")
                return
            except LauncherConfigError as err:
                if time.monotonic() - ready_since > self.recover_timeout_s:
                    raise
                line = f"slice {self.tpu_name}: setting up its VMs failed ({str(err)[:300]})"
                log.warning("%s: trying again in %g s (launcher.recover_timeout_s)", line, self.state_poll_s)
                time.sleep(self.state_poll_s)

    # ------------------------------------------------------------------------------------------- setup

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

    def validate(self) -> None:
        """Config errors before anything is contacted."""
        require(self.tpu_name, "launcher.tpu_name", "the TPU VM name, as in `gcloud compute tpus tpu-vm list`")
        require(self.zone, "launcher.zone", "the TPU's zone, e.g. us-central2-b")
        if shutil.which(self.gcloud) is None and not self.planning:
            raise LauncherConfigError(
                f"launcher.gcloud={self.gcloud!r}: not found on PATH (install the Google Cloud CLI)"
            )
        check_flags(self.gcloud_track, self.ssh_flags, self.scp_flags)
        if self.on_preempted not in ON_PREEMPTED or not self.state_poll_s > 0:
            raise LauncherConfigError(
                f"launcher.on_preempted={self.on_preempted!r}, launcher.state_poll_s={self.state_poll_s!r}: expected "
                f"one of {', '.join(ON_PREEMPTED)} and seconds > 0"
            )
        if not (isinstance(self.describe_attempts, int) and self.describe_attempts >= 1) or self.describe_backoff_s < 0:
            raise LauncherConfigError(
                f"launcher.describe_attempts={self.describe_attempts!r}, launcher.describe_backoff_s="
                f"{self.describe_backoff_s!r}: expected an integer >= 1 and seconds >= 0"
            )
        alive = (self.ssh_alive_interval_s, self.ssh_alive_count)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in alive) or alive[1] < 1:
            raise LauncherConfigError(
                f"launcher.ssh_alive_interval_s={alive[0]!r}, launcher.ssh_alive_count={alive[1]!r}: expected whole "
                "seconds >= 0 (0: no keep-alive) and a count >= 1"
            )
        if not self.recover_timeout_s >= 0:
            raise LauncherConfigError(f"launcher.recover_timeout_s={self.recover_timeout_s!r}: expected seconds >= 0")
        if self.slot_kind == "pod" and self.worker_ids() != list(range(self.shape().workers)):
            # libtpu takes the slice's topology from the TPU's metadata: a job on some VMs waits for the rest.
            raise LauncherConfigError(
                f"launcher.workers={self.workers!r} with launcher.slots=pod: a pod job runs on every VM of the TPU "
                "(libtpu waits for all of them to join); use launcher.workers=all, or launcher.slots=vm or chips:N "
                "to run trials on some VMs each"
            )
        self.slots()
        if self.deploy:
            self.wheel_source()

    def wheel_source(self) -> Path:
        """What deploy=true installs: launcher.wheel, else this checkout (built into a wheel at deploy time)."""
        if self.wheel is not None:
            if not Path(self.wheel).is_file() or not str(self.wheel).endswith(".whl"):
                raise LauncherConfigError(
                    f"launcher.wheel={self.wheel!r}: not a wheel file (expected a path to trm_sweeps-*.whl)"
                )
            return Path(self.wheel)
        if not (CHECKOUT / "pyproject.toml").is_file():
            raise LauncherConfigError(
                f"launcher.deploy=true builds a wheel from a checkout, but this trm-sweeps is installed ({CHECKOUT} has no "
                "pyproject.toml): set launcher.wheel=/path/to/trm_sweeps-<version>.whl (the wheel you installed), or "
                "install the same version on every worker and keep launcher.deploy=false"
            )
        return CHECKOUT

    def prepare(self) -> None:
        """Validate, check every worker answers (first contact: the key set-up may take minutes), run
        launcher.setup on each, check it has a Python the project runs on, and deploy this code version when asked.
        Run again on a slice recreated after a preemption (wait_until_available): its VMs are new."""
        self.validate()
        self._run_all("true", "reaching the workers", self.connect_timeout_s)
        if self.setup:
            self._run_all(self.setup, "launcher.setup on every worker", self.copy_timeout_s)
        self.check_python()
        if self.deploy:
            self._deploy()

    def check_python(self) -> None:
        """launcher.python on every worker is at least MIN_PYTHON (a TPU VM image's python3 may be older)."""
        argv = self.ssh_argv("all", python_check(self.python))
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=self.ssh_timeout_s)
        python_refusal(self.python, proc.returncode, proc.stdout, proc.stderr)

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

    def _deploy(self) -> None:
        """Install this code version on every worker (launcher.wheel, or a wheel built from this checkout)."""
        source = self.wheel_source()
        if source.suffix == ".whl":
            wheel = str(source)
        else:
            dist = source / "dist"
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)], check=True
            )
            wheel = max(glob.glob(str(dist / "trm_sweeps-*.whl")), key=lambda p: Path(p).stat().st_mtime)
        scp = [
            *self.base_args("scp"),
            wheel,
            f"{self.tpu_name}:{self.remote_dir}/",
            *self._location_flags("scp"),
            "--worker=all",
        ]
        self._run_all(f"mkdir -p {shell_path(self.remote_dir)}", "creating the remote directory")
        proc = subprocess.run(scp, check=False, capture_output=True, text=True, timeout=self.copy_timeout_s)
        if proc.returncode != 0:
            raise LauncherConfigError(
                f"copying {Path(wheel).name} to the workers failed: {proc.stderr.strip()[-1000:]}"
            )
        remote_wheel = f"{self.remote_dir}/{Path(wheel).name}"
        self._run_all(
            f"{shell_path(self.python)} -m pip install -q --no-deps --force-reinstall {shell_path(remote_wheel)}",
            "installing the wheel",
        )

    # ---------------------------------------------------------------------------------------- launching

    # The chips' processes are the pod runtime's (the job's own batch check counts them); the VMs are remote.
    world_size = 1
    shares_filesystem = False

    def describe(self, spec: JobSpec) -> str:
        """The command every worker of the job's slot runs, as one ssh (the driver starts a session per worker)."""
        workers = ",".join(map(str, spec.slot.workers)) if spec.slot.workers else "all"
        return shlex.join(self.ssh_argv(workers, self.remote_command(spec)))

    def slots(self, kind: str | None = None) -> list[Slot]:
        """pod: every VM runs each trial; vm: a trial per VM; chips:N: a trial per N chips of a VM."""
        shape = self.shape()
        return tpu_slots(
            kind or self.slot_kind, self.worker_ids(), shape.chips_per_vm, shape.chip_family.accelerator_type
        )

    def slot_alive(self, slot: Slot) -> bool:
        """Whether every VM of the slot still answers ssh and no process of an earlier job still holds the slot's
        chips (a failed or stopped job on a dead VM, or one that outlived its stop, retires only its slots)."""
        workers = ",".join(map(str, slot.workers)) if slot.workers else "all"
        check = chips_free_check(slot.env.get("TPU_VISIBLE_CHIPS"))
        try:
            proc = subprocess.run(
                self.ssh_argv(workers, check), check=False, capture_output=True, text=True, timeout=self.ssh_timeout_s
            )
        except subprocess.TimeoutExpired:
            return False
        if proc.returncode == 1 and "still runs" in proc.stdout:
            log.warning("slot %s: %s; it takes no more trials", slot.name, proc.stdout.strip().replace("\n", "; "))
        return proc.returncode == 0

    def remote_command(self, spec: JobSpec) -> str:
        env = {**self.env, **spec.slot.env, **spec.env}
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        train = shlex.join(["-m", "trm.train", *quote_literals([*spec.overrides, f"{JOB_TAG_KEY}={spec.name}"])])
        here = shell_path(self.remote_dir)
        job = f"{exports} {shell_path(self.python)} {train}".strip()
        return job_command(f"mkdir -p {here} && cd {here}", job, launch_id=uuid.uuid4().hex[:16])

    def cancel_command(self, spec: JobSpec, grace_s: float | None = None) -> str:
        """Stop the job's processes on its VMs: SIGTERM, then SIGKILL after `grace_s` (launcher.kill_grace_s)."""
        job = quote_literals([f"{JOB_TAG_KEY}={spec.name}"])[0]  # as it stands on their command lines
        return stop_command(job_pattern(job), self.kill_grace_s if grace_s is None else grace_s)

    def launch(self, spec: JobSpec) -> JobHandle:
        command = self.remote_command(spec)
        vms = list(spec.slot.workers) or self.worker_ids()
        workers = [
            start_worker(
                f"worker-{w}",
                self.ssh_argv(str(w), command),
                spec.workdir,
                worker_env(spec, with_slot=False),  # the slot's environment goes in the remote command
                spec.workdir / f"worker-{w}.log",
            )
            for w in vms
        ]
        cancel_on = ",".join(map(str, spec.slot.workers)) if spec.slot.workers else "all"
        return JobHandle(
            workers,
            remote_cancel=lambda grace_s: self._run_on(
                cancel_on, self.cancel_command(spec, grace_s), "stopping the job", self.ssh_timeout_s + grace_s + 10
            ),
            grace_s=self.kill_grace_s,
        )
