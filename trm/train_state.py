"""What a run resumes from: the training state and its checkpoint layout (capture/restore side by side); the
collective save and resume around trm/checkpoints/checkpoint.py's files are trm/checkpointer.py's.

A checkpoint is one dict (trm/checkpoints/checkpoint.py writes and reads it atomically):

    step        steps done                     model       the weights (state_dict)
    ema         the EMA's state_dict or None   optimizers  one state_dict per optimizer
    loader      the data position              ranks       every rank's {"carry": {...} on CPU, "rng": CPU RNG}
    carry       SPMD (xla) only: the global carry on CPU, once; `ranks` then holds each rank's "rng" alone
    train_sums  metric sums since the last log point (CPU)
    best        the best eval so far: {"value", "step", "metrics"}
    last_eval   the latest eval's metrics      identity    what wrote it (checkpoint.IDENTITY)
    best_file   what best.pt holds (trm/checkpoints/best_file.py)

Rank 0 alone reads and writes the files (only it may see the path); every rank restores its own carry and RNG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.swa_utils import AveragedModel

from trm.checkpoints import best_file, checkpoint
from trm.data.loader import TrainLoader
from trm.model import ACTModel, Carry
from trm.runtime.base import Runtime


@dataclass
class Best:
    """The best eval so far by the run's objective (`train.objective`, in `train.objective_direction`)."""

    maximize: bool
    value: float
    step: int | None = None  # None: no eval yet
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def start(cls, direction: str) -> Best:
        """Nothing yet: the worst value in `direction` (maximize or minimize: the schema's train.objective_direction)."""
        maximize = direction == "maximize"
        return cls(maximize=maximize, value=-math.inf if maximize else math.inf)

    @property
    def found_value(self) -> float | None:
        """The best value, or None before the first eval."""
        return self.value if self.step is not None else None

    def update(self, value: float, step: int, metrics: dict[str, float]) -> bool:
        """Keep the eval at `step` if its `value` is better (a NaN never is); True if it was."""
        improved = value > self.value if self.maximize else value < self.value
        if improved:
            self.value, self.step, self.metrics = value, step, metrics
        return improved

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "step": self.step, "metrics": self.metrics}

    def load(self, saved: Mapping[str, Any]) -> None:
        self.value, self.step, self.metrics = saved["value"], saved["step"], saved["metrics"]


@dataclass
class TrainState:
    """Everything a checkpoint holds, live: the loop updates `step`, `carry`, `train_sums`, `best`, `last_eval`."""

    model: ACTModel
    optimizers: list[Optimizer]
    ema: AveragedModel | None
    loader: TrainLoader
    identity: dict[str, Any]  # {"config": training_identity(cfg), "data": fingerprint}: what may resume it
    best: Best
    train_sums: Tensor  # on the device: read only at log points
    step: int = 0
    carry: Carry | None = None  # None until the first step builds it from the first batch
    last_eval: dict[str, float] = field(default_factory=dict)
    best_file: best_file.BestFile = field(default_factory=best_file.BestFile)  # what best.pt holds

    def carry_on_cpu(self, runtime: Runtime) -> dict[str, Tensor]:
        """The carry moved to the CPU (collective under multi-host SPMD: runtime.to_cpu)."""
        if self.carry is None:
            raise RuntimeError("no carry to save before the first step")
        return runtime.to_cpu(self.carry._asdict())

    def rank_state(self, runtime: Runtime) -> dict[str, Any]:
        """This rank's part: its carry and RNG, so a resumed job continues exactly where each rank was."""
        return {"carry": self.carry_on_cpu(runtime), "rng": torch.get_rng_state()}

    def capture(self, ranks: list[dict[str, Any]], carry: dict[str, Tensor] | None = None) -> dict[str, Any]:
        """The checkpoint (rank 0), given every rank's `rank_state` (under SPMD: every rank's RNG, and the global
        `carry` once)."""
        return {
            "step": self.step,
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "optimizers": [opt.state_dict() for opt in self.optimizers],
            "loader": self.loader.state_dict(),
            "ranks": ranks,
            "carry": carry,
            "train_sums": self.train_sums.cpu(),
            "best": self.best.to_dict(),
            "last_eval": self.last_eval,
            checkpoint.IDENTITY: self.identity,
            best_file.KEY: self.best_file.to_dict(),
        }

    def restore(self, saved: Mapping[str, Any], rank: int, device: torch.device, world_size: int) -> None:
        """Continue from `saved` (a `capture`) as rank `rank` of `world_size`: weights, optimizers, data position, this
        rank's carry and RNG, the sums since the last log point, the best so far and the latest eval.

        A checkpoint of another process count (a slice that came back larger or smaller): under SPMD its global carry
        and data position hold for any count, and every process's RNG is rank 0's (one seed, one program), so a rank
        it lacks takes rank 0's. Per-rank carries (DDP) are each rank's share of the batch: refused, every rank
        alike (CheckpointMismatchError), naming both counts."""
        self.model.load_state_dict(saved["model"])
        for opt, opt_state in zip(self.optimizers, saved["optimizers"]):
            opt.load_state_dict(opt_state)
        if self.ema is not None and saved.get("ema") is not None:
            self.ema.load_state_dict(saved["ema"])
        self.loader.load_state_dict(saved["loader"])
        ranks = saved["ranks"]
        if saved.get("carry") is None and len(ranks) != world_size:
            raise checkpoint.CheckpointMismatchError(
                f"the checkpoint of step {saved['step']} was written by {len(ranks)} processes, each with its own share "
                f"of the batch's carry, and this run has {world_size}: resume it with {len(ranks)} processes (the "
                "machine or launcher.slots it ran on), or start it again with checkpoint.resume=false"
            )
        mine = ranks[rank] if rank < len(ranks) else ranks[0]
        carry: Mapping[str, Tensor] = saved.get("carry") or mine["carry"]  # SPMD's global carry, saved once
        self.carry = Carry(**{k: v.to(device) for k, v in carry.items()})
        torch.set_rng_state(mine["rng"])
        self.step = saved["step"]
        self.best.load(saved["best"])
        self.best_file = best_file.BestFile.of(saved)
        self.train_sums = saved["train_sums"].to(device)
        # A run resumed at its last step (its job finished, then its outcome was lost) trains nothing more:
        # its final eval is the one in the checkpoint, so the value a sweep reads is still that training's.
        self.last_eval = saved.get("last_eval") or {}
