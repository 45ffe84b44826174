"""The slice is watched while trials run (issue 56: "the slice is polled while trials run"): a maintenance event
(`health` UNHEALTHY_MAINTENANCE) while two jobs run and neither ends is noticed within `launcher.watch_s`, and the
pause stops both with their grace, so each saves. The driver used to ask the slice only when a job ended and before
a launch: jobs that hang on a slice under maintenance ran on until `stall_timeout_s`, their checkpoints unsaved."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import MachineUnavailableError
from tests.sweep_helpers import FAKE_GCLOUD, fake_pod
from tests.test_pod_pause import two_vm_study

UNWATCHED_S = 60  # after this the stand-in jobs fail on their own (fail-now): the old driver's only cue


@pytest.mark.slow  # runs the gcloud stand-in: processes
def test_a_maintenance_event_is_noticed_while_the_jobs_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    cfg = two_vm_study(
        tmp_path,
        fresh_pg_url,
        "launcher.watch_s=1",
        f"study.name=watch-{tmp_path.name}",  # the jobs' names, which a stop's pkill matches: this test's own
    )
    vms = [pod / "test-pod" / f"worker-{w}" / "trm" for w in (0, 1)]
    ended, unwatched = threading.Event(), threading.Event()
    marked: list[float] = []

    def maintenance() -> None:
        deadline = time.monotonic() + 120
        while not all((vm / "started").exists() for vm in vms):
            assert time.monotonic() < deadline, "the two trials did not start"
            time.sleep(0.1)
        (pod / "test-pod.health").write_text("UNHEALTHY_MAINTENANCE")
        marked.append(time.monotonic())
        if not ended.wait(UNWATCHED_S):  # nothing noticed it: the jobs end, and their failure asks the slice
            unwatched.set()
            for vm in vms:
                (vm / "fail-now").touch()

    hand = threading.Thread(target=maintenance)
    hand.start()
    try:
        with pytest.raises(MachineUnavailableError, match=r"is READY but UNHEALTHY_MAINTENANCE.*on_preempted=exit"):
            Driver(typed_sweep(cfg)).run()
    finally:
        ended.set()
        hand.join()
    noticed_s = time.monotonic() - marked[0]
    assert not unwatched.is_set(), "the maintenance was noticed only once the jobs failed"
    assert noticed_s < UNWATCHED_S
    assert [(vm / "saved").read_text() for vm in vms] == ["checkpoint"] * 2  # stopped with their grace: saved


@pytest.mark.slow  # runs the gcloud stand-in: processes
def test_the_watch_describes_at_most_every_watch_s_and_never_at_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from sweeps.launchers.tpu.launcher import TpuPodLauncher

    pod = fake_pod(tmp_path, monkeypatch, 2)
    (pod / "test-pod.health").write_text("UNHEALTHY_MAINTENANCE")
    args: dict = dict(tpu_name="test-pod", zone="us-central2-b", gcloud=str(FAKE_GCLOUD), python=sys.executable)
    tpu = TpuPodLauncher(**args, watch_s=3600)
    assert tpu.watch() is None and not (pod / "describe.log").exists()  # not yet watch_s since the last
    tpu.watched_at -= 3600
    assert tpu.watch() == "slice test-pod (v4-16) is READY but UNHEALTHY_MAINTENANCE"
    assert tpu.watch() is None and len((pod / "describe.log").read_text().splitlines()) == 1
    never = TpuPodLauncher(**args, watch_s=0)
    never.watched_at -= 10**6
    assert never.watch() is None and len((pod / "describe.log").read_text().splitlines()) == 1
