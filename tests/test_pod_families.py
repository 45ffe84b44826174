"""Every chip family the launcher sizes (issue 56.6): the slot's TPU_ACCELERATOR_TYPE and the preflight's device
files come from the slice's description, not v4's; on the stand-in gcloud's v4, v5e, v5p and v6e slices, whose VMs
show their chips as Cloud TPU's do (v4: /dev/accel*, v5e/v5p/v6e: /dev/vfio/N beside /dev/vfio/vfio)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.launchers.base import build_launcher
from sweeps.launchers.torchrun import free_port
from sweeps.launchers.tpu.launcher import TpuPodLauncher
from sweeps.launchers.tpu.preflight import probe_args
from sweeps.launchers.tpu.slice import FAMILIES
from sweeps.preflight import main as preflight_main
from tests.sweep_helpers import FAST_TRIAL, fake_pod, stand_in_pod_overrides, trial_list


def pod_args(tmp_path: Path, db: str, *extra: str) -> list[str]:
    trial = [*FAST_TRIAL, "runtime.backend=torch", "train.global_batch_size=32", f"runtime.port={free_port()}"]
    return [
        *stand_in_pod_overrides(db, tmp_path / "out", sys.executable),
        f"trial.overrides={trial_list(trial)}",
        f"preflight.expect={{torch: '{torch.__version__}', torch_xla: null}}",
        "preflight.min_free_gb=0",
        "wandb.enabled=false",
        *extra,
    ]


@pytest.mark.slow  # runs the gcloud stand-in: a process per call
@pytest.mark.parametrize(
    ("accelerator", "slots", "types", "bounds"),
    [
        ("v4-32", "vm", {"v4-8"}, "2,2,1"),
        ("v4-32", "chips:2", {"v4-4"}, "1,2,1"),
        ("v5p-16", "chips:1", {"v5p-2"}, "1,1,1"),
        ("v5litepod-16", "vm", {"v5litepod-4"}, "2,2,1"),
        ("v5litepod-16", "chips:2", {"v5litepod-2"}, "1,2,1"),
        ("v6e-8", "vm", {"v6e-8"}, "2,4,1"),  # one host of 8 chips
    ],
)
def test_a_slots_accelerator_type_is_its_familys(
    accelerator: str, slots: str, types: set[str], bounds: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_pod(tmp_path, monkeypatch, 0, accelerator=accelerator)
    cfg = compose_sweep_config(pod_args(tmp_path, "postgresql://nowhere/db", f"launcher.slots={slots}"))
    launcher = build_launcher(cfg.launcher)
    assert isinstance(launcher, TpuPodLauncher)
    made = launcher.slots()
    assert {s.env["TPU_ACCELERATOR_TYPE"] for s in made} == types
    assert {s.env["TPU_CHIPS_PER_PROCESS_BOUNDS"] for s in made} == {bounds}


@pytest.mark.slow
@pytest.mark.parametrize(("accelerator", "glob"), [("v4-16", "/dev/accel*"), ("v5litepod-16", "/dev/vfio/[0-9]*")])
def test_the_preflight_looks_for_the_chips_where_the_family_has_them(
    accelerator: str,
    glob: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fresh_pg_url: str,
) -> None:
    pod = fake_pod(tmp_path, monkeypatch, 0, accelerator=accelerator)
    args = pod_args(tmp_path, fresh_pg_url)
    sweep = typed_sweep(compose_sweep_config(args))
    launcher = build_launcher(sweep.launcher)
    assert isinstance(launcher, TpuPodLauncher)
    train = {"runtime": {"port": 12355}, "data": {"source": "generate"}}
    assert probe_args(sweep, launcher, train)["chips_glob"] == glob  # was /dev/accel* on every family
    explicit = typed_sweep(compose_sweep_config([*args, "preflight.chips_glob=/dev/x*"]))
    assert probe_args(explicit, launcher, train)["chips_glob"] == "/dev/x*"
    # The family's pattern, under the stand-in VM's own /dev, counts exactly its chips (not /dev/vfio/vfio).
    vm_glob = "~/dev/" + glob.removeprefix("/dev/")
    assert preflight_main([*args, f"preflight.chips_glob='{vm_glob}'"]) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.splitlines()[-1] == "no problems: the machine is ready"
    assert (pod / "test-pod" / "worker-0" / "dev" / "vfio" / "vfio").exists() == (glob != "/dev/accel*")
    assert FAMILIES[accelerator.split("-", maxsplit=1)[0]].device_glob == glob
