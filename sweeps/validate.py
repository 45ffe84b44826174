"""Validate a sweep before anything runs: one clear error naming the key, the value and what is accepted.

Everything here would otherwise fail every trial (or the driver, after the study was opened and its baseline
trial used up) while the driver itself exits 0. Checks:
  - the budget and the study definition: integers that are integers, metric names the trainer produces, a study
    name that can be a directory;
  - the search space against the training config: every searched key exists (the training config composed with
    each branch of the space, exactly as a trial would get it) and every range gives values of the key's type;
  - each trial's training config: positive step counts and batch sizes, a batch that splits over the launcher's
    world, a dataset given by path that exists where it can be checked;
  - the sampler and the pruner, built as the driver builds them, with the arguments Optuna accepts at
    construction but fails on later;
  - the machine: the interpreter of a local launcher, and an output_root this user can write.

Each check is a short independent function; validate_sweep at the end runs them in order, so this module is the
one place a user's mistake is caught.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from contracts.metric_names import EVAL_METRICS, MAXIMIZED, MINIMIZED, TRIAL_NUMBERS
from storage import study_name
from sweeps.config_values import SweepConfigError, is_int
from sweeps.estimate import Utilization, UtilizationError
from sweeps.launchers.base import Launcher
from sweeps.space import SearchSpace
from sweeps.validate_optuna import check_optuna
from sweeps.validate_trials import check_range_types, check_trial_config, check_trial_keys, compose_trial, trial_length

__all__ = ["SweepConfigError", "trial_length", "validate_sweep"]  # the driver and the CLI import these here


def _check_budget(cfg: DictConfig) -> None:
    if not is_int(cfg.n_trials) or cfg.n_trials <= 0:
        raise SweepConfigError(f"n_trials={cfg.n_trials!r}: expected an integer > 0")
    if cfg.max_concurrent is not None and (not is_int(cfg.max_concurrent) or cfg.max_concurrent < 1):
        raise SweepConfigError(
            f"max_concurrent={cfg.max_concurrent!r}: expected an integer >= 1, or null for one trial per slot"
        )
    if cfg.timeout is not None and (
        isinstance(cfg.timeout, bool) or not isinstance(cfg.timeout, (int, float)) or cfg.timeout <= 0
    ):
        raise SweepConfigError(f"timeout={cfg.timeout!r}: expected seconds > 0, or null for no limit")
    for key, value in (
        ("stall_timeout_s", cfg.stall_timeout_s),
        ("heartbeat.interval_s", cfg.heartbeat.interval_s),
        ("heartbeat.grace_s", cfg.heartbeat.grace_s),
        ("storage_outage_backoff.first_s", cfg.storage_outage_backoff.first_s),
        ("storage_outage_backoff.max_s", cfg.storage_outage_backoff.max_s),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise SweepConfigError(f"{key}={value!r}: expected seconds > 0")
    if cfg.heartbeat.grace_s <= cfg.heartbeat.interval_s:
        raise SweepConfigError(
            f"heartbeat.grace_s={cfg.heartbeat.grace_s} must exceed heartbeat.interval_s={cfg.heartbeat.interval_s}: "
            "a live driver's trials would look dead between two beats"
        )


def _check_estimate(estimate: DictConfig) -> None:
    """The dry run's pricing inputs (a bad utilization would only fail after every trial's FLOPs were counted)."""
    peak = estimate.peak_tflops
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak <= 0:
        raise SweepConfigError(f"estimate.peak_tflops={peak!r}: expected the chip's peak in TFLOP/s, > 0")
    try:
        Utilization.parse(estimate.utilization)
    except UtilizationError as err:
        raise SweepConfigError(str(err)) from None


def _check_study(study: DictConfig, scale: str) -> None:
    _check_study_name(study.name)
    for key, value in (
        ("direction", study.direction),
        *((f"objectives[{i}].direction", o.direction) for i, o in enumerate(study.get("objectives") or [])),
    ):
        if str(value).lower() not in ("maximize", "minimize"):
            raise SweepConfigError(f"study.{key}={value!r}: expected 'maximize' or 'minimize'")
    if study.value not in ("best", "last"):
        raise SweepConfigError(f"study.value={study.value!r}: expected 'best' or 'last'")
    if study.objective not in EVAL_METRICS:
        raise SweepConfigError(
            f"study.objective={study.objective!r}: not a metric the trainer produces at its evals; expected one of {list(EVAL_METRICS)}"
        )
    for i, extra in enumerate(study.get("objectives") or []):
        if extra.get("name") not in (*TRIAL_NUMBERS, *EVAL_METRICS):
            raise SweepConfigError(
                f"study.objectives[{i}].name={extra.get('name')!r}: not a value a trial records; expected one of "
                f"{list(TRIAL_NUMBERS)} (stored by the job) or an eval metric {list(EVAL_METRICS)}"
            )
    _check_prune_metric(study)
    if scale not in study.space:
        raise SweepConfigError(f"scale={scale!r}: study {study.name!r} has ranges for {sorted(study.space)} only")
    if not is_int(study.seeds) or study.seeds < 1:
        raise SweepConfigError(f"study.seeds={study.seeds!r}: expected an integer >= 1")


def _check_study_name(name: Any) -> None:
    """Everything the name becomes (storage/study_name.py); any other character is fine: the launchers quote it
    on the trial's command line (quote_literals)."""
    why = study_name.problem(name)
    if why is not None:
        shown = repr(name) if isinstance(name, str) else name
        raise SweepConfigError(f"study.name={shown}: {why}")


