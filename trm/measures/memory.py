"""A run's peak memory on its device, for the trial record (issue 45): which configurations come near the
machine's limit is a property of the configuration, read beside its parameters in `sweeps.status` and the report.

CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`). XLA: the runtime's `peak_bytes_used` where
it reports one (a TPU does; XLA on a CPU reports no peak: None). CPU: the process's peak resident set
(`getrusage`), which counts the interpreter and its libraries too: compare trials of one machine, not a model's size.
"""

from __future__ import annotations

import resource
import sys

import torch

MB = 2**20


def peak_memory_mb(device: torch.device) -> float | None:
    """Peak memory of this process's device so far, in MiB; None where the device does not say."""
    try:
        if device.type == "cuda":
            return round(torch.cuda.max_memory_allocated(device) / MB, 1)
        if device.type == "xla":
            import torch_xla.core.xla_model as xm

            peak = xm.get_memory_info(device).get("peak_bytes_used")
            return round(peak / MB, 1) if peak else None
    except (RuntimeError, KeyError, AttributeError):  # a runtime that keeps no such count
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(rss / (MB if sys.platform == "darwin" else 1024), 1)
