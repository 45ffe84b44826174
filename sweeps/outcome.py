"""What the driver tells Optuna about a trial whose driver died: a pure function of the trial's record.

A trial is orphaned when the driver that ran it is gone (its heartbeat went stale, or it never beat). Its job
may have finished and stored its outcome before or after the driver died: that outcome is the truth, and
throwing it away (fail, retry, resume at the last step) would spend a pod-hour and could record a failure for
finished work. Only a trial whose job recorded no usable outcome is failed and queued again.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from optuna.trial import TrialState


def seed_prefix(index: int) -> str:
    """Where the job of seed `index` stores its outcome on the trial (seed 0: no prefix)."""
    return f"seed{index}/" if index else ""


@dataclass(frozen=True)
class Verdict:
    state: TrialState
    values: list[float] = field(default_factory=list)  # COMPLETE: the objective value(s), mean over seeds
    reason: str = ""  # FAIL: why (kept as the trial's fail_reason)
    requeue: bool = False  # FAIL: queue a copy with the same parameters (resumes from its checkpoint)


def orphan_verdict(
    attrs: Mapping[str, Any],
    seeds: int,
    values_of: Callable[[Mapping[str, Any]], list[float] | None],
    why: str,
) -> Verdict:
    """The verdict for an orphaned trial from its user attributes.

    `values_of` reads one seed's objective value(s) from its (unprefixed) attributes, None when missing or not
    finite; `why` says how the driver was found gone (for the reason of a re-queued trial)."""
    per_seed = [{k[len(seed_prefix(i)):]: v for k, v in attrs.items() if k.startswith(seed_prefix(i))} if i else dict(attrs) for i in range(seeds)]
    if per_seed[0].get("outcome") == "PRUNED":
        return Verdict(TrialState.PRUNED)
    failed = next((seed for seed in per_seed if seed.get("outcome") == "FAIL" and not seed.get("retryable")), None)
    if failed is not None:  # the configuration failed (bad input, divergence): running it again would repeat it
        return Verdict(TrialState.FAIL, reason=str(failed.get("error") or "the job reported FAIL without a reason"))
    if all(seed.get("outcome") == "COMPLETE" for seed in per_seed):
        values = [values_of(seed) for seed in per_seed]
        if all(v is not None for v in values):
            columns = list(zip(*values))  # type: ignore[arg-type]
            return Verdict(TrialState.COMPLETE, values=[statistics.fmean(c) for c in columns])
    return Verdict(TrialState.FAIL, reason=f"{why}; its job recorded no outcome to keep: queued again, resumes from its checkpoint", requeue=True)
