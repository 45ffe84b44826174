"""The `xla` data plane (TPU, or XLA's CPU client in tests): torch_xla PJRT, one process per host, SPMD.

Imported only when `runtime.backend` resolves to `xla` (trm/runtime/__init__.py), so the rest of the project
never needs torch_xla.

- SPMD (`xr.use_spmd()`): each process traces the program for the *global* batch once; a 1-D mesh with a
  `data` axis spans every device of the job (all chips of all hosts). Batches are sharded on dim 0 over
  that axis, parameters and optimizer state are left unannotated (= replicated), and the compiler inserts
  the gradient reduction. There is no DDP and no per-process gradient averaging.
- Feeding: every host loads only its own slice of the global batch (the loader's rank/world split over
  processes) and `to_device` assembles the global array from the hosts' slices (`ShardingSpec(...,
  minibatch=True)`): host i's rows land on host i's chips, so no host ever holds the global batch.
- Tensors are global: a metric summed over the sharded batch is already the sum over every chip of every
  host (the compiled program all-reduces it) and is replicated on each host. `all_reduce_sum` therefore
  returns it unchanged; summing it again over the processes would count it `process_count` times.
- The gloo control plane (object broadcasts, barriers, start-up agreement) is the base class's, over the
  same processes; XLA collectives are never used for it.
- Compile once per shape: with `runtime.compile_cache_dir` set, XLA's persistent compilation cache lives in that
  (per-VM, local) directory, so a later trial on the VM loads the executables of an earlier one with the same
  graphs. The optimizers' and EMA's hyperparameters are device data, not constants (trm/optim.py), so trials
  that differ only in them have the same graphs (tests/xla/test_compile_cache.py).
"""

from __future__ import annotations

import os
from typing import Any, TypeVar, cast

import numpy as np
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch import Tensor, nn

from trm.runtime.base import Runtime

MESH_AXIS = "data"
T = TypeVar("T")


class XlaWorldMismatchError(RuntimeError):
    """The XLA world (devices, processes) is not the one the launcher planned for."""


def check_world(devices: int, processes: int, world_size: int, expected_devices: int | None) -> None:
    """Fail loudly, with both numbers, when the XLA runtime's world differs from the launcher's.

    `world_size` is the control plane's process count (torchrun/TPU env or config); `expected_devices`
    the device count the launcher expects (config `runtime.expected_devices`; None = not checked)."""
    problems = []
    if processes != world_size:
        problems.append(
            f"XLA runtime sees {processes} process(es) (xr.process_count()) but the control plane was "
            f"launched with world_size={world_size}"
        )
    if expected_devices is not None and devices != int(expected_devices):
        problems.append(
            f"XLA runtime sees {devices} device(s) (xr.global_runtime_device_count()) but "
            f"runtime.expected_devices={int(expected_devices)}"
        )
    if problems:
        raise XlaWorldMismatchError(
            "; ".join(problems)
            + ". Check that the same command was started on every worker VM (one process per VM) and that "
            "the launcher's TPU topology matches the pod."
        )


