"""Helpers of the XLA lane's tests: run scenarios in fresh processes (see conftest.py for why)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sweeps.testing import LAUNCHER_ENV

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "_worker.py"

# XLA's CPU backend spends seconds per compile in LLVM; these flags cut that ~3x for the tiny test model.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
FOREIGN_ENV = LAUNCHER_ENV  # a worker that inherited them would think it is part of a bigger job


def xla_env(devices: int | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    env.update(PJRT_DEVICE="CPU", XLA_FLAGS=FAST_COMPILE, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    if devices is not None:
        env["CPU_NUM_DEVICES"] = str(devices)
    env.update(extra)
    return env


def run_python(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def run_workers(scenarios: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """Run each scenario (`devices`, `args`) in its own worker process, two at a time; load what each wrote.

    A scenario whose worker failed maps to its error text, so only the tests that need it fail."""
    import torch

    def one(name: str, spec: dict[str, Any]) -> Any:
        out = out_dir / f"{name}.pt"
        proc = run_python([str(WORKER), str(out), *spec["args"]], xla_env(spec.get("devices")))
        if proc.returncode != 0:
            return f"worker {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        return torch.load(out, weights_only=False)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(one, name, spec) for name, spec in scenarios.items()}
        return {name: future.result() for name, future in futures.items()}


def result(results: dict[str, Any], name: str) -> dict[str, Any]:
    value = results[name]
    if isinstance(value, str):
        pytest.fail(value, pytrace=False)
    return value
