"""One writer per checkpoint directory: rank 0 holds an OS lock (flock) on `<checkpoint dir>/.writer.lock` from
before it resumes until the process ends.

Why: after its driver dies a job trains on until its next report tells it the trial is no longer RUNNING (it then
stops, writing nothing more); the next driver's retry of that trial resumes from the same directory. Without the
lock both wrote there for a while (docs/reliability.md). With it the retry waits, saying for whom, until the old
job has exited, then resumes from the last checkpoint that job wrote. The lock is the kernel's: it is released
when its holder dies however it dies (kill -9 included), so a crash never leaves a stale lock behind.

Only a local directory can be locked this way; an object store (gs://) has no such lock, and a pod's retry
starts on the same VMs only after the launcher stopped the old job's workers (sweeps/launchers/tpu/launcher.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import fsspec

LOCK_FILE = ".writer.lock"


class CheckpointBusyError(RuntimeError):
    """Another process kept the checkpoint directory for longer than the wait: a RuntimeError, which a sweep may
    retry (the other process will have exited by then)."""


def local_dir(url: str) -> Path | None:
    """The checkpoint URL as a local directory, or None for a URL of a remote filesystem."""
    protocol, path = fsspec.core.split_protocol(str(url))
    return Path(path) if protocol in (None, "file", "local") else None


def acquire(url: str, wait_s: float, poll_s: float = 0.5) -> TextIO | None:
    """Hold the directory's lock (the returned file keeps it until closed or the process ends); wait up to `wait_s`
    for another holder to let go. None for a remote URL."""
    directory = local_dir(url)
    if directory is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / LOCK_FILE, "a+")  # noqa: SIM115 (held open for the process's life: that is the lock)
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _holder(handle)
            if time.monotonic() >= deadline:
                handle.close()
                raise CheckpointBusyError(
                    f"{directory} is still being written by process {holder} after {wait_s:g} s "
                    "(checkpoint.lock_wait_s): not resuming beside it"
                ) from None
            if not said:
                print(f"waiting for process {holder}, still writing {directory}, to exit", file=sys.stderr, flush=True)
                said = True
            time.sleep(poll_s)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _holder(handle: TextIO) -> str:
    handle.seek(0)
    return handle.read().strip() or "unknown"


@contextlib.contextmanager
def held(url: str, wait_s: float, is_main: bool) -> Iterator[None]:
    """Rank 0 holds the lock of `url`'s directory inside the block (the other ranks write no checkpoint file)."""
    handle = acquire(url, wait_s) if is_main else None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()