def _check_prune_metric(study: DictConfig) -> None:
    """The pruner compares reported values in the study's direction: a metric reported in its place must be an
    eval metric that is better in that same direction (an accuracy for maximize, a loss for minimize)."""
    metric = study.get("prune_metric")
    if metric is None:
        return
    if study.get("objectives"):
        raise SweepConfigError(
            f"study.prune_metric={metric!r}: this study has several objectives and Optuna prunes single-objective studies only; remove it"
        )
    accepted = [f"eval/{m}" for m in (MAXIMIZED if str(study.direction).lower() == "maximize" else MINIMIZED)]
    if metric not in accepted:
        raise SweepConfigError(
            f"study.prune_metric={metric!r}: for a study that is to {str(study.direction).lower()} expected null (the objective) or one of {accepted}"
        )


def _check_launcher_python(cfg: DictConfig, launcher: Launcher) -> None:
    """A local launcher's interpreter must exist and have this project: otherwise each trial's job dies at start."""
    python = cfg.launcher.get("python")
    if python is None or not launcher.shares_filesystem:
        return  # the driver's own interpreter, or one on remote machines
    found = shutil.which(str(python))
    fix = f"give an interpreter that has this project installed, or null for the driver's own ({sys.executable})"
    if found is None:
        raise SweepConfigError(f"launcher.python={python!r}: no such executable (not a file, or not on PATH); {fix}")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('trm') is None)"
    try:  # from another directory, as the jobs run in their trial directories
        answer = subprocess.run(
            [found, "-c", probe], check=False, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60
        )
        ok = answer.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise SweepConfigError(f"launcher.python={python!r}: it cannot import trm (the training package); {fix}")


def _check_output_root(output_root: Any) -> None:
    """Trial directories are made under output_root once the study is open: a root that cannot be written would
    fail the driver there, with the baseline trial used up. Make it and a file in it now; leave nothing behind."""
    root = Path(str(output_root)).resolve()
    created = [path for path in (root, *root.parents) if not path.exists()]  # deepest first
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-"):
            pass
    except OSError as err:
        raise SweepConfigError(
            f"output_root={str(output_root)!r}: cannot write there ({err.strerror or err}); choose a directory this user can write"
        ) from None
    finally:
        for path in created:
            with contextlib.suppress(OSError):
                path.rmdir()


# What `sweeps.run` reads at the top level (conf/sweep.yaml and its groups). Anything else there was added with `+`
# and nothing reads it: `+train.steps=60` or `+arch=...` would be silently ignored by every trial.
SWEEP_KEYS = frozenset(
    {
        "study",
        "storage",
        "launcher",
        "sampler",
        "preflight",
        "pruner",
        "scale",
        "n_trials",
        "timeout",
        "max_concurrent",
        "dry_run",
        "seed",
        "output_root",
        "heartbeat",
        "draws",
        "reeval",
        "estimate",
        "stall_timeout_s",
        "poll_s",
        "storage_outage_backoff",
        "progress_interval_s",
        "wandb",
        "trial",
        "hydra",
    }
)


def _check_no_ignored_keys(cfg: DictConfig) -> None:
    ignored = sorted({str(key) for key in cfg} - SWEEP_KEYS)
    if ignored:
        raise SweepConfigError(
            f"{ignored} are not sweep settings, so every trial would ignore them. Training keys for every trial go "
            "in trial.overrides (e.g. 'trial.overrides=[experiment=tiny_cpu,train.steps=60]': the list replaces the "
            "site's, so repeat what you keep), searched keys in a study's "
            "space (--config-dir with your own study/*.yaml)"
        )


def validate_sweep(cfg: DictConfig, space: SearchSpace, base_overrides: list[str], launcher: Launcher) -> None:
    _check_no_ignored_keys(cfg)
    check_trial_keys(cfg, space)
    _check_budget(cfg)
    _check_estimate(cfg.estimate)
    _check_study(cfg.study, cfg.scale)
    name = type(launcher).__name__
    slots = launcher.slots()  # launcher.slots parsed and checked against the launcher's machines
    slot_chips = slots[0].chips  # None: a launcher that counts no chips (local, torchrun: world_size above)
    for values in space.representative():
        train_cfg = compose_trial([*base_overrides, *slots[0].overrides], values, f"study.space.{cfg.scale}")
        check_trial_config(train_cfg, launcher.world_size, name, launcher.shares_filesystem, slot_chips)
    check_range_types(cfg, space, base_overrides)
    check_optuna(cfg, trial_length(base_overrides))
    _check_launcher_python(cfg, launcher)
    _check_output_root(cfg.output_root)  # last: the only check that touches the disk
