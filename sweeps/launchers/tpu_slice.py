"""What a Cloud TPU slice says about itself: `gcloud [alpha] compute tpus tpu-vm describe NAME --zone=ZONE
[--project=P] --format=json`, the TPU API's Node resource.

The fields read (the Node resource of the TPU API, v2: `acceleratorType`, `acceleratorConfig`, `state`,
`runtimeVersion`, `networkEndpoints`):
- `networkEndpoints`: one per worker VM, in worker order (`ipAddress`); the count is the slice's workers, which
  is what gcloud's `--worker=i` indexes (it refuses i >= the count).
- `acceleratorType` (`v4-32`, `v5litepod-16`, `v5p-8`, `v6e-8`): its number counts TensorCores. Cloud TPU's docs:
  a v4 chip has two TensorCores (v4-32: 16 chips), as a v5p chip does (the v5p table: 2x2x1 = 8 cores, 4 chips, 1
  host); a v5e (`v5litepod-N`) or v6e chip has one (N chips). Where the type is missing or of another family,
  `acceleratorConfig.topology` (AxB or AxBxC, in chips) gives the chip count.
- Chips per VM: the chips over the endpoints (v4 and v5p hosts have 4 chips; v5e/v6e hosts 8 on one-host
  slices, 4 on larger ones: the endpoints settle it without a table per family).
- Devices: torch_xla shows one device per chip on these families (v4 and v5p run each chip's two TensorCores as
  one, "megacore"; v5e and v6e chips have one): the job's `runtime.expected_devices` is the chip count. v2/v3
  (one device per TensorCore) are not read here: refused, naming the type.
docs/pod-unknowns.md lists what no source settles (a v5e/v6e slice under torch_xla here is untested).
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeps.launchers.base import LauncherConfigError, MachineUnavailableError

log = logging.getLogger(__name__)

ON_PREEMPTED = ("wait", "exit")  # launcher.on_preempted: what a study does while its slice is not READY
# TensorCores per chip of each family whose `acceleratorType` number counts TensorCores (Cloud TPU's docs).
CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1}


@dataclass(frozen=True)
class SliceShape:
    """A TPU slice as `tpu-vm describe` gives it. Invariant: chips divide evenly over the worker VMs (>= 1)."""

    name: str
    accelerator_type: str  # "v4-32"; or "V4 2x2x4" (acceleratorConfig) where the Node has no acceleratorType
    state: str  # READY, CREATING, PREEMPTED, STOPPED, REPAIRING, ...
    runtime_version: str
    worker_ips: tuple[str, ...]  # networkEndpoints[i].ipAddress: worker i's internal address
    chips: int

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

    def label(self) -> str:
        return f"{self.name} ({self.accelerator_type})"

    def line(self) -> str:
        return (
            f"slice {self.label()}, {self.state}, runtime {self.runtime_version or '?'}: {self.workers} VM(s) x "
            f"{self.chips_per_vm} chip(s) = {self.devices} devices; workers at {', '.join(self.worker_ips)}"
        )


def chips_of(node: Mapping[str, Any]) -> tuple[str, int] | None:
    """(the type as shown, its chip count) from a Node's acceleratorType, else its acceleratorConfig's topology."""
    kind = str(node.get("acceleratorType") or "")
    match = re.fullmatch(r"(v4|v5p|v5litepod|v6e)-(\d+)", kind)
    if match and int(match.group(2)) % CORES_PER_CHIP[match.group(1)] == 0:
        return kind, int(match.group(2)) // CORES_PER_CHIP[match.group(1)]
    config = node.get("acceleratorConfig") or {}
    topology = str(config.get("topology") or "")
    if re.fullmatch(r"\d+(x\d+){1,2}", topology):
        return kind or f"{config.get('type', '?')} {topology}", math.prod(int(d) for d in topology.split("x"))
    return None


def parse_node(name: str, node: Mapping[str, Any]) -> SliceShape:
    """The shape of a `describe --format=json` answer; a Node this cannot size is refused in one line."""
    found = chips_of(node)
    ips = tuple(str(e.get("ipAddress") or "?") for e in node.get("networkEndpoints") or ())
    state = str(node.get("state") or "?")
    if found is None:
        raise LauncherConfigError(
            f"launcher.tpu_name={name!r}: its acceleratorType {node.get('acceleratorType')!r} is not one this "
            f"launcher sizes (expected {', '.join(f'{k}-N' for k in CORES_PER_CHIP)}, or an acceleratorConfig "
            "topology)"
        )
    kind, chips = found
    if not ips or chips < len(ips) or chips % len(ips):
        raise LauncherConfigError(
            f"launcher.tpu_name={name!r}: slice {kind} in state {state} lists {len(ips)} worker endpoint(s) for "
            f"{chips} chip(s); expected a READY slice whose chips divide over its VMs (gcloud compute tpus tpu-vm "
            "describe shows it)"
        )
    return SliceShape(name, kind, state, str(node.get("runtimeVersion") or ""), ips, chips)


def describe_node(argv: Sequence[str], name: str, timeout_s: float) -> dict[str, Any]:
    """Run `argv` (the describe command line) and return the Node it prints as JSON."""
    try:
        proc = subprocess.run(list(argv), check=False, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise LauncherConfigError(
            f"launcher.tpu_name={name!r}: `gcloud ... tpu-vm describe` did not answer in {timeout_s:g} s "
            "(launcher.ssh_timeout_s)"
        ) from None
    except OSError as err:  # no such program: before validate's own check has run (a dry run sizes the slots first)
        raise LauncherConfigError(
            f"launcher.gcloud={argv[0]!r}: cannot run it ({err.strerror}); install the Google Cloud CLI, or give its "
            "path"
        ) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise LauncherConfigError(
            f"launcher.tpu_name={name!r}: `gcloud ... tpu-vm describe` failed: {last[-400:]} (check launcher.tpu_name, "
            "launcher.zone and launcher.project)"
        )
    try:
        node = json.loads(proc.stdout)
    except ValueError:
        node = None
    if not isinstance(node, dict):
        raise LauncherConfigError(
            f"launcher.tpu_name={name!r}: `gcloud ... tpu-vm describe --format=json` printed no JSON object: "
            f"{proc.stdout.strip()[:200]!r}"
        )
    return node


def describe_slice(argv: Sequence[str], name: str, timeout_s: float) -> SliceShape:
    """Run `argv` (the describe command line) and read the slice's shape from its JSON."""
    return parse_node(name, describe_node(argv, name, timeout_s))


