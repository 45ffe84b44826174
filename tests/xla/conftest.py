"""The XLA lane: `make test-xla` runs this directory in .venv-xla (torch 2.9 + torch_xla 2.9, PJRT_DEVICE=CPU).

The main `make test` (main venv, no torch_xla) must not collect it: files here are collected only when the
pytest command names this directory (or a file in it). When it is named, nothing skips: a missing torch_xla
or PJRT_DEVICE is a failure.

Each XLA scenario runs in its own process (tests/xla/_worker.py, started by _lane.py): SPMD mode and the
number of virtual CPU devices (CPU_NUM_DEVICES) are fixed per process before the first XLA tensor.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _requested(config: pytest.Config) -> bool:
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (base / str(arg).split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if not _requested(config):
        return True  # the main lane: tests/xla belongs to `make test-xla`
    return None


@pytest.fixture(scope="session", autouse=True)
def xla_lane() -> None:
    """Fail (never skip) when the lane is not set up."""
    if importlib.util.find_spec("torch_xla") is None:
        pytest.fail("tests/xla needs torch_xla: run `make test-xla` (it builds .venv-xla)", pytrace=False)
    if not os.environ.get("PJRT_DEVICE"):
        pytest.fail("tests/xla needs PJRT_DEVICE=CPU (as `make test-xla` sets it)", pytrace=False)
