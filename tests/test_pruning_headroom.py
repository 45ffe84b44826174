"""contracts/pruning/headroom.py: a trial is cut only when the most a finished trial gained from that step would
still leave it short of their best; run in real Optuna studies."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from hydra.utils import instantiate

from contracts.pruners import PRUNER_TARGETS
from contracts.pruning.headroom import HeadroomPruner

CONF = Path(__file__).parents[1] / "conf" / "pruner" / "headroom.yaml"


def study_with(curves: list[dict[int, float]], direction: str = "maximize", **kw: float) -> optuna.Study:
    """A study whose finished trials reported these curves (their value: the last point)."""
    study = optuna.create_study(direction=direction, pruner=HeadroomPruner(**kw))  # type: ignore[arg-type]
    for curve in curves:
        trial = study.ask()
        for step, value in sorted(curve.items()):
            trial.report(value, step)
        study.tell(trial, curve[max(curve)])
    return study


def verdict(study: optuna.Study, reports: dict[int, float]) -> bool:
    trial = study.ask()
    for step, value in sorted(reports.items()):
        trial.report(value, step)
    return trial.should_prune()


# Four finished trials at a short horizon: they gain at most 0.2 from step 100 to the end; the best ends at 0.9.
SHORT = [{100: 0.5, 200: 0.6}, {100: 0.6, 200: 0.7}, {100: 0.7, 200: 0.9}, {100: 0.4, 200: 0.5}]


def test_a_trial_that_could_not_reach_the_best_with_the_largest_gain_seen_is_cut() -> None:
    study = study_with(SHORT)
    assert verdict(study, {100: 0.69}) is True  # 0.69 + 0.2 < 0.9
    assert verdict(study, {100: 0.71}) is False  # 0.71 + 0.2 >= 0.9


def test_the_same_value_is_kept_where_the_study_saw_a_late_starter_gain_more() -> None:
    """The horizon read from the study's own curves: one finished trial that started at 0.1 and ended at 0.95
    (a deep configuration at a long horizon) stops the rule from cutting a slow start at step 100."""
    late = [*SHORT[:3], {100: 0.1, 200: 0.95}]
    assert verdict(study_with(SHORT), {100: 0.3}) is True
    assert verdict(study_with(late), {100: 0.3}) is False


def test_no_verdict_before_the_startup_trials_finished_and_a_margin_prunes_less() -> None:
    assert verdict(study_with(SHORT[:3]), {100: 0.0}) is False  # 3 finished trials, 4 needed
    assert verdict(study_with(SHORT, n_startup_trials=3), {100: 0.0}) is True
    assert verdict(study_with(SHORT, margin=0.05), {100: 0.66}) is False  # 0.86 >= 0.9 - 0.05
    assert verdict(study_with(SHORT, margin=0.05), {100: 0.64}) is True


def test_a_finished_trial_is_read_at_its_last_report_at_or_before_the_step() -> None:
    """A finished trial that evaluated at 150 only, not at 100, has no value at 100 yet; at step 160 it counts."""
    odd = [*SHORT[:3], {150: 0.0, 200: 0.95}]
    study = study_with(odd, n_startup_trials=3)
    assert verdict(study, {100: 0.3}) is True  # the late starter is not read at step 100: max gain 0.2
    assert verdict(study, {160: 0.3}) is False  # at 160 it gained 0.95 from its 0.0 at 150


def test_minimize_mirrors_the_rule() -> None:
    losses = [{s: 1 - v for s, v in c.items()} for c in SHORT]
    study = study_with(losses, direction="minimize")
    assert verdict(study, {100: 0.31}) is True  # 0.31 - 0.2 > 0.1
    assert verdict(study, {100: 0.29}) is False


def test_bad_settings_name_the_key_and_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"n_startup_trials=0: expected an integer >= 1"):
        HeadroomPruner(n_startup_trials=0)
    with pytest.raises(ValueError, match=r"margin=-0.1: expected a finite number >= 0"):
        HeadroomPruner(margin=-0.1)


def test_the_shipped_file_builds_through_the_jobs_allowlist() -> None:
    """A trial's job rebuilds the stored spec with Hydra's instantiate over PRUNER_TARGETS (trm/links/trial.py)."""
    spec = yaml.safe_load(CONF.read_text())
    pruner = instantiate(spec, _execution_whitelist_=PRUNER_TARGETS)
    assert isinstance(pruner, HeadroomPruner) and pruner.n_startup_trials == spec["n_startup_trials"]
