"""An API error is not a preemption (issue 56.1): `tpu-vm describe` fails like an API call on the stand-in gcloud
(latency, 5xx, 429, a reauth, no answer, NOT_FOUND, a stale state, `health`, several networks), and the tpu_pod
launcher retries what says nothing about the slice, and stops the study only on what does."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.launchers.base import LauncherConfigError
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.launchers.tpu.slice import parse_node
from tests.sweep_helpers import FAKE_GCLOUD, fake_pod


def launcher(**kw: object) -> TpuPodLauncher:
    args: dict = dict(tpu_name="test-pod", zone="us-central2-b", gcloud=str(FAKE_GCLOUD), python=sys.executable,
                      describe_attempts=3, describe_backoff_s=0.01)  # fmt: skip
    return TpuPodLauncher(**{**args, **kw})


def describes(pod: Path) -> int:
    log = pod / "describe.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.slow  # runs the gcloud stand-in: a process per describe
def test_api_errors_are_retried_and_logged_and_only_the_slice_itself_stops_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    monkeypatch.setenv("FAKE_TPU_DESCRIBE_LATENCY_S", "0.2")
    monkeypatch.setenv("FAKE_TPU_DESCRIBE_HANG_S", "30")
    faults = pod / "test-pod.describe-faults"
    tpu = launcher(ssh_timeout_s=3)
    caplog.set_level(logging.INFO, logger="sweeps")

    faults.write_text("503\n429\n")  # two errors, then the Node: READY
    before = describes(pod)
    assert tpu.unavailable() is None and describes(pod) - before == 3
    faults.write_text("hang\n500\n")  # no answer within launcher.ssh_timeout_s, a 500: asked again
    assert tpu.unavailable() is None and not faults.read_text()

    faults.write_text("reauth\nreauth\nreauth\n")  # every attempt fails: nothing known, the study goes on
    caplog.clear()
    assert tpu.unavailable() is None
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "could not be described in 3 attempt(s)" in warned[0], warned
    assert "Reauthentication failed" in warned[0] and warned[0].endswith("taken as still usable")
    faults.write_text("reauth\nreauth\nreauth\n")  # ... but it is no READY for a study waiting for one
    assert "could not be described" in str(tpu.not_ready())

    faults.write_text("404\n")  # what the API says of the slice: gone at once, not retried
    before = describes(pod)
    gone = tpu.unavailable()
    assert describes(pod) - before == 1
    assert gone == (
        "slice test-pod is not found (ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource "
        "'projects/fake-project/locations/us-central2-b/nodes/test-pod' was not found)"
    )
    for health in ("UNHEALTHY_MAINTENANCE", "TIMEOUT"):
        (pod / "test-pod.health").write_text(health)
        assert tpu.unavailable() == f"slice test-pod (v4-16) is READY but {health}"
    (pod / "test-pod.health").write_text("HEALTHY")
    assert tpu.unavailable() is None

    monkeypatch.setenv("FAKE_TPU_STALE_DESCRIBES", "1")  # the API's view lags the preemption by one describe
    subprocess.run([str(FAKE_GCLOUD), "--fake-admin", "preempt", "test-pod"], check=True)
    assert tpu.unavailable() is None
    assert tpu.unavailable() == "slice test-pod (v4-16) is PREEMPTED"


@pytest.mark.slow
def test_the_shape_needs_an_answer_and_names_what_to_check_when_there_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 2)
    (pod / "test-pod.describe-faults").write_text("503\n")
    assert launcher().shape().workers == 2  # one error: asked again
    (pod / "test-pod.describe-faults").write_text("reauth\n" * 3)
    with pytest.raises(LauncherConfigError, match=r"^launcher.tpu_name='test-pod': slice test-pod could not be "
                       r"described in 3 attempt\(s\): .*Reauthentication failed.*`gcloud auth login`"):  # fmt: skip
        launcher().shape()
    with pytest.raises(LauncherConfigError, match=r"describe_attempts=0.*expected an integer >= 1"):
        launcher(describe_attempts=0).validate()


@pytest.mark.slow
def test_a_slice_on_several_networks_has_as_many_workers_as_gcloud_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gcloud (ParseWorkerFlag) takes every n-th endpoint of a TPU on n networks: a 2-VM v5p-16 is not 4 x 2."""
    pod = fake_pod(tmp_path, monkeypatch, 0, accelerator="v5p-16")
    monkeypatch.setenv("FAKE_TPU_NETWORKS", "2")
    shape = launcher().shape()
    assert (shape.workers, shape.chips_per_vm, shape.devices) == (2, 4, 8)
    assert shape.worker_ips == ("10.130.0.10", "10.130.0.11")  # each VM's first network
    tpu = launcher()
    tpu.check_python()  # every worker the launcher counts answers gcloud's --worker=all
    assert "--worker=all" in (pod / "calls.log").read_text()
    with pytest.raises(subprocess.CalledProcessError):  # and gcloud refuses the worker the old count made up
        subprocess.run([*tpu.ssh_argv("3", "true")], check=True, capture_output=True)


def test_a_v3_or_v2_is_refused_whether_named_by_type_or_by_accelerator_config() -> None:
    endpoints = [{"ipAddress": "10.0.0.1"}]
    for node in (
        {"acceleratorType": "v3-8", "networkEndpoints": endpoints},
        {"acceleratorConfig": {"type": "V3", "topology": "2x2"}, "networkEndpoints": endpoints},
        {"acceleratorConfig": {"type": "V2", "topology": "2x2"}, "networkEndpoints": endpoints},
    ):
        with pytest.raises(LauncherConfigError, match=r"^launcher.tpu_name='t': its accelerator type .*v2 and v3"):
            parse_node("t", node)
    by_config = parse_node("t", {"acceleratorConfig": {"type": "V5LITE_POD", "topology": "4x4"},
                                 "networkEndpoints": endpoints * 4})  # fmt: skip
    assert (by_config.chips, by_config.chips_per_vm, by_config.family) == (16, 4, "v5litepod")
