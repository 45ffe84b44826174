"""Rank 0's host memory, sampled while its job runs and stored on its trial (storage.record.MemoryRecord).

The kernel's OOM killer ends a job with SIGKILL: it records no outcome and no peak. What the driver then has is what
the job stored before: its memory cgroup and that cgroup's OOM kill count when it started (the driver reads the
count again: contracts/out_of_memory.py killed_for_memory), its limit, and its peak as last sampled. Sampling starts
as the job attaches to its trial, before its set-up: a model too large for the machine is killed while it is built.

The peak is the kernel's high-water mark of the process's resident set (getrusage), so a sample misses nothing up to
its time; what grew after the last one is not in the record. A write goes to the study only when the peak grew
(GROWTH), never retried: the next sample writes again.
"""

from __future__ import annotations

import logging
import resource
import sys
import threading
import time
from collections.abc import Callable

from contracts.out_of_memory import machine_memory_mb, memory_cgroup, oom_kills
from storage.record import MemoryRecord

log = logging.getLogger(__name__)

GROWTH = 1.05  # a sample is stored when the peak grew by this factor since the last one stored


def peak_rss_mb() -> float:
    """This process's peak resident set so far, in MiB (KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (2**20 if sys.platform == "darwin" else 1024), 1)


class MemoryWatch:
    """A daemon thread storing a MemoryRecord through `store` at start and whenever the peak grew; `stop` ends it."""

    def __init__(self, store: Callable[[MemoryRecord], None], interval_s: float) -> None:
        self._store, self._interval = store, interval_s
        self._stop = threading.Event()
        cgroup = memory_cgroup()
        self._limit = cgroup.limit_mb if cgroup is not None and cgroup.limit_mb is not None else machine_memory_mb()
        self._events = str(cgroup.events) if cgroup is not None else None
        self._kills = oom_kills(cgroup.events) if cgroup is not None else None
        self._stored = 0.0
        self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)

    def start(self) -> MemoryWatch:
        self.sample()  # the first record before the set-up begins
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> None:
        """Store the peak if it grew by GROWTH since the last record (a failed write is left to the next sample)."""
        peak = peak_rss_mb()
        if peak < self._stored * GROWTH:
            return
        record = MemoryRecord(peak_mb=peak, at=time.time())
        if self._limit is not None:
            record["limit_mb"] = self._limit
        if self._events is not None and self._kills is not None:
            record["cgroup_events"], record["oom_kills"] = self._events, self._kills
        try:
            self._store(record)
            self._stored = peak
        except Exception as err:  # noqa: BLE001 (the trial finished elsewhere, or the database is briefly away)
            log.debug("could not record memory: %s", err)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()
