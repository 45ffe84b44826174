"""Slots: a launcher's machines divided so that the driver runs one trial per slot at once (`launcher.slots`).

TRM is small (5-7M parameters): at the paper's global batch of 768 a v4-64 leaves each of its 32 chips 24
examples, far too few to keep a chip busy, while the same trial on one VM (4 chips, 192 each) or one chip loses
little. So a pod can run eight trials at once, one per VM, or 32, one per chip, each its own job with its own
rank-0 reporting, pruning, checkpoints and W&B run.

    pod      one slot: every worker, every chip (one trial at a time on the whole pod)
    vm       one slot per worker VM, with all of its chips
    chips:N  N chips of one VM per slot (v4, v5p: N in 1, 2, 4; v5e, v6e: also 8 on a one-host slice)

A slot is confined by environment. On a TPU VM, libtpu and torch_xla read the topology from variables when
TPU_SKIP_MDS_QUERY is set instead of the pod's metadata (torch_xla 2.9, torch_xla/_internal/tpu.py:
build_tpu_env_from_vars, configure_one_chip_topology and configure_topology name TPU_VISIBLE_CHIPS,
TPU_CHIPS_PER_PROCESS_BOUNDS, TPU_PROCESS_BOUNDS, TPU_PROCESS_ADDRESSES, TPU_PROCESS_PORT, CLOUD_TPU_TASK_ID,
TPU_ACCELERATOR_TYPE, TPU_WORKER_ID and TPU_WORKER_HOSTNAMES). A slot's job is a one-host, one-process world
on its chips, with its own port, so it never joins the pod-wide mesh; the job also checks its device count
(`runtime.expected_devices`), so a libtpu that ignored the confinement fails at start-up instead of training
on the wrong chips. Two processes on one v4 host, as people who split a host run them (pytorch/xla#7714 and
public multi-process TPU recipes): chip bounds 1,2,1 for chips {0,1} and {2,3}, and each process its own TPU
client, mesh-controller and runtime-metrics port. Not yet run on a real pod: whether libtpu accepts the
TPU_ACCELERATOR_TYPE of a slot (v4-2, v4-4: not types Google sells) is unknown (docs/pod-unknowns.md). Each slot
keeps its own persistent compile cache (a subdirectory of runtime.compile_cache_dir): the cache's files are
written in place, so two processes must not share one. On a GPU machine a slot is a set of CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sweeps.config.config_values import UserConfigError

ACCEPTED = "pod, vm or chips:N (N chips of one VM per slot)"
SLOT_CHOICES = ("pod", "vm", "chips:2", "chips:1")  # what a dry run prices the study on
TPU_BASE_PORT = 8476  # torch_xla's default first TPU client port (configure_topology); slot k of a VM uses +k
METRICS_BASE_PORT = 8431  # libtpu's runtime metrics port (reported, not documented); slot k of a VM uses +k
# The ports libtpu takes on a TPU VM: TPU client / mesh controller from 8476 (8476-8479 for 4 processes), the
# runtime metrics port 8431 (from it, one per process), 8470/8471 of older runtimes. Reported by users, not
# documented by Google (docs/pod-unknowns.md); the control plane (runtime.port) and the preflight keep off them.
LIBTPU_PORTS = (8431, 8432, 8433, 8434, 8470, 8471, 8476, 8477, 8478, 8479)
# Chips of one VM as a slot of 1, 2, 4 or 8 chips: the TPU_CHIPS_PER_PROCESS_BOUNDS of each size (a v4 or v5p VM
# is 2x2x1; a one-host v5e or v6e slice of 8 chips 2x4x1, Cloud TPU's topology tables).
CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}


class SlotConfigError(UserConfigError):
    """launcher.slots names a division the launcher's machines do not allow."""


