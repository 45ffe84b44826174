"""Packing a pod (launcher.slots): one trial per slot at once on the stand-in `gcloud`'s VMs (tests/fake_gcloud),
each VM a real process tree in its own directory. The training runs on the CPU with the torch backend; what a
TPU would read (its topology variables) is checked where the job's process starts."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from storage.record import trial_detail
from storage.trial_record import TrialLaunch
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.slots import SlotConfigError, SlotPool, device_slots, tpu_slots
from sweeps.launchers.tpu.slice import FAMILIES
from sweeps.validation.validate import SweepConfigError
from tests.sweep_helpers import FAST_TRIAL, fake_pod, trial_list

V4 = FAMILIES["v4"].accelerator_type

FAKE_GCLOUD = Path(__file__).parent / "fake_gcloud" / "gcloud"
TOPOLOGY_KEYS = ("TPU_VISIBLE_CHIPS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "TPU_PROCESS_BOUNDS", "TPU_PROCESS_PORT")


@pytest.fixture
def pod8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return fake_pod(tmp_path, monkeypatch, 8)


def env_recording_python(tmp_path: Path) -> Path:
    """The workers' interpreter: records the environment the job starts with (in the VM's directory), then runs
    Python; so the test reads what each training process saw, as the VM gave it plus the launcher's exports."""
    script = tmp_path / "python-recording-env"
    script.write_text(f'#!/bin/sh\nenv > "env-$$.txt"\nexec {sys.executable} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def pod_study(
    tmp_path: Path, db: str, workers: int, slots: str, n_trials: int, *extra: str, trial: tuple[str, ...] = ()
) -> Driver:
    """A `halting` study in PostgreSQL `db` on the fake pod's `workers` VMs, divided as `slots`; `trial` adds to
    FAST_TRIAL."""
    cfg = compose_sweep_config(
        [
            "site=pod",
            "launcher.tpu_name=test-pod",
            "launcher.zone=us-central2-b",
            f"launcher.gcloud={FAKE_GCLOUD}",
            f"launcher.python={env_recording_python(tmp_path)}",
            f"launcher.slots={slots}",
            "launcher.remote_dir='~/trm'",
            "launcher.env={}",
            "launcher.ssh_timeout_s=20",
            "storage=postgres",
            f"storage.url={db}",
            f"output_root={tmp_path}/out",
            "study=halting",
            f"n_trials={n_trials}",
            "pruner=none",
            f"trial.overrides={trial_list([*FAST_TRIAL, 'runtime.backend=torch', *trial])}",
            "heartbeat.interval_s=1",
            "poll_s=0.2",
            "wandb.enabled=false",
            "reeval.at_end=false",  # the packing tests count training processes per VM
            "preflight.enabled=false",  # tests/test_preflight.py covers it; here the packing
            *extra,
        ]
    )
    return Driver(typed_sweep(cfg))


def recorded_envs(pod: Path, worker: int) -> list[dict[str, str]]:
    """The environments the training processes on one fake VM started with."""
    envs = []
    for path in sorted((pod / "test-pod" / f"worker-{worker}" / "trm").glob("env-*.txt")):
        envs.append(dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line))
    return envs


def test_slots_divide_a_pod_into_vms_or_chips_with_their_own_topology() -> None:
    vms = tpu_slots("vm", range(8), 4, V4)
    assert [s.name for s in vms] == [f"vm-{w}" for w in range(8)] and all(s.chips == 4 for s in vms)
    assert vms[3].workers == (3,) and vms[3].env["TPU_VISIBLE_CHIPS"] == "0,1,2,3"
    assert vms[3].overrides == ("runtime.expected_devices=4",)
    chips = tpu_slots("chips:1", [0, 1], 4, V4)
    assert len(chips) == 8 and chips[5].name == "vm-1/chips-1" and chips[5].env["TPU_VISIBLE_CHIPS"] == "1"
    ports = {s.env["TPU_PROCESS_PORT"] for s in chips if s.workers == (1,)}
    assert len(ports) == 4  # four jobs on one VM: four TPU client ports
    pairs = tpu_slots("chips:2", [0], 4, V4)
    assert [s.env["TPU_VISIBLE_CHIPS"] for s in pairs] == ["0,1", "2,3"]


