"""The distributed runtime the training loop talks to: who am I, reduce, broadcast, barrier.

Two planes (DESIGN.md): a gloo *control plane* over the job's processes for everything that is not a model
tensor (start-up agreement, prune verdicts, barriers), and a *data plane* for gradients: DDP for
`torch`, nothing for `single`. Every collective has a timeout so no rank waits forever on a dead peer.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

BACKENDS = ("auto", "single", "torch")


class RuntimeMismatchError(RuntimeError):
    """Workers disagree on something that must be identical (config, code, data)."""


@dataclass
class Runtime:
    backend: str = "single"
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum a (small, metrics) tensor over all processes; the result is on every rank."""
        if self.distributed:
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s `obj` on every rank (prune verdicts, stop signals)."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The module the train step calls (DDP for `torch`); `model` itself stays the one to save."""
        if self.distributed:
            return nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
        return model

    def to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Move this process's batch to its device (and, on XLA, lay it out over the mesh)."""
        return {k: v.to(self.device) for k, v in batch.items()}

    def step_boundary(self) -> None:
        """End of one train step: XLA cuts and runs its graph here; eager backends do nothing."""

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_runtime(cfg: Any) -> Runtime:
    """Pick and start the runtime from config (`runtime.backend`) and the environment (torchrun's vars)."""
    backend = cfg.backend
    if backend not in BACKENDS:
        raise ValueError(f"runtime.backend={backend!r}: expected one of {list(BACKENDS)}")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if backend == "auto":
        backend = "torch" if world_size > 1 else "single"
    if backend == "single":
        if world_size > 1:
            raise ValueError(f"runtime.backend=single but WORLD_SIZE={world_size}: use runtime.backend=torch or auto")
        return Runtime()
    rank = int(os.environ.get("RANK", "0"))
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=float(cfg.timeout_s))
        )
    return Runtime(backend="torch", rank=rank, world_size=world_size)


def check_agreement(runtime: Runtime, fingerprints: dict[str, str]) -> None:
    """Stop every process, with one error naming the workers that differ, unless all fingerprints agree.

    The classic failure of a pod whose VMs were not all updated: different code, config or data."""
    everyone = runtime.all_gather_object(fingerprints)
    problems = []
    for key, reference in fingerprints.items():
        ref0 = everyone[0].get(key)
        differing = [rank for rank, fp in enumerate(everyone) if fp.get(key) != ref0]
        if differing:
            problems.append(f"{key} differs on worker(s) {differing} from worker 0 ({ref0!s:.12})")
    if problems:
        raise RuntimeMismatchError("workers disagree: " + "; ".join(problems))
