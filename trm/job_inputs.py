"""What a job reads before it builds a model: its dataset, built or opened on this worker's own disk (no shared
filesystem), and its per-process batch. Shared by training (trm/train.py) and re-evaluation (trm/reeval.py)."""

from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from trm.data.build import ensure_generated
from trm.data.format import DatasetError, SplitMeta, load_split
from trm.runtime.base import Runtime

Arrays = dict[str, np.ndarray]


def load_data(cfg: DictConfig) -> tuple[Arrays, Arrays, SplitMeta, SplitMeta]:
    """Build (generated) or open (path) the dataset on this worker's own disk; no shared filesystem."""
    data = cfg.data
    if data.source == "generate":
        ensure_generated(data.path, data.num_train, data.num_test, data.blanks, data.seed, num_aug=data.num_aug)
    elif data.source != "path":  # an option without a schema (data=sudoku_extreme: contracts/train_config.py)
        raise DatasetError(f"data.source={data.source!r}: expected 'generate' or 'path'")
    train_arrays, train_meta = load_split(data.path, "train")
    test_arrays, test_meta = load_split(data.path, "test")
    return train_arrays, test_arrays, train_meta, test_meta


def check_batch(cfg: DictConfig, runtime: Runtime) -> int:
    """Per-process batch size; the global batch must split evenly over the processes (the schema holds both
    batches >= 1: contracts/train_config.py TrainLoop)."""
    for key in ("global_batch_size", "eval_batch_size"):
        value = cfg.train[key]
        if value % runtime.world_size:
            raise ValueError(
                f"train.{key}={value} is not divisible by the world size {runtime.world_size}: "
                f"use a positive multiple of {runtime.world_size}"
            )
    return int(cfg.train.global_batch_size) // runtime.world_size
