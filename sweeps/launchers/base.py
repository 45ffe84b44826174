"""The launcher contract: what the driver, a dry run, the preflight and validation ask of a launcher (`Launcher`),
what it is given (`JobSpec`), what it answers of its machine (`Machine`, `PreflightReport`), and the configured
launcher built and refused here unless it has every member; a job's environment on this machine (`worker_env`).
What `launch` returns, the handle over a job's worker processes: sweeps/launchers/workers.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sweeps.config.config_values import UserConfigError
from sweeps.config.optuna_parts import build
from sweeps.config.schema import SweepConfig
from sweeps.launchers.slots import WHOLE, Slot
from sweeps.launchers.workers import JobHandle, machine_env


class LauncherConfigError(UserConfigError):
    """A launcher that cannot start jobs as configured; names the key and value."""


class MachineUnavailableError(RuntimeError):
    """The launcher's machine is gone for now (a TPU slice PREEMPTED) and its launcher is told not to wait
    (launcher.on_preempted=exit): the study is left resumable, its running trials queued again."""


def require(value: object, key: str, hint: str) -> None:
    if value in (None, "", "???"):
        raise LauncherConfigError(f"{key}={value!r}: required ({hint})")


@dataclass
class JobSpec:
    """Everything a launcher needs to start one trial."""

    name: str  # "<study>-<trial number>"; also tags the workers' processes for remote cancel
    overrides: list[str]  # Hydra overrides for `python -m trm.train`
    workdir: Path  # local directory for this job's logs (and, for local workers, their cwd)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the workers
    slot: Slot = WHOLE  # where it runs (sweeps/launchers/slots.py): which workers, confined to which chips


@dataclass(frozen=True)
class Machine:
    """What a dry run says of the machine a launcher runs on, asked of it (a TPU slice as `tpu-vm describe` gives it,
    or as launcher.accelerator_type plans it)."""

    line: str  # one line for a person: its name, type, state and size
    accelerator_type: str  # what the study is priced on (estimate.pods' key: v4-32)
    chips: int


@dataclass(frozen=True)
class PreflightReport:
    """What a launcher's preflight found on its machine."""

    shown: str  # for a person: the machine's line, then a row per worker
    problems: list[str]  # one line each, naming where and the fix; none: the machine is ready


class Launcher(Protocol):
    """What the driver, a dry run, the preflight and validation ask of a launcher (`conf/launcher/*.yaml` builds one).
    Every member is asked of every launcher: none is recognised by its class (tests/test_architecture_doc.py)."""

    def prepare(self) -> None:
        """Check the config and reach (or deploy to) the workers, before the study is opened."""

    def launch(self, spec: JobSpec) -> JobHandle:
        """Start one job on the workers."""
        ...

    def describe(self, spec: JobSpec) -> str:
        """The job's command line as a shell would run it (what a dry run prints)."""
        ...

    @property
    def world_size(self) -> int:
        """Training processes the global batch is split over, as far as the driver can count them before launch."""
        ...

    @property
    def shares_filesystem(self) -> bool:
        """Whether the workers run on this machine: its paths (data, interpreter) are theirs and can be checked here."""
        ...

    def slots(self, kind: str | None = None) -> list[Slot]:
        """The machine divided as `launcher.slots` says (or as `kind` would): the driver runs a trial per slot."""
        ...

    def slot_alive(self, slot: Slot) -> bool:
        """Whether a slot whose job failed can take another trial (a dead VM takes only its own slots out)."""
        ...

    def unavailable(self) -> str | None:
        """None while the machine can run jobs; else one line saying why it cannot (a TPU slice PREEMPTED): the
        driver asks when a job fails and before each launch (sweeps/trials/preemption.py)."""
        ...

    def wait_until_available(self, line: str) -> None:
        """After `unavailable` said `line`: return once the machine runs jobs again, prepared anew (fresh VMs), or
        raise MachineUnavailableError where the launcher is told not to wait."""
        ...

    def watch(self) -> str | None:
        """Asked on every pass of the driver's loop while trials run: None, or why the machine is gone (as
        `unavailable` says it), so a machine taken while its jobs still run is noticed without waiting for one to end
        (a TPU slice: described at most every launcher.watch_s)."""
        ...

    def machine(self) -> Machine | None:
        """The machine the study is priced on, for a dry run's header; None where it is this one."""
        ...

    def preflight(self, sweep: SweepConfig, train: Mapping[str, Any] | None = None) -> PreflightReport | None:
        """Its checks of the machine before a study starts trials there, and again once it is back (a TPU pod: a
        probe on every VM); None where it has none. `train`: the trials' training config as composed, composed from
        `sweep` when not given. The driver asks unless `preflight.enabled=false`; `python -m sweeps.preflight` asks."""
        ...


# What build_launcher checks a configured class for: the protocol's own members, read off it.
LAUNCHER_MEMBERS = tuple(name for name in vars(Launcher) if not name.startswith("_"))


class ThisMachine:
    """The Launcher members of a launcher whose machine is this one: never taken from the study, nothing to
    describe or to probe before one."""

    def unavailable(self) -> str | None:
        return None

    def wait_until_available(self, line: str) -> None:
        """Never asked: `unavailable` never says so."""

    def watch(self) -> str | None:
        return None

    def machine(self) -> Machine | None:
        return None

    def preflight(self, sweep: SweepConfig, train: Mapping[str, Any] | None = None) -> PreflightReport | None:
        return None


def worker_env(spec: JobSpec, with_slot: bool = True) -> dict[str, str]:
    """A local worker's environment: ours, the slot's confinement (unless the worker is only a remote shell's
    client: ssh does not carry its environment to the VM), then the job's own."""
    return machine_env({**(spec.slot.env if with_slot else {}), **spec.env})


def build_launcher(node: Mapping[str, Any]) -> Launcher:
    """The configured launcher, refused here unless it has the interface the driver uses (sweeps.launchers.base)."""
    launcher: Launcher = build(node)
    # Looked up on the class: reading world_size on the instance would evaluate config that prepare() checks later.
    missing = [name for name in LAUNCHER_MEMBERS if not hasattr(type(launcher), name)]
    if missing:
        raise LauncherConfigError(f"launcher._target_={node.get('_target_')!r}: not a launcher (it lacks {missing})")
    return launcher
