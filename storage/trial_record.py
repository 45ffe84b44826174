"""A trial's facts as typed records: what the driver stores when it launches a trial (`TrialLaunch`) and what the
job's rank 0 stores when it ends (`TrialOutcome`).

Every writer builds a record and stores its `as_attrs()`; every reader takes `of(trial.user_attrs)` and reads its
fields. A new trial fact is one field here: its writers and readers see it by type, and a TrialOutcome field is
cleared on a retry by being one (`ATTEMPT_ATTRS`). The attribute names are the fields' names, as studies on disk
and optuna-dashboard have them; the other names of the study record live in storage/record.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, ClassVar, TypeVar, cast

from storage.record import (
    DETAILS_ATTR,
    DRIVER_TIMING_DETAIL,
    FAIL_REASON_ATTR,
    JOB_ERROR_ATTR,
    MEMORY_ATTR,
    PREEMPTED_ATTR,
    PROGRESS_ATTR,
    SEED_STD_ATTR,
    SEED_VALUES_ATTR,
    merged_details,
    trial_detail,
)


# The seeds of one trial (study.seeds > 1): seed i > 0's job stores its outcome under "seed<i>/" (seed 0: no prefix).
def seed_prefix(index: int) -> str:
    """Where the job of seed `index` stores its outcome on the trial."""
    return f"seed{index}/" if index else ""


# A trial fact is one field of a record below: its name is the attribute's name on the trial (as stored on studies
# already on disk, and as optuna-dashboard shows it). Its metadata says where it is stored: a flat attribute (`FLAT`),
# or a key of `details` (`DETAIL`); and whether it is written only when set (`WHEN_SET`: absent rather than None).
FLAT: dict[str, bool] = {"detail": False, "when_set": False}
DETAIL: dict[str, bool] = {"detail": True, "when_set": False}
WHEN_SET: dict[str, bool] = {"detail": False, "when_set": True}
DETAIL_WHEN_SET: dict[str, bool] = {"detail": True, "when_set": True}
CHIPS_OVERRIDE = "runtime.expected_devices="  # an older record's only word of its chips (TrialLaunch.of)
R = TypeVar("R", bound="TrialFacts")


class TrialFacts:
    """What TrialLaunch and TrialOutcome share: stored with `as_attrs`, read back with `of`, named with `names_of`."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def as_attrs(self, stored: Mapping[str, Any] | None = None, prefix: str = "") -> dict[str, Any]:
        """{attribute name: value} to store on the trial, under `prefix` (a seed's). The nested facts are merged
        into the `details` that `stored` (the trial's attributes) holds under the prefix, a fresh one without it;
        `details` comes first: the driver acts once it sees `outcome`, which must find the rest written."""
        out: dict[str, Any] = {}
        nested: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None or not f.metadata["when_set"]:
                (nested if f.metadata["detail"] else out)[f.name] = value
        details = merged_details(stored or {}, prefix, **nested)
        return {prefix + DETAILS_ATTR: details, **{prefix + k: v for k, v in out.items()}}

    @classmethod
    def of(cls: type[R], user_attrs: Mapping[str, Any], prefix: str = "") -> R:
        """The record from a trial's user attributes (under `prefix`, a seed's). A fact not stored (a record older than
        its field, an attempt not that far yet) or stored as None reads as the field's default."""
        attrs = {k[len(prefix) :]: v for k, v in user_attrs.items() if k.startswith(prefix)} if prefix else user_attrs
        read = {f.name: trial_detail(attrs, f.name) if f.metadata["detail"] else attrs.get(f.name) for f in fields(cls)}
        return cls(**{name: value for name, value in read.items() if value is not None})

    @classmethod
    def attr_names(cls) -> tuple[str, ...]:
        """The trial attributes the record is stored as: its flat facts, `details`, and its nested facts' names
        (each an attribute of its own in records written before `details` existed)."""
        return (*(f.name for f in fields(cls) if not f.metadata["detail"]), DETAILS_ATTR, *cls.detail_names())

    @classmethod
    def detail_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.metadata["detail"])

    @classmethod
    def names_of(cls: type[R], pick: Callable[[R], tuple[Any, ...]]) -> tuple[str, ...]:
        """The attribute names of the fields `pick` reads, checked by type: `TrialOutcome.names_of(lambda o: (o.steps,
        o.best_step))` is ("steps", "best_step"), and a field the record lacks is mypy's error (an AttributeError
        here). For a reader that takes attributes by name (a table's columns, a plot's cost axis)."""
        names = {f.name for f in fields(cls)}

        class Names:
            def __getattr__(self, name: str) -> str:
                if name not in names:
                    raise AttributeError(f"{cls.__name__} has no field {name!r}")
                return name

        return tuple(str(name) for name in pick(cast(R, Names())))


