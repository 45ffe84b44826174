"""The trial's typed records (storage/trial_record.py): what lands on a study is what landed before they existed,
records read back through a real Optuna study, older records read, and the attempt attributes follow the fields."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import optuna
import pytest

from contracts.code_version import git_commit
from contracts.out_of_memory import INFEASIBLE_OOM, out_of_memory
from contracts.run_summary import RunSummary
from storage import open_storage
from storage.record import (
    DETAILS_ATTR,
    INFEASIBLE_ATTR,
    RUN_AGAIN_ATTR,
    THROUGHPUT_DETAIL,
    merged_details,
)
from storage.study_record import StudyAttrs
from storage.trial_record import ATTEMPT_ATTRS, TrialLaunch, TrialOutcome, attempt_attr, seed_prefix
from trm.fingerprint import code_fingerprint
from trm.links.trial import TrialLink

# ATTEMPT_ATTRS as it was written by hand before it was derived from the records' fields.
HAND_WRITTEN_ATTEMPT_ATTRS = (
    "outcome", "progress", "best_value", "best_step", "steps", "details", "final_metrics", "params_count",
    "precision", "device", "flops_per_sample_step", "compute_flops", "train_seconds", "timing", "code_version",
    "code_commit", "code_dirty", "error", "retryable", "run_again", "preempted", "infeasible", "peak_memory_mb",
    "job_error", "fail_reason", "driver_timing", "seed_values", "seed_std", "best_checkpoint_note",
)  # fmt: skip

SUMMARY: dict[str, Any] = {  # a training summary as trm/train.py writes it, with every fact the record takes
    "outcome": "COMPLETE",
    "best_value": 0.75,
    "best_step": 40,
    "steps": 50,
    "params": 123456,
    "flops_per_sample_step": 2.5e6,
    "compute_flops": 1.6e10,
    "seconds": 12.5,
    "precision": "bf16",
    "device": "cpu",
    "peak_memory_mb": 512.0,
    "final": {"eval/exact_accuracy": 0.7, "eval/loss": 1.25},
    "timing": {"run_start": 1.0, "first_step_start": 2.0, "first_step_end": 2.5, "last_step_end": 10.0},
    "throughput": {"samples_per_s": 100.0, "flops_per_s": 1e9},
    "profile": "/tmp/run/profile/trace.json",
    "best_checkpoint": {"note": "best.pt is step 30's: step 40's was lost"},
}
FAILED: dict[str, Any] = {
    "outcome": "FAIL",
    "steps": 3,
    "params": 10,
    "seconds": 0.5,
    "final": None,
    "throughput": {},  # a run too short to measure: not stored
    "error": "torch.OutOfMemoryError: CUDA out of memory. " + "x" * 3000,
    "retryable": False,
    "run_again": False,
}


def legacy_outcome_attrs(outcome: str, summary: dict[str, Any], stored: dict[str, Any], prefix: str) -> dict[str, Any]:
    """What trm/links/trial.py record_outcome stored before TrialOutcome, as it was written (keys under `prefix`)."""
    facts = {"final_metrics": summary.get("final") or {}, "timing": summary.get("timing")}
    if summary.get("throughput"):
        facts[THROUGHPUT_DETAIL] = summary["throughput"]
    if summary.get("profile"):
        facts["profile"] = summary["profile"]
    details = merged_details(stored, prefix, **facts)
    git = git_commit()
    attrs = {
        DETAILS_ATTR: details,
        "outcome": outcome,
        "best_value": summary.get("best_value"),
        "best_step": summary.get("best_step"),
        "steps": summary.get("steps"),
        "params_count": summary.get("params"),
        "flops_per_sample_step": summary.get("flops_per_sample_step"),
        "compute_flops": summary.get("compute_flops"),
        "train_seconds": summary.get("seconds"),
        "precision": summary.get("precision"),
        "device": summary.get("device"),
        "peak_memory_mb": summary.get("peak_memory_mb"),
        "code_version": code_fingerprint(),
        "code_commit": git.commit if git else None,
        "code_dirty": git.dirty if git else None,
    }
    note = (summary.get("best_checkpoint") or {}).get("note")
    if note:
        attrs["best_checkpoint_note"] = note
    if summary.get("error"):
        attrs["error"] = str(summary["error"])[-2000:]
        attrs["retryable"] = bool(summary.get("retryable"))
        attrs[RUN_AGAIN_ATTR] = bool(summary.get("run_again"))
        if out_of_memory(str(summary["error"])):
            attrs[INFEASIBLE_ATTR] = INFEASIBLE_OOM
    return {prefix + key: value for key, value in attrs.items()}


def sqlite_study(tmp_path: Path, name: str = "records") -> tuple[optuna.Study, str]:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name=name, storage=open_storage(url), direction="maximize")
    StudyAttrs(objective="eval/exact_accuracy").store(study.set_user_attr)
    return study, url


LAUNCH = TrialLaunch(
    overrides=["arch.hidden_size=64", "optim.lr=0.001"],
    workdir="/runs/records/abcd1234/trial-3",
    checkpoint_url="/ckpt/records/abcd1234/trial-1/checkpoints",
    slot="vm-3/chips-0-1",
    train_overrides=["arch.hidden_size=64", "optim.lr=0.001", "runtime.expected_devices=2"],
    chips=2,
)


def launched(study: optuna.Study) -> optuna.Trial:
    """A trial with what the driver stores at launch (sweeps/trials/trial_runner.py start_trial)."""
    trial = study.ask()
    for key, value in LAUNCH.as_attrs().items():
        trial.set_user_attr(key, value)
    return trial


@pytest.mark.slow  # runs the gcloud stand-in or git: a process
@pytest.mark.parametrize(("seed_index", "outcome", "summary"), [(0, "COMPLETE", SUMMARY), (1, "FAIL", FAILED)])
def test_the_job_stores_what_it_stored_before_the_record_was_typed(
    tmp_path: Path, seed_index: int, outcome: str, summary: dict[str, Any]
) -> None:
    study, url = sqlite_study(tmp_path)
    trial = launched(study)
    before = dict(study.trials[0].user_attrs)
    TrialLink("records", trial.number, url, seed_index=seed_index).record_outcome(RunSummary.of(summary))
    stored = study.trials[0].user_attrs
    prefix = seed_prefix(seed_index)
    expected = {**before, **legacy_outcome_attrs(outcome, summary, before, prefix)}
    assert stored == expected  # the same names, values and `details` as before TrialOutcome
    record = TrialOutcome.of(stored, prefix)
    assert record.outcome == outcome and record.params_count == summary["params"]
    assert record.train_seconds == summary["seconds"] and record.final_metrics == (summary["final"] or {})
    assert TrialLaunch.of(stored) == LAUNCH  # the job's write kept the driver's `details` (train_overrides)


def test_failure_facts_are_stored_only_for_a_failure() -> None:
    record = RunSummary.of({**SUMMARY, "retryable": True}).trial_outcome(code=("hash", None, None))
    attrs = record.as_attrs()
    assert not {"error", "retryable", "run_again", "infeasible"} & set(attrs)
    failed = RunSummary.of(FAILED).trial_outcome(code=("hash", "abc", False), infeasible=INFEASIBLE_OOM)
    assert failed.error is not None and len(failed.error) == 2000 and failed.error.endswith("x")
    assert (failed.retryable, failed.run_again, failed.infeasible) == (False, False, INFEASIBLE_OOM)
    assert THROUGHPUT_DETAIL not in failed.as_attrs()[DETAILS_ATTR]  # an empty measurement is not stored


def test_records_round_trip_through_a_study_under_each_seed(tmp_path: Path) -> None:
    study, _ = sqlite_study(tmp_path)
    trial = launched(study)
    first = RunSummary.of(SUMMARY).trial_outcome(code=("hash", "abc", True))
    second = RunSummary.of(FAILED).trial_outcome(code=("hash", None, None), infeasible=INFEASIBLE_OOM)
    for index, record in ((0, first), (1, second)):
        stored = study.trials[0].user_attrs
        for key, value in record.as_attrs(stored, seed_prefix(index)).items():
            trial.set_user_attr(key, value)
    attrs = study.trials[0].user_attrs
    assert TrialOutcome.of(attrs) == first
    assert TrialOutcome.of(attrs, seed_prefix(1)) == second
    assert TrialLaunch.of(attrs) == LAUNCH and TrialLaunch.of(attrs).chips == 2
    assert "seed1/outcome" in attrs and "seed1/params_count" in attrs  # seed i > 0 under its prefix
    assert attrs[DETAILS_ATTR]["train_overrides"] == LAUNCH.train_overrides  # seed 0's merged into the launch's


def test_an_older_record_reads_with_its_newer_facts_missing() -> None:
    # Before `details` (nested facts as attributes of their own), the git commit, the slot and the launch overrides.
    old = {"outcome": "COMPLETE", "best_value": 0.5, "params_count": 7, "final_metrics": {"eval/loss": 2.0}}
    old |= {"timing": {"run_start": 0.0}, "workdir": "/runs/t-0", "checkpoint_url": "/ckpt/t-0"}
    record = TrialOutcome.of(old)
    assert (record.outcome, record.best_value, record.params_count) == ("COMPLETE", 0.5, 7)
    assert record.final_metrics == {"eval/loss": 2.0} and record.timing == {"run_start": 0.0}
    assert record.code_commit is None and record.throughput is None and record.error is None
    launch = TrialLaunch.of(old)
    assert (launch.workdir, launch.checkpoint_url, launch.slot, launch.train_overrides) == (
        "/runs/t-0",
        "/ckpt/t-0",
        None,
        None,
    )
    assert launch.chips is None
    # Before `chips` was a fact: a pod trial's device-count override says how many it trained on.
    assert TrialLaunch.of({**old, DETAILS_ATTR: {"train_overrides": ["runtime.expected_devices=32"]}}).chips == 32
    assert TrialOutcome.of({}) == TrialOutcome() and TrialOutcome().final_metrics == {}
    assert TrialOutcome.of({"final_metrics": None, DETAILS_ATTR: None}).final_metrics == {}  # cleared on a retry


def test_attempt_attributes_follow_the_outcome_fields() -> None:
    assert set(HAND_WRITTEN_ATTEMPT_ATTRS) <= set(ATTEMPT_ATTRS)
    assert {f.name for f in fields(TrialOutcome)} <= set(ATTEMPT_ATTRS)
    assert all(attempt_attr(seed_prefix(1) + name) for name in TrialOutcome().as_attrs())
    # The launch is rewritten at each attempt, not cleared: a retry keeps its predecessor's until it launches.
    assert not {f.name for f in fields(TrialLaunch)} & set(ATTEMPT_ATTRS)


def test_the_named_attributes_are_the_records_fields() -> None:
    outcome = {f.name for f in fields(TrialOutcome)}
    assert {INFEASIBLE_ATTR, RUN_AGAIN_ATTR, THROUGHPUT_DETAIL} <= outcome
    assert TrialOutcome.names_of(lambda o: (o.params_count, o.train_seconds)) == ("params_count", "train_seconds")
    with pytest.raises(AttributeError, match="no field 'params'"):
        TrialOutcome.names_of(lambda o: (o.params,))  # type: ignore[attr-defined]


# The study attributes the driver wrote by hand before StudyAttrs (sweeps/search/study.py open_study), with the
# evidence wrapper's record (contracts/pruning/evidence.py).
HAND_WRITTEN_STUDY_ATTRS = (
    "objective", "objectives", "pruner", "prune_metric", "sampler", "launcher", "scale", "definition", "uid",
    "drivers", "pruner_evidence",
)  # fmt: skip


def test_the_study_record_is_stored_under_the_names_studies_on_disk_have(tmp_path: Path) -> None:
    assert tuple(f.name for f in fields(StudyAttrs)) == HAND_WRITTEN_STUDY_ATTRS
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="attrs", storage=open_storage(url), direction="maximize")
    spec = {"_target_": "optuna.pruners.MedianPruner", "n_warmup_steps": 10}
    written = StudyAttrs(objective="eval/exact_accuracy", objectives=["eval/exact_accuracy"], pruner=spec, uid="ab")
    written.store(study.set_user_attr)
    assert study.user_attrs == {"objective": "eval/exact_accuracy", "objectives": ["eval/exact_accuracy"],
                                "pruner": spec, "uid": "ab"}  # fmt: skip
    assert StudyAttrs.of(optuna.load_study(study_name="attrs", storage=url).user_attrs) == written
    # A writer writes only its own facts, and only where they differ from what the study holds.
    writes: list[str] = []
    StudyAttrs(objective="eval/exact_accuracy", drivers=2).store(lambda k, v: writes.append(k), study.user_attrs)
    assert writes == ["drivers"]


def test_an_older_study_reads_with_its_newer_facts_missing() -> None:
    older = StudyAttrs.of({"objective": "eval/loss", "pruner": {"_target_": "optuna.pruners.NopPruner"}})
    assert older.objective_names == ["eval/loss"] and older.reported == "eval/loss"  # before objectives, prune_metric
    assert (older.uid, older.drivers, older.definition, older.sampler) == (None, None, None, None)
    assert StudyAttrs.of({}).objective_names == [] and StudyAttrs.of({}).reported is None
    newer = StudyAttrs(objective="eval/exact_accuracy", objectives=["eval/exact_accuracy", "eval/loss"])
    assert StudyAttrs.of({**newer.as_attrs(), "prune_metric": "eval/loss"}).reported == "eval/loss"
    assert newer.objective_names == ["eval/exact_accuracy", "eval/loss"]


def test_the_driver_stores_the_study_record_once_per_open(tmp_path: Path) -> None:
    from sweeps.config.typed_config import typed_sweep
    from sweeps.driver import Driver
    from tests.sweep_helpers import sweep_config

    url = f"sqlite:///{tmp_path / 'study.db'}"
    sweep = typed_sweep(sweep_config(url, tmp_path / "out", "study.name=opened"))
    study = Driver(sweep).open_study()
    stored = StudyAttrs.of(study.user_attrs)
    assert set(study.user_attrs) == set(HAND_WRITTEN_STUDY_ATTRS) - {"pruner_evidence"}
    assert (stored.drivers, stored.sampler, stored.launcher) == (1, "TPESampler", "LocalLauncher")
    assert stored.objective_names == [stored.objective] and stored.reported == stored.prune_metric
    assert isinstance(stored.uid, str) and isinstance(stored.pruner, dict) and isinstance(stored.definition, dict)
    again = StudyAttrs.of(Driver(sweep).open_study().user_attrs)
    assert again == StudyAttrs(**{**stored.as_attrs(), "drivers": 2})  # the same study, a second driver


def test_a_run_summary_reads_back_from_its_json_and_keeps_the_live_stamps() -> None:
    """summary.json and the `end` line are RunSummary.to_dict; `of` reads them back. The phase stamps are the
    clock's live dict: `end`, stamped after the files are written, reaches the trial record made last."""
    summary = RunSummary.of(SUMMARY)
    assert RunSummary.of(json.loads(json.dumps(summary.to_dict()))) == summary
    assert list(summary.to_dict())[:4] == ["outcome", "error", "steps", "rank_steps"]  # the order the file had
    stamps = {"run_start": 1.0}
    live = RunSummary(outcome="COMPLETE", timing=stamps)
    stamps["end"] = 2.0
    assert live.to_dict()["timing"] == {"run_start": 1.0, "end": 2.0}
    assert live.trial_outcome(code=("hash", None, None)).timing == {"run_start": 1.0, "end": 2.0}
