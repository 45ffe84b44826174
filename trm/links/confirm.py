"""Rank 0's link to the study for a confirm job (`sweep.confirm=true`): a finished trial's configuration trained again
on a fresh `seed` (sweeps/trials/confirm.py starts it).

The trial is finished, so nothing is written to it and no pruner is asked: the job trains to its end. Its progress
and its end go to study attributes (storage/confirm_record.py): the end once, COMPLETE or FAIL; a stopped job
(PREEMPTED by a SIGTERM, ABANDONED) stores nothing, and the same command resumes it from its checkpoint.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from optuna.storages import RDBStorage

from contracts.code_version import git_commit
from contracts.metric_names import HALTED_EXAMPLES
from contracts.run_summary import RunSummary
from contracts.train_config import SweepLink
from storage.confirm_record import COMPLETE, FAIL, ConfirmSeed, confirm_attr, confirm_progress_attr
from storage.record import ProgressRecord, Reeval
from storage.study_record import StudyAttrs
from trm.fingerprint import code_fingerprint
from trm.links.trial import TrialLinkError, open_linked_study, retry

log = logging.getLogger(__name__)


def open_study(sweep: SweepLink) -> tuple[RDBStorage, int, dict[str, Any]]:
    """The study's storage, id and attributes (retried through a database outage), refusing a study of the same
    name that is not the one whose trial is confirmed (another uid)."""
    if sweep.study is None or sweep.trial_number is None or sweep.storage is None:
        raise ValueError(
            f"sweep.confirm=true needs sweep.study, sweep.trial_number and sweep.storage (got study={sweep.study!r}, "
            f"trial_number={sweep.trial_number!r}, storage set: {sweep.storage is not None})"
        )
    return open_linked_study(sweep, "the confirm job does not write to it")


class ConfirmLink:
    """Implements trm.run_end.Reporter for rank 0 of a confirm job."""

    def __init__(self, sweep: SweepLink, seed: int, checkpoint_url: str | None) -> None:
        self.storage, self.study_id, attrs = open_study(sweep)
        self.policy = sweep.report_retry
        self.trial, self.seed, self.checkpoint_url = int(sweep.trial_number or 0), seed, checkpoint_url
        self.metric = str(StudyAttrs.of(attrs).objective)
        self.finished = False
        self.first_progress: tuple[int, float] | None = None

    def report(self, step: int, metrics: dict[str, float]) -> str:
        """Never pruned: a confirm seed is trained to its end (its trial was judged already)."""
        return "continue"

    def progress(self, step: int) -> None:
        """Show the stage this job is moving: one write, never retried (the next log point writes again)."""
        now = time.time()
        first_step, first_at = self.first_progress = self.first_progress or (step, now)
        record = ProgressRecord(step=step, at=now, first_step=first_step, first_at=first_at)
        try:
            self.storage.set_study_user_attr(self.study_id, confirm_progress_attr(self.trial, self.seed), record)
        except Exception as err:  # noqa: BLE001 (the database briefly away: the next log point writes again)
            log.warning("could not record progress at step %d: %s", step, err)

    def record_outcome(self, summary: RunSummary) -> None:
        """Store the job's end as a ConfirmSeed (COMPLETE or FAIL only; the first call counts)."""
        if self.finished or summary.outcome not in (COMPLETE, FAIL):
            return
        self.finished = True
        git = git_commit()
        ended = summary.trial_outcome(
            code=(code_fingerprint(), git.commit if git else None, git.dirty if git else None)
        )
        record = ConfirmSeed.from_outcome(
            self.trial, self.seed, self.metric, ended, self.checkpoint_url, f"eval/{HALTED_EXAMPLES}"
        )
        retry(
            lambda: self.storage.set_study_user_attr(
                self.study_id, confirm_attr(self.trial, self.seed), record.as_dict()
            ),
            f"storing trial {self.trial}'s confirm seed {self.seed}",
            self.policy,
        )


def store_reeval(sweep: SweepLink, seed: int, record: Reeval) -> None:
    """Add a confirm seed's re-evaluation (trm/reeval.py run with sweep.confirm=true) to its ConfirmSeed record; a
    seed without a COMPLETE record has no checkpoint of this stage to evaluate: refused."""
    storage, study_id, attrs = open_study(sweep)
    key = confirm_attr(int(sweep.trial_number or 0), seed)
    stored = ConfirmSeed.of(attrs.get(key))
    if stored is None or stored.outcome != COMPLETE:
        raise TrialLinkError(f"trial {sweep.trial_number} has no finished confirm seed {seed}: nothing to add to")
    again = replace(stored, reeval_value=record.value, reeval_examples=record.examples, reeval_step=record.step)
    retry(
        lambda: storage.set_study_user_attr(study_id, key, again.as_dict()),
        f"storing trial {sweep.trial_number}'s confirm seed {seed}'s re-evaluation",
        sweep.report_retry,
    )
