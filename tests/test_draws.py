"""No wasted draws (sweeps/search/distinct_draws.py): a repeated configuration is drawn again instead of being recorded
as a FAIL trial, a finite space the budget covers is enumerated, and a study that exhausted its space ends cleanly.

Issue 29: a user study over `optim.lr: choice(0.001, 0.002)` with n_trials=5 recorded 21 FAIL trials beside its
2 trained ones; a TPE study of the 72-configuration tiny space recorded 40.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.samplers import RandomSampler, TPESampler
from optuna.trial import TrialState, create_trial

from dashboards.report_page import summary_line
from dashboards.report_view import StudyView
from storage import open_storage
from storage.record import DUPLICATE_OF_ATTR, NOT_STARTED_ATTR, trained_trials
from sweeps.config.compose import compose_sweep_config
from sweeps.config.config_values import SweepConfigError
from sweeps.config.optuna_parts import build
from sweeps.config.schema import Draws
from sweeps.config.typed_config import typed_block, typed_sweep
from sweeps.driver import Driver
from sweeps.search.budget import budget_used
from sweeps.search.distinct_draws import (
    DistinctSampler,
    EnumeratingSampler,
    choose_sampler,
    space_size,
)
from sweeps.search.draw import draw_within_budget
from sweeps.search.space import parse_space
from sweeps.status import collect
from sweeps.trials.progress import measure
from sweeps.trials.wandb_summary import study_summary
from tests.sweep_helpers import sweep_config
from tests.test_sweeps import with_space


def test_space_size_counts_each_conditional_branch_with_its_own_parameters() -> None:
    space = parse_space(
        {"optim.name": "choice(adamw, lion)", "arch.H_cycles": "range(1, 4)"},
        {"optim.name": {"adamw": {"optim.lr": "choice(0.1, 0.2, 0.3)"}}},
    )
    assert space_size(space) == (3 + 1) * 3  # adamw x 3 lrs, lion alone; times 3 H cycles
    assert space_size(parse_space({"optim.lr": "interval(0.001, 0.01)"})) is None  # a float range is infinite
    assert space_size(parse_space({"optim.lr": "choice(0.001, 0.002)"})) == 2


def test_a_finite_space_the_budget_covers_is_enumerated_a_large_one_is_not(caplog: pytest.LogCaptureFixture) -> None:
    small = parse_space({"optim.lr": "choice(0.001, 0.002)"})
    large = parse_space({"arch.hidden_size": "range(8, 64, 8)", "arch.H_cycles": "range(1, 4)"})  # 28
    knobs = Draws(max_redraws=20, enumerate_share=0.5)
    with caplog.at_level(logging.INFO, logger="sweeps"):
        chosen = choose_sampler(TPESampler(seed=0), small, 5, knobs, seed=0)
    assert isinstance(chosen, DistinctSampler) and isinstance(chosen.base, EnumeratingSampler)
    assert "2 configurations and n_trials=5 covers 100% of it: BruteForceSampler" in caplog.text
    kept = choose_sampler(TPESampler(seed=0), large, 8, knobs, seed=0)
    assert isinstance(kept, DistinctSampler) and isinstance(kept.base, TPESampler)
    never = choose_sampler(TPESampler(seed=0), small, 5, Draws(max_redraws=3, enumerate_share=None), seed=0)
    assert isinstance(never, DistinctSampler) and isinstance(never.base, TPESampler)


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"max_redraws": -1, "enumerate_share": 0.5}, r"draws.max_redraws=-1: expected a whole number >= 0"),
        ({"max_redraws": 3, "enumerate_share": 1.5}, r"draws.enumerate_share=1.5: expected a number in \(0, 1\]"),
        ({"max_redraws": "x", "enumerate_share": 0.5}, r"draws.max_redraws='x': expected an integer, not str"),
    ],
)
def test_bad_draw_knobs_are_refused_naming_key_and_value(knobs: dict, message: str) -> None:
    with pytest.raises(SweepConfigError, match=message):
        typed_block("draws", Draws, knobs)


def test_a_repeated_draw_is_drawn_again_and_not_recorded_as_fail(tmp_path: Path) -> None:
    """A real SQLite study, Optuna's RandomSampler over 3 configurations, three draws through the driver's draw:
    the random draws repeat (seed 3 draws 0.02 twice in a row, checked below on a bare sampler), and the
    wrapper draws them again: 3 trials, 3 configurations, no FAIL."""
    space = parse_space({"optim.lr": "choice(0.01, 0.02, 0.03)"})
    bare = optuna.create_study(sampler=RandomSampler(seed=3))
    plain = [bare.ask().suggest_categorical("optim.lr", [0.01, 0.02, 0.03]) for _ in range(3)]
    assert len(set(plain)) < 3  # the sampler alone repeats itself
    storage = open_storage(f"sqlite:///{tmp_path}/draws.db")
    sampler = DistinctSampler(RandomSampler(seed=3), space, max_redraws=20)
    study = optuna.create_study(study_name="draws", storage=storage, sampler=sampler)
    for value in (0.5, 0.6, 0.7):
        draw = draw_within_budget(study, storage, space, n_trials=3)
        assert draw.trial is not None and not draw.exhausted
        study.tell(draw.trial, value)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert sorted(t.params["optim.lr"] for t in trials) == [0.01, 0.02, 0.03]
    assert sampler.redraws >= 1  # a repeat was drawn and drawn again
    fourth = draw_within_budget(study, storage, space, n_trials=10)  # budget left, space spent
    assert fourth.trial is None and fourth.exhausted and len(study.get_trials(deepcopy=False)) == 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_exhausted_space_ends_cleanly_with_its_trained_trials_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's study: optim.lr: choice(0.001, 0.002), n_trials=5, trained for real: 2 trained trials, no FAIL,
    and one line saying the space is exhausted."""
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        db, tmp_path, "study.name=exhausted", "n_trials=5", "pruner=none", "study.enqueue_baseline=false"
    )
    with caplog.at_level(logging.INFO, logger="sweeps"):
        Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.001, 0.002)"}))).run()
    trials = optuna.load_study(study_name="exhausted", storage=db).get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    assert sorted(t.params["optim.lr"] for t in trials) == [0.001, 0.002]
    ends = [r.getMessage() for r in caplog.records if "search space exhausted" in r.getMessage()]
    assert ends == [
        "search space exhausted: all 2 configurations of the search space trained (2 trials), before n_trials=5"
    ]


