"""Whether a job ran out of memory: a configuration too large for the machine. The job does not retry it
(trm/run_end.py) and marks its trial infeasible; the driver neither retries it nor stops the study on it
(sweeps/trials/retry.py), since a smaller configuration fits.

Two ways it shows. An error the job raised (an allocator's), read on its text because the driver sees only the line
the job stored. And the kernel's OOM killer, which ends the job with SIGKILL before it can say anything: the job
notes its memory cgroup and that cgroup's `oom_kill` count when it starts, and samples its own peak while it runs
(trm/measures/memory_watch.py, storage.record.MemoryRecord); the driver, seeing the job killed, reads the count again
(`killed_for_memory`). No torch here: both sides read it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# How each backend says it, as the job's error line reads `<class>: <message>`:
# CUDA: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...` (torch.cuda.OutOfMemoryError);
# CPU: `RuntimeError: [enforce fail at alloc_cpu.cpp:...] ... DefaultCPUAllocator: can't allocate memory: ...`;
# XLA (TPU HBM): `RuntimeError: ... RESOURCE_EXHAUSTED: ... Out of memory ...`; Python's own `MemoryError`;
# the kernel's OOM killer: `killed_for_memory`'s line, which begins "out of memory".
MARKERS = ("OutOfMemoryError", "out of memory", "Out of memory", "can't allocate memory", "RESOURCE_EXHAUSTED")
INFEASIBLE_OOM = "out of memory"  # the trial's `infeasible` attribute (storage.record.INFEASIBLE_ATTR): why

# A job killed by SIGKILL whose last sampled peak reached this share of its memory limit is taken for one the OOM
# killer ended, where no cgroup count can tell (a pod's VM, whose /sys the driver cannot read).
NEAR_LIMIT = 0.9
# A cgroup's limit at or above this many bytes is no limit (cgroup v1 writes 2^63 rounded down to a page; v2 "max").
_UNLIMITED = 2**62
MB = 2**20


def out_of_memory(error: str) -> bool:
    """Whether the error text (a class and message, or a log line) says memory ran out."""
    return error.startswith("MemoryError") or any(marker in error for marker in MARKERS)


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup: the file that counts its OOM kills, and its limit (None: none set)."""

    events: Path  # v2: <cgroup>/memory.events; v1: <cgroup>/memory.oom_control (both have an `oom_kill N` line)
    limit_mb: float | None


def memory_cgroup(proc: Path = Path("/proc/self"), root: Path = Path("/sys/fs/cgroup")) -> MemoryCgroup | None:
    """The memory cgroup `proc` runs in (cgroup v2, or v1's memory hierarchy), where this process can read its OOM
    kill count; None where there is none to read (no cgroup file system, no such count: an old kernel)."""
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: its own mount, or beside v1 under unified/
            candidates = [(root / path.lstrip("/"), "memory.events", "memory.max")]
            candidates.append((root / "unified" / path.lstrip("/"), "memory.events", "memory.max"))
        elif "memory" in controllers.split(","):
            candidates = [(root / "memory" / path.lstrip("/"), "memory.oom_control", "memory.limit_in_bytes")]
        else:
            continue
        for directory, events, limit in candidates:
            if oom_kills(directory / events) is not None:
                return MemoryCgroup(directory / events, _limit_mb(directory / limit))
    return None


def oom_kills(events: Path) -> int | None:
    """The `oom_kill N` count of a cgroup's memory.events or memory.oom_control; None where it cannot be read."""
    try:
        text = events.read_text()
    except OSError:
        return None
    found = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def _limit_mb(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= _UNLIMITED:
        return None
    return round(int(text) / MB, 1)


def machine_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """This machine's RAM (MemTotal), the limit of a job in no limited cgroup; None where it cannot be read."""
    try:
        found = re.search(r"^MemTotal:\s+(\d+) kB$", meminfo.read_text(), re.MULTILINE)
    except OSError:
        return None
    return round(int(found.group(1)) / 1024, 1) if found else None


def killed_for_memory(
    sigkill: bool, peak_mb: float | None, limit_mb: float | None, kills_then: int | None, kills_now: int | None
) -> str | None:
    """The line saying the kernel's OOM killer ended a job, or None without the evidence: `sigkill` (the job ended
    by SIGKILL), and its memory cgroup's OOM kill count risen since the job started (`kills_then` to `kills_now`,
    where the driver can read it), or else its last sampled peak at NEAR_LIMIT of its limit."""
    if not sigkill:
        return None
    peak = f"peak {peak_mb:.0f} MiB sampled" if peak_mb is not None else "no peak sampled"
    of_limit = f" of a {limit_mb:.0f} MiB limit" if limit_mb is not None else ""
    if kills_then is not None and kills_now is not None and kills_now > kills_then:
        return (
            f"out of memory: the kernel's OOM killer ended the job (SIGKILL; its memory cgroup's oom_kill count rose "
            f"from {kills_then} to {kills_now}), {peak}{of_limit}"
        )
    if peak_mb is not None and limit_mb is not None and peak_mb >= NEAR_LIMIT * limit_mb:
        return f"out of memory: the job was killed by SIGKILL at its memory limit, {peak}{of_limit}"
    return None
