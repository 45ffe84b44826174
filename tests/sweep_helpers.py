"""Helpers shared by the sweep tests: fast trial settings and a driver config on a test database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import DictConfig

from sweeps.config import compose_sweep_config

# A trial that trains for real in seconds: the test_tiny preset (conf/experiment/test_tiny.yaml) with one H cycle
# and up to 2 halting steps, 20 steps, eval every 10. A trial keeps the default precision (auto), not the preset's fp32.
FAST_TRIAL = [
    "experiment=test_tiny",
    "train.precision=auto",
    "arch.H_cycles=1",
    "arch.halt_max_steps=2",
    "train.log_interval=10",
    "train.eval_interval=10",
    "train.steps=20",
    "optim.warmup_steps=1",
]


def trial_list(overrides: list[str]) -> str:
    """A Hydra list override value: ['a=1','b=2'] (quoted, since the items contain '=')."""
    return "[" + ",".join(f"'{o}'" for o in overrides) + "]"


def sweep_overrides(storage_url: str, out: Path, *extra: str, trial: list[str] | None = None) -> list[str]:
    return [
        f"storage.url={storage_url}",
        f"output_root={out}",
        f"trial.overrides={trial_list(trial or FAST_TRIAL)}",
        "heartbeat.interval_s=1",
        "heartbeat.grace_s=4",
        "poll_s=0.2",
        "progress_interval_s=2",
        "reeval.at_end=false",  # a job per top trial at each study's end: tests/test_reeval.py turns it on
        *extra,
    ]


def sweep_config(storage_url: str, out: Path, *extra: str, trial: list[str] | None = None) -> DictConfig:
    return compose_sweep_config(sweep_overrides(storage_url, out, *extra, trial=trial))


def summary_of(workdir: Path) -> dict:
    return json.loads((workdir / "run" / "summary.json").read_text())


def trial_dir(study_root: Path, number: int) -> Path:
    """A trial's working directory, <output_root>/<study>/<uid[:8]>/trial-<n>: the study has one uid."""
    matches = sorted(study_root.glob(f"*/trial-{number}"))
    assert len(matches) == 1, f"expected one trial-{number} under {study_root}, found {matches}"
    return matches[0]


def trial_file_exists(study_root: Path, number: int, relative: str) -> bool:
    """Whether <study>/<uid[:8]>/trial-<n>/<relative> exists yet (before the trial starts, its directory does not)."""
    return any(study_root.glob(f"*/trial-{number}/{relative}"))


def fake_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> Path:
    """The stand-in gcloud's pod (tests/fake_gcloud): `workers` VMs, each a directory under the returned root."""
    root = tmp_path / "pod"
    root.mkdir()
    monkeypatch.setenv("FAKE_TPU_ROOT", str(root))
    monkeypatch.setenv("FAKE_TPU_WORKERS", str(workers))
    return root
