"""What every launcher returns: a handle over the job's worker processes that the driver can poll,
wait on and cancel, and that says which worker failed and why.

A job is one or more local processes, one per worker (a process, a torchrun node, or the ssh session to
a TPU VM), each writing its own log. The first worker to fail ends the job: the others are cancelled
at once instead of waiting on a collective timeout, so a dead worker stops the whole job within seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hydra.errors import HydraException

from contracts.overrides import parse_override
from sweeps.config.config_values import UserConfigError
from sweeps.config.optuna_parts import build
from sweeps.config.schema import SweepConfig
from sweeps.launchers.interrupts import signals_held
from sweeps.launchers.job_command import LITERAL_KEYS
from sweeps.launchers.slots import WHOLE, Slot

TERMINATE_GRACE_S = 10.0  # launcher.kill_grace_s's default (conf/launcher/*.yaml): SIGTERM to SIGKILL
# Jobs `cancel_all` stops at once: each stop of a pod's job is a gcloud ssh that a dead VM holds until its timeout.
CANCEL_AT_ONCE = 32


class LauncherConfigError(UserConfigError):
    """A launcher that cannot start jobs as configured; names the key and value."""


class MachineUnavailableError(RuntimeError):
    """The launcher's machine is gone for now (a TPU slice PREEMPTED) and its launcher is told not to wait
    (launcher.on_preempted=exit): the study is left resumable, its running trials queued again."""


def require(value: object, key: str, hint: str) -> None:
    if value in (None, "", "???"):
        raise LauncherConfigError(f"{key}={value!r}: required ({hint})")


def hydra_quote(value: str) -> str:
    """`value` as a quoted Hydra override value that the job reads back unchanged: quotes (and the backslashes
    before them) escaped, and `${` escaped so that OmegaConf does not resolve it as an interpolation."""
    value = re.sub(r"(\\+)(?='|\$\{|$)", lambda m: m.group(1) * 2, value)
    return "'" + value.replace("'", "\\'").replace("${", "\\${") + "'"


def _reads_back(key: str, value: str) -> bool:
    """Whether Hydra parses `key=value` as the plain string `value` (not a sweep, a number or an error)."""
    if "${" in value:
        return False
    try:
        parsed = parse_override(f"{key}={value}")
    except HydraException:  # the grammar refuses a quote, a non-ASCII letter, `=`, `#` ...
        return False
    return not parsed.is_sweep_override() and isinstance(parsed.value(), str) and parsed.value() == value


def quote_literals(overrides: Sequence[str]) -> list[str]:
    """The job's overrides with each literal value (LITERAL_KEYS) quoted where Hydra would not read it back as
    itself: a comma would make a sweep, a quote or `é` a grammar error, `123` a number. Other values are unchanged,
    so the usual command line stays as it was."""
    out = []
    for override in overrides:
        key, _, value = override.partition("=")
        out.append(f"{key}={hydra_quote(value)}" if key in LITERAL_KEYS and not _reads_back(key, value) else override)
    return out


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


class Process(Protocol):
    """What a JobHandle needs of a worker's process: subprocess.Popen, or a warm worker's forked job."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Worker:
    name: str
    process: Process
    log_path: Path


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError:
        return ""


def start_worker(name: str, argv: Sequence[str], cwd: Path, env: dict[str, str], log_path: Path) -> Worker:
    """Start one worker process in its own session (so cancel reaches its children too)."""
    cwd.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")  # noqa: SIM115 (the child writes to it; closed when the worker is reaped)
    process = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()  # the child keeps its own descriptor
    return Worker(name, process, log_path)


class JobHandle:
    """The running job: poll / wait / cancel, and the first failure."""

    def __init__(
        self,
        workers: list[Worker],
        remote_cancel: Callable[[float], None] | None = None,
        grace_s: float = TERMINATE_GRACE_S,
    ):
        self.workers = workers
        self.remote_cancel = remote_cancel
        self.grace_s = grace_s  # SIGTERM to SIGKILL when the job is cancelled or a worker failed
        self.failure: str | None = None  # "worker-2 exited with 1: <last log lines>"
        self.failed_worker: str | None = None
        self.cancelled = False
        self._returncode: int | None = None

    def poll(self) -> int | None:
        """None while running; then 0 if every worker succeeded, else the first failure's exit code."""
        if self._returncode is not None:
            return self._returncode
        codes = [w.process.poll() for w in self.workers]
        for worker, code in zip(self.workers, codes):
            if code not in (None, 0) and self.failure is None and not self.cancelled:
                self.failed_worker = worker.name
                self.failure = f"{worker.name} exited with code {code}; last log lines:\n{tail(worker.log_path)}"
                self._returncode = code
                self._stop_all()
                return code
        if all(code is not None for code in codes):
            self._returncode = 0 if all(code == 0 for code in codes) else next(c for c in codes if c)
            return self._returncode
        return None

    def wait(self, timeout_s: float | None = None, poll_s: float = 0.5) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(poll_s)
        return code

    def cancel(self, grace_s: float | None = None) -> None:
        """Stop every worker, remote ones included; idempotent. Workers get SIGTERM (a checkpoint) and `grace_s`
        (launcher.kill_grace_s) to exit before SIGKILL; a hung or stopped job cannot act on SIGTERM, so the
        driver gives it 0."""
        self.cancelled = True
        self._stop_all(self.grace_s if grace_s is None else grace_s)
        if self._returncode is None:
            self._returncode = -signal.SIGTERM

    def _stop_all(self, grace_s: float | None = None) -> None:
        """SIGTERM to every worker (and the remote cancel), SIGKILL to those still there after `grace_s`. Ctrl-C or
        SIGTERM to the driver waits until this is done (sweeps.launchers.interrupts.signals_held): a stop left half-way
        left a job training in its own session, its trial RUNNING with nothing recorded."""
        with signals_held():
            self._stop_workers(self.grace_s if grace_s is None else grace_s)

    def _stop_workers(self, grace_s: float) -> None:
        if self.remote_cancel is not None:
            with contextlib.suppress(Exception):  # best effort: the local sessions are stopped below either way
                self.remote_cancel(grace_s)  # remote workers: SIGTERM, SIGKILL after grace_s, on their VMs
        for worker in self.workers:
            _signal_group(worker.process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(worker.process, signal.SIGKILL)
                worker.process.wait()

    @property
    def log_paths(self) -> list[Path]:
        return [w.log_path for w in self.workers]


def cancel_all(jobs: Sequence[JobHandle], grace_s: float | None = None) -> None:
    """`JobHandle.cancel(grace_s)` for every job, CANCEL_AT_ONCE at a time: a stop that waits (a job's kill grace, a
    dead VM's ssh timeout) costs that wait once, not once per job. Ctrl-C or SIGTERM to the driver waits until every
    stop is done (signals_held, as for one job); the first error of any stop is raised once all are."""
    if not jobs:
        return
    with signals_held(), ThreadPoolExecutor(min(CANCEL_AT_ONCE, len(jobs)), "cancel") as pool:
        for future in [pool.submit(job.cancel, grace_s) for job in jobs]:
            future.result()


def _signal_group(process: Process, sig: int) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def machine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Ours, with `extra` on top, and OpenMP told not to spin: workers share this machine's cores, and OpenMP's
    default spin-waiting makes a step several times slower when another process is busy (docs/benchmarks.md,
    "OpenMP spin-waiting")."""
    env = {**os.environ, **(extra or {})}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


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
