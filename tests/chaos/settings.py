"""The faulted study's shape: how many trials, drivers and steps, and the driver's limits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class SoakSettings:
    work: Path  # the study's trial directories, the drivers' logs
    n_trials: int = 20
    drivers: int = 2
    max_concurrent: int = 1  # per driver
    seed: int = 1  # the sweep's sampler seed (each driver derives its own from it) and the fault schedule's
    train_steps: int = 40
    eval_interval: int = 10  # also the log (progress) interval
    # Above a trial's start-up on a loaded 2-core machine (docs/reliability.md, Soak).
    stall_timeout_s: int = 45
    heartbeat_interval_s: int = 1
    grace_s: int = 5
    pruner: str = "hyperband"
    # The study's objective (maximized): eval/accuracy differs between trials of a few steps (exact accuracy is 0
    # for all of them), so a told value that is not its own run's shows, and Hyperband has something to prune.
    objective: str = "eval/accuracy"
    study: str = "soak"
    pg_down_s: float = 10.0
    driver_restart_s: float = 1.0  # a killed driver is started again this long after
    target_wait_s: float = 240.0  # a fault that finds no target for this long is not injected
    timeout_s: float = 1800.0  # the whole soak: drivers still running then are stopped and the checks fail

    @property
    def output_root(self) -> Path:
        return self.work / "runs"
