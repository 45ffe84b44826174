"""How fast the training steps ran, in steady state: the measurement behind `estimate.utilization`.

A sweep prices a pod division by the fraction of the chips' peak a trial reaches at its per-chip batch
(sweeps/config/estimate.py). That fraction is only known from real steps on the real chips, so every job measures it:
the wall time of its training steps between log points (the metrics read there waits for the device, so on XLA,
where a step is only dispatched, the time is still the device's), without

- the steps before the first log point: they hold the compile (torch.compile, XLA's first graphs) and warm-up;
- evals, checkpoints, logging and the progress write to the study: they are timed apart and taken out.

The result is stored in the trial's `details` (`throughput`) and read back by `python -m sweeps.utilization`, with
the compile counts of the job (trm/measures/compile_counters.py: a step that compiled again inside the timed steps).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from trm.measures.compile_counters import CompileWatch


class StepTimer:
    """Training-step seconds and steps from the first log point on; `excluded()` takes a block out."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, compiles: CompileWatch | None = None) -> None:
        self.clock = clock
        self.compiles = compiles or CompileWatch()
        self.steps = 0  # measured steps (after the first log point)
        self.seconds = 0.0  # their wall time, excluded blocks taken out
        self._excluded = 0.0  # excluded time since the last mark
        self._last: tuple[int, float] | None = None  # (step, time) of the latest log point

    def mark(self, step: int) -> str | None:
        """A log point, after the device was waited for: the steps since the last one count from here on.
        Returns a warning line when those steps compiled (after the first log point)."""
        now = self.clock()
        if self._last is None:
            self._last = (step, now)  # timing starts here: the steps before held the compile
        else:
            last_step, last_time = self._last
            self.steps += step - last_step
            self.seconds += max(0.0, now - last_time - self._excluded)
            self._last = (step, now)
        self._excluded = 0.0
        return self.compiles.mark(step)

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """Time spent in this block (an eval, a checkpoint) is not step time."""
        start = self.clock()
        try:
            with self.compiles.excluded():
                yield
        finally:
            if self._last is not None:
                self._excluded += self.clock() - start

    def summary(self, flops_per_sample_step: int, global_batch: int, devices: int) -> dict[str, Any] | None:
        """What the trial stores: None when no steps were measured (a run shorter than two log points)."""
        if self.steps <= 0 or self.seconds <= 0:
            return None
        flops_per_s = flops_per_sample_step * global_batch * self.steps / self.seconds
        return {
            "steps": self.steps,
            "seconds": self.seconds,
            "samples_per_s": global_batch * self.steps / self.seconds,
            "flops_per_s": flops_per_s,  # summed over the job's devices
            "devices": devices,
            "examples_per_device": global_batch / devices,
            "compiles": self.compiles.summary(),
        }