def test_two_processes_on_a_v4_host_get_the_recipes_bounds_and_ports_of_their_own() -> None:
    """Two 2-chip slots on a v4 host (2x2 chips): chip bounds 1,2,1 (chips {0,1} and {2,3}, as the multi-process
    recipes set them), each its own TPU client, mesh-controller and runtime-metrics port, and its own compile
    cache directory (the cache writes its files in place: two processes must not share one)."""
    pairs = tpu_slots("chips:2", [0], 4, V4)
    assert [s.env["TPU_CHIPS_PER_PROCESS_BOUNDS"] for s in pairs] == ["1,2,1", "1,2,1"]
    for key in (
        "TPU_PROCESS_PORT",
        "TPU_MESH_CONTROLLER_ADDRESS",
        "TPU_MESH_CONTROLLER_PORT",
        "TPU_RUNTIME_METRICS_PORTS",
    ):
        assert len({s.env[key] for s in pairs}) == 2, key
    assert [s.env["TPU_VISIBLE_DEVICES"] for s in pairs] == ["0,1", "2,3"]
    caches = [o for s in pairs for o in s.overrides if o.startswith("runtime.compile_cache_subdir=")]
    assert caches == ["runtime.compile_cache_subdir=chips-0-1", "runtime.compile_cache_subdir=chips-2-3"]
    from tests.config_blocks import runtime_config
    from trm.runtime import compile_cache_dir

    runtime = runtime_config("runtime.compile_cache_dir=/c", caches[1])
    assert compile_cache_dir(runtime, create=False) == "/c/chips-2-3"
    with pytest.raises(ValueError, match=r"runtime.compile_cache_subdir='\.\./x'"):
        compile_cache_dir(
            runtime_config("runtime.compile_cache_dir=/c", "runtime.compile_cache_subdir=../x"), create=False
        )
    whole = tpu_slots("pod", range(8), 4, V4)
    assert len(whole) == 1 and whole[0].whole and whole[0].chips == 32 and not whole[0].env
    with pytest.raises(SlotConfigError, match=r"launcher.slots='chips:3'.*N in \[1, 2, 4\]"):
        tpu_slots("chips:3", [0], 4, V4)
    with pytest.raises(SlotConfigError, match=r"launcher.slots='host'.*pod, vm or chips:N"):
        tpu_slots("host", [0], 4, V4)
    gpus = device_slots("chips:2", 4)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in gpus] == ["0,1", "2,3"]
    with pytest.raises(SlotConfigError, match="launcher.devices"):
        device_slots("chips:2", None)
    with pytest.raises(SlotConfigError, match="no VMs to divide"):
        device_slots("vm", 4)


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_a_slot_confines_its_job_by_the_hosts_chip_bounds_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """libtpu takes a confined host's chips from TPU_CHIPS_PER_HOST_BOUNDS (Ray, pytorch/xla#7714): every slot of a
    VM exports it with the process bounds (one process per slot), in the command its VM runs."""
    from sweeps.launchers.base import JobSpec
    from sweeps.launchers.tpu.launcher import TpuPodLauncher

    fake_pod(tmp_path, monkeypatch, 2)
    for kind, bounds in (("vm", "2,2,1"), ("chips:2", "1,2,1"), ("chips:1", "1,1,1")):
        pods = TpuPodLauncher(tpu_name="t", zone="z", gcloud=str(FAKE_GCLOUD), slots=kind)
        for slot in pods.slots():
            env = slot.env
            assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == bounds, (kind, env)
            assert env["TPU_HOST_BOUNDS"] == "1,1,1" and env["TPU_SKIP_MDS_QUERY"] == "1"
            command = pods.remote_command(JobSpec("j", [], Path("."), slot=slot))
            assert f"TPU_CHIPS_PER_HOST_BOUNDS={bounds} " in command
    whole = TpuPodLauncher(tpu_name="t", zone="z", gcloud=str(FAKE_GCLOUD)).slots()
    assert len(whole) == 1 and "TPU_CHIPS_PER_HOST_BOUNDS" not in whole[0].env  # the pod's own metadata


def test_a_slot_pool_shares_the_whole_machine_or_hands_out_each_slot_once() -> None:
    shared = SlotPool(device_slots("pod", None), 2)  # a laptop: two trials side by side on its cores
    assert shared.take() is not None and shared.take() is not None and shared.take() is None
    pool = SlotPool(tpu_slots("vm", range(3), 4, V4), None)  # null max_concurrent: every slot
    taken = [pool.take(), pool.take(), pool.take()]
    assert pool.take() is None and len({s.name for s in taken if s}) == 3
    assert taken[0] is not None and taken[1] is not None and taken[2] is not None
    pool.retire(taken[1])
    pool.give_back(taken[0])
    assert pool.take() == taken[0] and pool.take() is None  # the retired slot never comes back
    capped = SlotPool(tpu_slots("vm", range(8), 4, V4), 3)
    assert len(list(iter(capped.take, None))) == 3


