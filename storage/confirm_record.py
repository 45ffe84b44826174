"""The confirm stage's records: a top configuration trained again on a fresh training seed (sweeps/trials/confirm.py
starts the job, trm/links/confirm.py is its rank 0's side and writes these).

Each seed's job stores one `ConfirmSeed` as a study attribute, `confirm:<trial>:<seed>` (Optuna refuses writes to a
finished trial, and the trial's own value stays what it reported), and rewrites its progress under
`confirm-progress:<trial>:<seed>` (a storage.record.ProgressRecord: the stage stops a job that stops moving). The
record is written once, when the job ends COMPLETE or FAIL: a stopped job (Ctrl-C, a stall) writes none, and the
same command resumes it from its checkpoint. A COMPLETE record is never trained again (`trained_seeds`). Where the
study was re-evaluated on more puzzles, a second job evaluates the seed's checkpoint the same way and adds its
`reeval_*` fields to the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from storage.trial_record import TrialOutcome

CONFIRM_ATTR_PREFIX = "confirm:"
CONFIRM_STAGE_ATTR = "confirm_stage"  # the settings the stage last ran with (a ConfirmStage)
CONFIRM_PROGRESS_PREFIX = "confirm-progress:"
COMPLETE = "COMPLETE"  # trm/run_end.py's outcome names: a record holds one of these two
FAIL = "FAIL"


def confirm_attr(trial: int, seed: int) -> str:
    """The study attribute holding trial `trial`'s configuration trained on `seed`."""
    return f"{CONFIRM_ATTR_PREFIX}{trial}:{seed}"


def confirm_progress_attr(trial: int, seed: int) -> str:
    """The study attribute its job rewrites at every log point (a ProgressRecord)."""
    return f"{CONFIRM_PROGRESS_PREFIX}{trial}:{seed}"


@dataclass(frozen=True)
class ConfirmSeed:
    """One confirm job's end, as stored (`as_dict`) and read back (`of`). Values are the objective's, as the job's
    own evals measured them: the platform takes `best_value` or `final_value` as the study's `study.value` says."""

    trial: int  # the trial whose configuration (its training overrides) was trained again
    seed: int  # the training seed (`seed=`): one that no job of the trial trained with
    outcome: str  # COMPLETE or FAIL
    metric: str  # the objective (train.objective)
    best_value: float | None = None  # the objective at its best eval
    best_step: int | None = None
    final_value: float | None = None  # the objective at its last eval
    examples: int | None = None  # test puzzles each eval counted (eval/halted_examples): the eval's noise
    steps: int | None = None
    train_seconds: float | None = None
    checkpoint_url: str | None = None  # its checkpoints (best.pt, latest.pt), as the job wrote them
    error: str | None = None  # a FAIL's error (its last 2000 characters)
    # Its checkpoint evaluated again on the study's larger eval (trm/reeval.py with sweep.confirm=true), as its
    # trial's was (storage.record.Reeval): the value, the puzzles counted and the checkpoint's step. None: not yet.
    reeval_value: float | None = None
    reeval_examples: int | None = None
    reeval_step: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_outcome(
        cls, trial: int, seed: int, metric: str, ended: TrialOutcome, checkpoint_url: str | None, examples_key: str
    ) -> ConfirmSeed:
        """The record of a confirm job's end from the TrialOutcome its summary makes (RunSummary.trial_outcome in
        contracts/run_summary.py: the one place the summary's names become the record's), the objective `metric`, where its checkpoints are and the final
        metric that counts the eval's puzzles (`examples_key`, contracts.metric_names': storage imports no contracts)."""
        final = ended.final_metrics
        examples = final.get(examples_key)
        return cls(
            trial=trial,
            seed=seed,
            outcome=COMPLETE if ended.outcome == COMPLETE else FAIL,
            metric=metric,
            best_value=ended.best_value,
            best_step=ended.best_step,
            final_value=final.get(metric),
            examples=int(examples) if isinstance(examples, (int, float)) else None,
            steps=ended.steps,
            train_seconds=ended.train_seconds,
            checkpoint_url=checkpoint_url,
            error=ended.error,
        )

    @classmethod
    def of(cls, stored: Any) -> ConfirmSeed | None:
        """The record from a study attribute's value; None when it is not one (absent, or another version's)."""
        names = {f.name for f in fields(cls)}
        required = {"trial", "seed", "outcome", "metric"}
        if not isinstance(stored, dict) or not required <= set(stored) <= names:
            return None
        return cls(**stored)

    def value(self, use_best: bool) -> float | None:
        """Its objective as the study measures a trial's (study.value: best or last); None when it has none."""
        return self.best_value if use_best else self.final_value


@dataclass(frozen=True)
class ConfirmStage:
    """What the stage last ran with (conf/sweep.yaml `confirm`), stored before its first job: the readers of the
    ranking (sweeps.best, sweeps.status, the report, the W&B summary) have the storage alone, not the sweep config."""

    top_k: int
    seeds: int
    first_seed: int
    own_variance_at: int  # a configuration with this many values uses its own seed variance; fewer: the pooled

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, stored: Any) -> ConfirmStage | None:
        names = {f.name for f in fields(cls)}
        return cls(**stored) if isinstance(stored, dict) and set(stored) == names else None


def confirmations(study_attrs: Mapping[str, Any]) -> dict[int, dict[int, ConfirmSeed]]:
    """Every confirm record stored on the study: {trial number: {seed: ConfirmSeed}}."""
    out: dict[int, dict[int, ConfirmSeed]] = {}
    for key, value in study_attrs.items():
        if key.startswith(CONFIRM_ATTR_PREFIX) and (record := ConfirmSeed.of(value)) is not None:
            out.setdefault(record.trial, {})[record.seed] = record
    return out


def trained_seeds(study_attrs: Mapping[str, Any], trial: int) -> set[int]:
    """The seeds trial `trial`'s configuration was confirmed on (COMPLETE): never trained again."""
    return {s for s, r in confirmations(study_attrs).get(trial, {}).items() if r.outcome == COMPLETE}
