"""A save's device work runs on every rank (trm/checkpointer.py `Checkpointer.save`): each rank first cuts the step
(`step_boundary`: under multi-host SPMD the step's pending sums, forced on rank 0 alone, waited for hosts that never
joined), and rank 0 moves the checkpoint's tensors to the CPU in one call (`to_cpu_tree`), not one per tensor.

A 2-process PJRT CPU run of this under SPMD is not possible here: docs/pod-unknowns.md says why."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from torch import Tensor

from tests.test_train import config
from trm.runtime.base import Runtime
from trm.train import train_one
from trm.train_setup import setup

T = TypeVar("T")


@dataclass
class Recording(Runtime):
    """The single-process runtime, as rank `rank`, writing down the calls a save makes of the data plane."""

    calls: list[str] = field(default_factory=list)
    spmd: bool = False

    @property
    def global_tensors(self) -> bool:
        return self.spmd

    def step_boundary(self) -> None:
        self.calls.append("step_boundary")

    def to_cpu(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        self.calls.append("to_cpu")
        return super().to_cpu(tensors)

    def to_cpu_tree(self, tree: T) -> T:
        self.calls.append("to_cpu_tree")
        return super().to_cpu_tree(tree)


@pytest.mark.parametrize(
    ("rank", "spmd", "expected"),
    [
        (0, True, ["step_boundary", "to_cpu", "to_cpu_tree"]),  # the global carry once, then the rest in one call
        (1, True, ["step_boundary", "to_cpu"]),  # every rank joins the carry's copy; nothing else is copied
        (0, False, ["step_boundary", "to_cpu", "to_cpu_tree"]),  # DDP: each rank's own carry
        (1, False, ["step_boundary", "to_cpu"]),
    ],
)
def test_every_rank_cuts_the_step_before_a_save_and_rank_0_copies_once(
    tmp_path: Path, data_root: Path, rank: int, spmd: bool, expected: list[str]
) -> None:
    runtime = Recording(spmd=spmd)
    t = setup(config(tmp_path, data_root, "train.steps=20", "checkpoint.resume=false"), runtime)
    runtime.rank = rank  # a save as that rank (the set-up's data split is rank 0's: one process here)
    train_one(t, 0)  # leaves the step's sums added after its boundary, as every step does
    runtime.calls.clear()
    t.checkpointer.save()
    assert runtime.calls == expected
    assert (tmp_path / "checkpoints" / "latest.pt").exists() == (rank == 0)


def test_the_eager_runtime_hands_the_tree_back_as_it_is() -> None:
    tree: dict[str, Any] = {"step": 3, "optimizers": [{"state": {0: {"m": Tensor([1.0])}}}]}
    assert Runtime().to_cpu_tree(tree) is tree