def test_a_retry_goes_back_to_its_predecessors_slot_when_it_is_free() -> None:
    """site=pod keeps checkpoints on a VM's own disk: with slots=vm a retry on another VM started over."""
    pool = SlotPool(tpu_slots("vm", range(3), 4, V4), None)
    first = pool.take()
    assert first is not None and first.name == "vm-0"
    assert pool.prefer(first, "vm-2").name == "vm-2"  # vm-0 went back
    assert sorted(s.name for s in pool.free) == ["vm-0", "vm-1"] and pool.busy == 1
    busy = pool.take()
    assert busy is not None and pool.prefer(busy, "vm-2") is busy  # taken already: it runs where it is
    assert pool.prefer(busy, None) is busy  # a first attempt has no slot to go back to


@pytest.mark.slow
def test_slots_vm_runs_eight_trials_at_once_each_confined_to_its_vm(
    pod8: Path, tmp_path: Path, fresh_pg_url: str
) -> None:
    driver = pod_study(tmp_path, fresh_pg_url, 8, "vm", 8)
    driver.run()
    trials = optuna.load_study(study_name="halting", storage=driver.storage_url).trials
    assert len(trials) == 8 and all(t.state == TrialState.COMPLETE for t in trials), [
        (t.number, t.state, t.user_attrs.get("fail_reason")) for t in trials
    ]
    assert sorted(str(TrialLaunch.of(t.user_attrs).slot) for t in trials) == [f"vm-{w}" for w in range(8)]
    assert {TrialLaunch.of(t.user_attrs).chips for t in trials} == {4}  # its slot's chips, a fact of the record
    timing = [trial_detail(t.user_attrs, "driver_timing") for t in trials]
    assert max(t["launched_at"][0] for t in timing) < min(t["exited_at"][-1] for t in timing)  # all 8 at once
    for trial in trials:
        worker = int(str(TrialLaunch.of(trial.user_attrs).slot).split("-")[1])
        envs = recorded_envs(pod8, worker)
        assert len(envs) == 1  # one training process on that VM, no other trial's
        env = envs[0]
        assert env["TPU_VISIBLE_CHIPS"] == "0,1,2,3" and env["TPU_PROCESS_BOUNDS"] == "1,1,1"
        assert env["TPU_WORKER_ID"] == "0" and env["TPU_WORKER_HOSTNAMES"] == "localhost"  # not the pod's mesh
        summary = pod8 / "test-pod" / f"worker-{worker}" / "trm" / "runs" / "halting"
        runs = list(summary.glob(f"*/trial-{trial.number}/run/summary.json"))
        assert len(runs) == 1 and json.loads(runs[0].read_text())["outcome"] == "COMPLETE"  # trained on its VM


