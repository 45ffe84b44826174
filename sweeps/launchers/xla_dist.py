"""LEGACY: pods still on torch_xla < 2.1, started with `torch_xla.distributed.xla_dist`.

xla_dist runs on one VM and fans out to every worker itself (`--tpu=NAME --restart-tpuvm-pod-server`).
It was removed from torch_xla 2.1+; use `launcher=tpu_pod` there. Only one local process exists, so a
failure names the whole pod rather than a worker.
"""

from __future__ import annotations

import shlex
import sys

from sweeps.job_command import JOB_TAG_KEY
from sweeps.launchers.base import (
    TERMINATE_GRACE_S,
    JobHandle,
    JobSpec,
    quote_literals,
    require,
    start_worker,
    worker_env,
)
from sweeps.slots import Slot, device_slots


class XlaDistLauncher:
    # The pod's processes are xla_dist's business (the job's own batch check counts them); the VMs are remote.
    world_size = 1
    shares_filesystem = False

    def __init__(
        self,
        tpu_name: str | None = None,
        python: str | None = None,
        restart_server: bool = True,
        kill_grace_s: float = TERMINATE_GRACE_S,
    ):
        self.tpu_name, self.kill_grace_s = tpu_name, kill_grace_s
        self.python = python or sys.executable
        self.restart_server = restart_server

    def slots(self, kind: str | None = None) -> list[Slot]:
        """Only the whole pod: xla_dist always starts every worker."""
        return device_slots(kind or "pod", None)

    def slot_alive(self, slot: Slot) -> bool:
        return True

    def prepare(self) -> None:
        require(self.tpu_name, "launcher.tpu_name", "the TPU pod name given to xla_dist --tpu")

    def describe(self, spec: JobSpec) -> str:
        return shlex.join(self.command(spec))

    def command(self, spec: JobSpec) -> list[str]:
        argv = [self.python, "-m", "torch_xla.distributed.xla_dist", f"--tpu={self.tpu_name}"]
        if self.restart_server:
            argv.append("--restart-tpuvm-pod-server")
        return [
            *argv,
            "--",
            self.python,
            "-m",
            "trm.train",
            *quote_literals([*spec.overrides, f"{JOB_TAG_KEY}={spec.name}"]),
        ]

    def launch(self, spec: JobSpec) -> JobHandle:
        worker = start_worker(
            "xla_dist", self.command(spec), spec.workdir, worker_env(spec), spec.workdir / "xla_dist.log"
        )
        return JobHandle([worker], grace_s=self.kill_grace_s)
