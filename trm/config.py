"""Compose the training config outside a Hydra app (tools, the sweep driver's validation, tests).

Kept free of torch so the sweep driver can validate trial overrides without importing the model."""
from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    if GlobalHydra.instance().is_initialized():  # inside a Hydra app whose search path is conf/ too
        return compose(config_name=config_name, overrides=overrides)
    with initialize_config_dir(config_dir=CONF_DIR):
        return compose(config_name=config_name, overrides=overrides)


def compose_train_config(overrides: list[str]) -> DictConfig:
    """The training config as `python -m trm.train <overrides>` would see it (without a Hydra run dir)."""
    return _compose("train", overrides)


def compose_sweep_config(overrides: list[str]) -> DictConfig:
    """The sweep config as `python -m sweeps.run <overrides>` would see it."""
    return _compose("sweep", overrides)
