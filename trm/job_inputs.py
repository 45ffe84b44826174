"""What a job reads before it builds a model: its dataset, built or opened on this worker's own disk (no shared
filesystem), its per-process batch, and where it writes. Shared by training (trm/train.py) and re-evaluation
(trm/reeval.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from contracts.train_config import GeneratedDataConfig, TrainApp, TrainLoop
from trm.data.build import ensure_generated
from trm.data.format import DatasetError, SplitMeta, load_split
from trm.runtime.base import Runtime

Arrays = dict[str, np.ndarray]


def load_data(data: GeneratedDataConfig | dict[str, Any]) -> tuple[Arrays, Arrays, SplitMeta, SplitMeta]:
    """Build (generated) or open (path) the dataset on this worker's own disk; no shared filesystem. `data`: the
    `data` block, typed by its option's schema (GeneratedDataConfig), or a dict for an option without one."""
    if isinstance(data, GeneratedDataConfig):
        if data.source == "generate":
            ensure_generated(data.path, data.num_train, data.num_test, data.blanks, data.seed, num_aug=data.num_aug)
        path = data.path
    else:  # an option without a schema (data=sudoku_extreme: contracts/train_config.py): it names a built dataset
        if data.get("source") != "path":
            raise DatasetError(f"data.source={data.get('source')!r}: expected 'path' (or data=sudoku_generated)")
        path = str(data["path"])
    train_arrays, train_meta = load_split(path, "train")
    test_arrays, test_meta = load_split(path, "test")
    return train_arrays, test_arrays, train_meta, test_meta


def check_batch(train: TrainLoop, runtime: Runtime) -> int:
    """Per-process batch size; the global batch must split evenly over the processes (the schema holds both
    batches >= 1: contracts/train_config.py TrainLoop)."""
    for key, value in (("global_batch_size", train.global_batch_size), ("eval_batch_size", train.eval_batch_size)):
        if value % runtime.world_size:
            raise ValueError(
                f"train.{key}={value} is not divisible by the world size {runtime.world_size}: "
                f"use a positive multiple of {runtime.world_size}"
            )
    return train.global_batch_size // runtime.world_size


def out_dir(cfg: TrainApp) -> Path:
    """Where the job writes: `out_dir`, Hydra's run directory unless overridden (null only outside a run)."""
    if cfg.out_dir is None:
        raise ValueError("out_dir=None: expected the directory the job writes to (Hydra's run directory by default)")
    return Path(cfg.out_dir)
