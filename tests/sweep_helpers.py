"""Helpers shared by the sweep tests: fast trial settings and a driver config on a test database."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import DictConfig

from sweeps.config.compose import compose_sweep_config
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
    # The VMs' /etc/environment: the launchers' OpenMP policy (sweeps.launchers.base.machine_env), so the jobs do
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


def stand_in_pod_overrides(db: str, out: Path, python: str) -> list[str]:
    """`sweeps.run` overrides of a one-trial halting study on the stand-in pod (`fake_pod`'s slice `test-pod`):
    its gcloud, the VMs' interpreter and directory, the study on PostgreSQL `db`, trial directories under `out`."""
    return [
        "site=pod",
        "launcher.tpu_name=test-pod",
        "launcher.zone=us-central2-b",
        f"launcher.gcloud={FAKE_GCLOUD}",
        f"launcher.python={python}",
        "launcher.remote_dir='~/trm'",
        "launcher.env={}",
        "storage=postgres",
        f"storage.url={db}",
        f"output_root={out}",
        "study=halting",
        "n_trials=1",
    ]
