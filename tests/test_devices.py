"""`runtime.device` (trm/runtime/devices.py): which torch device a `single`/`torch` job trains on.

This machine has no GPU, so the choice of a GPU per process is checked with torch's CUDA queries answering for
two GPUs; the real GPU run (an H100, lent once) is in docs/benchmarks.md, "A GPU: H100".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from contracts.hydra_app import TrainJob, compose_train_config
from tests.config_blocks import runtime_config
from trm.runtime import init_runtime
from trm.runtime.devices import resolve_device
from trm.train import run


def test_auto_and_cpu_train_on_the_cpu_of_a_machine_without_a_gpu() -> None:
    assert not torch.cuda.is_available()  # this suite's machines; the GPU path is measured apart
    assert resolve_device("auto", 1, {}) == torch.device("cpu")
    assert resolve_device("cpu", 4, {"LOCAL_RANK": "3"}) == torch.device("cpu")
    runtime = init_runtime(runtime_config(backend="single", device="auto", timeout_s=5))
    assert runtime.device == torch.device("cpu") and runtime.data_group is None


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ("cuda", r"runtime.device=cuda but torch sees no GPU .*use runtime.device=auto or cpu"),
        ("gpu", r"runtime.device='gpu': expected one of \['auto', 'cpu', 'cuda'\]"),
    ],
)
def test_a_device_this_machine_cannot_give_is_refused_naming_the_key(choice: str, message: str) -> None:
    for backend in ("single", "torch"):
        with pytest.raises(ValueError, match=message):
            init_runtime(runtime_config(backend=backend, device=choice, timeout_s=5))


def test_the_xla_backend_still_refuses_a_device_typo() -> None:
    """XLA picks its own devices (the key is ignored there), but a typo fails before torch_xla is imported."""
    with pytest.raises(ValueError, match=r"runtime.device='tpu': expected one of"):
        init_runtime(runtime_config(backend="xla", device="tpu", timeout_s=5))


def test_each_process_of_a_node_takes_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's CUDA queries answer for two visible GPUs (a slot's CUDA_VISIBLE_DEVICES=2,3, say)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", 1, {}) == torch.device("cuda", 0)
    assert resolve_device("cuda", 2, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == torch.device("cuda", 1)
    two_nodes = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}  # world 4 over 2 nodes: 2 GPUs each is enough
    assert resolve_device("auto", 4, two_nodes) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"4 processes on this machine \(of 4 in the job\) but 2 visible GPU\(s\)"):
        resolve_device("auto", 4, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert resolve_device("auto", 8, {}) == torch.device("cuda", 0)  # one process per machine, 8 machines


@pytest.mark.slow
def test_a_run_says_which_device_it_trained_on(tmp_path: Path, data_root: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = compose_train_config(
        [
            "experiment=test_tiny",
            f"data.root={data_root}",
            f"out_dir={tmp_path}",
            "train.steps=2",
            "train.eval_interval=2",
            "runtime.device=auto",
            "wandb.enabled=false",
        ]  # fmt: skip
    )
    summary = run(TrainJob.of(cfg))
    assert summary.outcome == "COMPLETE" and summary.device == "cpu"  # what the trial stores
    assert json.loads((tmp_path / "summary.json").read_text())["device"] == "cpu"
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    start = next(line for line in lines if line.get("event") == "start")
    assert start["device"] == "cpu"
