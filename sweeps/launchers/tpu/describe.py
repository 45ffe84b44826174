"""Asking gcloud about the slice: `tpu-vm describe` with retries, what its failures mean, and waiting for READY.

An API call fails for reasons that say nothing about the slice: a 5xx or 429 of the TPU API, a slow answer, a
credential that needs `gcloud auth login` again. Such a failure is retried with backoff (launcher.
describe_attempts, launcher.describe_backoff_s doubling), then logged and taken as "nothing known": the study goes
on as it was. Only what the API says about the slice stops it: a state other than READY, an unhealthy `health`
(sweeps/launchers/tpu/slice.py: gone_line), or NOT_FOUND (a deleted slice; a queued resource's is deleted and
recreated). gcloud prints an API error as `ERROR: (gcloud.<command>) <STATUS>: <message>` (googlecloudsdk's
api_lib/util/exceptions.py: the error's `status`, e.g. NOT_FOUND, UNAVAILABLE, RESOURCE_EXHAUSTED) and exits 1.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeps.launchers.base import LauncherConfigError, MachineUnavailableError
from sweeps.launchers.tpu.slice import gone_line

log = logging.getLogger(__name__)

ON_PREEMPTED = ("wait", "exit")  # launcher.on_preempted: what a study does while its slice is not usable
NOT_FOUND = re.compile(r"\bNOT_FOUND\b|HTTPError 404\b")  # the API's status name, or its bare code


@dataclass(frozen=True)
class Answer:
    """One describe, after its retries: exactly one of `node` (the Node), `not_found` (the API says there is no
    such slice) and `error` (every attempt failed otherwise: nothing is known about the slice)."""

    node: Mapping[str, Any] | None = None
    not_found: str | None = None
    error: str | None = None

    def gone(self, name: str) -> str | None:
        """The line saying the slice is not usable, or None (usable, or nothing known: see `error`)."""
        if self.not_found is not None:
            return f"slice {name} is not found ({self.not_found})"
        return None if self.node is None else gone_line(name, self.node)


def error_line(stderr: str, code: int) -> str:
    """gcloud's `ERROR: ...` line (a reauth error ends with its advice lines), else its last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("ERROR:")), lines[-1] if lines else f"exit {code}")[-400:]


def describe_once(argv: Sequence[str], timeout_s: float) -> Answer:
    """Run `argv` (the describe command line) once."""
    try:
        proc = subprocess.run(list(argv), check=False, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Answer(error=f"no answer in {timeout_s:g} s (launcher.ssh_timeout_s)")
    except OSError as err:  # no such program: validate names launcher.gcloud before a study runs
        return Answer(error=f"launcher.gcloud={argv[0]!r} cannot run ({err.strerror})")
    if proc.returncode != 0:
        line = error_line(proc.stderr, proc.returncode)
        return Answer(not_found=line) if NOT_FOUND.search(proc.stderr) else Answer(error=line)
    try:
        node = json.loads(proc.stdout)
    except ValueError:
        node = None
    if not isinstance(node, dict):
        return Answer(error=f"`--format=json` printed no JSON object: {proc.stdout.strip()[:200]!r}")
    return Answer(node=node)


def describe(
    argv: Sequence[str], timeout_s: float, attempts: int, backoff_s: float, sleep: Callable[[float], None] = time.sleep
) -> Answer:
    """Describe, retrying an error (not a NOT_FOUND) up to `attempts` times, `backoff_s` doubling between them."""
    answer = Answer(error="not asked")
    for attempt in range(attempts):
        answer = describe_once(argv, timeout_s)
        if answer.error is None:
            return answer
        if attempt < attempts - 1:
            log.info("tpu-vm describe failed (%s): asking again in %g s", answer.error, backoff_s * 2**attempt)
            sleep(backoff_s * 2**attempt)
    return answer


def unknown_line(name: str, answer: Answer, attempts: int) -> str:
    return f"slice {name} could not be described in {attempts} attempt(s): {answer.error}"


def refuse_unknown(name: str, answer: Answer, attempts: int) -> None:
    """Where the slice's shape is needed and no Node came back: one line naming what to check."""
    why = answer.gone(name) if answer.not_found is not None else unknown_line(name, answer, attempts)
    raise LauncherConfigError(
        f"launcher.tpu_name={name!r}: {why} (check launcher.tpu_name, launcher.zone, launcher.project and `gcloud "
        "auth login`; launcher.describe_attempts retries an error more)"
    )


def wait_for_ready(line: str, not_ready: Callable[[], str | None], on_preempted: str, poll_s: float) -> None:
    """Return once `not_ready()` says nothing (usable), asking every `poll_s`; raise MachineUnavailableError at
    once where launcher.on_preempted=exit. One warning per line seen, not one per poll."""
    if on_preempted == "exit":
        raise MachineUnavailableError(
            f"{line}: the driver ends (launcher.on_preempted=exit); trials that were running were queued again, "
            "spending no retry; run the same command once the slice is READY to continue the study"
        )
    log.warning(
        "%s: the study waits until it is READY, asking every %g s (launcher.state_poll_s; launcher.on_preempted="
        "exit ends the driver instead)",
        line,
        poll_s,
    )
    while (now := not_ready()) is not None:
        if now != line:
            log.warning("%s: still waiting", now)
            line = now
        time.sleep(poll_s)
