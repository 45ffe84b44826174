"""Validate a sweep before anything runs: one clear error naming the key, the value and what is accepted.

Checks the budget, the study definition, that every searched key exists in the training config (by
composing the training config with each branch of the search space, exactly as a trial would), that the
batch splits over the launcher's world, and that a dataset given by path exists where it can be checked.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sweeps.space import SearchSpace, to_overrides
from trm.config import compose_train_config
from trm.metric_names import MAXIMIZED, MINIMIZED


class SweepConfigError(ValueError):
    pass


def _check_budget(cfg: DictConfig) -> None:
    if not isinstance(cfg.n_trials, int) or cfg.n_trials <= 0:
        raise SweepConfigError(f"n_trials={cfg.n_trials!r}: expected an integer > 0")
    if not isinstance(cfg.max_concurrent, int) or cfg.max_concurrent < 1:
        raise SweepConfigError(f"max_concurrent={cfg.max_concurrent!r}: expected an integer >= 1")
    if cfg.timeout is not None and (not isinstance(cfg.timeout, (int, float)) or cfg.timeout <= 0):
        raise SweepConfigError(f"timeout={cfg.timeout!r}: expected seconds > 0, or null for no limit")


def _check_study(study: DictConfig, scale: str) -> None:
    for key, value in (("direction", study.direction), *((f"objectives[{i}].direction", o.direction) for i, o in enumerate(study.get("objectives") or []))):
        if str(value).lower() not in ("maximize", "minimize"):
            raise SweepConfigError(f"study.{key}={value!r}: expected 'maximize' or 'minimize'")
    if study.value not in ("best", "last"):
        raise SweepConfigError(f"study.value={study.value!r}: expected 'best' or 'last'")
    if not str(study.objective).startswith(("eval/", "train/")):
        raise SweepConfigError(f"study.objective={study.objective!r}: expected a metric name such as 'eval/exact_accuracy'")
    _check_prune_metric(study)
    if scale not in study.space:
        raise SweepConfigError(f"scale={scale!r}: study {study.name!r} has ranges for {sorted(study.space)} only")
    if not isinstance(study.seeds, int) or study.seeds < 1:
        raise SweepConfigError(f"study.seeds={study.seeds!r}: expected an integer >= 1")


def _check_prune_metric(study: DictConfig) -> None:
    """The pruner compares reported values in the study's direction: a metric reported in its place must be an
    eval metric that is better in that same direction (an accuracy for maximize, a loss for minimize)."""
    metric = study.get("prune_metric")
    if metric is None:
        return
    if study.get("objectives"):
        raise SweepConfigError(f"study.prune_metric={metric!r}: this study has several objectives and Optuna prunes single-objective studies only; remove it")
    accepted = [f"eval/{m}" for m in (MAXIMIZED if str(study.direction).lower() == "maximize" else MINIMIZED)]
    if metric not in accepted:
        raise SweepConfigError(f"study.prune_metric={metric!r}: for a study that is to {str(study.direction).lower()} expected null (the objective) or one of {accepted}")


def compose_trial(base: list[str], values: dict[str, Any], where: str) -> DictConfig:
    """The training config one trial would get; Hydra's own error, with the study key named, if not."""
    overrides = [*base, *to_overrides(values)]
    try:
        return compose_train_config(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        message = str(err).strip().splitlines()[0]
        culprit = next((k for k in values if k.split(".")[-1] in message or k in message), None)
        named = f"{where}[{culprit!r}]={values[culprit]!r}" if culprit else f"{where} ({' '.join(overrides)})"
        raise SweepConfigError(f"{named} does not fit the training config (conf/train.yaml): {message}") from None


def _check_trial_config(train_cfg: DictConfig, world_size: int, launcher_name: str, local_data: bool) -> None:
    batch = train_cfg.train.global_batch_size
    if batch % world_size:
        raise SweepConfigError(
            f"train.global_batch_size={batch} is not divisible by the world size {world_size} of launcher "
            f"{launcher_name}: use a multiple of {world_size}"
        )
    if local_data and train_cfg.data.source == "path":
        path = OmegaConf.select(train_cfg, "data.path", throw_on_missing=False)
        if path in (None, "???") or not (Path(path) / "train" / "dataset.json").exists():
            raise SweepConfigError(
                f"data.path={path!r}: no dataset there (expected train/dataset.json); build one with "
                f"`python -m trm.data.build --source csv ...` or use data=sudoku_generated"
            )


def validate_sweep(cfg: DictConfig, space: SearchSpace, base_overrides: list[str]) -> None:
    _check_budget(cfg)
    _check_study(cfg.study, cfg.scale)
    launcher = cfg.launcher._target_.rsplit(".", 1)[-1]
    world_size = int(cfg.launcher.get("nnodes", 1)) * int(cfg.launcher.get("nproc_per_node", 1))
    local_data = launcher in ("LocalLauncher", "TorchrunLauncher")
    for values in space.representative():
        train_cfg = compose_trial(base_overrides, values, f"study.space.{cfg.scale}")
        _check_trial_config(train_cfg, world_size, launcher, local_data)
