"""Multi-process training on the gloo control plane: real torchrun jobs, one directory per node."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeps.launchers.base import JobSpec
from sweeps.launchers.torchrun import TorchrunLauncher, free_port
from sweeps.launchers.workers import JobHandle, start_worker

pytestmark = pytest.mark.slow  # every test here starts processes or trains

ROOT = Path(__file__).resolve().parents[1]

# Exploration off: its random draws differ between a 1-process and an N-process run by design.
JOB = [
    "experiment=test_tiny",
    "train.log_interval=5",
    "train.eval_interval=10",
    "train.steps=20",
    "halting.exploration_prob=0.0",
    "optim.warmup_steps=5",
]


def records(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def run_job(tmp_path: Path, nnodes: int, *extra: str) -> tuple[JobHandle, Path]:
    out = tmp_path / f"out-{nnodes}"
    spec = JobSpec(f"dist-{nnodes}", [*JOB, f"out_dir={out}", *extra], tmp_path / f"job-{nnodes}")
    handle = TorchrunLauncher(nnodes=nnodes, nproc_per_node=1).launch(spec)
    return handle, out


@pytest.fixture(scope="module")
def single_process_records(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The 1-process run every N-process run is compared with (run once for the module)."""
    single, single_out = run_job(tmp_path_factory.mktemp("single"), 1)
    assert single.wait(300) == 0, single.failure
    return records(single_out)


@pytest.mark.parametrize("nnodes", [2, 4])
def test_n_process_job_matches_single_process_run(
    tmp_path: Path, nnodes: int, single_process_records: list[dict]
) -> None:
    multi, multi_out = run_job(tmp_path, nnodes)
    assert multi.wait(400) == 0, multi.failure
    one, many = single_process_records, records(multi_out)
    assert [r["step"] for r in one] == [r["step"] for r in many]
    for a, b in zip(one, many):
        for key in ("train/lm_loss", "train/accuracy", "eval/lm_loss", "eval/accuracy", "eval/exact_accuracy"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=2e-4, abs=1e-5), (a["step"], key)
    evals = [r for r in many if "eval/halted_examples" in r]
    assert evals and all(r["eval/halted_examples"] == 32 for r in evals)  # every eval example counted exactly once
    summary = json.loads((multi_out / "summary.json").read_text())
    assert summary["rank_steps"] == [20] * nnodes
    for node in range(nnodes):  # each node built its own data in its own directory
        assert (tmp_path / f"job-{nnodes}" / f"node-{node}" / "outputs" / "data").is_dir()


def _node(name: str, cwd: Path, port: int, rank: int, overrides: list[str], log: Path):
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1",
            "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "trm.train", *overrides]  # fmt: skip
    return start_worker(name, argv, cwd, dict(os.environ), log)


def test_workers_with_another_seed_or_code_version_all_stop_naming_the_mismatch(tmp_path: Path) -> None:
    # Worker 1 runs other code: a copy of trm/ with one changed line, first on its import path.
    other_code = tmp_path / "node-1"
    shutil.copytree(ROOT / "trm", other_code / "trm", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "conf", other_code / "conf")
    (other_code / "trm" / "schedules.py").write_text(
        (ROOT / "trm" / "schedules.py").read_text() + "\n# hotfix on one VM\n"
    )
    port = free_port()
    out = [f"out_dir={tmp_path / 'out'}"]
    workers = [
        _node("node-0", tmp_path / "node-0", port, 0, [*JOB, *out, "seed=0"], tmp_path / "node-0.log"),
        _node("node-1", other_code, port, 1, [*JOB, *out, "seed=1"], tmp_path / "node-1.log"),
    ]
    for w in workers:  # each worker on its own: every one of them must stop by itself
        assert w.process.wait(timeout=180) != 0
        text = w.log_path.read_text()
        assert "workers disagree" in text, text[-2000:]
        assert "config differs on worker(s) [1]" in text and "code differs on worker(s) [1]" in text
    assert (
        not (tmp_path / "out" / "metrics.jsonl").exists()
        or "train/lm_loss" not in (tmp_path / "out" / "metrics.jsonl").read_text()
    )


def test_sigkill_of_one_worker_ends_the_job_and_names_it(tmp_path: Path) -> None:
    handle, out = run_job(tmp_path, 2, "train.steps=100000", "train.eval_interval=100000")
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and metrics.read_text()):
        assert time.monotonic() < deadline and handle.poll() is None, handle.failure
        time.sleep(0.2)
    # The training process (not the torchrun agent) of node 1.
    agent = handle.workers[1].process.pid
    child = subprocess.run(["pgrep", "-P", str(agent)], capture_output=True, text=True).stdout.split()
    assert child, "node-1's training process not found"
    os.kill(int(child[0]), signal.SIGKILL)
    killed_at = time.monotonic()
    code = handle.wait(90)
    assert code not in (None, 0)
    assert time.monotonic() - killed_at < 60
    print(f"[fault] SIGKILL of a torchrun worker: job ended {time.monotonic() - killed_at:.1f} s later")
    assert handle.failed_worker == "node-1"
    assert "node-1 exited with code" in handle.failure and "SIGKILL" in handle.failure
    assert all(w.process.poll() is not None for w in handle.workers)  # node 0 was stopped too
