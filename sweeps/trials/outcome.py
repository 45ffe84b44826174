"""What the driver tells Optuna about a trial: pure functions of the trial's record.

`job_verdict`: a job of ours ended. The outcome its rank 0 stored is the truth (exit codes are only the
fallback: with ssh fan-out to many VMs they are not reliable).

`orphan_verdict`: a trial is orphaned when the driver that ran it is gone (its heartbeat went stale, or it never beat). Its job
may have finished and stored its outcome before or after the driver died: that outcome is the truth, and
throwing it away (fail, retry, resume at the last step) would spend a pod-hour and could record a failure for
finished work. Only a trial whose job recorded no usable outcome is failed and queued again.
"""

from __future__ import annotations

import errno
import math
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import TrialState

from contracts.out_of_memory import INFEASIBLE_OOM, out_of_memory
from storage.record import MEMORY_ATTR, PROGRESS_ATTR
from storage.trial_record import TrialOutcome, seed_prefix

# The exception classes whose failure a retry repeats: trm/run_end.py NOT_RETRYABLE by name (the platform does not
# import the trainer; tests/test_failure_classes.py holds the two equal), for an error the job raised before it
# could record one (its log's last exception line). Any other class is worth a retry, as the job itself decides.
CONFIGURATION_ERRORS = ("ValueError", "TypeError", "KeyError", "NonFiniteLossError", "RuntimeMismatchError")
# trm/run_end.py PERMANENT_ERRNOS: an OSError with one of these fails again on a retry (a full or read-only disk).
PERMANENT_ERRNOS = (
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.ENOTDIR,
    errno.ENAMETOOLONG,
)
# A Python exception's last line, `ValueError: ...` or `torch.OutOfMemoryError: ...`: the class (dotted module
# path allowed) and its message.
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Failure|Interrupt|Exit))(?::\s.*)?$")
# Exceptions a wrapper raises about the job's own (torchrun's): not the error the job raised.
WRAPPER_ERRORS = ("ChildFailedError",)


def raised_line(log_text: str | None) -> str | None:
    """The exception line (`ValueError: runtime.device=cuda but ...`) a job's log ends with: the last one in it,
    which is the error that ended the process (a chained traceback prints its cause first); None when the log
    shows none (a worker killed by a signal, a lost VM)."""
    found = None
    for line in (log_text or "").splitlines():
        match = EXCEPTION_LINE.match(line.rstrip())
        if match and match.group(1) not in WRAPPER_ERRORS:
            found = line.rstrip()
    return found


def error_class(line: str) -> str:
    """`ValueError` of `ValueError: ...`, `OutOfMemoryError` of `torch.OutOfMemoryError: ...`."""
    return line.split(":", 1)[0].strip().rsplit(".", 1)[-1]


def retry_repeats(line: str) -> bool:
    """Whether an error line is one a retry meets again (the job's own rule, trm/run_end.py Outcome.failed): a
    configuration error by its class, running out of memory, or an OSError whose errno a retry on the same disk
    meets again."""
    said = re.search(r"\[Errno (\d+)\]", line)
    permanent = said is not None and int(said.group(1)) in PERMANENT_ERRNOS
    return error_class(line) in CONFIGURATION_ERRORS or out_of_memory(line) or permanent


def first_step_done(attrs: Mapping[str, Any]) -> bool:
    """Whether the job (one seed's, unprefixed `attrs`) completed a training step: its `timing` has the stamp the
    job makes after its first step (trm/measures/clock.py `first_step_end`). A failure without it came from the set-up
    (config, device, data, resume checks), which every configuration of the study goes through."""
    timing = TrialOutcome.of(attrs).timing
    return isinstance(timing, dict) and "first_step_end" in timing


