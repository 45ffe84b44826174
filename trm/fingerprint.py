"""Fingerprints that every worker of a job must share: its config as composed (interpolations unresolved: a
worker-local path stays `${...}`) and its code version. Both config fingerprints read the config as written
(contracts.hydra_app.TrainJob's `written`), never a resolved or typed copy: a checkpoint resumes by them, so the
same config must give the same values as it always did (tests/test_fingerprint.py)."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from contracts.code_version import code_fingerprint
from contracts.training_keys import NOT_TRAINING_KEYS, WORKER_LOCAL_KEYS, under

__all__ = ["code_fingerprint", "config_fingerprint", "training_identity"]  # code_fingerprint: a contract


def config_fingerprint(written: Mapping[str, Any]) -> str:
    """The hash every worker of a job compares: the config as written, less what differs between workers."""
    container = copy.deepcopy(dict(written))  # the job's own copy is left as it is
    for key in WORKER_LOCAL_KEYS:
        container.pop(key, None)
    container.get("train", {}).pop("progress", None)
    blob = OmegaConf.to_yaml(OmegaConf.create(container), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def training_identity(written: Mapping[str, Any], precision: str | None = None) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: every key of the config as written (`written`) that changes the
    training, flattened (`optim.lr`: 0.001, ...), including the sweep study, its uid and storage. Kept as values,
    not a hash, so a refusal can name the keys that differ.

    `precision` is the mode the job resolved `train.precision` to (trm/precision.py). It replaces the config's
    value there, and `train.bf16_mode` leaves: the mode is what trains, `auto` and bf16_mode only chose it. So a
    bf16 checkpoint is refused where `auto` resolves to fp32 (another machine kind: that would change the training;
    set train.precision explicitly to continue it), while `auto` and an explicit value that give the same mode, or a
    checkpoint written before `auto` existed in that mode, resume."""
    flat = _flatten(written)
    identity = {key: value for key, value in flat.items() if not under(key, NOT_TRAINING_KEYS)}
    if precision is not None:
        identity["train.precision"] = precision
        identity.pop("train.bf16_mode", None)
    return identity
