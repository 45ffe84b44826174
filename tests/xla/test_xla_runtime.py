"""The xla runtime's control plane (who am I, where do we meet), backend choice, loss divisor, metric
reduction, and the start-up guard that compares the XLA world with the launcher's."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
import torch
from _lane import run_python, xla_env

from sweeps.launchers.slots import LIBTPU_PORTS
from tests.config_blocks import runtime_config
from trm.runtime import xla_available
from trm.runtime.base import Runtime, resolve_control_plane

HOSTS = ",".join(f"t1v-n-0abc-w-{i}" for i in range(8))


def runtime_cfg(**overrides):
    return runtime_config(**overrides)  # the real `runtime:` block, with its defaults, typed


def test_config_declares_the_xla_keys() -> None:
    cfg = runtime_cfg()
    assert cfg.port == 12355  # torch_xla's own rendezvous default (docs/pod-unknowns.md)
    assert cfg.port not in LIBTPU_PORTS  # on worker 0 the job's own libtpu holds those
    assert cfg.rank is None and cfg.world_size is None and cfg.master_addr is None and cfg.expected_devices is None


def test_control_plane_from_tpu_worker_env() -> None:
    plane = resolve_control_plane(runtime_cfg(), {"TPU_WORKER_ID": "3", "TPU_WORKER_HOSTNAMES": HOSTS})
    assert (plane.rank, plane.world_size, plane.master_addr, plane.port) == (3, 8, "t1v-n-0abc-w-0", 12355)
    assert plane.init_method == "tcp://t1v-n-0abc-w-0:12355"
    assert (
        resolve_control_plane(runtime_cfg(port=9100), {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": HOSTS}).port
        == 9100
    )


def test_control_plane_prefers_torchrun_env() -> None:
    env = {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
        "TPU_WORKER_ID": "3",
        "TPU_WORKER_HOSTNAMES": HOSTS,
    }
    plane = resolve_control_plane(runtime_cfg(), env)
    assert (plane.rank, plane.world_size, plane.master_addr, plane.port) == (1, 2, "10.0.0.5", 29500)
    assert plane.init_method == "env://"  # joins torchrun's store


def test_control_plane_config_overrides_the_environment() -> None:
    cfg = runtime_cfg(rank=2, world_size=4, master_addr="coordinator")
    plane = resolve_control_plane(cfg, {"TPU_WORKER_ID": "3", "TPU_WORKER_HOSTNAMES": HOSTS})
    assert (plane.rank, plane.world_size, plane.master_addr) == (2, 4, "coordinator")
    assert plane.source == "tpu-env+config"


def test_control_plane_defaults_to_one_process_and_rejects_bad_ranks() -> None:
    plane = resolve_control_plane(runtime_cfg(), {})
    assert (plane.rank, plane.world_size, plane.source) == (0, 1, "single")
    with pytest.raises(ValueError, match=r"rank=8 is not in \[0, world_size=8\)"):
        resolve_control_plane(runtime_cfg(), {"TPU_WORKER_ID": "8", "TPU_WORKER_HOSTNAMES": HOSTS})


def test_auto_picks_xla_only_when_pjrt_device_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert xla_available()  # torch_xla is installed in this lane
    monkeypatch.delenv("PJRT_DEVICE")
    assert not xla_available()


def test_loss_divisor_and_metric_sums_per_backend() -> None:
    from trm.runtime.xla import XlaRuntime

    # DDP: each process divides its own share; gradients are then averaged over the processes.
    assert Runtime().loss_divisor(64) == 64
    assert Runtime(world_size=8).loss_divisor(768) == 96
    # SPMD: the loss is summed over the global batch, whatever the number of processes (hosts).
    pod = SimpleNamespace(num_devices=32, world_size=8)
    assert XlaRuntime.loss_divisor(pod, 768) == 768
    with pytest.raises(ValueError, match="global_batch_size=770 is not divisible by the 32 XLA devices"):
        XlaRuntime.loss_divisor(pod, 770)
    # Metric sums are already global under SPMD: never summed over the hosts again.
    sums = torch.arange(9.0)
    assert XlaRuntime.all_reduce_sum(pod, sums) is sums


def test_guard_fails_loudly_when_the_xla_world_differs_from_the_launchers() -> None:
    """init_runtime on 2 virtual devices: a wrong device count and a wrong process count each stop it with
    both numbers (before any gloo rendezvous, so nothing hangs); the right expectation starts SPMD."""
    script = textwrap.dedent(
        """
        import os
        from tests.config_blocks import runtime_config
        from trm.runtime import init_runtime
        def start(**kw):
            return init_runtime(runtime_config(backend="xla", **kw))
        for label, kw, env in [
            ("DEVICES", {"expected_devices": 3}, {}),
            ("PROCESSES", {}, {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost,worker-1"}),
        ]:
            os.environ.update(env)
            try:
                start(**kw)
                print(label, "STARTED")
            except Exception as err:
                print(label, type(err).__name__, err)
            for key in env:
                del os.environ[key]
        rt = start(expected_devices=2)
        print("OK", rt.backend, rt.world_size, rt.num_devices, rt.loss_divisor(8))
        """
    )
    proc = run_python(["-c", script], xla_env(2), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split(" ", 1)[0]: line for line in proc.stdout.splitlines() if line[:2] in ("DE", "PR", "OK")}
    assert "XlaWorldMismatchError" in lines["DEVICES"]
    assert "sees 2 device(s)" in lines["DEVICES"] and "runtime.expected_devices=3" in lines["DEVICES"]
    assert "XlaWorldMismatchError" in lines["PROCESSES"]
    assert "sees 1 process(es)" in lines["PROCESSES"] and "world_size=2" in lines["PROCESSES"]
    assert lines["OK"] == "OK xla 1 2 8"
