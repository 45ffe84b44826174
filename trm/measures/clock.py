"""Wall-clock stamps (epoch seconds) of a run's phases, stored in its summary as `timing`.

The sweep's overhead (interpreter and imports before `run_start`, set-up before the first step, teardown after
the last) is measured from them (bench/_sweep.py). The stamps a training run makes, in order:

- `run_start`: the training run proper starts (after the imports, Hydra and the runtime's start-up);
- `first_step_start`, `first_step_end`: around the first step this process runs (after a resume: its first);
- `last_step_end`: after the latest step;
- `train_end`: after the last step's eval and checkpoint: training work ends here;
- `end`: after the tracker's run is closed; what is left is the outcome write and the exit.

On XLA a step is dispatched asynchronously, so the step stamps mark dispatch, not completion.
"""

from __future__ import annotations

import time


class PhaseClock:
    """Started at construction (`run_start`); `stamps` is the live dict the summary holds."""

    def __init__(self) -> None:
        self.started = time.time()
        self.stamps: dict[str, float] = {"run_start": self.started}

    def stamp(self, phase: str) -> None:
        """Record that `phase` happened now (again: the latest time is kept)."""
        self.stamps[phase] = time.time()

    def stamp_once(self, phase: str) -> None:
        """Record that `phase` happened now unless it already did (the first time is kept)."""
        if phase not in self.stamps:
            self.stamps[phase] = time.time()

    def seconds(self) -> float:
        """Seconds since `run_start`, rounded to 10 ms."""
        return round(time.time() - self.started, 2)
