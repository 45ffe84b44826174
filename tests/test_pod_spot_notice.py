"""A spot preemption as Google sends it, end to end on the stand-in pod (issue 56): the notice's SIGTERM to every
process of the VMs some seconds before the stop (30 on Compute Engine), the job's save and upload to gs:// (the
stand-in store, tests/fake_gcs.py) within that notice, the kill, the slice recreated, and the trial resumed from
the uploaded checkpoint on fresh VMs, spending no retry."""

from __future__ import annotations

import importlib
import json
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

from storage.record import PREEMPTED_ATTR, PROGRESS_ATTR, RETRIES_NOT_SPENT_ATTR
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.torchrun import free_port
from sweeps.trials.retry import retries_used
from tests.fake_gcs import StandInGCS
from tests.sweep_helpers import (
    FAKE_GCLOUD,
    FAST_TRIAL,
    FRESH_VM_PYTHON,
    fake_pod,
    stand_in_pod_study,
    venv_setup,
)

NOTICE_S = 5  # the notice's SIGTERM to the stop (Google's 30): the job's save and upload fit in it here
EVAL_INTERVAL = 150  # the periodic saves: none between the notice and the stop (a save there is the notice's)


def admin_events(pod: Path) -> dict[str, tuple[float, str]]:
    """The stand-in's account of the preemption (admin.log): each step's time and what it did."""
    events = {}
    for line in (pod / "admin.log").read_text().splitlines():
        if " at=" in line:
            what, _, at = line.rpartition(" at=")
            events[what.split()[0]] = (float(at), what)
    return events


@pytest.mark.slow  # a pod study on the stand-in gcloud: processes
def test_a_spot_notice_saves_to_gs_within_the_notice_and_the_trial_resumes_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    store = tmp_path / "gcs"  # Cloud Storage: one store for the VMs and the driver, outliving the VMs
    (store / "bucket").mkdir(parents=True)
    monkeypatch.setenv("FAKE_GCS_ROOT", str(store))
    for protocol in StandInGCS.protocol:  # the driver's gs:// too (it looks into a chain's checkpoints)
        monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, protocol, StandInGCS)
    monkeypatch.setenv("FAKE_TPU_PREEMPT_NOTICE_S", str(NOTICE_S))
    monkeypatch.setenv("FAKE_TPU_RECREATE_AFTER_S", "2")
    trial = [o for o in FAST_TRIAL if not o.startswith(("train.steps", "train.eval_interval"))]
    trial += [
        f"train.steps={EVAL_INTERVAL + 10}",  # a periodic save past the notice's, then the end
        f"train.eval_interval={EVAL_INTERVAL}",
        "train.preemption_check_interval=1",
        "runtime.backend=torch",
        f"runtime.port={free_port()}",
    ]
    cfg = compose_sweep_config(
        [
            *stand_in_pod_study(fresh_pg_url, tmp_path / "out", FRESH_VM_PYTHON, trial),
            "trial.checkpoint_root=gs://bucket/ckpt",
            "heartbeat.max_retry=0",  # a retry spent would leave the trial failed
            "launcher.state_poll_s=0.3",
            f"preflight.expect={{torch: '{torch.__version__}', torch_xla: null}}",
            "preflight.chips_glob='~/dev/accel*'",
            "preflight.min_free_gb=0",
        ]
    )
    cfg.launcher.setup = venv_setup()  # a fresh VM has no venv: every prepare makes one
    seen: dict[str, object] = {}

    def preempt_mid_trial() -> None:
        """Once the job is past step 20 (its progress in the study), a spot preemption; at the stop, what the
        bucket holds (the recreate follows 2 s later)."""
        deadline = time.monotonic() + 300
        while True:
            try:
                trials = optuna.load_study(study_name="halting", storage=fresh_pg_url).trials
            except KeyError:  # the driver has not created the study yet
                trials = []
            progress = trials[0].user_attrs.get(PROGRESS_ATTR) if trials else None
            if progress and progress["step"] >= 20:
                break
            assert time.monotonic() < deadline, "the trial made no progress"
            time.sleep(0.2)
        seen["progress"] = progress["step"]
        hand = subprocess.Popen([str(FAKE_GCLOUD), "--fake-admin", "preempt", "test-pod"])
        while not (pod / "admin.log").exists() or "stop" not in admin_events(pod):
            assert hand.poll() is None, "the preemption ended before its stop"
            time.sleep(0.05)
        latest = list(store.glob("bucket/ckpt/**/trial-0/checkpoints/latest.pt"))
        if latest:
            seen["uploaded_at"] = latest[0].stat().st_mtime
            seen["step"] = torch.load(latest[0], map_location="cpu", weights_only=False)["step"]
        assert hand.wait(timeout=60) == 0

    hand = threading.Thread(target=preempt_mid_trial)
    hand.start()
    Driver(typed_sweep(cfg)).run()
    hand.join()

    events = admin_events(pod)
    (notice_at, notice), (stop_at, stop) = events["notice"], events["stop"]
    assert notice.startswith("notice signalled=") and int(notice.split("=")[1]) > 0  # the job's processes among them
    assert "step" in seen, "no checkpoint in gs://bucket at the stop: the job did not save on the notice's SIGTERM"
    step = seen["step"]
    what = f"progress {seen['progress']} at the notice, step {step} uploaded at {seen['uploaded_at']}: {events}"
    assert isinstance(step, int) and 20 <= int(seen["progress"]) <= step < EVAL_INTERVAL, what  # the notice's save
    assert notice_at < float(seen["uploaded_at"]) < stop_at, what  # ... uploaded within the notice
    assert stop == "stop killed=0", what  # the job had ended: nothing was left for the kill

    first, second = optuna.load_study(study_name="halting", storage=fresh_pg_url).trials
    assert first.state == TrialState.FAIL and first.user_attrs[PREEMPTED_ATTR]
    assert second.state == TrialState.COMPLETE, second.user_attrs.get("fail_reason")
    assert second.user_attrs[RETRIES_NOT_SPENT_ATTR] == 1 and retries_used(second) == 0  # no retry charged
    log = (Path(second.user_attrs["workdir"]) / "worker-0.log").read_text()
    starts = [json.loads(line) for line in log.splitlines() if line.startswith('{"event": "start"')]
    assert starts and starts[0]["resumed_from"] == step, log[-2000:]  # from the checkpoint the notice uploaded