def seed_attrs(attrs: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The attributes the job of seed `index` stored, without their prefix (storage.trial_record.seed_prefix)."""
    prefix = seed_prefix(index)
    return {k[len(prefix) :]: v for k, v in attrs.items() if k.startswith(prefix)} if prefix else dict(attrs)


@dataclass(frozen=True)
class Verdict:
    state: TrialState
    values: list[float] = field(default_factory=list)  # COMPLETE: the objective value(s), mean over seeds
    reason: str = ""  # FAIL: why (kept as the trial's fail_reason)
    requeue: bool = (
        False  # FAIL: worth a retry, a copy with the same parameters (sweeps/trials/retry.py says if one is queued)
    )
    # FAIL by an error the job raised: its line (`ValueError: ...`, also the reason's first line), and whether it
    # was raised before the job's first step (sweeps/trials/retry.py stop_reason decides whether the study goes on).
    error_line: str | None = None
    before_first_step: bool = False
    # FAIL by the kernel's OOM killer (the job could store nothing): what the driver stores for it, as the job does
    # for an out-of-memory error it raised (TrialOutcome.infeasible and peak_memory_mb).
    infeasible: str | None = None
    peak_memory_mb: float | None = None


def orphan_verdict(
    attrs: Mapping[str, Any],
    seeds: int,
    values_of: Callable[[Mapping[str, Any]], list[float] | None],
    why: str,
) -> Verdict:
    """The verdict for an orphaned trial from its user attributes.

    `values_of` reads one seed's objective value(s) from its (unprefixed) attributes, None when missing or not
    finite; `why` says how the driver was found gone (for the reason of a re-queued trial)."""
    per_seed = [seed_attrs(attrs, i) for i in range(seeds)]
    outcomes = [TrialOutcome.of(seed) for seed in per_seed]
    if outcomes[0].outcome == "PRUNED":
        return Verdict(TrialState.PRUNED)
    failed = next((o for o in outcomes if o.outcome == "FAIL" and not o.retryable), None)
    if failed is not None:  # the configuration failed (bad input, divergence): running it again would repeat it
        return Verdict(TrialState.FAIL, reason=str(failed.error or "the job reported FAIL without a reason"))
    if all(o.outcome == "COMPLETE" for o in outcomes):
        values = [values_of(seed) for seed in per_seed]
        if all(v is not None for v in values):
            columns = list(zip(*values))
            return Verdict(TrialState.COMPLETE, values=[statistics.fmean(c) for c in columns])
    return Verdict(
        TrialState.FAIL,
        reason=f"{why}; its job recorded no outcome to keep",
        requeue=True,
    )


def job_verdict(
    attrs: Mapping[str, Any],
    values: list[float] | None,
    objective: str,
    *,
    exit_code: int,
    launcher_failure: str | None,
    cancelled: bool,
    memory_killed: str | None = None,
) -> Verdict:
    """The verdict for one seed's job that ended, from what it stored (`attrs`, unprefixed).

    `values`: its objective value(s) when it stored COMPLETE (None if missing or not finite); `launcher_failure`:
    the launcher's account of a failing worker (its name, exit code, last log lines); `cancelled`: we stopped it
    (a stall, an interrupt), so a missing outcome is not the job's fault but is already being handled;
    `memory_killed`: the kernel's OOM killer's evidence when it ended the job (contracts.out_of_memory
    killed_for_memory), which makes a job that stored no outcome infeasible, not worth a retry."""
    record = TrialOutcome.of(attrs)
    outcome = record.outcome
    if outcome == "COMPLETE":
        if values is None:
            return Verdict(TrialState.FAIL, reason=f"job finished without a finite {objective}")
        return Verdict(TrialState.COMPLETE, values=values)
    if outcome == "PRUNED":
        return Verdict(TrialState.PRUNED)
    if outcome == "PREEMPTED":
        return Verdict(
            TrialState.FAIL,
            reason=f"preempted at step {record.steps} (checkpoint saved)",
            requeue=True,
        )
    if outcome == "FAIL":
        error = str(record.error or "the job reported FAIL without a reason")
        reason = error
        if record.infeasible:  # too large for the machine: its line says so first, and what it reached
            peak = record.peak_memory_mb
            reached = f", peak {peak:.0f} MiB" if isinstance(peak, (int, float)) else ""
            reason = f"infeasible ({record.infeasible}{reached}), not retried: {error}"
        if launcher_failure:
            reason = f"{reason}\n{launcher_failure}"
        # A lost peer or connection is worth a retry; the configuration's own failure is not.
        return Verdict(
            TrialState.FAIL,
            reason=reason,
            requeue=bool(record.retryable) and not cancelled,
            error_line=error.splitlines()[0] if record.error else None,
            before_first_step=not first_step_done(attrs),
        )
    # No outcome, killed by the kernel for its memory: the configuration's own (a retry is killed again), with the
    # peak its job sampled; the study goes on (sweeps/trials/retry.py stop_reason: out of memory never stops it).
    if memory_killed is not None and not cancelled:
        sampled = attrs.get(MEMORY_ATTR)
        peak = sampled.get("peak_mb") if isinstance(sampled, dict) else None
        reached = f", peak {peak:.0f} MiB" if isinstance(peak, (int, float)) else ""
        tail = f"\n{launcher_failure}" if launcher_failure else ""
        return Verdict(
            TrialState.FAIL,
            reason=f"infeasible ({INFEASIBLE_OOM}{reached}), not retried: {memory_killed}{tail}",
            error_line=memory_killed,
            before_first_step=not isinstance(attrs.get(PROGRESS_ATTR), dict),
            infeasible=INFEASIBLE_OOM,
            peak_memory_mb=float(peak) if isinstance(peak, (int, float)) else None,
        )
    # No outcome, and an exception in the job's log: it raised before it reached the study (a device or config
    # check before its trial link): its line leads the reason (what a summary counts), and it is retried only
    # when a retry could get past it (retry_repeats, the job's own rule).
    line = None if cancelled else raised_line(launcher_failure)
    if line is not None:
        return Verdict(
            TrialState.FAIL,
            reason=f"{line}\n{launcher_failure}",
            requeue=not retry_repeats(line),
            error_line=line,
            before_first_step=not isinstance(attrs.get(PROGRESS_ATTR), dict),
        )
    # No outcome, no error of its own: the job died before rank 0 could store one (a killed or crashed worker, a
    # lost VM). That is not the configuration's fault: fail it with the worker named, worth a retry.
    if launcher_failure:
        # "worker-0 exited with code -9; last log lines:" would lead the reason (and a summary) with a dangling colon
        head, newline, tail = launcher_failure.partition("\n")
        worker, said, _ = head.partition("; last log lines:")
        reason = f"{worker} without recording an outcome\nlast log lines:\n{tail}" if said else launcher_failure
    else:
        reason = f"the job exited with code {exit_code} without recording an outcome"
    return Verdict(TrialState.FAIL, reason=reason, requeue=not cancelled)


def objective_values(attrs: Mapping[str, Any], objective: str, extra: list[str], use_best: bool) -> list[float] | None:
    """One seed's objective value(s) from its (unprefixed) attributes: the objective (its best value when
    `use_best`, else its final one), then each extra objective; None if any is missing or not finite."""
    record = TrialOutcome.of(attrs)
    final = record.final_metrics
    values = [record.best_value if use_best else final.get(objective)]
    values += [attrs.get(name, final.get(name)) for name in extra]
    out: list[float] = []
    for value in values:
        if value is None or not math.isfinite(float(value)):
            return None
        out.append(float(value))
    return out


def seed_mean(per_seed: list[list[float]]) -> list[float]:
    """A trial's value(s): the mean over its seeds of each objective."""
    return [statistics.fmean(v[i] for v in per_seed) for i in range(len(per_seed[0]))]


def clip_line(line: str, limit: int) -> str:
    """`line` in at most `limit` characters: cut after a whole word and marked ` ...`, never mid-word (`no space left
    on the de` read as the error itself)."""
    if len(line) <= limit:
        return line
    cut = line[: max(1, limit - 4)]
    head = cut.rsplit(" ", 1)[0] if " " in cut.strip() else cut
    return f"{head.rstrip(' ;,:(')} ..."


def clip_reason(reason: str, limit: int = 2000) -> str:
    """A failure reason short enough for a trial attribute: its first line (the error) and its end (the log tail)."""
    if len(reason) <= limit:
        return reason
    head = clip_line(reason.splitlines()[0], limit // 4)
    return f"{head}\n...\n{reason[-(limit - len(head) - 5) :]}"
