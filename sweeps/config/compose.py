"""Compose the sweep config outside a Hydra app (tests, benchmarks, tools), checked against its schema."""

from __future__ import annotations

from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from contracts.hydra_app import compose_config
from sweeps.config import schema
from sweeps.config.config_values import SweepConfigError
from sweeps.config.typed_config import composition_error_line


def compose_sweep_config(overrides: list[str]) -> DictConfig:
    """The sweep config as `python -m sweeps.run <overrides>` would see it; a value or key the schema refuses is a
    SweepConfigError naming the key, the value and what is accepted."""
    schema.register()  # conf/sweep.yaml's defaults name the schema
    try:
        return compose_config("sweep", overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise SweepConfigError(composition_error_line(err)) from err
