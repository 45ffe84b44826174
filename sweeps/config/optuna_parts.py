"""The Optuna objects config may build (sampler, pruner, launcher), built one way for the driver and validation.

Its own module so that sweeps.validation.validate can build them exactly as the driver does without importing the driver.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate

from contracts.pruners import PRUNER_TARGETS

# What config may instantiate: `_target_` is code execution, so only these classes.
TARGETS = ["optuna.samplers.*", *PRUNER_TARGETS, "sweeps.launchers.*"]


def build(node: Mapping[str, Any]) -> Any:
    """Instantiate a `_target_` node, refusing any class outside TARGETS."""
    return instantiate(node, _convert_="all", _execution_whitelist_=TARGETS)


def resolved_dict(node: Mapping[str, Any]) -> dict[str, Any]:
    """A `_target_` node of the typed config (resolved when it was typed) as a deep copy the caller may change."""
    return {str(key): value for key, value in copy.deepcopy(dict(node)).items()}


def pruner_spec(pruner: Mapping[str, Any], train_steps: int) -> dict[str, Any]:
    """The `pruner` node as a resolved `_target_` dict: stored on the study so every job builds the same one, with
    its lengths in steps (resolve_steps)."""
    return resolve_steps(resolved_dict(pruner), train_steps)


def resolve_steps(spec: dict[str, Any], train_steps: int) -> dict[str, Any]:
    """`spec` (a pruner's `_target_` dict, changed in place) with its lengths in the trial's steps, also in a
    wrapped pruner (contracts/pruning/evidence.py): `max_resource: auto` is the trial length, and an
    `n_warmup_steps` between 0 and 1 a share of it (no verdict before it, whatever train.steps a study has)."""
    for node in (spec, spec.get("wrapped")):
        if not isinstance(node, dict):
            continue
        if node.get("max_resource") == "auto":
            node["max_resource"] = train_steps
        warmup = node.get("n_warmup_steps")
        if isinstance(warmup, float) and 0 < warmup < 1:
            node["n_warmup_steps"] = round(warmup * train_steps)
    return spec