@pytest.mark.slow
def test_a_killed_slot_does_not_stop_the_others_and_a_dead_vm_takes_only_its_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_pg_url: str
) -> None:
    root = fake_pod(tmp_path, monkeypatch, 2)
    # chips:2 on 2 VMs: 4 slots, 2 per VM. Trials long enough to kill one while the others train. 4 trials: what
    # runs after the death is the killed trials' retries, each slot taken as a new trial's is (SlotPool.take, then
    # prefer: back to its predecessor's slot, retired here).
    driver = pod_study(tmp_path, fresh_pg_url, 2, "chips:2", 4, "heartbeat.max_retry=1", trial=("train.steps=100",))
    worker1 = root / "test-pod" / "worker-1"

    def kill_vm1_once_training() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            found = subprocess.run(["pgrep", "-f", "[t]rm.train"], capture_output=True, text=True).stdout.split()
            # This pod's training processes: not another test's, nor the VMs' shells that run them.
            found = [pid for pid in found if _cwd_under(pid, root) and _comm(pid) not in ("sh", "bash")]
            on_vm1 = [pid for pid in found if _cwd_under(pid, worker1)]
            if len(found) >= 4 and on_vm1 and any(worker1.glob("trm/runs/*/*/trial-*/run/metrics.jsonl")):
                (root / "test-pod" / "worker-1.dead").touch()  # the VM goes away: ssh to it now fails
                for pid in on_vm1:
                    os.kill(int(pid), signal.SIGKILL)
                return
            time.sleep(0.3)

    killer = threading.Thread(target=kill_vm1_once_training, daemon=True)
    killer.start()
    driver.run()
    killer.join(1)
    trials = optuna.load_study(study_name="halting", storage=driver.storage_url).trials
    by_state = {state: [t for t in trials if t.state == state] for state in TrialState}
    killed = by_state[TrialState.FAIL]
    assert killed, "no trial was killed on VM 1"
    assert all(str(TrialLaunch.of(t.user_attrs).slot).startswith("vm-1/") for t in killed)
    assert all("worker-1" in t.user_attrs["fail_reason"] for t in killed)
    # The others were not stopped, and everything after the death ran on VM 0's two slots.
    completed = by_state[TrialState.COMPLETE]
    assert len(completed) == 4 and not by_state[TrialState.RUNNING] and not by_state[TrialState.WAITING]
    first_fail = min(t.number for t in killed)
    later = [t for t in trials if t.number > first_fail and t.state == TrialState.COMPLETE]
    assert later and all(str(TrialLaunch.of(t.user_attrs).slot).startswith("vm-0/") for t in later)


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cwd_under(pid: str, directory: Path) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(directory)
    except OSError:
        return False


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_a_batch_that_does_not_divide_over_a_slots_chips_is_refused(
    pod8: Path, tmp_path: Path, fresh_pg_url: str
) -> None:
    driver = pod_study(tmp_path, fresh_pg_url, 8, "chips:4", 1, trial=("train.global_batch_size=6",))
    with pytest.raises(SweepConfigError, match="global_batch_size=6 is not divisible by the 4 chips of each slot"):
        driver.validate()
    assert not (pod8 / "calls.log").exists()  # refused before any VM was contacted


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
def test_the_dry_run_prices_the_study_on_each_division_of_the_pod(
    pod8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], fresh_pg_url: str
) -> None:
    from sweeps.config import estimate
    from sweeps.run import print_packings

    costs = [estimate.Cost(params=1, flops_per_sample_step=10**9, global_batch=768, steps=1000) for _ in range(16)]
    driver = pod_study(tmp_path, fresh_pg_url, 8, "pod", 16)
    print_packings(driver, costs, estimate.Utilization.parse(driver.sweep.estimate.utilization))
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[1]: line for line in lines[1:] if "slots=" in line.split()[1]}
    assert set(rows) == {"slots=pod", "slots=vm", "slots=chips:2", "slots=chips:1"}
    assert "equal chip-hours by construction" in lines[-1]  # one assumed utilization: said, not hidden
    assert " 8 at once x  4 chips, 192 examples/chip/step" in rows["slots=vm"]
    # 16 equal trials: 2 waves of 8 on 4 chips each take as long as 16 one after another on 32 chips.
    half = estimate.Utilization.parse(0.5)
    by_name = {p.slots: p for p in estimate.packings(costs, {"pod": (1, 32), "vm": (8, 4)}, 1e12, half)}
    assert by_name["pod"].chip_hours == pytest.approx(by_name["vm"].chip_hours)
    assert by_name["pod"].wall_hours == pytest.approx(by_name["vm"].wall_hours)
    uneven = estimate.packings(costs[:9], {"vm": (8, 4)}, 1e12, half)[0]  # a 9th trial: a second wave
    assert uneven.wall_hours == pytest.approx(2 * costs[0].hours(4, 1e12, 0.5))
    # Utilization measured per per-chip batch (sweeps.utilization): each division at its own, so the chip-hours
    # say what packing buys. 24 examples/chip at 10%, 192 at 40%: slots=vm costs a quarter of slots=pod's.
    measured = estimate.Utilization.parse({24: 0.1, 192: 0.4})
    priced = {p.slots: p for p in estimate.packings(costs, {"pod": (1, 32), "vm": (8, 4)}, 1e12, measured)}
    assert (priced["pod"].utilization, priced["vm"].utilization) == (0.1, 0.4)
    assert priced["pod"].chip_hours == pytest.approx(4 * priced["vm"].chip_hours)
    assert priced["pod"].chip_hours == pytest.approx(16 * costs[0].hours(32, 1e12, 0.1) * 32)
    assert priced["pod"].wall_hours == pytest.approx(4 * priced["vm"].wall_hours)  # 16 trials: 2 waves of 8
    print_packings(driver, costs, measured)
    lines = capsys.readouterr().out.splitlines()
    assert not any("by construction" in line for line in lines)
    rows = {line.split()[1]: line for line in lines[1:]}
    assert "24 examples/chip/step at 10%:" in rows["slots=pod"] and "192 examples/chip/step at 40%:" in rows["slots=vm"]
    assert "384 examples/chip/step at 40%:" in rows["slots=chips:2"]  # past the last measured batch: no extrapolation
