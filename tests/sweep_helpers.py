"""Helpers shared by the sweep tests: fast trial settings and a driver config on a test database."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig

from sweeps.config.compose import compose_sweep_config
from sweeps.launchers.base import build_launcher
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.testing import FAST_TRIAL, sweep_overrides, trial_list

__all__ = ["FAST_TRIAL", "sweep_overrides", "trial_list"]  # the suite imports them from here too


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


def fake_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, accelerator: str | None = None) -> Path:
    """The stand-in gcloud's pod (tests/fake_gcloud): `workers` v4 VMs (a v4-8 each), or the slice `accelerator`
    names (v4-32: 4 VMs), each VM a directory under the returned root."""
    root = tmp_path / "pod"
    root.mkdir()
    monkeypatch.setenv("FAKE_TPU_ROOT", str(root))
    monkeypatch.setenv("FAKE_TPU_WORKERS", str(workers))
    if accelerator is not None:
        monkeypatch.setenv("FAKE_TPU_TYPE", accelerator)
    else:
        monkeypatch.delenv("FAKE_TPU_TYPE", raising=False)
    monkeypatch.setenv("FAKE_GCLOUD_RETRY_S", "0.05")  # gcloud's 5 s between attempts on ssh's 255
    # `--fake-admin preempt`: the VMs gone at once, no notice (a test of the spot notice's SIGTERM sets its own).
    monkeypatch.setenv("FAKE_TPU_PREEMPT_NOTICE_S", "0")
    # The VMs' /etc/environment: the launchers' OpenMP policy (sweeps.launchers.workers.machine_env), so the jobs do
    # not spin-wait on this machine's shared cores; and the test server's password file where it needs one (each
    # VM's credentials; TRM_SWEEPS_TEST_PG may name a server with a password). Nothing else of the caller's
    # reaches them, as over real ssh.
    image = ["OMP_WAIT_POLICY"]
    pgpass = os.environ.get("PGPASSFILE") or str(Path("~/.pgpass").expanduser())
    if Path(pgpass).is_file():
        monkeypatch.setenv("PGPASSFILE", pgpass)
        image.append("PGPASSFILE")
    monkeypatch.setenv("FAKE_TPU_VM_ENVIRONMENT", ",".join(image))
    return root


FAKE_GCLOUD = Path(__file__).parent / "fake_gcloud" / "gcloud"


def unique_job_name(tmp_path: Path) -> str:
    """A job name no other test uses at the same time: the stand-in's VMs are processes of one machine, so a
    stop's `pkill -f` by job name (sweeps.launchers.tpu.shell.stop_command) reaches every test's job of that
    name, where a real pod's reaches only its own VMs (two pod tests with `pod-job-1` stopped each other's jobs
    when pytest-xdist ran them at once)."""
    return f"pod-job-{tmp_path.name}"


POD_SLICE = ("site=pod", "launcher.tpu_name=test-pod", "launcher.zone=us-central2-b")  # `fake_pod`'s slice


def stand_in_vms(python: str) -> list[str]:
    """Launcher overrides for the stand-in pod's VMs: its gcloud, the VMs' interpreter and directory, no env."""
    return [
        f"launcher.gcloud={FAKE_GCLOUD}",
        f"launcher.python={python}",
        "launcher.remote_dir='~/trm'",
        "launcher.env={}",
    ]


def pod_launcher(*extra: str) -> TpuPodLauncher:
    """The pod launcher of `POD_SLICE` with `extra` launcher overrides (no slice is asked until it is used)."""
    cfg = compose_sweep_config([*POD_SLICE, *extra])
    launcher = build_launcher(cfg.launcher)
    assert isinstance(launcher, TpuPodLauncher)
    return launcher


def stand_in_pod_overrides(db: str, out: Path, python: str) -> list[str]:
    """`sweeps.run` overrides of a one-trial halting study on the stand-in pod (`fake_pod`'s slice `test-pod`):
    its gcloud, the VMs' interpreter and directory, the study on PostgreSQL `db`, trial directories under `out`."""
    return [
        *POD_SLICE,
        *stand_in_vms(python),
        "storage=postgres",
        f"storage.url={db}",
        f"output_root={out}",
        "study=halting",
        "n_trials=1",
    ]


POD_TRIAL = [*FAST_TRIAL, "runtime.backend=torch"]  # a fast trial on the stand-in pod's VMs, which have no XLA


def stand_in_pod_study(db: str, out: Path, python: str, trial: list[str]) -> list[str]:
    """`stand_in_pod_overrides` with what every stand-in pod study that trains sets: no pruner, `trial` as every
    trial's overrides, a heartbeat a second, a 0.2 s driver loop, no re-evaluation at the end."""
    return [
        *stand_in_pod_overrides(db, out, python),
        "pruner=none",
        f"trial.overrides={trial_list(trial)}",
        "heartbeat.interval_s=1",
        "poll_s=0.2",
        "reeval.at_end=false",
    ]


FRESH_VM_PYTHON = "'~/venv/bin/python'"  # the interpreter `venv_setup` makes on each VM


def venv_setup() -> str:
    """launcher.setup for VMs that come and go: a fresh VM has no venv, so every prepare makes one (a wrapper of
    this interpreter) at FRESH_VM_PYTHON."""
    return f"mkdir -p ~/venv/bin && printf '#!/bin/sh\\nexec {sys.executable} \"$@\"\\n' > ~/venv/bin/python && chmod +x ~/venv/bin/python"
