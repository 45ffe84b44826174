"""Typed blocks of the training config, for tests that call the trainer's parts directly: they take the blocks
trm.train's main hands down (contracts.hydra_app.TrainJob), not the composed DictConfig."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from omegaconf import OmegaConf

from contracts.hydra_app import compose_train_config
from contracts.train_config import RuntimeConfig


def block(key: str, *overrides: str) -> Any:
    """The `key` block of the training config `overrides` compose, typed by its schema (`optim`: an OptimConfig)."""
    return OmegaConf.to_object(compose_train_config(list(overrides))[key])


def runtime_config(*overrides: str, **values: Any) -> RuntimeConfig:
    """conf/train.yaml's `runtime` block with `overrides`, typed, then `values` set as given: a test may hand the
    runtime a value the schema would refuse (`device="gpu"`), to see the runtime refuse it as well."""
    return dataclasses.replace(cast(RuntimeConfig, block("runtime", *overrides)), **values)
