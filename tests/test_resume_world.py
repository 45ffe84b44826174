"""A checkpoint resumed by another process count (a pod slice that came back larger or smaller): under SPMD it
restores on any count; with per-rank carries (DDP) it is refused in one line naming both counts
(trm/train_state.py `TrainState.restore`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_train import config
from trm.checkpoints import checkpoint
from trm.runtime import init_runtime
from trm.train import run
from trm.train_setup import setup

pytestmark = pytest.mark.slow  # each test trains


def test_a_checkpoint_restores_on_a_larger_or_smaller_slice_under_spmd_and_is_refused_under_ddp(
    tmp_path: Path, data_root: Path
) -> None:
    run(config(tmp_path, data_root, "train.steps=20", "train.stop_after=10"))
    ddp = checkpoint.load(str(tmp_path / "checkpoints"))  # one process: ranks = [{"carry", "rng"}], no global carry
    assert ddp is not None and len(ddp["ranks"]) == 1 and ddp["carry"] is None
    job = config(tmp_path / "again", data_root, "train.steps=20", "checkpoint.resume=false")
    runtime = init_runtime(job.app.runtime)
    try:
        state = setup(job, runtime).state
        # SPMD, as xla writes it: the global carry once and every process's RNG; read by 2 processes, then by 1.
        rng = ddp["ranks"][0]["rng"]
        spmd = {**ddp, "carry": ddp["ranks"][0]["carry"], "ranks": [{"rng": rng}]}
        state.restore(spmd, 1, torch.device("cpu"), 2)  # rank 1 of a slice twice as large: was an IndexError
        assert state.step == 10 and state.carry is not None
        assert torch.equal(state.carry.z, spmd["carry"]["z"]) and torch.equal(torch.get_rng_state(), rng)
        state.restore({**spmd, "ranks": [{"rng": rng}] * 4}, 0, torch.device("cpu"), 1)  # a smaller one
        assert state.step == 10
        with pytest.raises(checkpoint.CheckpointMismatchError) as err:
            state.restore(ddp, 1, torch.device("cpu"), 2)
        message = str(err.value)
        assert "\n" not in message and "written by 1 processes" in message and "this run has 2" in message
        assert "checkpoint.resume=false" in message
    finally:
        runtime.close(True)