@dataclass(frozen=True)
class Slot:
    """Where one trial runs: which workers (VMs, nodes) start its job, on how many chips, confined how."""

    name: str  # "pod", "vm-3", "vm-3/chips-2-3": on the trial's record and in the driver's log
    workers: tuple[int, ...]  # the worker VMs (or nodes) its job runs on; () = all of the launcher's
    chips: int | None = None  # accelerator chips its job trains on; None = the launcher's whole world
    env: Mapping[str, str] = field(default_factory=dict)  # what confines its processes to those chips
    overrides: tuple[str, ...] = ()  # what it adds to its job's command line (a device-count check at start-up)

    @property
    def whole(self) -> bool:
        """The launcher's whole machine (slots=pod): trials take turns on it, or (local) share its cores."""
        return self.name == WHOLE.name


WHOLE = Slot("pod", ())


@dataclass(frozen=True)
class SlotKind:
    """A parsed `launcher.slots`."""

    kind: str  # "pod", "vm" or "chips"
    chips: int | None = None  # N of chips:N

    @classmethod
    def parse(cls, value: object) -> SlotKind:
        text = str(value).strip().lower()
        if text in ("pod", "vm"):
            return cls(text)
        match = re.fullmatch(r"chips:(\d+)", text)
        if match and int(match.group(1)) >= 1:
            return cls("chips", int(match.group(1)))
        raise SlotConfigError(f"launcher.slots={value!r}: expected {ACCEPTED}")


