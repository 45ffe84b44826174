"""The warm worker's line protocol, between the local launcher (sweeps/launchers/warm.py) and the worker
(trm/warm_worker.py): one JSON object per line. The launcher writes a `JobRequest` per job on the worker's stdin;
the worker answers on its stdout with `Ready` once, `Started` per request and `Exited` per child that ended. An
answer is told apart by the one key that names its kind (`ready`, `started`, `exited`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class JobRequest:
    """Start `python -m trm.train <argv>` in `cwd`, with exactly `env`, writing stdout and stderr to `log`."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    log: str

    def line(self) -> bytes:
        return (json.dumps(asdict(self)) + "\n").encode()

    @classmethod
    def parse(cls, line: bytes | str) -> JobRequest:
        return cls(**json.loads(line))


@dataclass(frozen=True)
class Ready:
    """The worker imported everything and takes requests."""

    pid: int


@dataclass(frozen=True)
class Started:
    """The job of the last request runs as process `pid`."""

    pid: int


@dataclass(frozen=True)
class Exited:
    """Job `pid` ended with exit code `code` (the worker is its parent: only it can wait for it)."""

    pid: int
    code: int


Answer = Ready | Started | Exited


def encode(answer: Answer) -> str:
    """One answer as its line (without the newline)."""
    if isinstance(answer, Exited):
        return json.dumps({"exited": answer.pid, "code": answer.code})
    return json.dumps({"ready" if isinstance(answer, Ready) else "started": answer.pid})


def decode(line: bytes | str) -> Answer:
    """An answer line read back; a line of no known kind is refused (a worker of another version)."""
    message = json.loads(line)
    if "exited" in message:
        return Exited(int(message["exited"]), int(message["code"]))
    if "started" in message:
        return Started(int(message["started"]))
    if "ready" in message:
        return Ready(int(message["ready"]))
    raise ValueError(f"warm worker answered {message!r}: not one of ready, started, exited")
