"""A training run's summary: what rank 0 writes to `<out_dir>/summary.json` and prints as its `end` line when the run
ends, and hands to whoever watches the run (its trial or confirm link, its tracker).

One typed record, `RunSummary`, built once by trm/train.py (`summarize`, or the partial one of a failure before the
loop) and read through its fields: `to_dict` is the JSON object (summary.json and the `end` line keep the names and
order they always had), `of` reads it back, and `trial_outcome` is the study record's TrialOutcome (the one place the
summary's names become the record's: `params` -> `params_count`, `seconds` -> `train_seconds`, `final` ->
`final_metrics`). Here, not in trm/, because benches and tests read summary.json too (as contracts/metrics_log.py's
metrics.jsonl).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from storage.trial_record import TrialOutcome


@dataclass(frozen=True)
class RunSummary:
    """The end of one run. A summary made before the loop (the run failed in its set-up) holds only its outcome,
    error, retry judgement and peak memory; every other fact reads as None."""

    outcome: str | None = None  # COMPLETE, PRUNED, ABANDONED, PREEMPTED or FAIL (trm/run_end.py)
    error: str | None = None  # the error that ended it (a FAIL), else None
    steps: int | None = None  # the steps it reached
    rank_steps: list[int] | None = None  # every rank's last step: they all stopped at the same one
    retryable: bool | None = None  # a FAIL a retry could pass (trm/run_end.py NOT_RETRYABLE)
    run_again: bool | None = None  # a FAIL of the machine (disk full, rights): the same command resumes it
    objective: str | None = None  # train.objective
    precision: str | None = None  # what train.precision resolved to (auto: from the device) ...
    precision_reason: str | None = None  # ... and why
    device: str | None = None  # what runtime.device resolved to on rank 0 (cpu, cuda:0; xla for the XLA backend)
    best_value: float | None = None  # the objective at its best eval
    best_step: int | None = None
    best_checkpoint: dict[str, Any] | None = None  # what best.pt holds, and a `note` when it is not the best
    final: dict[str, float] | None = None  # every metric of its last eval
    seconds: float | None = None  # the run's own wall time (trm/measures/clock.py)
    # The phase stamps (trm/measures/clock.py): the clock's live dict, so `end`, stamped after the files are written,
    # reaches the trial link that reads it last.
    timing: dict[str, float] | None = None
    compute_flops: float | None = None  # FLOPs per sample-step x global batch x steps
    throughput: dict[str, Any] | None = None  # steady-state step speed (trm/measures/throughput.py); None: too short
    params: int | None = None  # trainable parameters but the puzzle embedding's (trm/model.py count_params)
    puzzle_emb_params: int | None = None
    flops_per_sample_step: float | None = None  # rank 0's count (trm/flops.py); None on other ranks
    profile: str | None = None  # train.profile_steps: the trace file or directory written (trm/measures/profiling.py)
    peak_memory_mb: float | None = None  # rank 0's device peak (trm/measures/memory.py)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of summary.json and the `end` line: every field, in this order."""
        return asdict(self) | {"timing": self.timing}  # the live dict itself, not asdict's copy

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> RunSummary:
        """The record from summary.json's object (or an `end` line's); keys it does not hold are ignored."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def trial_outcome(
        self, code: tuple[str | None, str | None, bool | None], infeasible: str | None = None
    ) -> TrialOutcome:
        """The trial's record of this end: with its `code` (version, commit, dirty) and, for a failure, why its
        configuration cannot fit (`infeasible`)."""
        error = self.error
        return TrialOutcome(
            outcome=self.outcome,
            best_value=self.best_value,
            best_step=self.best_step,
            steps=self.steps,
            params_count=self.params,
            flops_per_sample_step=self.flops_per_sample_step,
            compute_flops=self.compute_flops,
            train_seconds=self.seconds,
            precision=self.precision,
            device=self.device,
            peak_memory_mb=self.peak_memory_mb,
            code_version=code[0],
            code_commit=code[1],
            code_dirty=code[2],
            best_checkpoint_note=(self.best_checkpoint or {}).get("note") or None,
            error=str(error)[-2000:] if error else None,
            retryable=bool(self.retryable) if error else None,
            run_again=bool(self.run_again) if error else None,
            infeasible=infeasible if error else None,
            final_metrics=self.final or {},
            timing=self.timing,
            throughput=self.throughput or None,  # absent for a run too short to measure (sweeps.utilization)
            profile=self.profile or None,
        )
