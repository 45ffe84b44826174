"""A config's fingerprints (trm/fingerprint.py) are what a checkpoint resumes by and every worker compares: the same
composed config must give the same values whatever shape the trainer hands it in. Since issue 44 the trainer reads
the config as written from `TrainJob.written` (a plain dict, made once in main) instead of the DictConfig; the
functions below are the DictConfig versions as they were, kept here verbatim as the reference."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from contracts.hydra_app import TrainJob, compose_train_config, to_dict
from contracts.training_keys import NOT_TRAINING_KEYS, WORKER_LOCAL_KEYS, under
from trm.fingerprint import config_fingerprint, training_identity
from trm.tracking.run_config import safe_config


def reference_config_fingerprint(cfg: DictConfig) -> str:
    """trm/fingerprint.py config_fingerprint before issue 44 (commit e63a2a5), verbatim."""
    container = to_dict(cfg, resolve=False)
    for key in WORKER_LOCAL_KEYS:
        container.pop(key, None)
    container.get("train", {}).pop("progress", None)
    blob = OmegaConf.to_yaml(OmegaConf.create(container), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def reference_training_identity(cfg: DictConfig, precision: str | None = None) -> dict[str, Any]:
    """trm/fingerprint.py training_identity before issue 44 (commit e63a2a5), verbatim."""
    flat = _flatten(to_dict(cfg, resolve=False))
    identity = {key: value for key, value in flat.items() if not under(key, NOT_TRAINING_KEYS)}
    if precision is not None:
        identity["train.precision"] = precision
        identity.pop("train.bf16_mode", None)
    return identity


CONFIGS = [
    [],
    ["experiment=test_tiny", "train.steps=20", "train.eval_interval=10"],
    ["experiment=paper_sudoku", "data=sudoku_extreme", "data.path=/data/sudoku-extreme"],
    ["optim=adamw", "optim.lr=0.003", "curriculum=linear", "halting=adaptive", "arch=trm_att_sudoku"],
    [  # a sweep trial's job: the link keys, retry and engine settings, W&B keys the driver passes
        "sweep.study=fp",
        "sweep.study_uid=0123456789ab",
        "sweep.trial_number=3",
        "sweep.storage=postgresql://postgres@127.0.0.1:5432/trm_sweeps",
        "sweep.password_env=SOME_ENV",
        "sweep.seed_index=1",
        "sweep.report_retry.attempts=3",
        "sweep.storage_engine.pool_size=1",
        "wandb.run_id=0123456789ab-t3-s1",
        "train.progress=false",
        "runtime.timeout_s=600",
    ],
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: " ".join(o)[:40] or "defaults")
def test_the_job_gives_the_fingerprints_the_dictconfig_gave(
    overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRM_DATA_DIR", str(tmp_path / "data"))  # data.root: ${oc.env:...}, kept unresolved
    cfg = compose_train_config([*overrides, f"out_dir={tmp_path}"])
    job = TrainJob.of(cfg)
    assert config_fingerprint(job.written) == reference_config_fingerprint(cfg)
    for precision in (None, "fp32", "bf16"):
        assert training_identity(job.written, precision) == reference_training_identity(cfg, precision)
    # As Hydra's main sees it: `out_dir` an interpolation of Hydra's run directory, never resolved here.
    written = compose_train_config(overrides)
    assert config_fingerprint(to_dict(written, resolve=False)) == reference_config_fingerprint(written)
    assert config_fingerprint(job.written) == config_fingerprint(to_dict(written, resolve=False))  # out_dir: local


def test_readers_leave_the_written_config_as_it_was(tmp_path: Path) -> None:
    """The fingerprints and the W&B config each read their own copy: the job's `written` is shared by all."""
    job = TrainJob.of(compose_train_config(["sweep.storage=postgresql://u@h/db", f"out_dir={tmp_path}"]))
    before = repr(job.written)
    first = config_fingerprint(job.written)
    training_identity(job.written, "bf16")
    safe_config(job.written)
    assert repr(job.written) == before and config_fingerprint(job.written) == first
