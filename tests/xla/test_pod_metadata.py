"""Who a job is on a real TPU VM: its ssh session has no TPU_WORKER_ID, so `resolve_control_plane` takes the rank, the
world size and the rendezvous host from torch_xla's metadata getter (torch_xla/_internal/tpu.py: `tpu-env` for
WORKER_ID, `worker-network-endpoints` for the VMs' addresses, worker 0's first). Here the getter is fed the text the
metadata server gives, and nothing else of torch_xla is stubbed."""

from __future__ import annotations

import pytest
from torch_xla._internal import tpu

from tests.config_blocks import runtime_config
from trm.runtime.base import resolve_control_plane

# A v4-32's metadata as a VM reads it (abridged `tpu-env`: YAML of quoted strings; endpoints: hostname:uid:ip).
TPU_ENV = """ACCELERATOR_TYPE: 'v4-32'
CHIPS_PER_HOST_BOUNDS: '2,2,1'
HOST_BOUNDS: '1,1,4'
TOPOLOGY: '2x2x4'
TPU_CHIPS_PER_PROCESS_BOUNDS: '2,2,1'
TPU_PROCESS_BOUNDS: '1,1,4'
WORKER_ID: '{worker}'
ZONE: 'us-central2-b'
"""
ENDPOINTS = ",".join(f"t1v-n-5f3e2a10-w-{i}:{8432015870473846912 + i}:10.130.0.{9 + i}" for i in range(4))


def canned(monkeypatch: pytest.MonkeyPatch, worker: int, endpoints: str) -> list[str]:
    """Feed torch_xla's metadata getter; return the keys it was asked for."""
    asked: list[str] = []
    text = {"tpu-env": TPU_ENV.format(worker=worker), "worker-network-endpoints": endpoints}

    def get_metadata(key: str) -> str:
        asked.append(key)
        return text[key]

    monkeypatch.setattr(tpu, "_get_metadata", get_metadata)
    for name in ("TPU_SKIP_MDS_QUERY", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "CLOUD_TPU_TASK_ID"):
        monkeypatch.delenv(name, raising=False)  # torch_xla reads os.environ: the metadata path, as on a VM
    return asked


@pytest.mark.parametrize("worker", [0, 2])
def test_a_vm_without_tpu_worker_id_learns_its_rank_and_worker_0_from_the_metadata(
    worker: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = canned(monkeypatch, worker, ENDPOINTS)
    plane = resolve_control_plane(
        runtime_config(), {"PJRT_DEVICE": "TPU"}
    )  # an ssh session's environment: no TPU_WORKER_ID
    assert (plane.rank, plane.world_size, plane.master_addr, plane.source) == (worker, 4, "10.130.0.9", "tpu-metadata")
    assert plane.init_method == "tcp://10.130.0.9:12355"
    assert sorted(set(asked)) == ["tpu-env", "worker-network-endpoints"]


def test_a_one_vm_slice_is_one_process_on_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    canned(monkeypatch, 0, "t1v-n-5f3e2a10-w-0:8432015870473846912:10.130.0.9")
    plane = resolve_control_plane(runtime_config(), {"PJRT_DEVICE": "TPU"})
    assert (plane.rank, plane.world_size, plane.master_addr) == (0, 1, "localhost")


def test_config_still_overrides_what_the_metadata_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.world_size set: the metadata is not asked (a job confined by its launcher knows its world)."""
    asked = canned(monkeypatch, 3, ENDPOINTS)
    cfg = runtime_config(rank=0, world_size=1)
    plane = resolve_control_plane(cfg, {"PJRT_DEVICE": "TPU"})
    assert (plane.rank, plane.world_size, plane.source) == (0, 1, "single+config") and asked == []