class XlaRuntime(Runtime):
    """SPMD data parallel over every XLA device of the job, gloo control plane over the processes."""

    def __init__(self, rank: int, world_size: int, mesh: Any):
        super().__init__(backend="xla", rank=rank, world_size=world_size, device=torch_xla.device())
        self.mesh = mesh
        self.num_devices = int(np.prod(mesh.mesh_shape))
        self._specs: dict[int, Any] = {}

    @property
    def devices(self) -> int:
        return self.num_devices

    @property
    def global_tensors(self) -> bool:
        """SPMD: a tensor is global, and a batch-sharded one (the carry) spans every host's chips."""
        return True

    def to_cpu(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """All of `tensors` to the CPU in one transfer (torch_xla 2.9's `xm._maybe_convert_to_cpu`, what `xm.save`
        uses: one sync of the list, then one device-to-host call for all of it) rather than one `.cpu()`, each its
        own sync and copy, per tensor. Every process calls it (a multi-host copy of sharded data is collective)."""
        return dict(xm._maybe_convert_to_cpu(tensors))

    def to_cpu_tree(self, tree: T) -> T:
        """Every tensor of `tree` to the CPU in one transfer (`xm._maybe_convert_to_cpu`, as `xm.save` does), not
        torch.save's sync and copy per tensor. Rank 0 alone calls it: after `step_boundary` on every rank the
        replicated tensors (weights, optimizer, EMA, sums) hold no pending work, so the copy runs no computation
        that the other hosts would have to join; the batch-sharded carry went through `to_cpu` on every process."""
        return cast(T, xm._maybe_convert_to_cpu(tree))

    def loss_divisor(self, global_batch: int) -> int:
        """Under SPMD the step's loss sums over the *global* batch (no gradient averaging afterwards)."""
        if global_batch % self.num_devices:
            raise ValueError(
                f"train.global_batch_size={global_batch} is not divisible by the {self.num_devices} XLA devices "
                f"of the mesh: use a multiple of {self.num_devices}"
            )
        return global_batch

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Already global under SPMD (see module doc): returned as is, never summed over the hosts again."""
        return tensor

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """No wrapper: unannotated parameters are replicated and the compiler reduces their gradients."""
        return model

    def batch_spec(self, ndim: int) -> Any:
        """Shard dim 0 over the `data` axis, replicate the rest; this host's rows assemble the global batch."""
        if ndim not in self._specs:
            spec = (MESH_AXIS,) + (None,) * (ndim - 1)
            self._specs[ndim] = xs.ShardingSpec(self.mesh, spec, minibatch=True)
        return self._specs[ndim]

    def to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """This host's slice of the global batch -> one global tensor per key, sharded on the batch dim."""
        out = {}
        for key, value in batch.items():
            if value.dim() == 0:
                out[key] = value.to(self.device)
                continue
            if value.shape[0] % xr.addressable_runtime_device_count():
                raise ValueError(
                    f"batch[{key!r}] has {value.shape[0]} rows on this host, not divisible by its "
                    f"{xr.addressable_runtime_device_count()} XLA devices"
                )
            (out[key],) = xm.send_cpu_data_to_device([value.cpu()], self.device, self.batch_spec(value.dim()))
        return out

    def step_boundary(self) -> None:
        """Cut the lazy graph here and run it (compiled once per distinct graph, then cached)."""
        sync = getattr(torch_xla, "sync", None)
        if sync is not None:
            sync()
        else:  # torch_xla < 2.6
            xm.mark_step()


def init_compile_cache(path: str) -> None:
    """Persist XLA's compilation cache in `path` (a local directory, created if missing).

    torch_xla 2.9, torch_xla/runtime.py: `initialize_cache(path: str, readonly: bool = False)` "must be called
    before any computations have been performed" (it asserts the computation cache is not initialized yet, then
    sets XLA_PERSISTENT_CACHE_PATH / XLA_PERSISTENT_CACHE_READ_ONLY). Entries are named by the graph's hash;
    the counters PersistentCacheMiss / PersistentCacheHit / PersistentCacheDeserializeFailure (torch_xla.debug.
    metrics) say what happened to each lookup. One process per VM writes its own directory: not read-only.
    PJRT's CPU client cannot deserialize executables (UNIMPLEMENTED in 2.9: every lookup that finds its entry
    counts a DeserializeFailure and compiles again); TPU loads them."""
    if torch_xla._XLAC._xla_computation_cache_is_initialized():
        if os.environ.get("XLA_PERSISTENT_CACHE_PATH") == path:
            return  # an earlier run in this process (a Hydra multirun) set this very cache
        raise RuntimeError(
            f"runtime.compile_cache_dir={path!r}: XLA has already compiled something in this process; the "
            "persistent cache must be set before the first computation (init_runtime first)"
        )
    xr.initialize_cache(path, readonly=False)


def start(rank: int, world_size: int, expected_devices: int | None, compile_cache_dir: str | None = None) -> XlaRuntime:
    """Set the persistent compile cache and enter SPMD mode (both before any XLA tensor exists), build the mesh,
    check the world against the launcher's."""
    if compile_cache_dir is not None:
        init_compile_cache(compile_cache_dir)
    xr.use_spmd()
    devices = xr.global_runtime_device_count()
    check_world(devices, xr.process_count(), world_size, expected_devices)
    mesh = xs.Mesh(np.arange(devices), (devices,), (MESH_AXIS,))
    xs.set_global_mesh(mesh)
    return XlaRuntime(rank=rank, world_size=world_size, mesh=mesh)
