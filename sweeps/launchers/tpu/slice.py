"""What a Cloud TPU slice says about itself: `gcloud [alpha] compute tpus tpu-vm describe NAME --zone=ZONE
[--project=P] --format=json`, the TPU API's Node resource (asked by sweeps/launchers/tpu/describe.py).

The fields read (the Node resource of the TPU API, v2: `acceleratorType`, `acceleratorConfig`, `state`, `health`,
`runtimeVersion`, `networkConfigs`, `networkEndpoints`):
- `networkEndpoints`: one per worker VM and network, in worker order (`ipAddress`). A TPU attached to several
  networks lists each VM's endpoints together, so gcloud (578.0.0, command_lib/compute/tpus/tpu_vm/ssh.py:
  ParseWorkerFlag) takes every n-th one, n = len(networkConfigs) (at least 1): those are the workers `--worker=i`
  indexes (it refuses i >= their count). The launcher counts them the same way.
- `acceleratorType` (`v4-32`, `v5litepod-16`, `v5p-8`, `v6e-8`): its number counts TensorCores. Cloud TPU's docs:
  a v4 chip has two TensorCores (v4-32: 16 chips), as a v5p chip does (the v5p table: 2x2x1 = 8 cores, 4 chips, 1
  host); a v5e (`v5litepod-N`) or v6e chip has one (N chips). Where the type is missing,
  `acceleratorConfig.type` names the family (V4, V5P, V5LITE_POD, V6E) and `.topology` (AxB or AxBxC, in chips)
  the chip count.
- Chips per VM: the chips over the workers (v4 and v5p hosts have 4 chips; v5e/v6e hosts 8 on one-host slices,
  4 on larger ones: the workers settle it without a table per family).
- Devices: torch_xla shows one device per chip on these families (v4 and v5p run each chip's two TensorCores as
  one, "megacore"; v5e and v6e chips have one): the job's `runtime.expected_devices` is the chip count. v2/v3
  (one device per TensorCore) are refused, naming the type, whether by `acceleratorType` or `acceleratorConfig`.
- Usable: `state` READY and `health` not one of the API's unhealthy values (TIMEOUT, UNHEALTHY_TENSORFLOW,
  UNHEALTHY_MAINTENANCE); HEALTHY, HEALTH_UNSPECIFIED or no field at all is taken as healthy.
docs/pod-unknowns.md lists what no source settles (a v5e/v6e slice under torch_xla here is untested).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sweeps.launchers.base import LauncherConfigError


@dataclass(frozen=True)
class ChipFamily:
    """A TPU generation as the TPU API and the VMs name it."""

    name: str  # acceleratorType's prefix: v4-32's v4
    config_type: str  # acceleratorConfig.type's value (the TPU API's AcceleratorConfig.TypeValueValuesEnum)
    cores_per_chip: int  # what acceleratorType's number counts per chip (TensorCores)
    device_glob: str  # the chips' device files on a VM: what the preflight counts and checks nobody holds

    def accelerator_type(self, chips: int) -> str:
        """The type a slice of `chips` chips of this family has: TPU_ACCELERATOR_TYPE of a slot of them."""
        return f"{self.name}-{chips * self.cores_per_chip}"

    def chips_per_host(self, chips: int) -> int:
        """Chips per VM of a slice of `chips` (Cloud TPU's tables): for a dry run with no slice to describe."""
        return chips if self.cores_per_chip == 1 and chips <= 8 else min(4, chips)


# Cloud TPU's docs: v4 VMs expose their chips as /dev/accel*, v5e, v5p and v6e VMs as VFIO groups /dev/vfio/N (the
# troubleshooting pages' `lsof` of each); /dev/vfio/vfio, the VFIO container, is no chip.
FAMILIES = {
    f.name: f
    for f in (
        ChipFamily("v4", "V4", 2, "/dev/accel*"),
        ChipFamily("v5p", "V5P", 2, "/dev/vfio/[0-9]*"),
        ChipFamily("v5litepod", "V5LITE_POD", 1, "/dev/vfio/[0-9]*"),
        ChipFamily("v6e", "V6E", 1, "/dev/vfio/[0-9]*"),
    )
}
BY_CONFIG_TYPE = {f.config_type: f for f in FAMILIES.values()}
# The Node's health values that mean its VMs cannot be counted on (TPU API v2, Node.HealthValueValuesEnum).
UNHEALTHY = ("TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE")
ACCEPTED_TYPES = f"{', '.join(f'{k}-N' for k in FAMILIES)}, or an acceleratorConfig of type {', '.join(BY_CONFIG_TYPE)}"


@dataclass(frozen=True)
class SliceShape:
    """A TPU slice as `tpu-vm describe` gives it. Invariant: chips divide evenly over the worker VMs (>= 1)."""

    name: str
    accelerator_type: str  # "v4-32"; or "V4 2x2x4" (acceleratorConfig) where the Node has no acceleratorType
    state: str  # READY, CREATING, PREEMPTED, STOPPED, REPAIRING, ...
    runtime_version: str
    worker_ips: tuple[str, ...]  # the primary networkEndpoints' ipAddress: worker i's internal address
    chips: int
    family: str = "v4"  # a key of FAMILIES

    @property
    def workers(self) -> int:
        return len(self.worker_ips)

    @property
    def chips_per_vm(self) -> int:
        return self.chips // self.workers

    @property
    def devices(self) -> int:
        """The torch_xla devices a job on every VM sees: one per chip (the module's docstring)."""
        return self.chips

    @property
    def chip_family(self) -> ChipFamily:
        return FAMILIES[self.family]

    def label(self) -> str:
        return f"{self.name} ({self.accelerator_type})"

    def line(self) -> str:
        return (
            f"slice {self.label()}, {self.state}, runtime {self.runtime_version or '?'}: {self.workers} VM(s) x "
            f"{self.chips_per_vm} chip(s) = {self.devices} devices; workers at {', '.join(self.worker_ips)}"
        )


def chips_of(name: str, node: Mapping[str, Any]) -> tuple[str, ChipFamily, int]:
    """(the type as shown, its family, its chip count) from a Node's acceleratorType, else its acceleratorConfig;
    a type of another family (v2, v3) or none at all is refused in one line naming it."""
    kind = str(node.get("acceleratorType") or "")
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", kind)
    config = node.get("acceleratorConfig") or {}
    config_type = str(config.get("type") or "")
    family = FAMILIES.get(match.group(1)) if match else BY_CONFIG_TYPE.get(config_type)
    if match and family and int(match.group(2)) % family.cores_per_chip == 0:
        return kind, family, int(match.group(2)) // family.cores_per_chip
    topology = str(config.get("topology") or "")
    if not match and family and re.fullmatch(r"\d+(x\d+){1,2}", topology):
        return f"{config_type} {topology}", family, math.prod(int(d) for d in topology.split("x"))
    shown = kind or (f"acceleratorConfig {config_type} {topology}".strip() if config else None)
    raise LauncherConfigError(
        f"launcher.tpu_name={name!r}: its accelerator type {shown!r} is not one this launcher sizes (expected "
        f"{ACCEPTED_TYPES}; v2 and v3 show one torch_xla device per TensorCore and are not supported)"
    )


def primary_endpoints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The workers' endpoints: every n-th of networkEndpoints, n the Node's networks (gcloud's ParseWorkerFlag)."""
    networks = max(1, len(node.get("networkConfigs") or ()))
    return list(node.get("networkEndpoints") or ())[::networks]


def parse_node(name: str, node: Mapping[str, Any]) -> SliceShape:
    """The shape of a `describe --format=json` answer; a Node this cannot size is refused in one line."""
    kind, family, chips = chips_of(name, node)
    ips = tuple(str(e.get("ipAddress") or "?") for e in primary_endpoints(node))
    state = str(node.get("state") or "?")
    if not ips or chips < len(ips) or chips % len(ips):
        raise LauncherConfigError(
            f"launcher.tpu_name={name!r}: slice {kind} in state {state} lists {len(ips)} worker endpoint(s) for "
            f"{chips} chip(s); expected a READY slice whose chips divide over its VMs (gcloud compute tpus tpu-vm "
            "describe shows it)"
        )
    return SliceShape(name, kind, state, str(node.get("runtimeVersion") or ""), ips, chips, family.name)


def shape_of_type(name: str, accelerator_type: str) -> SliceShape:
    """The shape a slice of `accelerator_type` has by Cloud TPU's tables, with no slice to describe (a dry run
    with launcher.accelerator_type: the study priced before the TPU is created)."""
    try:
        _, family, chips = chips_of(name, {"acceleratorType": accelerator_type})
    except LauncherConfigError:
        raise LauncherConfigError(
            f"launcher.accelerator_type={accelerator_type!r}: expected one of {', '.join(f'{k}-N' for k in FAMILIES)} "
            "as Cloud TPU names its slices, e.g. v4-32"
        ) from None
    workers = chips // family.chips_per_host(chips)
    return SliceShape(name, accelerator_type, "not created", "", ("?",) * workers, chips, family.name)


def gone_line(name: str, node: Mapping[str, Any]) -> str | None:
    """None when the Node is usable (READY and not unhealthy); else the line the driver shows."""
    state, health = str(node.get("state") or "?"), str(node.get("health") or "")
    kind = node.get("acceleratorType") or "?"
    if state != "READY":
        return f"slice {name} ({kind}) is {state}"
    if health in UNHEALTHY:
        return f"slice {name} ({kind}) is READY but {health}"
    return None


def check_configured(shape: SliceShape, configured: Mapping[str, object]) -> None:
    """A configured size that contradicts the slice, refused in one line naming the key, its value and the slice's.
    `configured` maps launcher.num_workers, launcher.chips_per_vm and launcher.accelerator_type to their values
    (None: from the slice)."""
    actual: dict[str, tuple[object, str]] = {
        "launcher.num_workers": (shape.workers, "workers"),
        "launcher.chips_per_vm": (shape.chips_per_vm, "chips per VM"),
        "launcher.accelerator_type": (shape.accelerator_type, "as its type"),
    }
    for key, value in configured.items():
        if value is None:
            continue
        want, what = actual[key]
        wrong_type = isinstance(want, int) and (not isinstance(value, int) or isinstance(value, bool))
        if wrong_type or value != want:
            raise LauncherConfigError(
                f"{key}={value!r} but slice {shape.label()} has {want} {what}: drop the key or set {want}"
            )
