"""Getting a pod's VMs ready for jobs: the launcher's config checked before anything is contacted (validate), then
every worker reached, launcher.setup run, its Python checked and this code version deployed (prepare); again on a
slice recreated after a preemption."""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from sweeps.launchers.base import LauncherConfigError, require
from sweeps.launchers.tpu.calls import PodCalls
from sweeps.launchers.tpu.describe import ON_PREEMPTED
from sweeps.launchers.tpu.gcloud import check_flags
from sweeps.launchers.tpu.shell import prepared_mark, python_check, python_refusal, shell_path

# Where this code runs from: a checkout (pyproject.toml beside the packages) or an installed wheel.
CHECKOUT = Path(__file__).resolve().parents[3]


class PodSetup(PodCalls):
    """The pod's config checks and the VMs' set-up (the launcher's slots, which validate checks, are its own)."""

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
        sessions = self.ssh_sessions
        if not (isinstance(sessions, int) and not isinstance(sessions, bool) and sessions >= 1):
            raise LauncherConfigError(
                f"launcher.ssh_sessions={sessions!r}: expected an integer >= 1 (the most gcloud ssh processes one "
                "job's workers run in; 1 session per VM up to it, VMs grouped beyond)"
            )
        if not (self.recover_timeout_s >= 0 and self.watch_s >= 0):
            raise LauncherConfigError(
                f"launcher.recover_timeout_s={self.recover_timeout_s!r}, launcher.watch_s={self.watch_s!r}: expected "
                "seconds >= 0 (watch_s=0: the slice is asked only when a job ends and before a launch)"
            )
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
        Run again on a slice recreated after a preemption (wait_until_available): its VMs are new. Last, a new
        prepare id is left on every VM (shell.PREPARED_FILE): `slot_alive` finds a VM recreated under a slice that
        still reads READY by its missing id, so the study sets the slice up again instead of charging its trials."""
        self.validate()
        self._run_all("true", "reaching the workers", self.connect_timeout_s)
        if self.setup:
            self._run_all(self.setup, "launcher.setup on every worker", self.copy_timeout_s)
        self.check_python()
        if self.deploy:
            self._deploy()
        prepare_id = uuid.uuid4().hex[:16]
        self._run_all(prepared_mark(self.remote_dir, prepare_id), "leaving the prepare's id on every worker")
        self.prepare_id = prepare_id

    def check_python(self) -> None:
        """launcher.python on every worker is at least MIN_PYTHON (a TPU VM image's python3 may be older)."""
        argv = self.ssh_argv("all", python_check(self.python))
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=self.ssh_timeout_s)
        python_refusal(self.python, proc.returncode, proc.stdout, proc.stderr)

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
