"""The stop's one save: a preemption notice saves whatever the eval's verdict at its step, and an eval that meets
a notice at one step writes one checkpoint, not two (trm/train.py `stop_status`)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from contracts.run_summary import RunSummary
from tests.test_train import config
from trm.checkpoints import checkpoint
from trm.train import run

pytestmark = pytest.mark.slow  # each test trains


class NoticeAtEval:
    """A sweep trial whose job gets a preemption notice (SIGTERM, as a spot VM's) while its eval at `at` reports,
    and whose driver answers `verdict` there: "abandon" when it set the trial aside meanwhile."""

    def __init__(self, at: int, verdict: str) -> None:
        self.at, self.verdict = at, verdict
        self.finished: list[RunSummary] = []

    def report(self, step: int, metrics: dict) -> str:
        if step != self.at:
            return "continue"
        os.kill(os.getpid(), signal.SIGTERM)  # caught by trm/preemption.py's handler: the loop checks it after
        return self.verdict

    def progress(self, step: int) -> None:
        pass

    def record_outcome(self, summary: RunSummary) -> None:
        self.finished.append(summary)


def saved_steps(ckpt: Path) -> dict[str, int]:
    """The step each kept checkpoint file holds (a save rotates latest.pt to previous.pt)."""
    return {
        name: checkpoint.load(str(ckpt), name)["step"]
        for name in ("latest.pt", "previous.pt")
        if (ckpt / name).exists()
    }


def test_a_notice_at_an_abandoned_eval_still_saves(tmp_path: Path, data_root: Path) -> None:
    """The driver set the trial aside while the notice's save was due; the eval's "abandon" skipped it, and the
    trial, queued again, lost every step since its last checkpoint."""
    trial = NoticeAtEval(at=20, verdict="abandon")
    summary = run(config(tmp_path, data_root, "train.steps=40", "train.preemption_check_interval=10"), reporter=trial)
    assert summary.outcome == "ABANDONED" and summary.steps == 20
    assert saved_steps(tmp_path / "checkpoints") == {"latest.pt": 20, "previous.pt": 10}


def test_a_notice_at_an_eval_step_saves_once(tmp_path: Path, data_root: Path) -> None:
    """The eval saved, then the notice saved the same step again: previous.pt held step 10 twice, and the stop
    spent a second save of its kill grace."""
    trial = NoticeAtEval(at=10, verdict="continue")
    summary = run(config(tmp_path, data_root, "train.steps=40", "train.preemption_check_interval=10"), reporter=trial)
    assert summary.outcome == "PREEMPTED" and summary.steps == 10
    assert saved_steps(tmp_path / "checkpoints") == {"latest.pt": 10}  # one save: nothing rotated
