"""The launcher's side of a warm worker (trm/warm_worker.py): start it once, ask it for a job, watch the job.

A job forked by the warm worker is not this process's child, so it cannot be waited on with waitpid; the worker
reports its exit code instead. `ForkedJob` gives the job the part of subprocess.Popen's interface a JobHandle
uses (pid, poll, wait), and the job runs in its own session like any worker, so cancel signals its group.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from contracts.warm_protocol import Exited, JobRequest, Ready, Started, decode

START_TIMEOUT_S = 120.0  # the worker's imports (torch) on a loaded machine, or a fork on a busy one
UNKNOWN_EXIT = -1  # a job whose worker died before it could report the job's exit code


class WarmWorkerError(RuntimeError):
    """The warm worker could not start a job (it died, or did not answer in time)."""


@dataclass(frozen=True)
class Gone:
    """The worker process ended (its exit code): no answer will come."""

    code: int


class WarmWorker:
    """One `python -m trm.warm_worker` process, shared by every job this launcher starts."""

    def __init__(self, python: str, env: dict[str, str], log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [python, "-m", "trm.warm_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        self.log_path = log_path
        self.started: queue.Queue[Ready | Started | Gone] = queue.Queue()
        self.codes: dict[int, int] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        ready = self._next_started(START_TIMEOUT_S)
        if not isinstance(ready, Ready):
            raise WarmWorkerError(f"the warm worker did not start: {ready}")

    def _read(self, stream: IO[bytes] | None) -> None:
        for line in stream or []:
            message = decode(line)
            if isinstance(message, Exited):
                with self.lock:
                    self.codes[message.pid] = message.code
            else:
                self.started.put(message)
        self.started.put(Gone(self.process.wait()))

    def _next_started(self, timeout_s: float) -> Ready | Started | Gone:
        try:
            return self.started.get(timeout=timeout_s)
        except queue.Empty:
            raise WarmWorkerError(f"the warm worker did not answer in {timeout_s:g} s (log: {self.log_path})") from None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> ForkedJob:
        """Start one job (`python -m trm.train <argv>` in `cwd`, writing `log_path`); its pid once it runs."""
        cwd.mkdir(parents=True, exist_ok=True)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        request = JobRequest(argv, str(cwd), env, str(log_path))
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(request.line())
            self.process.stdin.flush()
        except BrokenPipeError:
            raise WarmWorkerError(f"the warm worker is gone (log: {self.log_path})") from None
        answer = self._next_started(START_TIMEOUT_S)
        if not isinstance(answer, Started):
            raise WarmWorkerError(f"the warm worker did not start the job: {answer} (log: {self.log_path})")
        return ForkedJob(self, answer.pid)

    def exit_code(self, pid: int) -> int | None:
        with self.lock:
            return self.codes.get(pid)

    def close(self) -> None:
        """Stop taking jobs (closing stdin); jobs still running finish on their own."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()


class ForkedJob:
    """A job the warm worker forked: pid, poll() and wait() as subprocess.Popen has them."""

    def __init__(self, worker: WarmWorker, pid: int):
        self.worker, self.pid = worker, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.worker.exit_code(self.pid)
            if code is None and not self.worker.alive and not _exists(self.pid):
                code = UNKNOWN_EXIT  # the worker died first: the job is gone, its code with it
            self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"warm job {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        return code


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
