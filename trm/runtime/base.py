"""The runtime the training loop talks to: who am I, reduce, broadcast, barrier; and the control plane.

Two planes: a gloo *control plane* over the job's processes for everything that is not a model
tensor (start-up agreement, prune verdicts, barriers), and a *data plane* for gradients: DDP for
`torch`, nothing for `single` (both here), SPMD for `xla` (trm/runtime/xla.py, one process per host). Every
collective has a timeout so no rank waits forever on a dead peer. `trm.runtime.init_runtime` picks one.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from contracts.train_config import RuntimeConfig

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """The control plane's rendezvous failed: the port is taken on worker 0, or the network drops its traffic."""


class RuntimeMismatchError(RuntimeError):
    """Workers disagree on something that must be identical (config, code, data)."""


@dataclass
class Runtime:
    backend: str = "single"
    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    data_group: Any = None  # the gradients' process group (NCCL on GPUs); None: the default (gloo) group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def devices(self) -> int:
        """Devices the global batch is spread over: one per process here (single, DDP); every chip under XLA."""
        return self.world_size

    @property
    def global_tensors(self) -> bool:
        """Whether a device tensor is the whole job's (SPMD: `xla`), the same value on every process; here each
        process's tensors are its own (its share of the batch)."""
        return False

    def to_cpu(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """`tensors` moved to the CPU (under multi-host SPMD a collective: every process calls it)."""
        return {k: v.cpu() for k, v in tensors.items()}

    def to_cpu_tree(self, tree: T) -> T:
        """`tree` (nested dicts, lists, tuples: a checkpoint rank 0 writes) with its device tensors on the CPU, for
        `torch.save`. Here as it is: torch.save copies each eager tensor itself. Rank 0 alone may call it, after
        `step_boundary` on every rank (the save's contract: trm/checkpointer.py)."""
        return tree

    def loss_divisor(self, global_batch: int) -> int:
        """What the train step divides its summed loss by so the gradient is the global batch mean.

        One process's share of the batch here (DDP then averages the gradients over the processes);
        the whole global batch under SPMD (`xla`), where the loss is already summed over every device."""
        return global_batch // self.world_size

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum a (small, metrics) tensor over all processes; the result is on every rank."""
        if self.distributed:
            tensor = tensor.clone()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.data_group)  # NCCL for GPU tensors
        return tensor

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s `obj` on every rank (prune verdicts, stop signals)."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The module the train step calls (DDP for `torch`); `model` itself stays the one to save."""
        if self.distributed:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            return nn.parallel.DistributedDataParallel(
                model, device_ids=device_ids, broadcast_buffers=False, process_group=self.data_group
            )
        return model

    def to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Move this process's batch to its device (and, on XLA, lay it out over the mesh)."""
        return {k: v.to(self.device) for k, v in batch.items()}

    def step_boundary(self) -> None:
        """End of one train step: XLA cuts and runs its graph here; eager backends do nothing."""

    def close(self, clean: bool = True) -> None:
        """Tear down the control plane. After a clean run every rank first meets at a barrier: a rank that
        destroys its gloo group while a peer is still finishing made that peer abort (SIGABRT) at exit."""
        if dist.is_initialized():
            if clean and self.distributed:
                dist.barrier()
            dist.destroy_process_group()


@dataclass
class ControlPlane:
    """Who this process is among the job's processes, and where they meet (the gloo rendezvous)."""

    rank: int
    world_size: int
    master_addr: str
    port: int
    source: str  # "torchrun", "tpu-env", "tpu-metadata" or "single", + "+config" when config overrides it

    @property
    def init_method(self) -> str:
        # Under torchrun, env:// also joins the agent's store when torchrun provides one.
        return "env://" if self.source.startswith("torchrun") else f"tcp://{self.master_addr}:{self.port}"


def resolve_control_plane(cfg: RuntimeConfig, env: dict[str, str] | None = None) -> ControlPlane:
    """Rank, world size and rendezvous of the control plane (gloo), for the `torch` and `xla` backends.

    Config (`runtime.rank`, `runtime.world_size`, `runtime.master_addr`, `runtime.port`) overrides the
    environment; otherwise torchrun's vars (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else the TPU VM's
    (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES: the rendezvous is the first hostname), else, on a TPU
    (PJRT_DEVICE=TPU) without those vars, torch_xla's metadata helpers; else one process."""
    env = dict(os.environ) if env is None else env
    port = cfg.port
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world, addr, source = (
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            env.get("MASTER_ADDR", "localhost"),
            "torchrun",
        )
        port = int(env.get("MASTER_PORT", port))
    elif "TPU_WORKER_ID" in env and env.get("TPU_WORKER_HOSTNAMES"):
        hosts = [h.strip() for h in env["TPU_WORKER_HOSTNAMES"].split(",") if h.strip()]
        rank, world, addr, source = int(env["TPU_WORKER_ID"]), len(hosts), hosts[0], "tpu-env"
    elif env.get("PJRT_DEVICE", "").upper() == "TPU" and cfg.world_size is None:
        from torch_xla._internal import tpu  # queries the TPU VM's metadata server

        hosts = tpu.get_worker_ips()
        rank, world, addr, source = int(tpu.worker_id()), len(hosts), hosts[0], "tpu-metadata"
    else:
        rank, world, addr, source = 0, 1, "localhost", "single"
    overridden = [value for value in (cfg.rank, cfg.world_size, cfg.master_addr) if value is not None]
    rank = rank if cfg.rank is None else cfg.rank
    world = world if cfg.world_size is None else cfg.world_size
    addr = addr if cfg.master_addr is None else cfg.master_addr
    if overridden:
        source += "+config"
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"runtime: rank={rank} is not in [0, world_size={world}) (from {source})")
    return ControlPlane(rank=rank, world_size=world, master_addr=addr, port=port, source=source)


