"""Asking every worker VM at once: sweeps/launchers/tpu/probe.py over one ssh each, the port check started on all
of them together (sweeps/launchers/tpu/preflight.py judges the answers)."""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sweeps.launchers.slots import Slot
from sweeps.launchers.tpu.probe import MARK, READY
from sweeps.launchers.tpu.shell import shell_path
from sweeps.launchers.tpu.slice import SliceShape

PROBE = Path(__file__).with_name("probe.py")


class Pod(Protocol):
    """What the preflight asks of the pod's launcher (TpuPodLauncher, which runs the preflight: named here by what
    it has, so that neither module imports the other)."""

    python: str  # launcher.python: the VMs' interpreter
    remote_dir: str  # launcher.remote_dir: where the jobs run on each VM
    env: dict[str, str]  # the job's exports

    def shape(self) -> SliceShape: ...

    def worker_ids(self) -> list[int]: ...

    def slots(self, kind: str | None = None) -> list[Slot]: ...

    def ssh_argv(self, worker: str, remote_command: str) -> list[str]: ...


@dataclass
class Answer:
    worker: int
    facts: dict[str, Any] | None  # the probe's JSON line, or None when it did not answer
    error: str = ""


def go_after(timeout_s: float, reach_s: float) -> float:
    """Seconds after the start by which the port check starts even if some worker is not ready: what
    `preflight.timeout_s` leaves once the check (reach_s) and the rank-0 checks after it (the storage's
    reach_s + 1) are set aside."""
    return max(0.0, float(timeout_s) - 2 * float(reach_s) - 2)


def ask_workers(launcher: Pod, args: dict[str, Any], timeout_s: float) -> list[Answer]:  # noqa: C901 (the READY/go barrier's states)
    """The probe on every worker, in parallel; a worker that does not answer in `timeout_s` is an Answer too.

    Each worker's gcloud makes its own API round trips before its ssh, so the probes start seconds apart. Each
    prints READY once its other facts are in and waits for `go` on its stdin, sent to all once every worker is
    ready (or has ended, or `go_after` passed): the port check's `preflight.reach_s` counts from the last
    worker's start, and a late VM does not read as a network that drops the port's traffic."""
    here = shell_path(launcher.remote_dir)
    command = f"mkdir -p {here} && cd {here} && {shell_path(launcher.python)} -c "
    command += f"{shlex.quote(PROBE.read_text())} {shlex.quote(json.dumps(args))}"
    start = time.monotonic()
    procs = {
        w: subprocess.Popen(
            launcher.ssh_argv(str(w), command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in launcher.worker_ids()
    }
    outs: dict[int, list[str]] = {w: [] for w in procs}
    errs: dict[int, list[str]] = {w: [] for w in procs}
    ready = {w: threading.Event() for w in procs}

    def read_out(worker: int, proc: subprocess.Popen[str]) -> None:
        for line in proc.stdout or ():
            outs[worker].append(line)
            if line.startswith(READY):
                ready[worker].set()
        ready[worker].set()  # ended: nothing to wait for

    def read_err(worker: int, proc: subprocess.Popen[str]) -> None:
        errs[worker].append(proc.stderr.read() if proc.stderr else "")

    readers = {
        w: [threading.Thread(target=f, args=(w, p), daemon=True) for f in (read_out, read_err)]
        for w, p in procs.items()
    }
    for thread in (t for pair in readers.values() for t in pair):
        thread.start()
    go_by = start + go_after(timeout_s, float(args["reach_s"]))
    for event in ready.values():
        event.wait(timeout=max(0.0, go_by - time.monotonic()))
    for proc in procs.values():
        with contextlib.suppress(OSError):  # a probe that has ended closed its end
            if proc.stdin is not None:
                proc.stdin.write("go\n")
                proc.stdin.close()
    deadline = start + timeout_s
    answers = []
    for worker, proc in procs.items():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            answers.append(Answer(worker, None, f"no answer in {timeout_s:g} s (preflight.timeout_s)"))
            continue
        for thread in readers[worker]:
            thread.join(timeout=5)  # the pipes end with the process
        out, err = "".join(outs[worker]), "".join(errs[worker])
        line = next((ln for ln in out.splitlines() if ln.startswith(MARK)), None)
        if line is None:
            last = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            answers.append(Answer(worker, None, f"the probe did not run: {last[-300:]}"))
        else:
            answers.append(Answer(worker, json.loads(line[len(MARK) :])))
    return answers