def tpu_slots(
    value: object, workers: Sequence[int], chips_per_vm: int, accelerator_type: Callable[[int], str]
) -> list[Slot]:
    """The slots of a TPU pod's worker VMs (`workers`, each with `chips_per_vm` chips); `accelerator_type` names a
    slice of N chips of the slice's family (sweeps/launchers/tpu/slice.py: ChipFamily.accelerator_type)."""
    kind = SlotKind.parse(value)
    if kind.kind == "pod":  # one device per chip (sweeps/launchers/tpu/slice.py): the job checks the count
        total = len(workers) * chips_per_vm
        return [Slot(WHOLE.name, (), total, overrides=(f"runtime.expected_devices={total}",))]
    size = chips_per_vm if kind.kind == "vm" else int(kind.chips or 0)
    if size not in CHIP_BOUNDS or chips_per_vm % size:
        raise SlotConfigError(
            f"launcher.slots={value!r}: a slot of {size} chip(s) does not divide a VM's {chips_per_vm} chips into "
            f"a TPU topology; expected chips:N with N in {sorted(n for n in CHIP_BOUNDS if chips_per_vm % n == 0)}"
        )
    slots = []
    for worker in workers:
        for k in range(chips_per_vm // size):
            chips = list(range(k * size, (k + 1) * size))
            name = f"vm-{worker}" if size == chips_per_vm else f"vm-{worker}/chips-{'-'.join(map(str, chips))}"
            env = one_host_tpu_env(chips, TPU_BASE_PORT + k, METRICS_BASE_PORT + k, accelerator_type(size))
            overrides = [f"runtime.expected_devices={size}"]
            if size < chips_per_vm:  # several processes on the VM: each its own compile cache
                overrides.append(f"runtime.compile_cache_subdir=chips-{'-'.join(map(str, chips))}")
            slots.append(Slot(name, (worker,), size, env, tuple(overrides)))
    return slots


def one_host_tpu_env(chips: Sequence[int], port: int, metrics_port: int, accelerator_type: str) -> dict[str, str]:
    """A one-process TPU world on `chips` of this VM, kept out of the pod's mesh (see the module's docstring);
    `accelerator_type`: a slice of that many chips of the VM's family (v4-8, v5litepod-4, ...)."""
    visible = ",".join(map(str, chips))
    return {
        "TPU_SKIP_MDS_QUERY": "1",  # read the topology below, not the pod's metadata
        "TPU_ACCELERATOR_TYPE": accelerator_type,  # torch_xla reads the family's version from it
        "TPU_HOST_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": CHIP_BOUNDS[len(chips)],
        # The host's bounds too, the same (one process per slot): Ray's TPU manager sets TPU_CHIPS_PER_HOST_BOUNDS
        # (1,1,1 for one chip, 1,2,1 for two), the maintainers' recipe for one host of a pod (pytorch/xla#7714)
        # TPU_CHIPS_PER_HOST_BOUNDS=2,2,1; torch_xla 2.9 reads either (build_tpu_env_from_vars).
        "TPU_CHIPS_PER_HOST_BOUNDS": CHIP_BOUNDS[len(chips)],
        "TPU_VISIBLE_CHIPS": visible,  # torch_xla's name
        "TPU_VISIBLE_DEVICES": visible,  # libtpu's, in the multi-process recipes
        "TPU_PROCESS_PORT": str(port),
        "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "TPU_MESH_CONTROLLER_ADDRESS": f"localhost:{port}",  # one mesh controller per process, on its own port
        "TPU_MESH_CONTROLLER_PORT": str(port),
        "TPU_RUNTIME_METRICS_PORTS": str(metrics_port),
        "CLOUD_TPU_TASK_ID": "0",
        # The control plane (trm/runtime/base.py) reads these: one process, rank 0, no pod-wide rendezvous.
        "TPU_WORKER_ID": "0",
        "TPU_WORKER_HOSTNAMES": "localhost",
    }


def device_slots(value: object, devices: int | None) -> list[Slot]:
    """The slots of one machine's `devices` GPUs (torchrun, local): chips:N gives each slot N of them."""
    kind = SlotKind.parse(value)
    if kind.kind == "pod":
        return [WHOLE]
    if kind.kind == "vm":
        raise SlotConfigError(
            f"launcher.slots={value!r}: this launcher runs on one machine, so it has no VMs to divide; "
            "use pod, or chips:N with launcher.devices set"
        )
    size = int(kind.chips or 0)
    if not devices or devices % size:
        raise SlotConfigError(
            f"launcher.slots={value!r} needs launcher.devices (the machine's GPU count) divisible by {size}; "
            f"got launcher.devices={devices!r}"
        )
    return [
        Slot(
            f"gpus-{'-'.join(map(str, ids))}",
            (),
            size,
            {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))},
        )
        for ids in (list(range(k * size, (k + 1) * size)) for k in range(devices // size))
    ]


class NoSlotLeftError(RuntimeError):
    """Every slot's machine stopped answering: no trial can start until the launcher's machines are back."""


class SlotPool:
    """The slots a new trial can take: at most `limit` busy at once (max_concurrent), a dead one retired.

    slots=pod is one slot, the whole machine: it is taken by up to `limit` trials at once, which is how a
    laptop runs max_concurrent trials side by side on its cores and a pod (limit 1) one after another."""

    def __init__(self, slots: Sequence[Slot], limit: int | None):
        shared = len(slots) == 1 and slots[0].whole
        self.limit = (limit or 1) if shared else min(limit or len(slots), len(slots))
        self.free: list[Slot] = [slots[0]] * self.limit if shared else list(slots)
        self.busy = 0
        self.retired: list[Slot] = []

    def take(self) -> Slot | None:
        if self.busy >= self.limit or not self.free:
            return None
        self.busy += 1
        return self.free.pop(0)

    def give_back(self, slot: Slot) -> None:
        self.busy -= 1
        self.free.append(slot)

    def prefer(self, taken: Slot, name: str | None) -> Slot:
        """The free slot called `name` in place of `taken` (which goes back), if there is one; else `taken`. A
        retry goes back to the slot its predecessor ran on: checkpoints on a VM's own disk resume only there."""
        chosen = next((s for s in self.free if s.name == name), None) if name and name != taken.name else None
        if chosen is None:
            return taken
        self.free.remove(chosen)
        self.free.append(taken)
        return chosen

    def retire(self, slot: Slot) -> None:
        """A slot whose machine is gone: never taken again (the other slots go on)."""
        self.busy -= 1
        self.retired.append(slot)
        if not self.free and not self.busy:
            names = ", ".join(s.name for s in self.retired)
            raise NoSlotLeftError(
                f"every slot is out ({names}): their machines no longer answer; the study is kept as it is "
                "(trials that were running are queued again): start the driver again once they are back"
            )
