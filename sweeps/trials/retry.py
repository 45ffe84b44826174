"""Whether a failed trial is queued again, and a line that says what really happens to it.

A trial that failed through no fault of its configuration (a killed worker, a stall, an interrupt, a driver that
died) is queued again with the same parameters (Optuna's RetryHeartbeatStaleTrialCallback) unless it used its
`heartbeat.max_retry` retries. The line says which, and whether the retry resumes a checkpoint or starts over:
"queued again, resumes from its checkpoint" was said before where nothing was queued, or no checkpoint existed.

An error the job raised can also stop the study (`stop_reason`): one raised before its first step that a retry
would meet again (a config or device check every configuration goes through), or the same error line in two
configurations. Retrying it, or drawing more, would burn the budget on the same line: the driver stops at once
and its last line is the job's own error (StudyStoppedByJobError).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
from optuna.trial import FrozenTrial

from contracts.out_of_memory import out_of_memory
from storage.heartbeat import retry_history
from storage.record import JOB_ERROR_ATTR, RETRIES_NOT_SPENT_ATTR
from sweeps.config.config_values import SweepConfigError
from sweeps.trials.outcome import error_class
from sweeps.trials.paths import url_exists

log = logging.getLogger("sweeps")

# What a run resumes from (trm/checkpoints/checkpoint.py's LATEST and PREVIOUS; named here so that the driver does not
# import torch): either one in a chain's checkpoint directory means its retry resumes.
RESUMABLE = ("latest.pt", "previous.pt")


@dataclass(frozen=True)
class RetryPlan:
    queued: bool  # a WAITING copy of the trial is (to be) queued
    note: str  # what happens, for the trial's fail_reason and the driver's line


def retries_used(trial: FrozenTrial) -> int:
    """How many retries of heartbeat.max_retry this trial's chain spent: the times its configuration was queued
    again, less those after an attempt its machine was taken from (storage.record.RETRIES_NOT_SPENT_ATTR)."""
    return len(retry_history(trial)) - int(trial.user_attrs.get(RETRIES_NOT_SPENT_ATTR) or 0)


def visible_here(checkpoint_url: str | None, shares_filesystem: bool) -> str | None:
    """`checkpoint_url` where this machine can look into it: a URL of a store (gs://...), or a path when the
    workers write to this machine's disk; None for a path on the workers' own disks (a pod's worker 0), where
    nothing here can tell whether a checkpoint was written."""
    if checkpoint_url is None:
        return None
    protocol, _ = fsspec.core.split_protocol(checkpoint_url)
    return checkpoint_url if shares_filesystem or protocol not in (None, "file", "local") else None


def checkpoint_written(checkpoint_url: str | None) -> bool | None:
    """Whether a retry chain's checkpoint directory holds a checkpoint to resume; None when it cannot be told
    (no URL recorded, the store unreachable)."""
    if not checkpoint_url:
        return None
    found = [url_exists(f"{checkpoint_url.rstrip('/')}/{name}") for name in RESUMABLE]
    return True if True in found else (None if None in found else False)


def plan_retry(trial: FrozenTrial, max_retry: int, checkpoint_url: str | None) -> RetryPlan:
    """What happens to `trial` (failed, worth a retry) under `heartbeat.max_retry`: the same rule as Optuna's
    callback, which the driver then calls (tests/test_study_record.py checks the two agree)."""
    used = retries_used(trial)
    if used >= max_retry:
        why = "heartbeat.max_retry=0" if max_retry == 0 else f"retried {used} time(s) (heartbeat.max_retry={max_retry})"
        return RetryPlan(False, f"not queued again: {why}")
    return RetryPlan(
        True, f"queued again (retry {used + 1} of {max_retry}), {resume_note(checkpoint_written(checkpoint_url))}"
    )


def resume_note(written: bool | None) -> str:
    """How a retry starts, given whether its chain's checkpoint was written (None: not known)."""
    if written is None:
        return "resumes from its checkpoint if one was written"
    return "resumes from its checkpoint" if written else "starts over (no checkpoint was written)"


def retry_of(number: int, origin: int, checkpoint_url: str | None) -> str:
    """` (retry of trial 3, resumes from its checkpoint)` for a trial's start line; "" for a chain's first trial."""
    if origin == number:
        return ""
    return f" (retry of trial {origin}, {resume_note(checkpoint_written(checkpoint_url))})"


def with_note(reason: str, note: str) -> str:
    """`reason` with `note` at the end of its first line (the line logs and tables show; a log tail follows)."""
    first, newline, rest = reason.partition("\n")
    return f"{first}; {note}{newline}{rest}"


def without_note(line: str) -> str:
    """A reason's first line without the retry note `with_note` put at its end (plan_retry's: "queued again ..."
    or "not queued again: ..."): what failed, the same for every attempt of a chain."""
    for marker in ("; queued again", "; not queued again"):
        line = line.split(marker, 1)[0]
    return line


# Errors decided by the configuration itself even when two share their words: a divergence ("non-finite loss at
# step 10: lm_loss=nan" in two learning rates) and running out of memory (two large models). Neither stops a study.
OWN_CONFIGURATION_ERRORS = ("NonFiniteLossError", "OutOfMemoryError")


class StudyStoppedByJobError(SweepConfigError):
    """A job's error that every configuration would meet (`stop_reason`): the study stops on it. Its message is
    the job's own error line (sweeps.run prints it as the driver's last line, exit 2 as any bad input)."""


def stop_reason(
    line: str,
    before_first_step: bool,
    retry_helps: bool,
    params: Mapping[str, Any],
    others: Iterable[FrozenTrial],
) -> str | None:
    """Why a trial's failure with the job's error `line` stops the study, or None when the study goes on.

    `before_first_step`: the job raised it in its set-up (sweeps.trials.outcome.first_step_done); `retry_helps`: the job
    (or, for an error it could not record, its class: sweeps.trials.outcome.retry_repeats) says a retry may get past it;
    `params`: the failed trial's; `others`: the study's failed trials, each carrying its job's error line
    (JOB_ERROR_ATTR). A retry of the same configuration (the same params) is not another configuration, but a
    retry that met the same line before its first step shows that retrying does not get past it."""
    if error_class(line) in OWN_CONFIGURATION_ERRORS or out_of_memory(line):  # a large model's own fault
        return None
    if before_first_step and not retry_helps:
        return "the job raised it before its first step, in the set-up every configuration goes through"
    params = dict(params)
    for other in others:
        if other.user_attrs.get(JOB_ERROR_ATTR) != line:
            continue
        if other.params != params:
            return f"trial {other.number}, another configuration, failed with the same error"
        if before_first_step:
            return f"trial {other.number}, the same configuration, failed with it too: a retry does not get past it"
    return None
