"""A profile of chosen training steps on request: `train.profile_steps=[a, b]` traces steps a..b (counted from 1)
on rank 0 into `<out_dir>/profile/`, and the run's summary names what was written (the trial record shows it).

Where a step's time goes is a question about one trial's configuration on one machine, so it is asked of a
trial, not of a bench: torch.profiler on CPU and GPU (a Chrome trace, `trace.json`, which Perfetto and
chrome://tracing open), torch_xla.debug.profiler on XLA (an XProf/TensorBoard log directory, `xla/`). A run
resumed past `a` traces nothing; a run that stops inside the window (pruned, preempted, failed) writes what it
traced so far.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TRACE_DIR = "profile"


class StepProfiler:
    """Starts before step `a` and stops after step `b` (1-based). Inactive without a window or off rank 0."""

    def __init__(self, window: tuple[int, int] | None, out_dir: Path, backend: str, device: torch.device) -> None:
        self.window, self.backend, self.device = window, backend, device
        self.dir = out_dir / TRACE_DIR
        self._session: Any = None
        self.written: str | None = None  # the trace file or directory, once stopped

    def before_step(self, step: int) -> None:
        """Called with the 0-based index of the step about to run."""
        if self.window is not None and self._session is None and self.written is None and step + 1 == self.window[0]:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._session = self._start()

    def after_step(self, done: int) -> None:
        """Called with the number of steps done."""
        if self._session is not None and self.window is not None and done >= self.window[1]:
            self.close()

    def close(self) -> str | None:
        """Stop a trace still running and write it; the path written, if any."""
        if self._session is None:
            return self.written
        session, self._session = self._session, None
        if self.backend == "xla":
            import torch_xla.debug.profiler as xp

            xp.stop_trace()
            self.written = str(self.dir / "xla")
        else:
            session.stop()
            path = self.dir / "trace.json"
            session.export_chrome_trace(str(path))
            self.written = str(path)
        return self.written

    def _start(self) -> Any:
        if self.backend == "xla":
            import torch_xla.debug.profiler as xp

            xp.start_trace(str(self.dir / "xla"))
            return xp
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        session = torch.profiler.profile(activities=activities, record_shapes=True)
        session.start()
        return session


def profile_window(steps: list[int] | None) -> tuple[int, int] | None:
    """`train.profile_steps` (checked by the schema: two steps, 1 <= a <= b) as a window, or None."""
    return None if steps is None else (steps[0], steps[1])
