"""Whether a job's error is the device (or the host) running out of memory: a configuration too large for the
machine. The job does not retry it (trm/run_end.py) and marks its trial infeasible; the driver neither retries
it nor stops the study on it (sweeps/trials/retry.py), since a smaller configuration fits. One rule, read on the error's
text, because the driver sees only the line the job stored. Pure text: no torch."""

from __future__ import annotations

# How each backend says it, as the job's error line reads `<class>: <message>`:
# CUDA: `torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...` (torch.cuda.OutOfMemoryError);
# CPU: `RuntimeError: [enforce fail at alloc_cpu.cpp:...] ... DefaultCPUAllocator: can't allocate memory: ...`;
# XLA (TPU HBM): `RuntimeError: ... RESOURCE_EXHAUSTED: ... Out of memory ...`; Python's own `MemoryError`.
MARKERS = ("OutOfMemoryError", "out of memory", "Out of memory", "can't allocate memory", "RESOURCE_EXHAUSTED")
INFEASIBLE_OOM = "out of memory"  # the trial's `infeasible` attribute (storage.record.INFEASIBLE_ATTR): why


def out_of_memory(error: str) -> bool:
    """Whether the error text (a class and message, or a log line) says memory ran out."""
    return error.startswith("MemoryError") or any(marker in error for marker in MARKERS)