def check_configured(shape: SliceShape, configured: Mapping[str, int | None]) -> None:
    """A configured size that contradicts the slice, refused in one line naming the key, its value and the slice's.
    `configured` maps launcher.num_workers and launcher.chips_per_vm to their values (None: from the slice)."""
    actual = {
        "launcher.num_workers": (shape.workers, "workers"),
        "launcher.chips_per_vm": (shape.chips_per_vm, "chips per VM"),
    }
    for key, value in configured.items():
        if value is None:
            continue
        want, what = actual[key]
        if not isinstance(value, int) or isinstance(value, bool) or value != want:
            raise LauncherConfigError(
                f"{key}={value!r} but slice {shape.label()} has {want} {what}: drop the key or set {want}"
            )


def slice_unavailable(argv: Sequence[str], name: str, timeout_s: float) -> str | None:
    """None when `describe` says READY; else the line the driver shows: the state (PREEMPTED, STOPPED, REPAIRING,
    CREATING ...), or why the slice could not be described (a spot slice's node may be deleted and recreated)."""
    try:
        node = describe_node(argv, name, timeout_s)
    except LauncherConfigError as err:
        return f"slice {name!r} cannot be described ({err})"
    state = str(node.get("state") or "?")
    return None if state == "READY" else f"slice {name} ({node.get('acceleratorType') or '?'}) is {state}"


def wait_for_ready(line: str, unavailable: Callable[[], str | None], on_preempted: str, poll_s: float) -> None:
    """Return once `unavailable()` says nothing (READY), asking every `poll_s`; raise MachineUnavailableError at
    once where launcher.on_preempted=exit. One warning per state seen, not one per poll."""
    if on_preempted == "exit":
        raise MachineUnavailableError(
            f"{line}: the running trials were queued again, spending no retry (launcher.on_preempted=exit); run the "
            "same command once the slice is READY to continue the study"
        )
    log.warning(
        "%s: the study waits until it is READY, asking every %g s (launcher.state_poll_s; launcher.on_preempted="
        "exit ends the driver instead)",
        line,
        poll_s,
    )
    while (now := unavailable()) is not None:
        if now != line:
            log.warning("%s: still waiting", now)
            line = now
        time.sleep(poll_s)
    log.warning("the slice is READY again: setting up its VMs anew (launcher.setup, the Python check, deploy)")
