"""How often a job's graphs compiled: stored with its throughput, and a warning line when the timed steps compile.

The throughput a trial stores (trm/measures/throughput.py) starts at the first log point, after the first compile. A step
that compiles again later (a shape or a Python value that changes, a curriculum stage, a graph break) spends that
compile inside the measured time; the counts stored beside the number say whether it did. The counts are the
libraries' own process-wide counters, read, never kept by hand: off XLA, TorchDynamo's (`torch.compile`: frames
compiled, graphs made); on XLA, torch_xla's debug metrics (`CompileTime` samples, and the persistent compile
cache's hits and misses when `runtime.compile_cache_dir` is set).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def read_compile_counters() -> dict[str, int]:
    """The process's compile counters now: XLA's where torch_xla is loaded, TorchDynamo's otherwise."""
    if "torch_xla" in sys.modules:
        import torch_xla.debug.metrics as met

        def count(name: str) -> int:
            return int(met.counter_value(name) or 0)

        compile_time = met.metric_data("CompileTime")
        return {
            "compiles": int(compile_time[0]) if compile_time else 0,
            "persistent_cache_hits": count("PersistentCacheHit"),
            "persistent_cache_misses": count("PersistentCacheMiss"),
        }
    from torch._dynamo.utils import counters

    return {"compiles": int(counters["frames"]["ok"]), "graphs": int(counters["stats"]["unique_graphs"])}


def _minus(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: value - before.get(key, 0) for key, value in now.items()}


class CompileWatch:
    """Compile counts at the first log point, at the end, and those of the timed steps in between.

    Compiles inside `excluded()` blocks (an eval traces its own graphs) are not the steps'."""

    def __init__(self, read: Callable[[], dict[str, int]] = read_compile_counters) -> None:
        self._read = read
        self._first: dict[str, int] | None = None  # at the first log point
        self._last: tuple[int, dict[str, int]] | None = None  # (step, counts) at the latest log point
        self._excluded: dict[str, int] = {}  # counted inside excluded blocks since the latest log point
        self.in_timed_steps: dict[str, int] = {}

    def mark(self, step: int) -> str | None:
        """A log point; a warning line when the steps since the previous one compiled."""
        now = self._read()
        warning = None
        if self._last is None:
            self._first = now
        else:
            last_step, last = self._last
            new = _minus(_minus(now, last), self._excluded)
            for key, value in new.items():
                self.in_timed_steps[key] = self.in_timed_steps.get(key, 0) + value
            if new.get("compiles", 0) > 0:
                warning = (
                    f"warning: the training step compiled {new['compiles']} more time(s) between steps {last_step} "
                    f"and {step}, after its first steps ({new}): that time is in the trial's measured throughput"
                )
        self._last, self._excluded = (step, now), {}
        return warning

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Compiles in this block (an eval, a checkpoint) are not the training step's."""
        before = self._read()
        try:
            yield
        finally:
            if self._last is not None:
                for key, value in _minus(self._read(), before).items():
                    self._excluded[key] = self._excluded.get(key, 0) + value

    def summary(self) -> dict[str, Any]:
        """What the trial stores beside its throughput (THROUGHPUT_DETAIL's `compiles`)."""
        return {"at_first_log_point": self._first, "total": self._read(), "in_timed_steps": self.in_timed_steps}