def test_status_and_the_report_count_trained_trials_only(tmp_path: Path) -> None:
    """Trials that trained nothing stay FAIL in Optuna's record (and optuna-dashboard's counts): a refused repeat
    (duplicate_of: by older versions, or when redraws run out) and a trial failed before any job of it started
    (not_started: not sampled, its launch refused, its driver dead before the first heartbeat). sweeps.status, the
    report, the W&B summary, the driver's progress and the budget neither count nor list them; a real failure and a
    retry whose inherited mark was cleared (None) are counted."""
    db = f"sqlite:///{tmp_path}/counts.db"
    study = optuna.create_study(study_name="counts", storage=db)
    dist = {"x": FloatDistribution(0, 1)}
    study.add_trial(create_trial(value=0.5, params={"x": 0.5}, distributions=dist))
    study.add_trial(
        create_trial(state=TrialState.FAIL, params={"x": 0.5}, distributions=dist, user_attrs={DUPLICATE_OF_ATTR: 0})
    )
    study.add_trial(create_trial(state=TrialState.FAIL, params={"x": 0.7}, distributions=dist))  # a real failure
    never = {NOT_STARTED_ATTR: "launch failed: RuntimeError: no VM"}
    study.add_trial(create_trial(state=TrialState.FAIL, params={"x": 0.8}, distributions=dist, user_attrs=never))
    cleared = {NOT_STARTED_ATTR: None}  # a mark cleared on a later attempt: it trained
    study.add_trial(create_trial(state=TrialState.FAIL, params={"x": 0.9}, distributions=dist, user_attrs=cleared))
    (shown,) = collect(open_storage(db), "counts")
    assert shown["counts"] == {"COMPLETE": 1, "PRUNED": 0, "FAIL": 2, "RUNNING": 0, "WAITING": 0}
    assert [t["number"] for t in shown["trials"]] == [0, 2, 4]
    assert "trials: complete 1, fail 2;" in summary_line(StudyView(study))
    summary = study_summary(study)
    assert (summary["count/fail"], summary["count/total"]) == (2, 3)
    trials = study.get_trials(deepcopy=False)
    assert budget_used(trials) == 3 and [t.number for t in trained_trials(trials)] == [0, 2, 4]
    progress = measure(trials, study.directions, 6, 1, 0.0, datetime.now())
    assert (progress.complete, progress.failed) == (1, 2)


# GP's joint draw takes the same path as multivariate TPE's; 30 GP fits cost minutes, so it is left out here.
@pytest.mark.parametrize("sampler", ["tpe", "cmaes", "nsga2", "random"])
def test_every_configured_sampler_draws_thirty_distinct_configurations_of_the_tiny_space(sampler: str) -> None:
    """Issue 29: TPE returned to configurations of the 72-configuration tiny space (40 repeats beside 11 trained).
    Each sampler of conf/sampler, as the driver builds it, on model_scaling's tiny space with a score that favours
    one corner: 30 draws, 30 configurations (joint draws included: multivariate TPE, CMA-ES, NSGA-II)."""
    cfg = compose_sweep_config([f"sampler={sampler}", "study=model_scaling"])
    space = parse_space(cfg.study.space.tiny)
    wrapped = choose_sampler(build(cfg.sampler), space, 30, typed_block("draws", Draws, cfg.draws), seed=0)
    study = optuna.create_study(sampler=wrapped, direction="maximize")
    for _ in range(30):
        trial = study.ask()
        values = space.sample(trial)
        study.tell(trial, values["arch.H_cycles"] + values["arch.L_cycles"] / 4 + values["arch.L_layers"] / 16)
    assert len({frozenset(t.params.items()) for t in study.trials}) == 30