@dataclass(frozen=True)
class TrialLaunch(TrialFacts):
    """What the driver stores when it launches a trial (sweeps/trials/trial_runner.py start_trial)."""

    overrides: list[str] | None = field(default=None, metadata=FLAT)  # the sampled parameters as overrides
    workdir: str | None = field(default=None, metadata=FLAT)  # the trial's directory: run/ (metrics, W&B) below it
    checkpoint_url: str | None = field(default=None, metadata=FLAT)  # its retry chain's checkpoints (best.pt)
    # Where its job ran (sweeps/launchers/slots.py: "pod", "vm-3").
    slot: str | None = field(default=None, metadata=FLAT)
    # Every training override the job ran with (pasted after `python -m trm.train` they re-train it, sweeps/best.py).
    train_overrides: list[str] | None = field(default=None, metadata=DETAIL)

    # The chips its job trains on (its slot's: sweeps/launchers/slots.py); None on a launcher that counts none.
    chips: int | None = field(default=None, metadata=DETAIL_WHEN_SET)

    @classmethod
    def of(cls, user_attrs: Mapping[str, Any], prefix: str = "") -> TrialLaunch:
        """TrialFacts.of; a record written before `chips` was stored gives its device-count override's value."""
        launch = super().of(user_attrs, prefix)
        return launch if launch.chips is not None else replace(launch, chips=legacy_chips(launch.train_overrides))


def legacy_chips(train_overrides: list[str] | None) -> int | None:
    """The chips an older pod trial trained on, from its device-count override (CHIPS_OVERRIDE); None elsewhere."""
    for item in train_overrides if isinstance(train_overrides, list) else []:
        if str(item).startswith(CHIPS_OVERRIDE):
            try:
                return int(str(item)[len(CHIPS_OVERRIDE) :])
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class TrialOutcome(TrialFacts):
    """What the job's rank 0 stores on its trial when it ends (trm/links/trial.py), made from its training summary
    (contracts/run_summary.py RunSummary.trial_outcome); the driver tells Optuna from it. Values are as stored (JSON):
    a reader that computes with one checks its type."""

    outcome: str | None = field(default=None, metadata=FLAT)  # COMPLETE, PRUNED, FAIL, PREEMPTED (trm/run_end.py)
    best_value: float | None = field(default=None, metadata=FLAT)  # the objective at its best eval
    best_step: int | None = field(default=None, metadata=FLAT)
    steps: int | None = field(default=None, metadata=FLAT)  # the training steps it reached
    params_count: int | None = field(default=None, metadata=FLAT)  # the model's parameters
    flops_per_sample_step: float | None = field(default=None, metadata=FLAT)
    compute_flops: float | None = field(default=None, metadata=FLAT)  # per sample-step x global batch x steps
    train_seconds: float | None = field(default=None, metadata=FLAT)  # the job's own run time
    precision: str | None = field(default=None, metadata=FLAT)  # the mode it trained in (why: its summary.json)
    device: str | None = field(default=None, metadata=FLAT)  # where rank 0 trained (cpu, cuda:0, xla:0)
    peak_memory_mb: float | None = field(default=None, metadata=FLAT)  # rank 0's device peak (trm/measures/memory.py)
    code_version: str | None = field(default=None, metadata=FLAT)  # the content hash of trm/, what resume checks
    # The git commit of the job's code and whether its work tree differed from it; None where the code is not a git
    # checkout's (an installed wheel), and on trials recorded before they were stored.
    code_commit: str | None = field(default=None, metadata=FLAT)
    code_dirty: bool | None = field(default=None, metadata=FLAT)
    best_checkpoint_note: str | None = field(
        default=None, metadata=WHEN_SET
    )  # best.pt is not its best (trm/checkpoints/best_file.py)
    # A failure: its error (the last 2000 characters), whether a retry could pass it, whether the machine was at
    # fault (RUN_AGAIN_ATTR) and, when the configuration cannot fit it, why (INFEASIBLE_ATTR).
    error: str | None = field(default=None, metadata=WHEN_SET)
    retryable: bool | None = field(default=None, metadata=WHEN_SET)
    run_again: bool | None = field(default=None, metadata=WHEN_SET)
    infeasible: str | None = field(default=None, metadata=WHEN_SET)
    final_metrics: dict[str, float] = field(default_factory=dict, metadata=DETAIL)  # every metric of its last eval
    timing: dict[str, float] | None = field(default=None, metadata=DETAIL)  # its stamps (trm/measures/clock.py)
    throughput: dict[str, Any] | None = field(default=None, metadata=DETAIL_WHEN_SET)  # THROUGHPUT_DETAIL
    # train.profile_steps: the trace file or directory the job wrote on rank 0's machine (trm/measures/profiling.py).
    profile: str | None = field(default=None, metadata=DETAIL_WHEN_SET)


# The driver's own attributes of one attempt (storage/record.py names them).
DRIVER_ATTEMPT_ATTRS = (
    PROGRESS_ATTR,
    MEMORY_ATTR,
    FAIL_REASON_ATTR,
    JOB_ERROR_ATTR,
    PREEMPTED_ATTR,
    SEED_VALUES_ATTR,
    SEED_STD_ATTR,
)

# Trial attributes that describe one attempt: the job's TrialOutcome (under "seed<i>/" for seed i > 0) and what the
# driver concluded. Optuna's retry copies every user attribute to the new trial; the driver clears these on a retry
# so that it never shows its predecessor's outcome or failure. A new TrialOutcome field is one of them by its field.
ATTEMPT_ATTRS = (*TrialOutcome.attr_names(), *DRIVER_ATTEMPT_ATTRS, DRIVER_TIMING_DETAIL)
DETAIL_KEYS = (*TrialOutcome.detail_names(), DRIVER_TIMING_DETAIL, *TrialLaunch.detail_names())


def attempt_attr(key: str) -> bool:
    """Whether a trial attribute (possibly "seed<i>/"-prefixed) belongs to one attempt."""
    return key.rsplit("/", 1)[-1] in ATTEMPT_ATTRS
