"""Shared by the sweep benches: run `python -m sweeps.run` exactly as a user would, read the study back, and
split each trial's wall time into set-up, training and teardown from the stamps the driver and the job store.

Stamps (epoch seconds): the driver's `driver_timing` (launched_at, exited_at: per seed) and the job's `timing`
(run_start: entry of trm.train.run after imports and Hydra; first_step_start; first_step_end; last_step_end;
train_end: after the last eval and checkpoint; end: after the W&B run closed) on the trial, and Optuna's own datetime_start (ask) and datetime_complete (tell).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from bench._results import ROOT, median
from storage import open_storage
from storage.record import DRIVER_TIMING_DETAIL, trial_detail
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps.search.space import params_to_values
from sweeps.testing import FAST_TRIAL

# A trial that trains for real in seconds (the smoke runs of the sweep benches): the test suite's.
QUICK_TRIAL = FAST_TRIAL
# A study's end stages train again after its last trial (the re-evaluation of its top trials on the whole test
# split; the laptop site's confirm stage, its top configurations on fresh seeds): a bench that measures or records
# the trials themselves turns both off. Their own costs: bench/trm_bench/confirm.py, docs/benchmarks.md.
NO_END_STAGES = ("reeval.at_end=false", "confirm.at_end=false")


def hydra_list(items: list[str]) -> str:
    """A Hydra list override value: ['a=1','b=2'] (quoted, since the items contain '=')."""
    return "[" + ",".join(f"'{o}'" for o in items) + "]"


def run_study(overrides: list[str], log_path: Path) -> dict[str, Any]:
    """`python -m sweeps.run <overrides>` in a subprocess from the repository root; its wall time and exit."""
    cmd = [sys.executable, "-m", "sweeps.run", *overrides]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print("$ " + " ".join(cmd[1:]), flush=True)
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    end = time.time()
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"sweeps.run exited with {proc.returncode}; log {log_path}:\n{tail}")
    return {"command": cmd[1:], "started_at": start, "ended_at": end, "wall_s": round(end - start, 2)}


def load_trials(storage_url: str, study_name: str) -> list[FrozenTrial]:
    study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
    return study.get_trials(deepcopy=False)


def trial_phases(trial: FrozenTrial) -> dict[str, float] | None:
    """Seconds of each phase of a one-seed trial, or None if the stamps are missing (a failed launch)."""
    job: dict[str, Any] = TrialOutcome.of(trial.user_attrs).timing or {}
    drv = trial_detail(trial.user_attrs, DRIVER_TIMING_DETAIL) or {}
    # train_end (after the last step's eval and checkpoint) is newer than last_step_end (before them): with only
    # the latter, the final eval counts as teardown, an overestimate of the overhead.
    job = {**job, "train_end": job.get("train_end", job.get("last_step_end"))}
    needed = ("run_start", "first_step_start", "first_step_end", "train_end", "end")
    if not all(k in job for k in needed) or not drv.get("launched_at") or not drv.get("exited_at"):
        return None
    asked, told = trial.datetime_start.timestamp(), trial.datetime_complete.timestamp()
    launched, exited = drv["launched_at"][0], drv["exited_at"][-1]
    return {
        "ask_to_launch": launched - asked,
        "launch_to_run": job["run_start"] - launched,  # interpreter, imports, Hydra compose (+ torchrun agent)
        "run_to_first_step": job["first_step_start"] - job["run_start"],  # runtime, data, model, trial link, W&B
        "first_step": job["first_step_end"] - job["first_step_start"],  # warm-up (compile, allocator)
        "training": job["train_end"] - job["first_step_start"],  # every step, eval and checkpoint
        "last_step_to_end": job["end"] - job["train_end"],  # summary, W&B finish
        "end_to_exit_seen": exited - job["end"],  # outcome write, process exit, driver poll
        "exit_seen_to_tell": told - exited,  # read outcome, tell
        "launch_to_first_step": job["first_step_start"] - launched,
        "last_step_to_tell": told - job["train_end"],
        "trial_wall": told - asked,
    }


PHASES = (
    "ask_to_launch",
    "launch_to_run",
    "run_to_first_step",
    "first_step",
    "training",
    "last_step_to_end",
    "end_to_exit_seen",
    "exit_seen_to_tell",
    "launch_to_first_step",
    "last_step_to_tell",
    "trial_wall",
)


def overhead_summary(trials: list[FrozenTrial], study_run: dict[str, Any]) -> dict[str, Any]:
    """Median phase times over the trials, and the share of the study's wall time spent outside training."""
    phases = [p for t in trials if (p := trial_phases(t)) is not None]
    training = sum(p["training"] for p in phases)
    wall = study_run["wall_s"]
    first_ask = min((t.datetime_start.timestamp() for t in trials if t.datetime_start), default=study_run["started_at"])
    last_tell = max(
        (t.datetime_complete.timestamp() for t in trials if t.datetime_complete), default=study_run["ended_at"]
    )
    per_trial_outside = [p["trial_wall"] - p["training"] for p in phases]
    return {
        "trials_timed": len(phases),
        "median_s": {k: round(median([p[k] for p in phases]), 3) for k in PHASES} if phases else {},
        "max_s": {k: round(max(p[k] for p in phases), 3) for k in PHASES} if phases else {},
        "study_wall_s": wall,
        "training_s": round(training, 2),
        "outside_training_s": round(wall - training, 2),
        "outside_fraction": round((wall - training) / wall, 4) if wall else None,
        "driver_start_to_first_ask_s": round(first_ask - study_run["started_at"], 2),
        "last_tell_to_driver_exit_s": round(study_run["ended_at"] - last_tell, 2),
        "median_outside_per_trial_s": round(median(per_trial_outside), 3) if per_trial_outside else None,
    }


def projected_fraction(summary: dict[str, Any], trial_training_s: float, n_trials: int) -> float | None:
    """The outside-training share of an n-trial study whose trials train for `trial_training_s` each, from the
    measured per-trial overhead and the measured driver start-up and shutdown."""
    per_trial = summary.get("median_outside_per_trial_s")
    if per_trial is None:
        return None
    fixed = summary["driver_start_to_first_ask_s"] + summary["last_tell_to_driver_exit_s"]
    outside = n_trials * per_trial + fixed
    return outside / (outside + n_trials * trial_training_s)


def trial_record(trial: FrozenTrial) -> dict[str, Any]:
    """What the benches keep of a trial: params, state, steps, compute, value and its reported curve."""
    outcome = TrialOutcome.of(trial.user_attrs)
    return {  # the benches' own JSON (bench/pruning/studies.py reads it back): its keys stay as the results on disk have them
        "number": trial.number,
        "state": trial.state.name,
        "params": params_to_values(trial.params),
        "value": trial.value if trial.state == TrialState.COMPLETE else None,
        "steps": outcome.steps,
        "compute_flops": outcome.compute_flops,
        "best_value": outcome.best_value,
        "intermediate": {int(k): v for k, v in sorted(trial.intermediate_values.items())},
        "phases_s": trial_phases(trial),
        "workdir": TrialLaunch.of(trial.user_attrs).workdir,
    }
