"""Checked checkpoints: a checkpoint is read back when written; best.pt is checked when a run
resumes, rewritten from the checkpoint of its step or, when its state is gone, named everywhere it is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import optuna
import pytest
from fsspec.implementations.local import LocalFileSystem

from dashboards.report_tables import best_block
from dashboards.report_view import StudyView
from storage.trial_record import TrialLaunch, TrialOutcome
from sweeps import best
from tests.test_train import config
from trm.checkpoints import checkpoint
from trm.checkpoints.best_file import BestFile
from trm.train import run


class LossyFileSystem(LocalFileSystem):
    """A local disk that keeps only half of what is written to it and reports no error (a full quota on some
    network file systems, a broken copy)."""

    protocol = "lossy"

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        handle = super()._open(path, mode, *args, **kwargs)
        if "w" in mode:
            write = handle.write
            handle.write = lambda data: write(bytes(data)[: len(data) // 2])
        return handle


def test_a_checkpoint_that_does_not_read_back_as_written_is_refused_and_the_old_one_kept(tmp_path: Path) -> None:
    fsspec.register_implementation("lossy", LossyFileSystem, clobber=True)
    checkpoint.save(str(tmp_path), checkpoint.LATEST, {"step": 1})
    with pytest.raises(checkpoint.CheckpointError, match=r"could not write checkpoint lossy://.*differ"):
        checkpoint.save(f"lossy://{tmp_path}", checkpoint.LATEST, {"step": 2})
    assert checkpoint.load(str(tmp_path))["step"] == 1  # never replaced, never rotated
    assert not (tmp_path / checkpoint.PREVIOUS).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]


def test_a_truncated_best_pt_is_rewritten_on_resume_from_the_checkpoint_of_its_step(
    tmp_path: Path, data_root: Path
) -> None:
    """It stayed unloadable after the run resumed and completed, and summary.json said nothing."""
    ckpt = tmp_path / "checkpoints"
    run(config(tmp_path, data_root, "train.steps=30", "train.stop_after=20"))
    best_step = checkpoint.load(str(ckpt))["best"]["step"]
    assert best_step in (10, 20)  # one of latest.pt (20) and previous.pt (10) holds it
    (ckpt / "best.pt").write_bytes((ckpt / "best.pt").read_bytes()[:1000])
    summary = run(config(tmp_path, data_root, "train.steps=30"))
    assert summary.outcome == "COMPLETE"
    assert checkpoint.load(str(ckpt), checkpoint.BEST)["step"] == summary.best_step
    assert summary.best_checkpoint["note"] is None and summary.best_checkpoint["step"] == summary.best_step


def test_a_best_pt_whose_state_is_gone_is_named_and_holds_the_next_best(tmp_path: Path, data_root: Path) -> None:
    """best.pt unreadable and no checkpoint of its step left: it is moved aside, rewritten at the next eval that
    beats what it holds, and summary.json, the trial, sweeps.best and the report say it is not the run's best."""
    ckpt = tmp_path / "checkpoints"
    run(config(tmp_path, data_root, "train.steps=40", "train.stop_after=30"))
    saved = checkpoint.load(str(ckpt))
    # The run's best was at step 5 with a value nothing beats, and only best.pt held that state.
    saved["best"] = {**saved["best"], "step": 5, "value": 2.0}
    saved["best_file"] = BestFile(step=5, value=2.0).to_dict()
    checkpoint.save(str(ckpt), checkpoint.LATEST, saved)
    (ckpt / "best.pt").write_bytes(b"truncated")
    summary = run(config(tmp_path, data_root, "train.steps=40"))
    assert summary.outcome == "COMPLETE" and summary.best_step == 5
    note = summary.best_checkpoint["note"]
    assert summary.best_checkpoint["step"] == 40 and checkpoint.load(str(ckpt), checkpoint.BEST)["step"] == 40
    assert note.startswith("best.pt holds step 40") and "best.pt of step 5 was not usable" in note
    assert str(ckpt / "best.pt.unreadable") in note and (ckpt / "best.pt.unreadable").read_bytes() == b"truncated"

    # The tools show it beside the path (the job stores the note on its trial: trm/links/trial.py).
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    for key, value in {
        **TrialLaunch(checkpoint_url=str(ckpt)).as_attrs(),
        **TrialOutcome(best_checkpoint_note=note).as_attrs(),
    }.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 0.5)
    info = best.describe(study, best.pick(study, None))
    assert f"checkpoint: {ckpt}/best.pt\n  warning:  {note}" in best.render_text(info)
    assert "warning:</b> best.pt holds step 40" in best_block(StudyView(study))


# `python -m sweeps.best format=json`'s keys, in order, as `describe` wrote its dict before it returned a BestTrial.
BEST_JSON_KEYS = [
    "study", "trial", "state", "value", "objective", "best_step", "overrides", "retrain", "best_checkpoint",
    "best_checkpoint_found", "best_checkpoint_note", "wandb", "workdir", "code_version", "code_commit", "code_dirty",
    "reeval", "ranking", "overlap", "confirmed", "confirm_checkpoints", "confirmed_ranking", "confirmed_tie",
    "trials_winner",
]  # fmt: skip


def test_the_best_trial_is_a_record_whose_json_keeps_its_keys(tmp_path: Path) -> None:
    import json

    from storage.study_record import StudyAttrs

    study = optuna.create_study(study_name="described", direction="maximize")
    StudyAttrs(objective="eval/exact_accuracy").store(study.set_user_attr)
    trial = study.ask({"optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    launch = TrialLaunch(checkpoint_url=str(tmp_path / "ckpt"), workdir="/runs/t-0", train_overrides=["optim.lr=1"])
    outcome = TrialOutcome(outcome="COMPLETE", best_step=7, code_version="h" * 64, code_commit="abc", code_dirty=True)
    for key, value in {**launch.as_attrs(), **outcome.as_attrs(launch.as_attrs())}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 0.5)
    info = best.describe(study, best.pick(study, None))
    with pytest.raises(AttributeError):
        info.trial = 3  # type: ignore[misc]  # frozen: the report and the CLI read one description
    stored = json.loads(json.dumps(info.as_dict()))
    assert list(stored) == BEST_JSON_KEYS
    assert stored["best_checkpoint"] == f"{tmp_path / 'ckpt'}/best.pt" and stored["best_checkpoint_found"] is False
    assert (stored["objective"], stored["best_step"], stored["retrain"][-1]) == ("eval/exact_accuracy", 7, "optim.lr=1")
    assert info.commit_text() == "abc with uncommitted changes"
    text = best.render_text(info)
    assert "study described, trial 0 (COMPLETE): eval/exact_accuracy = 0.5000 at step 7" in text
    assert "commit:     abc with uncommitted changes" in text and "(not found from here)" in text
