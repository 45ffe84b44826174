"""The study record's names: what the sweep driver writes on a study and the training job reads.

The record is the contract between the driver and the job (docs/architecture.md, "The contracts between parts"):
the channel back from a job; its names live here, in `storage`, which both sides may import. The study's facts and
a trial's are typed records (storage/study_record.py: StudyAttrs; storage/trial_record.py: TrialLaunch,
TrialOutcome; Reeval here): writers and readers go through them. The names below are the attributes no record
holds: the driver's own per-attempt marks and the typed dicts a job rewrites as it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

# What the evidence wrapper (contracts/pruning/evidence.py) measured, rewritten whenever it changes
# (StudyAttrs.pruner_evidence).


class RungEvidence(TypedDict):
    """One reported step: Kendall's tau between the audit trials' values there and their final values (None:
    undefined, e.g. all equal), over `n` audit trials; `on`: the wrapped pruner may prune there."""

    tau: float | None
    n: int
    on: bool
    near_best_cut: NotRequired[list[int]]  # check=near_best: the near-best audits the wrapped pruner would cut here


class EvidenceRecord(TypedDict):
    audit_trials: list[int]  # completed audit trials (never pruned) the agreement is measured on
    min_audit: int
    min_agreement: float
    rungs: dict[str, RungEvidence]  # by step (a string: study attributes are JSON)
    check: NotRequired[str]  # "near_best" (absent: the rank agreement, as before the check was a choice)
    near_best: NotRequired[list[int]]  # check=near_best: the audits within one eval standard error of their best


# Trial attribute of a draw refused because another trial has exactly its parameters: the other's number.
DUPLICATE_OF_ATTR = "duplicate_of"
# Trial attribute of a trial whose job failed on an error it raised: the error's line (`ValueError: ...`), as the
# driver read it from the job's record or log. The same line in two configurations stops the study (sweeps.trials.retry).
JOB_ERROR_ATTR = "job_error"
# Trial attribute: the job failed on its machine (a disk full, missing rights), not its configuration: once fixed,
# the same sweep command resumes it from its checkpoint (sweeps/trials/rerun.py). True or False beside `error`.
RUN_AGAIN_ATTR = "run_again"
# Trial attribute of an attempt the driver set aside because its machine went away under it (a TPU slice
# PREEMPTED, STOPPED or REPAIRING: the launcher's line); it failed through no fault of its configuration.
PREEMPTED_ATTR = "preempted"
# Trial attribute a retry copy carries (Optuna copies user attributes): how many attempts of its chain were set
# aside (PREEMPTED_ATTR) and so spend no retry of heartbeat.max_retry (sweeps.trials.retry.retries_used).
RETRIES_NOT_SPENT_ATTR = "retries_not_spent"
# Trial attribute of a trial its machine cannot train (why: contracts/out_of_memory.py's INFEASIBLE_OOM): its job
# ran out of memory. Not retried, and no reason to stop the study: a smaller configuration fits.
INFEASIBLE_ATTR = "infeasible"
# Trial attribute of a trial that was asked and failed before any job of it started (why): it trained nothing.
NOT_STARTED_ATTR = "not_started"
# Optuna cannot delete a trial, so these stay FAIL in its record (and in optuna-dashboard's counts); each carries
# one of these attributes, and every count and table of ours leaves it out (`trained_trials`).
UNTRAINED_ATTRS = (DUPLICATE_OF_ATTR, NOT_STARTED_ATTR)


def untrained(trial: FrozenTrial) -> bool:
    """Whether the trial trained nothing: a refused repeat, or a trial failed before any job of it started."""
    return any(trial.user_attrs.get(attr) is not None for attr in UNTRAINED_ATTRS)


def trained_trials(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials less those that trained nothing (`untrained`): what the budget, counts and tables take."""
    return [t for t in trials if not untrained(t)]


# Trial attribute the job's rank 0 rewrites at every log point (a ProgressRecord): the driver stops a job whose
# step stops moving (a hung or SIGSTOPped worker) after `stall_timeout_s`, on its own clock.
PROGRESS_ATTR = "progress"


class ProgressRecord(TypedDict):
    step: int  # the step of the log point
    at: float  # when, in epoch seconds on the job's clock
    # Where this job's steps began (a resumed job starts past 0) and when: the driver's ETA reads the job's own
    # pace from them (sweeps.trials.progress). Absent in records written before they existed.
    first_step: NotRequired[int]
    first_at: NotRequired[float]


# Trial attribute: what a job's rank 0 samples of its host memory while it runs (trm/measures/memory_watch.py), from before
# its set-up: the record a job the kernel's OOM killer ended leaves (it stores no outcome). The driver reads it to
# tell such a kill from another SIGKILL (contracts/out_of_memory.py killed_for_memory).
MEMORY_ATTR = "memory"


