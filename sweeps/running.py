"""A trial this driver runs: its job, heartbeat and what the loop has seen of it (seeds, progress, timings).

The driver's per-trial state, kept apart from the loop that moves it along.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from storage import HeartbeatThread
from sweeps.launchers.base import JobHandle
from sweeps.slots import WHOLE, Slot


class JobNotLaunchedError(RuntimeError):
    """A running trial's job was asked for before it was launched."""


@dataclass
class RunningTrial:
    trial: optuna.Trial
    handle: JobHandle | None
    heartbeat: HeartbeatThread
    workdir: Path
    sampled: dict[str, Any] = field(default_factory=dict)  # the sampled values: {override key: value}
    origin: int = 0  # first trial of its retry chain: owner of the checkpoints
    earlier: tuple[int, ...] = ()  # the attempts before it in its retry chain, first first
    slot: Slot = WHOLE  # where its jobs run (sweeps/slots.py); every seed of the trial runs there
    seed_index: int = 0
    seed_objectives: list[list[float]] = field(default_factory=list)  # each finished seed's objective value(s)
    started: float = field(default_factory=time.time)
    # Epoch seconds at which each seed's job was launched and seen to exit (bench/sweep_overhead.py): with
    # the job's own stamps (`timing` attribute) they split a trial's wall time into set-up, training, teardown.
    launched_at: list[float] = field(default_factory=list)
    exited_at: list[float] = field(default_factory=list)
    # The job's last reported progress and when this driver saw it change (its own clock: a pod VM's may differ).
    progress: Any = None
    progress_seen: float = field(default_factory=time.time)
    stall_reason: str | None = None  # set when the driver stopped the job for showing no progress

    @property
    def job(self) -> JobHandle:
        """The current seed's job (launch_seed sets it before the trial joins the loop)."""
        if self.handle is None:
            raise JobNotLaunchedError(f"trial {self.trial.number}: no job launched yet")
        return self.handle
