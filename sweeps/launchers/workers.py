"""A job's worker processes and the handle over them that the driver can poll, wait on and cancel, and that
says which worker failed and why.

A job is one or more local processes, one per worker (a process, a torchrun node, or the ssh session to
a TPU VM), each writing its own log. The first worker to fail ends the job: the others are cancelled
at once instead of waiting on a collective timeout, so a dead worker stops the whole job within seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sweeps.launchers.interrupts import signals_held

TERMINATE_GRACE_S = 10.0  # launcher.kill_grace_s's default (conf/launcher/*.yaml): SIGTERM to SIGKILL
# Jobs `cancel_all` stops at once: each stop of a pod's job is a gcloud ssh that a dead VM holds until its timeout.
CANCEL_AT_ONCE = 32


class Process(Protocol):
    """What a JobHandle needs of a worker's process: subprocess.Popen, or a warm worker's forked job."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Worker:
    name: str
    process: Process
    log_path: Path


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError:
        return ""


def start_worker(name: str, argv: Sequence[str], cwd: Path, env: dict[str, str], log_path: Path) -> Worker:
    """Start one worker process in its own session (so cancel reaches its children too)."""
    cwd.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 (the child writes to it; closed when the worker is reaped)
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()  # the child keeps its own descriptor
    return Worker(name, process, log_path)


class JobHandle:
    """The running job: poll / wait / cancel, and the first failure."""

    def __init__(
        self,
        workers: list[Worker],
        remote_cancel: Callable[[float], None] | None = None,
        grace_s: float = TERMINATE_GRACE_S,
    ):
        self.workers = workers
        self.remote_cancel = remote_cancel
        self.grace_s = grace_s  # SIGTERM to SIGKILL when the job is cancelled or a worker failed
        self.failure: str | None = None  # "worker-2 exited with 1: <last log lines>"
        self.failed_worker: str | None = None
        self.cancelled = False
        self._returncode: int | None = None

    def poll(self) -> int | None:
        """None while running; then 0 if every worker succeeded, else the first failure's exit code."""
        if self._returncode is not None:
            return self._returncode
        codes = [w.process.poll() for w in self.workers]
        for worker, code in zip(self.workers, codes):
            if code not in (None, 0) and self.failure is None and not self.cancelled:
                self.failed_worker = worker.name
                self.failure = f"{worker.name} exited with code {code}; last log lines:\n{tail(worker.log_path)}"
                self._returncode = code
                self._stop_all()
                return code
        if all(code is not None for code in codes):
            self._returncode = 0 if all(code == 0 for code in codes) else next(c for c in codes if c)
            return self._returncode
        return None

    def wait(self, timeout_s: float | None = None, poll_s: float = 0.5) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(poll_s)
        return code

    def cancel(self, grace_s: float | None = None) -> None:
        """Stop every worker, remote ones included; idempotent. Workers get SIGTERM (a checkpoint) and `grace_s`
        (launcher.kill_grace_s) to exit before SIGKILL; a hung or stopped job cannot act on SIGTERM, so the
        driver gives it 0."""
        self.cancelled = True
        self._stop_all(self.grace_s if grace_s is None else grace_s)
        if self._returncode is None:
            self._returncode = -signal.SIGTERM

    def _stop_all(self, grace_s: float | None = None) -> None:
        """SIGTERM to every worker (and the remote cancel), SIGKILL to those still there after `grace_s`. Ctrl-C or
        SIGTERM to the driver waits until this is done (sweeps.launchers.interrupts.signals_held): a stop left half-way
        left a job training in its own session, its trial RUNNING with nothing recorded."""
        with signals_held():
            self._stop_workers(self.grace_s if grace_s is None else grace_s)

    def _stop_workers(self, grace_s: float) -> None:
        if self.remote_cancel is not None:
            with contextlib.suppress(Exception):  # best effort: the local sessions are stopped below either way
                self.remote_cancel(grace_s)  # remote workers: SIGTERM, SIGKILL after grace_s, on their VMs
        for worker in self.workers:
            _signal_group(worker.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(worker.process, signal.SIGKILL)
                worker.process.wait()

    @property
    def log_paths(self) -> list[Path]:
        return [w.log_path for w in self.workers]


def cancel_all(jobs: Sequence[JobHandle], grace_s: float | None = None) -> None:
    """`JobHandle.cancel(grace_s)` for every job, CANCEL_AT_ONCE at a time: a stop that waits (a job's kill grace, a
    dead VM's ssh timeout) costs that wait once, not once per job. Ctrl-C or SIGTERM to the driver waits until every
    stop is done (signals_held, as for one job); the first error of any stop is raised once all are."""
    if not jobs:
        return
    with signals_held(), ThreadPoolExecutor(min(CANCEL_AT_ONCE, len(jobs)), "cancel") as pool:
        for future in [pool.submit(job.cancel, grace_s) for job in jobs]:
            future.result()


def _signal_group(process: Process, sig: int) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def machine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Ours, with `extra` on top, and OpenMP told not to spin: workers share this machine's cores, and OpenMP's
    default spin-waiting makes a step several times slower when another process is busy (docs/benchmarks.md,
    "OpenMP spin-waiting")."""
    env = {**os.environ, **(extra or {})}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env
