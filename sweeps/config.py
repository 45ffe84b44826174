"""Compose the sweep config outside a Hydra app (tests, benchmarks, tools)."""

from __future__ import annotations

from omegaconf import DictConfig

from contracts.hydra_app import compose_config


def compose_sweep_config(overrides: list[str]) -> DictConfig:
    """The sweep config as `python -m sweeps.run <overrides>` would see it."""
    return compose_config("sweep", overrides)
