"""The slice describes itself (issue 43.1): `gcloud compute tpus tpu-vm describe` sizes the tpu_pod launcher. On the
stand-in's slices of 1, 2, 4 and 8 VMs the same command, with no size key, dry-runs, preflights and trains a trial;
a configured size the slice contradicts is refused in one line naming the key."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

from storage.trial_record import TrialLaunch
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import LauncherConfigError
from sweeps.launchers.torchrun import free_port
from sweeps.launchers.tpu.slice import SliceShape, check_configured, parse_node
from sweeps.preflight import main as preflight_main
from sweeps.run import dry_run
from sweeps.validation.validate import SweepConfigError
from tests.sweep_helpers import FAST_TRIAL, fake_pod, stand_in_pod_overrides, trial_dir, trial_list

# Batches every slice here divides: 32 examples over 4 to 32 chips and 1 to 8 processes. Two steps and one eval:
# what is tested is the sizing, the preflight and a trial trained to its end on every VM, and on a 2-core machine
# an 8-process job's steps are slow (v4-64 took 54 s with FAST_TRIAL's 20 steps and 2 evals, 24-28 s with these).
TRIAL = [*FAST_TRIAL, "runtime.backend=torch", "train.global_batch_size=32", "train.eval_batch_size=32"]
TRIAL += ["train.steps=2", "train.eval_interval=2", "train.log_interval=2"]


def node(kind: str | None, vms: int, **extra: object) -> dict[str, object]:
    endpoints = [{"ipAddress": f"10.0.0.{w}", "port": 8470} for w in range(vms)]
    return {"acceleratorType": kind, "state": "READY", "runtimeVersion": "v2-alpha-tpuv5", "networkEndpoints": endpoints,
            **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "vms", "chips", "per_vm"),
    [
        ("v4-8", 1, 4, 4),  # v4-N counts TensorCores: two per chip, four chips per VM
        ("v4-32", 4, 16, 4),
        ("v4-64", 8, 32, 4),
        ("v5p-8", 1, 4, 4),  # v5p: two TensorCores per chip too (2x2x1: 8 cores, 4 chips, 1 host)
        ("v5litepod-8", 1, 8, 8),  # v5e: one per chip; a one-host slice of 8 chips
        ("v5litepod-16", 4, 16, 4),
        ("v6e-8", 1, 8, 8),
    ],
)
def test_a_described_slice_gives_workers_chips_per_vm_and_devices(kind: str, vms: int, chips: int, per_vm: int) -> None:
    shape = parse_node("my-tpu", node(kind, vms))
    assert (shape.workers, shape.chips, shape.chips_per_vm, shape.devices) == (vms, chips, per_vm, chips)
    assert shape.worker_ips == tuple(f"10.0.0.{w}" for w in range(vms))


def test_a_slice_this_cannot_size_is_refused_naming_its_type() -> None:
    by_topology = parse_node("t", node(None, 4, acceleratorConfig={"type": "V4", "topology": "2x2x4"}))
    assert (by_topology.chips, by_topology.chips_per_vm, by_topology.accelerator_type) == (16, 4, "V4 2x2x4")
    with pytest.raises(LauncherConfigError, match=r"^launcher.tpu_name='t': its accelerator type 'v3-8' is not one"):
        parse_node("t", node("v3-8", 1))  # one torch_xla device per TensorCore there: not sized here
    with pytest.raises(LauncherConfigError, match=r"slice v4-32 in state CREATING lists 0 worker endpoint\(s\)"):
        parse_node("t", {**node("v4-32", 0), "state": "CREATING"})


def test_a_configured_size_the_slice_contradicts_is_one_line_naming_the_key() -> None:
    shape = SliceShape("my-tpu", "v4-32", "READY", "", ("a", "b", "c", "d"), 16)
    with pytest.raises(LauncherConfigError) as refused:
        check_configured(shape, {"launcher.num_workers": 8, "launcher.chips_per_vm": None})
    assert str(refused.value) == "launcher.num_workers=8 but slice my-tpu (v4-32) has 4 workers: drop the key or set 4"
    with pytest.raises(LauncherConfigError, match=r"^launcher.chips_per_vm=8 but slice my-tpu \(v4-32\) has 4 chips"):
        check_configured(shape, {"launcher.chips_per_vm": 8})
    check_configured(shape, {"launcher.num_workers": 4, "launcher.chips_per_vm": 4})  # agreeing: fine


def pod_command(tmp_path: Path, db: str, *extra: str) -> list[str]:
    """The one command every slice runs: no launcher.num_workers, chips_per_vm or runtime.expected_devices."""
    return [
        *stand_in_pod_overrides(db, tmp_path / "out", sys.executable),
        "pruner=none",
        f"trial.overrides={trial_list([*TRIAL, f'runtime.port={free_port()}'])}",
        "heartbeat.interval_s=1",
        "poll_s=0.2",
        "wandb.enabled=false",
        "reeval.at_end=false",
        "estimate.enabled=false",  # the price needs trm.info's FLOPs: one slow process per slice (test_sweeps prices)
        f"preflight.expect={{torch: '{torch.__version__}', torch_xla: null}}",
        "preflight.chips_glob='~/dev/accel*'",
        "preflight.min_free_gb=0",
        *extra,
    ]


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_a_size_the_slice_contradicts_is_refused_before_any_vm_is_contacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    """What a v4-64's constants did on a v4-32: gcloud refused workers 4-7 and every trial died at start-up."""
    pod = fake_pod(tmp_path, monkeypatch, 0, accelerator="v4-32")
    command = pod_command(tmp_path, fresh_pg_url)
    with pytest.raises(LauncherConfigError) as refused:
        Driver(typed_sweep(compose_sweep_config([*command, "launcher.num_workers=8"]))).validate()
    assert str(refused.value) == (
        "launcher.num_workers=8 but slice test-pod (v4-32) has 4 workers: drop the key or set 4"
    )
    trial = trial_list([*TRIAL, "runtime.expected_devices=32"])
    with pytest.raises(SweepConfigError) as contradicted:
        Driver(typed_sweep(compose_sweep_config([*command, f"trial.overrides={trial}"]))).validate()
    assert str(contradicted.value).startswith(
        "trial.overrides has runtime.expected_devices=32 but launcher.slots' slot pod trains with "
        "runtime.expected_devices=16"
    )
    assert not (pod / "calls.log").exists()  # no ssh, no scp: refused on the description alone


