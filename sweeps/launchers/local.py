"""One training process on this machine: the embedded default.

`warm=true` starts each job from a warm worker (trm/warm_worker.py: torch imported once, one forked process per
job) instead of a fresh interpreter: for short trials on a laptop, where the start-up is a visible share. Each
job is still its own process. The pod launchers keep a fresh interpreter per job: their start-up is small
beside a pod trial, and a fresh process is the one sure way a TPU's runtime and chips are released.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from sweeps.launchers.base import JobSpec, ThisMachine, worker_env
from sweeps.launchers.job_command import stop_grace
from sweeps.launchers.quoting import quote_literals
from sweeps.launchers.slots import Slot, device_slots
from sweeps.launchers.warm import WarmWorker
from sweeps.launchers.workers import TERMINATE_GRACE_S, JobHandle, Worker, machine_env, start_worker


class LocalLauncher(ThisMachine):
    world_size = 1
    shares_filesystem = True  # the job runs here: its data path and interpreter can be checked here

    def __init__(
        self,
        python: str | None = None,
        slots: str = "pod",
        devices: int | None = None,
        warm: bool = False,
        kill_grace_s: float = TERMINATE_GRACE_S,
    ):
        self.python = python or sys.executable
        self.slot_kind, self.devices = slots, devices
        self.warm, self.kill_grace_s = warm, kill_grace_s
        self._warm_worker: WarmWorker | None = None

    def slots(self, kind: str | None = None) -> list[Slot]:
        """pod: trials share this machine (max_concurrent of them); chips:N: N of its `devices` GPUs each."""
        return device_slots(kind or self.slot_kind, self.devices)

    def slot_alive(self, slot: Slot) -> bool:
        return True  # this machine: the driver runs on it

    def prepare(self) -> None:
        """Nothing to deploy or reach: the driver's own interpreter runs the job."""

    def describe(self, spec: JobSpec) -> str:
        return shlex.join(self.command(spec))

    def command(self, spec: JobSpec) -> list[str]:
        return [self.python, "-m", "trm.train", *self.overrides(spec)]

    def overrides(self, spec: JobSpec) -> list[str]:
        """The job's overrides, told this launcher's kill grace (its stop's save ends within it)."""
        return quote_literals([*spec.overrides, stop_grace(self.kill_grace_s)])

    def launch(self, spec: JobSpec) -> JobHandle:
        env = worker_env(spec)
        # One machine: every trial can share one generated dataset instead of building its own.
        env.setdefault("TRM_DATA_DIR", str(Path("outputs/data").resolve()))
        log_path = spec.workdir / "worker-0.log"
        if not self.warm:
            worker = start_worker("worker-0", self.command(spec), spec.workdir, env, log_path)
            return JobHandle([worker], grace_s=self.kill_grace_s)
        job = self.warm_worker(spec.workdir.parent).fork(self.overrides(spec), spec.workdir, env, log_path)
        return JobHandle([Worker("worker-0", job, log_path)], grace_s=self.kill_grace_s)

    def warm_worker(self, logs: Path) -> WarmWorker:
        """The warm worker, started at the first job (again if it died): its own log sits beside the trials'."""
        if self._warm_worker is None or not self._warm_worker.alive:
            # OMP_* are read when libgomp loads, in the server: its environment's are every job's.
            self._warm_worker = WarmWorker(self.python, machine_env(), logs / "warm-worker.log")
        return self._warm_worker