def start_control_plane(plane: ControlPlane, cfg: RuntimeConfig) -> None:
    """The gloo group over the job's processes, with a timeout so no rank waits forever on a dead peer."""
    if plane.world_size > 1 and not dist.is_initialized():
        try:
            dist.init_process_group(
                "gloo",
                init_method=plane.init_method,
                rank=plane.rank,
                world_size=plane.world_size,
                timeout=datetime.timedelta(seconds=cfg.timeout_s),
            )
        except RuntimeError as err:  # DistNetworkError (port in use), DistStoreError (timeout): both RuntimeErrors
            raise ControlPlaneError(control_plane_failure(plane, err)) from None


def control_plane_failure(plane: ControlPlane, err: BaseException) -> str:
    """One line naming the key and what the network must allow: gloo's store listens on runtime.port on worker 0
    and its peers then connect to each other on ephemeral ports (the kernel's range, 32768-60999 on Linux)."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return (
        f"runtime.port={plane.port}: the control plane's rendezvous at {plane.master_addr}:{plane.port} failed on "
        f"rank {plane.rank} ({first}); on worker 0 that port must be free (libtpu takes 8431 and 8470-8479: pick "
        "another runtime.port), and the VMs' network must allow TCP between them on runtime.port and on every "
        "ephemeral port (gloo's; the default VPC's default-allow-internal rule does)"
    )


def start_data_plane(device: torch.device, world_size: int, cfg: RuntimeConfig) -> Any:
    """The group DDP reduces gradients over: NCCL between GPUs, the control plane's gloo group on CPUs.

    The metric sums (GPU tensors) go over it too; the control plane (objects, barriers) stays gloo. Not
    measured here: the lent GPU machine had one GPU, and NCCL refuses two ranks on one GPU, so a job of
    several GPU processes has not run in this project's checks."""
    if world_size == 1 or device.type != "cuda":
        return None
    return dist.new_group(backend="nccl", timeout=datetime.timedelta(seconds=cfg.timeout_s))


def check_agreement(runtime: Runtime, fingerprints: dict[str, str]) -> None:
    """Stop every process, with one error naming the workers that differ, unless all fingerprints agree.

    The classic failure of a pod whose VMs were not all updated: different code, config or data."""
    everyone = runtime.all_gather_object(fingerprints)
    problems = []
    for key in fingerprints:
        ref0 = everyone[0].get(key)
        differing = [rank for rank, fp in enumerate(everyone) if fp.get(key) != ref0]
        if differing:
            problems.append(f"{key} differs on worker(s) {differing} from worker 0 ({ref0!s:.12})")
    if problems:
        raise RuntimeMismatchError("workers disagree: " + "; ".join(problems))