class MemoryRecord(TypedDict):
    peak_mb: float  # the job's peak resident set so far, in MiB (the kernel's high-water mark at the last sample)
    at: float  # when it was sampled, in epoch seconds on the job's clock
    limit_mb: NotRequired[float]  # the job's memory limit: its cgroup's, else the machine's RAM
    # Its memory cgroup's OOM kill count file on the job's machine (memory.events or memory.oom_control) and the
    # count when the job started: a count risen by the time the job is found killed is the OOM killer's evidence.
    cgroup_events: NotRequired[str]
    oom_kills: NotRequired[int]


# Trial attributes the driver stores per attempt, beside the job's TrialOutcome (storage/trial_record.py): why it
# failed, and with several seeds each seed's objective and their standard deviation; and in `details` its own launch
# and exit times. The driver clears them on a retry with the job's (storage.trial_record.ATTEMPT_ATTRS).
FAIL_REASON_ATTR = "fail_reason"
SEED_VALUES_ATTR = "seed_values"
SEED_STD_ATTR = "seed_std"
DRIVER_TIMING_DETAIL = "driver_timing"

# A trial's system attribute: the heartbeat.grace_s of the driver that runs it. Another driver judges the trial
# orphaned only after the longer of its own grace and this one: a driver started with a shorter grace would
# otherwise fail a live driver's trials between two of its beats.
HEARTBEAT_GRACE_ATTR = "heartbeat_grace_s"

# A trial's wide, nested facts (timing stamps, every final metric, the full override list) live in one
# attribute, `details`, so that the dashboard's and the CLI's attribute tables show what a user reads (outcome,
# best value and step, steps, size, compute, code version, checkpoint) flat and short. Readers take them through
# `trial_detail`; writers merge into the attribute with `merged_details` (the driver writes train_overrides at
# launch and driver_timing at the end, the job final_metrics and timing in between: never at the same time).
DETAILS_ATTR = "details"
# Step speed and compile counts (trm/measures/throughput.py), read by sweeps.utilization.
THROUGHPUT_DETAIL = "throughput"


def trial_detail(attrs: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """One nested fact of a trial from its user attributes (an attribute of its own in records written before
    `details` existed)."""
    if key in attrs:
        return attrs[key]
    details = attrs.get(DETAILS_ATTR)
    return details.get(key, default) if isinstance(details, dict) else default


def merged_details(attrs: Mapping[str, Any], prefix: str = "", **facts: Any) -> dict[str, Any]:
    """The `details` attribute (under `prefix`, a seed's) with `facts` added to what it holds."""
    current = attrs.get(prefix + DETAILS_ATTR)
    return {**(current if isinstance(current, dict) else {}), **facts}


def samples_per_s(attrs: Mapping[str, Any]) -> float | None:
    """The steady-state training speed a trial's job measured (its `throughput` detail), if it measured one."""
    speed = trial_detail(attrs, THROUGHPUT_DETAIL)
    value = speed.get("samples_per_s") if isinstance(speed, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# The re-evaluation of a trial's best checkpoint on a larger eval (trm/reeval.py writes it, sweeps/trials/reeval.py ranks
# by it): a study attribute per trial, `reeval:<trial number>`, since Optuna refuses writes to a finished trial
# and its value stays what the trial reported. The value is the objective over `examples` test puzzles; `stderr`
# its binomial standard error sqrt(p(1-p)/examples) (None for an objective that is not a share, such as a loss).
REEVAL_ATTR_PREFIX = "reeval:"


def reeval_attr(number: int) -> str:
    """The study attribute holding trial `number`'s re-evaluation."""
    return f"{REEVAL_ATTR_PREFIX}{number}"


@dataclass(frozen=True)
class Reeval:
    """One trial's re-evaluation, as stored (`as_dict`) and read back (`of`)."""

    trial: int
    metric: str  # the study's objective, e.g. eval/exact_accuracy
    value: float
    stderr: float | None
    examples: int  # test puzzles evaluated
    step: int  # the training step of the checkpoint evaluated
    checkpoint: str  # its URL
    # Why a later re-evaluation of this trial failed (the driver's line: its checkpoint gone or unreadable): the
    # value is the earlier one's, and the trial cannot be reused as it stands. None: the latest one succeeded.
    failed: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, stored: Any) -> Reeval | None:
        """The record from a study attribute's value; None when it is not one (absent, or written by another version).
        A record from before `failed` existed reads with failed=None."""
        names = {f.name for f in fields(cls)}
        if not isinstance(stored, dict) or not names - {"failed"} <= set(stored) <= names:
            return None
        return cls(**stored)


def reevals(study_attrs: Mapping[str, Any]) -> dict[int, Reeval]:
    """Every trial's re-evaluation stored on the study: {trial number: Reeval}."""
    out = {}
    for key, value in study_attrs.items():
        if key.startswith(REEVAL_ATTR_PREFIX) and (record := Reeval.of(value)) is not None:
            out[record.trial] = record
    return out
