"""What the test suite and the benchmarks share (as `optuna.testing` serves Optuna's): a trial that trains for
real in seconds, the driver overrides that run a study fast on a test database, and the launcher variables a
stand-alone test process must not inherit."""

from __future__ import annotations

from pathlib import Path

# A trial that trains for real in seconds: the test_tiny preset (conf/experiment/test_tiny.yaml) with one H cycle
# and up to 2 halting steps, 20 steps, eval every 10. A trial keeps the default precision (auto), not the preset's fp32.
FAST_TRIAL = [
    "experiment=test_tiny",
    "train.precision=auto",
    "arch.H_cycles=1",
    "arch.halt_max_steps=2",
    "train.log_interval=10",
    "train.eval_interval=10",
    "train.steps=20",
    "optim.warmup_steps=1",
]

# Launcher and TPU variables that would make a process think it is part of a bigger job.
LAUNCHER_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
)


def trial_list(overrides: list[str]) -> str:
    """A Hydra list override value: ['a=1','b=2'] (quoted, since the items contain '=')."""
    return "[" + ",".join(f"'{o}'" for o in overrides) + "]"


def sweep_overrides(storage_url: str, out: Path, *extra: str, trial: list[str] | None = None) -> list[str]:
    """`python -m sweeps.run` overrides for a fast study: fast trials, quick heartbeats and progress lines."""
    return [
        f"storage.url={storage_url}",
        f"output_root={out}",
        f"trial.overrides={trial_list(trial or FAST_TRIAL)}",
        "heartbeat.interval_s=1",
        "heartbeat.grace_s=4",
        "poll_s=0.2",
        "progress_interval_s=2",
        "reeval.at_end=false",  # a job per top trial at each study's end: tests/test_reeval.py turns it on
        "confirm.at_end=false",  # trainings of the top configurations at the end: tests/test_confirm.py turns it on
        "max_concurrent=1",  # one trial at a time unless a test asks for more (the laptop site runs 2)
        # No W&B run per trial and none for the study: W&B's start-up is a large share of a fast trial's. A test
        # that reads the W&B files (tests/test_tracking.py and the others that import tests/wandb_offline.py)
        # turns it on.
        "wandb.enabled=false",
        "n_trials=6",  # a test study's budget unless it sets its own (the laptop site's is the table's: conf/site/laptop.yaml)
        *extra,
    ]
