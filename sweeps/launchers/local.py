"""One training process on this machine: the embedded default."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from sweeps.launchers.base import JobHandle, JobSpec, quote_literals, start_worker, worker_env
from sweeps.slots import Slot, device_slots


class LocalLauncher:
    world_size = 1
    shares_filesystem = True  # the job runs here: its data path and interpreter can be checked here

    def __init__(self, python: str | None = None, slots: str = "pod", devices: int | None = None):
        self.python = python or sys.executable
        self.slot_kind, self.devices = slots, devices

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
        return [self.python, "-m", "trm.train", *quote_literals(spec.overrides)]

    def launch(self, spec: JobSpec) -> JobHandle:
        env = worker_env(spec)
        # One machine: every trial can share one generated dataset instead of building its own.
        env.setdefault("TRM_DATA_DIR", str(Path("outputs/data").resolve()))
        worker = start_worker("worker-0", self.command(spec), spec.workdir, env, spec.workdir / "worker-0.log")
        return JobHandle([worker])
