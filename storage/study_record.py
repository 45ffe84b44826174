"""The study's side of the record as one typed record, `StudyAttrs`: what the driver writes on a study when it opens
it (sweeps/search/study.py), what the evidence wrapper writes as it measures (contracts/pruning/evidence.py), and
what the jobs, the report, the W&B summary and the CLIs read.

A writer builds a record of the facts it owns and stores them with `store` (only the facts it set, only where the
stored value differs); a reader takes `StudyAttrs.of(study.user_attrs)` and reads its fields. The attribute names
are the fields' names, as studies on disk and optuna-dashboard have them: a new study fact is one field here. The
trial's facts are storage/trial_record.py's; a trial's re-evaluation and the confirm stage are study attributes
keyed per trial (storage/record.py `Reeval`, storage/confirm_record.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from storage.record import EvidenceRecord


@dataclass(frozen=True)
class StudyAttrs:
    """The study's facts as stored (`store`) and read back (`of`). None: not stored (an older study, or a fact whose
    writer has not run yet). Values are as stored (JSON)."""

    objective: str | None = None  # the first objective: what the trials report at the end and are ranked by
    objectives: list[str] | None = None  # every objective, the first one first (the study's directions' order)
    # The pruner as a `_target_` dict, its lengths in steps: every job builds the pruner the driver configured
    # (a class moved since it was stored: contracts.pruners.current_pruner_spec).
    pruner: dict[str, Any] | None = None
    prune_metric: str | None = None  # what the jobs report at each eval (None: the objective; `reported`)
    sampler: str | None = None  # the sampler's class name (TPESampler)
    launcher: str | None = None  # the launcher's class name (LocalLauncher, TpuPodLauncher)
    scale: str | None = None  # the sweep's `scale`: which of the study's spaces it searched
    # What the trials trained and how they were judged (space, objectives, trial length, preset, pruner): a driver
    # with another definition is refused (sweeps/search/definition.py).
    definition: dict[str, Any] | None = None
    # A random id the study gets when first opened. Trial directories and checkpoints carry it, so a new study under
    # an old name (a new storage, a deleted study) never resumes the old study's checkpoints.
    uid: str | None = None
    drivers: int | None = None  # how many drivers have opened the study: each gets its own sampler seed
    # What the evidence wrapper measured (contracts/pruning/evidence.py), rewritten whenever it changes.
    pruner_evidence: EvidenceRecord | None = None

    @classmethod
    def of(cls, study_attrs: Mapping[str, Any]) -> StudyAttrs:
        """The record from a study's user attributes; a fact not stored reads as None."""
        return cls(**{f.name: study_attrs.get(f.name) for f in fields(cls)})

    def as_attrs(self) -> dict[str, Any]:
        """{attribute name: value} of the facts this record sets (None: not written)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def store(self, set_attr: Callable[[str, Any], None], stored: Mapping[str, Any] | None = None) -> None:
        """Write the facts this record sets with `set_attr` (`study.set_user_attr`, or a storage's
        `set_study_user_attr` bound to the study), each only where `stored` (the study's attributes) holds another
        value: a driver reopening its study writes nothing it already holds."""
        for key, value in self.as_attrs().items():
            if stored is None or stored.get(key) != value:
                set_attr(key, value)

    @property
    def reported(self) -> str | None:
        """What the trials report to the pruner at each eval: the prune metric, else the objective."""
        return self.prune_metric or self.objective

    @property
    def objective_names(self) -> list[str]:
        """Every objective (a study from before `objectives` was stored: its one objective; none: empty)."""
        if self.objectives:
            return [str(o) for o in self.objectives]
        return [self.objective] if self.objective else []
