"""N training processes on this machine under torchrun (gloo on CPU, rendezvous on loopback).

With `nnodes > 1` every node is its own torchrun agent in its own directory, building its own data: the
shape of a multi-VM job without a shared filesystem, on one machine.
"""

from __future__ import annotations

import shlex
import socket
import sys

from sweeps.launchers.base import JobSpec, LauncherConfigError, ThisMachine, worker_env
from sweeps.launchers.job_command import stop_grace
from sweeps.launchers.quoting import quote_literals
from sweeps.launchers.slots import Slot, device_slots
from sweeps.launchers.workers import TERMINATE_GRACE_S, JobHandle, start_worker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class TorchrunLauncher(ThisMachine):
    def __init__(
        self,
        nnodes: int = 1,
        nproc_per_node: int = 2,
        master_port: int = 0,
        python: str | None = None,
        slots: str = "pod",
        devices: int | None = None,
        kill_grace_s: float = TERMINATE_GRACE_S,
    ):
        self.nnodes, self.nproc_per_node, self.master_port = nnodes, nproc_per_node, master_port
        self.python = python or sys.executable
        self.slot_kind, self.devices, self.kill_grace_s = slots, devices, kill_grace_s

    def slots(self, kind: str | None = None) -> list[Slot]:
        """pod: trials share this machine; chips:N: each job's processes see N of its `devices` GPUs."""
        return device_slots(kind or self.slot_kind, self.devices)

    def slot_alive(self, slot: Slot) -> bool:
        return True  # every node runs on this machine

    def prepare(self) -> None:
        for key in ("nnodes", "nproc_per_node"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise LauncherConfigError(f"launcher.{key}={value!r}: expected an integer >= 1")

    @property
    def world_size(self) -> int:
        return int(self.nnodes) * int(self.nproc_per_node)

    shares_filesystem = True  # every node runs on this machine (each in its own directory when nnodes > 1)

    def describe(self, spec: JobSpec) -> str:
        """Node 0's command; the port is picked per job, so torchrun's default stands in for it."""
        return shlex.join(self.command(spec, 0, 29500))

    def command(self, spec: JobSpec, node_rank: int, port: int) -> list[str]:
        return [
            self.python, "-m", "torch.distributed.run",
            f"--nnodes={self.nnodes}", f"--node_rank={node_rank}", f"--nproc_per_node={self.nproc_per_node}",
            "--master_addr=127.0.0.1", f"--master_port={port}",
            "-m", "trm.train", *quote_literals([*spec.overrides, stop_grace(self.kill_grace_s)]),
        ]  # fmt: skip

    def launch(self, spec: JobSpec) -> JobHandle:
        port = self.master_port or free_port()
        workers = []
        for node in range(self.nnodes):
            node_dir = spec.workdir / f"node-{node}" if self.nnodes > 1 else spec.workdir
            workers.append(
                start_worker(
                    f"node-{node}",
                    self.command(spec, node, port),
                    node_dir,
                    worker_env(spec),
                    spec.workdir / f"node-{node}.log",
                )
            )
        return JobHandle(workers, grace_s=self.kill_grace_s)
