"""A pod job's workers in at most launcher.ssh_sessions gcloud processes: a v5e-256's 64 VMs in 8 sessions of 8
(`--worker=i,j,k`), not 64 gcloud interpreters with their API round trips. Each VM keeps its own log and exit status.

A session to one VM is `--worker=i`, as before: its process is the worker's. A session to several runs
shell.tagged_command on each; gcloud (578.0.0: command_lib/compute/tpus/tpu_vm/ssh.py) then starts an ssh per VM
in threads, all writing into its own output, and its exit status cannot name a worker: it is the first non-zero of
a list indexed by worker id but sized by the group, so a failure on a worker whose id is not below the group's size
(worker 9 of the group 8..15) raises IndexError in its thread and is lost, and gcloud exits 0 (its
`--output-directory` writes to `None/<worker>.log` in that release). Here a thread reads the session's output,
appends each tagged line to its VM's log and takes each VM's status from its exit tag; gcloud's own lines go to
the log of the worker they name, else to every worker's of the session still running. A VM with no exit tag when
the session ends (ssh gave up on it, the VM vanished) gets the session's exit status, or 255 for a session that
exited 0 without it.

The stop is the launcher's as before: a `pkill` on the job's VMs in one session, then the local sessions' groups.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from sweeps.launchers.tpu.shell import WORKER_TAG, tagged_command
from sweeps.launchers.workers import Worker, start_worker

TAGGED = re.compile(rb"^\[" + WORKER_TAG.encode() + rb" (\d+)(?: exit (\d+)\]\n?$|\] )")
NAMED = re.compile(rb"\bworker (\d+)\b")  # gcloud's own lines: `SSH: Attempting to connect to worker 3...`
SETTLE_S = 2.0  # once the gcloud process ended: how long its output may still be read before the statuses stand


def groups(workers: Sequence[int], sessions: int) -> list[list[int]]:
    """`workers` in at most `sessions` groups of consecutive workers, their sizes one apart at most."""
    count = min(len(workers), sessions)
    size, extra = divmod(len(workers), count)
    out, start = [], 0
    for g in range(count):
        end = start + size + (1 if g < extra else 0)
        out.append(list(workers[start:end]))
        start = end
    return out


class Session:
    """One gcloud ssh to a group of VMs and what its output says of each: log lines and exit statuses."""

    def __init__(self, argv: Sequence[str], workers: Sequence[int], cwd: Path, env: dict[str, str], logs: Path):
        self.workers = list(workers)
        self.status: dict[int, int] = {}
        self.lock = threading.Lock()
        self.read = threading.Event()  # the output's end was reached
        self.logs = {w: logs / f"worker-{w}.log" for w in self.workers}
        cwd.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        threading.Thread(target=self._read, name=f"ssh-session-{self.workers[0]}", daemon=True).start()

    def _read(self) -> None:
        files = {w: open(path, "ab") for w, path in self.logs.items()}  # noqa: SIM115 (closed below)
        try:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self._route(line, files)
        finally:
            for f in files.values():
                f.close()
            self.read.set()

    def _route(self, line: bytes, files: Mapping[int, IO[bytes]]) -> None:
        tagged = TAGGED.match(line)
        if tagged and int(tagged[1]) in files:
            worker = int(tagged[1])
            if tagged[2] is not None:
                self._settle(worker, int(tagged[2]))
                return
            targets = [worker]
            line = line[tagged.end() :]
        else:
            named = NAMED.search(line)
            targets = [int(named[1])] if named and int(named[1]) in files else self.running()
        for w in targets:
            files[w].write(line)
            files[w].flush()

    def _settle(self, worker: int, code: int) -> None:
        with self.lock:
            self.status.setdefault(worker, code)

    def running(self) -> list[int]:
        with self.lock:
            return [w for w in self.workers if w not in self.status]

    def poll(self, worker: int) -> int | None:
        """The worker's status: its exit tag's; once the session ended, the session's for a worker without one."""
        if worker not in self.status and self.proc.poll() is not None:
            self.read.wait(SETTLE_S)  # a VM process of the stand-in pod may hold the output open a little longer
            code = self.proc.returncode
            for w in self.running():
                self._settle(w, code if code else 255)
        return self.status.get(worker)


class GroupedWorker:
    """One VM of a Session, as a worker's process (sweeps.launchers.workers.Process): signals go to the session's
    group (its gcloud and ssh clients), which the job's other VMs of the session share."""

    def __init__(self, session: Session, worker: int):
        self.session, self.worker, self.pid = session, worker, session.proc.pid

    def poll(self) -> int | None:
        return self.session.poll(self.worker)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.session.proc.args, timeout or 0.0)
            time.sleep(0.05)
        return code


def session_argvs(
    vms: Sequence[int], sessions: int, argv: Callable[[str, str], list[str]], command: str
) -> list[tuple[list[int], list[str]]]:
    """Each gcloud session's VMs and its ssh argv (`argv(workers, command)`): one VM's runs `command`, several's
    run it tagged (shell.tagged_command). What start_sessions launches and a dry run prints."""
    return [
        (group, argv(str(group[0]), command))
        if len(group) == 1
        else (group, argv(",".join(map(str, group)), tagged_command(command)))
        for group in groups(vms, sessions)
    ]


def start_sessions(
    vms: Sequence[int],
    sessions: int,
    argv: Callable[[str, str], list[str]],
    command: str,
    workdir: Path,
    env: dict[str, str],
) -> list[Worker]:
    """A worker per VM, over at most `sessions` gcloud processes; `argv(workers, command)` is the ssh's."""
    workers = []
    for group, ssh in session_argvs(vms, sessions, argv, command):
        if len(group) == 1:
            w = group[0]
            workers.append(start_worker(f"worker-{w}", ssh, workdir, env, workdir / f"worker-{w}.log"))
            continue
        session = Session(ssh, group, workdir, env, workdir)
        workers += [Worker(f"worker-{w}", GroupedWorker(session, w), session.logs[w]) for w in group]
    return workers