@pytest.mark.slow
@pytest.mark.parametrize(("accelerator", "vms"), [("v4-8", 1), ("v4-16", 2), ("v4-32", 4), ("v4-64", 8)])
def test_one_command_dry_runs_preflights_and_trains_on_every_slice_size(
    accelerator: str,
    vms: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fresh_pg_url: str,
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 0, accelerator=accelerator)
    command = pod_command(tmp_path, fresh_pg_url)
    devices = 4 * vms

    driver = Driver(typed_sweep(compose_sweep_config(command)))
    driver.validate()
    dry_run(driver)
    shown = capsys.readouterr().out
    assert (
        f"# slice test-pod ({accelerator}), READY" in shown and f"{vms} VM(s) x 4 chip(s) = {devices} devices" in shown
    )
    assert f"runtime.expected_devices={devices}" in shown  # the pod slot's own override, on the trial's command

    assert preflight_main(command) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "no problems: the machine is ready", out
    rows = [line for line in out if line.split()[:1] and line.split()[0].isdigit()]
    assert [r.split()[0] for r in rows] == [str(w) for w in range(vms)]
    assert all(r.split()[-1] == ",".join(["localhost"] * vms) for r in rows)  # each VM's own list of the workers

    Driver(typed_sweep(compose_sweep_config(command))).run()
    (trial,) = optuna.load_study(study_name="halting", storage=fresh_pg_url).trials
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get("fail_reason")
    assert f"runtime.expected_devices={devices}" in (TrialLaunch.of(trial.user_attrs).train_overrides or [])
    run = trial_dir(pod / "test-pod" / "worker-0" / "trm" / "runs" / "halting", 0) / "run"
    assert (run / "summary.json").is_file()
    for w in range(vms):  # every VM's job was given the slice's device count
        configs = list((pod / "test-pod" / f"worker-{w}" / "trm").glob("outputs/train/*/.hydra/config.yaml"))
        assert configs and all(yaml.safe_load(c.read_text())["runtime"]["expected_devices"] == devices for c in configs)


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_a_dry_run_plans_on_an_accelerator_type_with_no_slice_to_describe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`site=pod dry_run=true launcher.accelerator_type=v5litepod-16` prices a study before the TPU exists (it needed
    a live slice to describe); a real run refuses a slice of another type, naming the key."""
    pod = fake_pod(tmp_path, monkeypatch, 0, accelerator="v4-16")
    command = pod_command(tmp_path, "postgresql://127.0.0.1:1/nowhere")  # nothing is stored or opened
    planned = [*command, "dry_run=true", "launcher.tpu_name=planned", "launcher.gcloud=/nonexistent/gcloud"]
    driver = Driver(typed_sweep(compose_sweep_config([*planned, "launcher.accelerator_type=v5litepod-16"])))
    driver.validate()
    dry_run(driver)
    shown = capsys.readouterr().out
    assert "# slice planned (v5litepod-16), not created" in shown and "4 VM(s) x 4 chip(s) = 16 devices" in shown
    assert "runtime.expected_devices=16" in shown
    assert not (pod / "describe.log").exists()
    with pytest.raises(LauncherConfigError, match=r"^launcher.accelerator_type='v3-8': expected one of v4-N"):
        Driver(typed_sweep(compose_sweep_config([*planned, "launcher.accelerator_type=v3-8"]))).validate()
    with pytest.raises(LauncherConfigError) as other:  # not a dry run: the slice described must be of that type
        Driver(typed_sweep(compose_sweep_config([*command, "launcher.accelerator_type=v4-32"]))).validate()
    assert str(other.value) == (
        "launcher.accelerator_type='v4-32' but slice test-pod (v4-16) has v4-16 as its type: drop the key or set v4-16"
    )
