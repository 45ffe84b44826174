"""Rank 0's link to its trial (trm.links.trial) against the real PostgreSQL: verdicts and the stored outcome."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

from contracts.hydra_app import TrainJob, compose_train_config
from contracts.run_summary import RunSummary
from storage import StorageUnavailableError, open_storage
from storage.record import PROGRESS_ATTR
from storage.study_record import StudyAttrs
from trm.links.trial import RetryPolicy, TrialLink, TrialLinkError, link_from_config, retry

METRICS = {"eval/exact_accuracy": 0.5, "eval/blank_accuracy": 0.9}


def make_study(url: str, name: str, pruner: dict, prune_metric: str | None = None) -> optuna.Study:
    """A study as the driver leaves it: objective, pruner spec and prune metric stored as study attributes."""
    study = optuna.create_study(study_name=name, storage=open_storage(url), direction="maximize")
    StudyAttrs(objective="eval/exact_accuracy", pruner=pruner).store(study.set_user_attr)
    if prune_metric:
        StudyAttrs(prune_metric=prune_metric).store(study.set_user_attr)
    return study


def test_reports_continue_then_abandon_once_the_trial_was_failed(pg_url: str) -> None:
    study = make_study(pg_url, "link_abandon", {"_target_": "optuna.pruners.NopPruner"})
    trial = study.ask()
    link = TrialLink("link_abandon", trial.number, pg_url)
    assert link.report(10, METRICS) == "continue"
    study.tell(trial, state=TrialState.FAIL)  # what a new driver does to the trial of a dead one
    assert link.report(20, METRICS) == "abandon"  # the orphaned job stops, writing nothing more
    assert link.report(30, {**METRICS, "eval/exact_accuracy": math.nan}) == "abandon"  # also when nothing is reported
    frozen = study.trials[0]
    assert frozen.intermediate_values == {10: 0.5}
    link.record_outcome(RunSummary(outcome="COMPLETE", best_value=0.5))
    assert "outcome" not in study.trials[0].user_attrs  # nothing may be written to a finished trial


def test_the_pruner_sees_the_prune_metric(pg_url: str) -> None:
    # A median pruner that prunes any trial below the first one's report at step 10.
    study = make_study(
        pg_url,
        "link_metric",
        {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1, "n_warmup_steps": 0},
        prune_metric="eval/blank_accuracy",
    )
    first, second = study.ask(), study.ask()
    assert TrialLink("link_metric", first.number, pg_url).report(10, METRICS) == "continue"
    study.tell(first, 0.5)
    # Same objective value, lower blank accuracy: pruned, because blank accuracy is what is compared.
    assert (
        TrialLink("link_metric", second.number, pg_url).report(10, {**METRICS, "eval/blank_accuracy": 0.1}) == "prune"
    )
    assert study.trials[1].intermediate_values == {10: pytest.approx(0.1)}


def test_retry_follows_its_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    monkeypatch.setattr("trm.links.trial.time.sleep", waits.append)

    def down() -> None:
        raise StorageUnavailableError("the database is restarting")

    with pytest.raises(TrialLinkError, match="reporting step 5 failed after 5 attempts"):
        retry(down, "reporting step 5", RetryPolicy(attempts=5, first_delay_s=1.0, max_delay_s=3.0))
    assert waits == [1.0, 2.0, 3.0, 3.0]  # doubled up to max_delay_s, none after the last try


def test_the_job_links_with_its_configs_retry_and_engine_settings(pg_url: str) -> None:
    """sweep.report_retry and sweep.storage_engine of the job's config reach its link (link_from_config)."""
    study = make_study(pg_url, "link_config", {"_target_": "optuna.pruners.NopPruner"})
    trial = study.ask()
    cfg = compose_train_config(
        [
            "sweep.study=link_config",
            f"sweep.trial_number={trial.number}",
            f"sweep.storage={pg_url}",
            "sweep.report_retry.attempts=3",
            "sweep.storage_engine.pool_size=1",
            "out_dir=unused",  # Hydra's run directory otherwise
        ]
    )
    link = link_from_config(TrainJob.of(cfg).app.sweep)
    assert link is not None and link.retry_policy == RetryPolicy(attempts=3)
    assert link.storage.engine.pool.size() == 1  # a QueuePool on PostgreSQL
    assert link.report(10, METRICS) == "continue"


def test_progress_keeps_where_this_job_began_so_the_eta_reads_its_own_pace(pg_url: str) -> None:
    study = make_study(pg_url, "link_progress", {"_target_": "optuna.pruners.NopPruner"})
    trial = study.ask()
    link = TrialLink("link_progress", trial.number, pg_url)
    link.progress(1000)  # a retry resumed at step 1,000
    link.progress(1100)
    stored = study.trials[0].user_attrs[PROGRESS_ATTR]
    assert (stored["step"], stored["first_step"]) == (1100, 1000)
    assert stored["first_at"] <= stored["at"]
