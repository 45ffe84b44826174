"""The preflight's port check on VMs whose gcloud sessions start seconds apart (each worker's gcloud makes its own
API round trips before ssh): preflight.reach_s counts from the last worker's start, so a late VM is not taken for
a network that drops the control plane's traffic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sweeps.preflight import main
from tests.sweep_helpers import fake_pod
from tests.test_preflight import give_python, pod_args

pytestmark = pytest.mark.slow  # starts the stand-in pod's processes

REACH_S = 2  # preflight.reach_s here: each late worker below starts later than this


@pytest.mark.parametrize("late", ["1=5", "0=5"], ids=["a-peer-starts-late", "worker-0-starts-late"])
def test_a_worker_starting_later_than_reach_s_still_reaches_worker_0(
    late: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_pg_url: str
) -> None:
    """Before: worker 0 listened for reach_s from its own start and each peer tried for reach_s from its own, so a
    session 5 s late (worker 1: worker 0 had stopped listening; worker 0: the peer had given up) read as "the VPC
    must allow TCP" and the driver refused the study."""
    pod = fake_pod(tmp_path, monkeypatch, 2)
    for w in (0, 1):
        give_python(pod / "test-pod" / f"worker-{w}", Path(sys.executable))
    monkeypatch.setenv("FAKE_TPU_START_DELAY_S", late)
    code = main([*pod_args(tmp_path, fresh_pg_url), f"preflight.reach_s={REACH_S}"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[-1] == "no problems: the machine is ready", out
