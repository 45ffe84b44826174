"""Fingerprints that every worker of a job must share: its config as composed (interpolations unresolved: a
worker-local path stays `${...}`) and its code version."""

from __future__ import annotations

import hashlib
from typing import Any

from omegaconf import DictConfig, OmegaConf

from contracts.code_version import code_fingerprint
from contracts.hydra_app import to_dict

__all__ = ["code_fingerprint", "config_fingerprint", "training_identity"]  # code_fingerprint: a contract

# Keys that legitimately differ between workers (each VM has its own output directory) or between a run
# and its resumption.
WORKER_LOCAL_KEYS = ("out_dir", "checkpoint", "runtime", "hydra")


def config_fingerprint(cfg: DictConfig) -> str:
    container = to_dict(cfg, resolve=False)
    for key in WORKER_LOCAL_KEYS:
        container.pop(key, None)
    container.get("train", {}).pop("progress", None)
    blob = OmegaConf.to_yaml(OmegaConf.create(container), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


# Keys that do not change what a run trains: where it writes, how it is watched, when it pauses, which
# attempt of a sweep trial it is (a retry resumes its first attempt's checkpoint), and where the data lies
# on this disk (its content is identified by the dataset fingerprint instead).
NOT_TRAINING_KEYS = (
    *WORKER_LOCAL_KEYS,
    "wandb",
    "data.root",
    "data.path",
    "train.progress",
    "train.stop_after",
    "train.preemption_check_interval",
    "sweep.trial_number",
    "sweep.job",
    "sweep.password_env",
    "sweep.report_retry",  # how the job talks to the study storage, not what it trains
    "sweep.storage_engine",
    "reeval",  # evaluating a trained checkpoint again reads it, never trains it (trm/reeval.py)
)


def _flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def training_identity(cfg: DictConfig, precision: str | None = None) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: every config key that changes the training, flattened
    (`optim.lr`: 0.001, ...), including the sweep study, its uid and storage. Kept as values, not a hash, so a
    refusal can name the keys that differ.

    `precision` is the mode the job resolved `train.precision` to (trm/precision.py). It replaces the config's
    value there, and `train.bf16_mode` leaves: the mode is what trains, `auto` and bf16_mode only chose it. So a
    bf16 checkpoint is refused where `auto` resolves to fp32 (another machine kind: that would change the training;
    set train.precision explicitly to continue it), while `auto` and an explicit value that give the same mode, or a
    checkpoint written before `auto` existed in that mode, resume."""
    flat = _flatten(to_dict(cfg, resolve=False))
    identity = {
        key: value
        for key, value in flat.items()
        if not any(key == skip or key.startswith(skip + ".") for skip in NOT_TRAINING_KEYS)
    }
    if precision is not None:
        identity["train.precision"] = precision
        identity.pop("train.bf16_mode", None)
    return identity
