"""What the driver tells Optuna about a trial: pure functions of the trial's record.

`job_verdict`: a job of ours ended. The outcome its rank 0 stored is the truth (exit codes are only the
fallback: with ssh fan-out to many VMs they are not reliable).

`orphan_verdict`: a trial is orphaned when the driver that ran it is gone (its heartbeat went stale, or it never beat). Its job
may have finished and stored its outcome before or after the driver died: that outcome is the truth, and
throwing it away (fail, retry, resume at the last step) would spend a pod-hour and could record a failure for
finished work. Only a trial whose job recorded no usable outcome is failed and queued again.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import TrialState

from storage.record import trial_detail


def seed_prefix(index: int) -> str:
    """Where the job of seed `index` stores its outcome on the trial (seed 0: no prefix)."""
    return f"seed{index}/" if index else ""


def seed_attrs(attrs: Mapping[str, Any], index: int) -> dict[str, Any]:
    """The attributes the job of seed `index` stored, without their prefix."""
    prefix = seed_prefix(index)
    return {k[len(prefix) :]: v for k, v in attrs.items() if k.startswith(prefix)} if prefix else dict(attrs)


@dataclass(frozen=True)
class Verdict:
    state: TrialState
    values: list[float] = field(default_factory=list)  # COMPLETE: the objective value(s), mean over seeds
    reason: str = ""  # FAIL: why (kept as the trial's fail_reason)
    requeue: bool = (
        False  # FAIL: worth a retry, a copy with the same parameters (sweeps/retry.py says if one is queued)
    )


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
    if per_seed[0].get("outcome") == "PRUNED":
        return Verdict(TrialState.PRUNED)
    failed = next((seed for seed in per_seed if seed.get("outcome") == "FAIL" and not seed.get("retryable")), None)
    if failed is not None:  # the configuration failed (bad input, divergence): running it again would repeat it
        return Verdict(TrialState.FAIL, reason=str(failed.get("error") or "the job reported FAIL without a reason"))
    if all(seed.get("outcome") == "COMPLETE" for seed in per_seed):
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
) -> Verdict:
    """The verdict for one seed's job that ended, from what it stored (`attrs`, unprefixed).

    `values`: its objective value(s) when it stored COMPLETE (None if missing or not finite); `launcher_failure`:
    the launcher's account of a failing worker (its name, exit code, last log lines); `cancelled`: we stopped it
    (a stall, an interrupt), so a missing outcome is not the job's fault but is already being handled."""
    outcome = attrs.get("outcome")
    if outcome == "COMPLETE":
        if values is None:
            return Verdict(TrialState.FAIL, reason=f"job finished without a finite {objective}")
        return Verdict(TrialState.COMPLETE, values=values)
    if outcome == "PRUNED":
        return Verdict(TrialState.PRUNED)
    if outcome == "PREEMPTED":
        steps = attrs.get("steps")
        return Verdict(
            TrialState.FAIL,
            reason=f"preempted at step {steps} (checkpoint saved)",
            requeue=True,
        )
    if outcome == "FAIL":
        reason = str(attrs.get("error") or "the job reported FAIL without a reason")
        if launcher_failure:
            reason = f"{reason}\n{launcher_failure}"
        # A lost peer or connection is worth a retry; the configuration's own failure is not.
        return Verdict(TrialState.FAIL, reason=reason, requeue=bool(attrs.get("retryable")) and not cancelled)
    # No outcome: the job died before rank 0 could store one (a killed or crashed worker, a lost VM). That is not
    # the configuration's fault: fail it with the worker named, worth a retry.
    reason = launcher_failure or f"the job exited with code {exit_code} without recording an outcome"
    return Verdict(TrialState.FAIL, reason=reason, requeue=not cancelled)


def objective_values(attrs: Mapping[str, Any], objective: str, extra: list[str], use_best: bool) -> list[float] | None:
    """One seed's objective value(s) from its (unprefixed) attributes: the objective (its best value when
    `use_best`, else its final one), then each extra objective; None if any is missing or not finite."""
    final = trial_detail(attrs, "final_metrics") or {}
    values = [attrs.get("best_value") if use_best else final.get(objective)]
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


def clip_reason(reason: str, limit: int = 2000) -> str:
    """A failure reason short enough for a trial attribute: its first line (the error) and its end (the log tail)."""
    if len(reason) <= limit:
        return reason
    head = reason.splitlines()[0][: limit // 4]
    return f"{head}\n...\n{reason[-(limit - len(head) - 5) :]}"
