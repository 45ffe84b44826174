"""Fingerprints that every worker of a job must share: resolved config and code version."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

# Keys that legitimately differ between workers (each VM has its own output directory) or between a run
# and its resumption.
WORKER_LOCAL_KEYS = ("out_dir", "checkpoint", "runtime", "hydra")


def config_fingerprint(cfg: DictConfig) -> str:
    container = OmegaConf.to_container(cfg, resolve=False)
    for key in WORKER_LOCAL_KEYS:
        container.pop(key, None)
    container.get("train", {}).pop("progress", None)
    blob = OmegaConf.to_yaml(OmegaConf.create(container), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 over the trm package's source files (the training code every worker must run)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
