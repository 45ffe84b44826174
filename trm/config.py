"""Compose the training config outside a Hydra app (tools, the sweep driver's validation, tests).

Kept free of torch so the sweep driver can validate trial overrides without importing the model."""

from __future__ import annotations

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

# The configs are a package (conf/ in the checkout, `trm_sweeps_conf` in the wheel: pyproject.toml), so an
# installed wheel finds them wherever it is run from. Both apps' `hydra.main` use CONFIG_PATH.
CONFIG_MODULE = "trm_sweeps_conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    if GlobalHydra.instance().is_initialized():  # inside a Hydra app whose search path is conf/ too
        return compose(config_name=config_name, overrides=overrides)
    with initialize_config_module(config_module=CONFIG_MODULE):
        return compose(config_name=config_name, overrides=overrides)


def compose_train_config(overrides: list[str]) -> DictConfig:
    """The training config as `python -m trm.train <overrides>` would see it (without a Hydra run dir)."""
    return _compose("train", overrides)


def compose_sweep_config(overrides: list[str]) -> DictConfig:
    """The sweep config as `python -m sweeps.run <overrides>` would see it."""
    return _compose("sweep", overrides)
