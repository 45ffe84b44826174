"""Two small parts of the sweep driver on their own: where a trial's jobs write (sweeps/trials/paths.py) and what counts
against a study's budget, which draw repeats a configuration, the baseline's parameter names (sweeps/search/budget.py).
The driver's tests cover them end to end; these pin the contract case by case, on real Optuna trials."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from omegaconf import OmegaConf
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from storage import retry_callback
from storage.record import DUPLICATE_OF_ATTR
from sweeps.search.budget import FINISHED, TRAINS, baseline_params, budget_used, twin_of
from sweeps.search.space import Conditional, parse_space
from sweeps.trials.paths import StudyRoots, TrialPaths

ROOT = Path(__file__).resolve().parents[1]
UID = "0123456789abcdef"  # a study uid: its first 8 characters name the study's directory

# ------------------------------------------------------------------------------------- sweeps/trials/paths.py


def test_local_roots_are_absolute_and_runs_and_checkpoints_follow_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    roots = StudyRoots.of("outputs/sweeps", None, None, "scaling", UID)
    study_dir = tmp_path / "outputs" / "sweeps" / "scaling" / "01234567"
    assert roots.output_root == study_dir  # resolved here: a job started elsewhere writes to the same place
    assert roots.run_root == roots.checkpoint_root == str(study_dir)
    assert roots.workdir(3) == study_dir / "trial-3"
    assert roots.checkpoint_url(3) == f"{study_dir}/trial-3/checkpoints"


def test_a_remote_run_root_is_kept_as_written_and_holds_the_checkpoints(tmp_path: Path) -> None:
    # site=pod: `runs` is relative to the launcher's remote_dir on every VM, not to this machine's cwd.
    roots = StudyRoots.of(str(tmp_path), "runs", None, "scaling", UID)
    assert roots.run_root == roots.checkpoint_root == "runs/scaling/01234567"
    assert roots.output_root == tmp_path / "scaling" / "01234567"  # the driver's own view stays local
    paths = roots.trial(4, 4)
    assert paths.run_dir == "runs/scaling/01234567/trial-4/run"
    assert paths.checkpoint_url == "runs/scaling/01234567/trial-4/checkpoints"
    assert paths.workdir == tmp_path / "scaling" / "01234567" / "trial-4"


def test_a_checkpoint_root_is_its_own_tree(tmp_path: Path) -> None:
    roots = StudyRoots.of(str(tmp_path), "runs", "gs://bucket/trm", "scaling", UID)
    assert roots.checkpoint_root == "gs://bucket/trm/scaling/01234567"
    paths = roots.trial(2, 2)
    assert paths.checkpoint_url == "gs://bucket/trm/scaling/01234567/trial-2/checkpoints"
    assert paths.run_dir == "runs/scaling/01234567/trial-2/run"  # runs stay under run_root


def test_another_study_under_the_same_name_gets_other_directories(tmp_path: Path) -> None:
    old = StudyRoots.of(str(tmp_path), "runs", "gs://bucket", "scaling", UID)
    new = StudyRoots.of(str(tmp_path), "runs", "gs://bucket", "scaling", "fedcba9876543210")
    assert old.workdir(0) != new.workdir(0)
    assert old.trial(0, 0).run_dir != new.trial(0, 0).run_dir
    assert old.checkpoint_url(0) != new.checkpoint_url(0)


@pytest.mark.parametrize("run_root", ["/mnt/run/data", "gs://run/run", "run"])
def test_a_run_root_containing_run_is_not_corrupted(tmp_path: Path, run_root: str) -> None:
    """The run directory ends in /run: nothing may be derived from it by editing the string (a checkpoint
    directory made by replacing "/run" would land inside another directory of run_root)."""
    roots = StudyRoots.of(str(tmp_path), run_root, None, "run", UID)  # the study named "run" too
    base = f"{run_root}/run/01234567"
    for seeds, seed_dir in ((1, ""), (2, "/seed-1")):
        paths = roots.trial(7, 5, seed_index=1 if seeds > 1 else 0, seeds=seeds)
        assert paths.run_dir == f"{base}/trial-7{seed_dir}/run"
        assert paths.checkpoint_url == f"{base}/trial-5{seed_dir}/checkpoints"


def test_one_seed_has_the_plain_layout_and_the_studys_checkpoint_url(tmp_path: Path) -> None:
    roots = StudyRoots.of(str(tmp_path), None, None, "scaling", UID)
    paths = roots.trial(3, 3)
    assert paths == TrialPaths(roots, 3, 3, 0, 1)
    assert paths.run_dir == f"{roots.run_root}/trial-3/run"
    assert paths.workdir == roots.workdir(3)
    # The driver records roots.checkpoint_url(origin) on the trial: with one seed it is where the job writes.
    assert paths.checkpoint_url == roots.checkpoint_url(3)


def test_a_retry_runs_in_its_own_directory_and_resumes_its_origins_checkpoints(tmp_path: Path) -> None:
    roots = StudyRoots.of(str(tmp_path), None, None, "scaling", UID)
    first, retry = roots.trial(2, 2), roots.trial(9, 2)
    assert retry.run_dir != first.run_dir and retry.workdir != first.workdir
    assert retry.run_dir == f"{roots.run_root}/trial-9/run"
    assert retry.checkpoint_url == first.checkpoint_url == roots.checkpoint_url(2)


def test_each_seed_has_its_own_run_checkpoint_and_work_directories(tmp_path: Path) -> None:
    roots = StudyRoots.of(str(tmp_path), None, "gs://bucket", "scaling", UID)
    seeds = [roots.trial(6, 4, seed_index=i, seeds=3) for i in range(3)]
    for field in ("run_dir", "checkpoint_url", "workdir"):
        values = [getattr(p, field) for p in seeds]
        assert len(set(values)) == 3, (field, values)
    for i, p in enumerate(seeds):
        assert p.run_dir == f"{roots.run_root}/trial-6/seed-{i}/run"
        assert p.checkpoint_url == f"gs://bucket/scaling/01234567/trial-4/seed-{i}/checkpoints"
        assert p.workdir == roots.workdir(6) / f"seed-{i}"
    # Seed 0 of several is not the single-seed layout: a study cannot mix one's files with the other's.
    assert seeds[0].run_dir != roots.trial(6, 4).run_dir
    assert seeds[0].checkpoint_url != roots.trial(6, 4).checkpoint_url
    # A retry of seed 1 resumes seed 1's checkpoints, not another seed's.
    assert roots.trial(8, 4, seed_index=1, seeds=3).checkpoint_url == seeds[1].checkpoint_url


# ------------------------------------------------------------------------------------ sweeps/search/budget.py


def fresh_study() -> optuna.Study:
    return optuna.create_study(direction="maximize")  # in memory


def add(study: optuna.Study, state: TrialState, params: dict[str, float] | None = None, **attrs: Any) -> int:
    """Add a real trial in `state` (x as its parameter); returns its number."""
    params = params if params is not None else {}
    study.add_trial(
        create_trial(
            state=state,
            value=0.5 if state == TrialState.COMPLETE else None,
            params=params,
            distributions={key: FloatDistribution(0.0, 1.0) for key in params},
            user_attrs=attrs,
        )
    )
    return study.trials[-1].number


def stale(study: optuna.Study, number: int, max_retry: int = 3) -> None:
    """What the driver does with a trial whose heartbeat went stale: FAIL, then a WAITING copy queued as a retry
    (Optuna's retry callback, as sweeps/trials/recovery.py's requeue and the storage's stale-trial callback use it)."""
    study.tell(number, state=TrialState.FAIL)
    retry_callback(max_retry)(study, study.trials[number])


def used(study: optuna.Study) -> int:
    return budget_used(study.get_trials(deepcopy=False))


def test_finished_and_running_trials_use_the_budget_and_waiting_ones_do_not() -> None:
    study = fresh_study()
    assert used(study) == 0
    add(study, TrialState.COMPLETE)
    add(study, TrialState.PRUNED)
    add(study, TrialState.FAIL)  # a failure that is not retried trained (or tried to): it counts
    assert used(study) == 3
    add(study, TrialState.RUNNING)
    assert used(study) == 4
    add(study, TrialState.WAITING)  # enqueued, not started
    assert used(study) == 4


def test_a_refused_duplicate_uses_no_budget() -> None:
    study = fresh_study()
    add(study, TrialState.COMPLETE, {"x": 0.5})
    add(study, TrialState.FAIL, {"x": 0.5}, **{DUPLICATE_OF_ATTR: 0})
    assert used(study) == 1


def test_a_retry_chain_uses_the_budget_once() -> None:
    study = fresh_study()
    first = study.ask()
    first.suggest_float("x", 0.0, 1.0)
    assert used(study) == 1  # running
    stale(study, first.number)  # FAIL + a WAITING retry
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]
    assert used(study) == 0  # the failure is replaced by its retry, which has not started
    retry = study.ask()  # a driver picks the retry up
    assert retry.number == 1
    assert used(study) == 1
    stale(study, retry.number)  # fails again: a second retry
    assert used(study) == 0
    again = study.ask()
    study.tell(again, 0.9)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    assert used(study) == 1  # three attempts, one configuration


def test_a_failure_past_max_retry_uses_the_budget() -> None:
    study = fresh_study()
    first = study.ask()
    stale(study, first.number, max_retry=1)
    study.ask()
    stale(study, 1, max_retry=1)  # the retries are spent: nothing queued
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert used(study) == 1


def test_finished_and_trains_split_the_states() -> None:
    """FINISHED: what used the budget; TRAINS: what a new draw must not repeat. A failure is finished but may be
    drawn again; a queued (WAITING) or running trial is not finished but will train."""
    assert set(FINISHED) & set(TRAINS) == {TrialState.COMPLETE, TrialState.PRUNED}
    assert TrialState.FAIL in FINISHED and TrialState.FAIL not in TRAINS
    assert {TrialState.RUNNING, TrialState.WAITING} <= set(TRAINS) - set(FINISHED)
    assert set(FINISHED) | set(TRAINS) == set(TrialState)


def twin_in(study: optuna.Study, number: int) -> int | None:
    """The driver's question: does another trial that trains, trains or will train have trial `number`'s params?"""
    params = study.trials[number].params
    return twin_of(number, params, study.get_trials(deepcopy=False, states=TRAINS))


@pytest.mark.parametrize(
    ("state", "is_twin"),
    [
        (TrialState.COMPLETE, True),
        (TrialState.PRUNED, True),
        (TrialState.RUNNING, True),
        (TrialState.WAITING, True),
        (TrialState.FAIL, False),  # a configuration that failed may be tried again
    ],
)
def test_a_draw_repeats_a_trial_that_trains_trained_or_will_train(state: TrialState, is_twin: bool) -> None:
    study = fresh_study()
    add(study, TrialState.COMPLETE, {"x": 0.25})
    earlier = add(study, state, {"x": 0.5})
    drawn = add(study, TrialState.RUNNING, {"x": 0.5})  # the driver's asked trial: RUNNING, itself among TRAINS
    assert twin_in(study, drawn) == (earlier if is_twin else None)


def test_a_trial_is_not_its_own_twin_and_another_value_is_no_twin() -> None:
    study = fresh_study()
    draw = study.ask({"x": FloatDistribution(0.0, 1.0)})
    # RUNNING, so among the TRAINS trials the driver passes: only its own number keeps it out.
    assert twin_in(study, draw.number) is None
    x = draw.params["x"]
    add(study, TrialState.COMPLETE, {"x": x + 1e-9 if x < 0.5 else x - 1e-9})
    assert twin_in(study, draw.number) is None
    twin = add(study, TrialState.COMPLETE, {"x": x})
    assert twin_in(study, draw.number) == twin


def test_params_that_differ_in_a_key_are_no_twin() -> None:
    study = fresh_study()
    add(study, TrialState.COMPLETE, {"x": 0.5, "y@lion": 0.1})  # a conditional parameter more
    add(study, TrialState.COMPLETE, {"x": 0.5})
    assert twin_in(study, 1) is None
    assert twin_in(study, 0) is None


def test_a_refused_duplicate_is_nobodys_twin_but_its_original_is() -> None:
    study = fresh_study()
    add(study, TrialState.COMPLETE, {"x": 0.5}, **{DUPLICATE_OF_ATTR: 9})  # refused draws are FAIL; even if not
    assert twin_of(99, {"x": 0.5}, study.get_trials(deepcopy=False)) is None
    original = add(study, TrialState.COMPLETE, {"x": 0.5})
    assert twin_of(99, {"x": 0.5}, study.get_trials(deepcopy=False)) == original


def test_without_searched_parameters_no_trial_is_a_twin() -> None:
    """A study that searches nothing runs the same configuration on purpose (e.g. a seeds study's baseline)."""
    study = fresh_study()
    add(study, TrialState.COMPLETE)
    add(study, TrialState.RUNNING)
    assert twin_in(study, 1) is None


# The optimizer study's space (conf/study/optimizer.yaml): a parameter per optimizer under `<key>@<optimizer>`.
OPTIMIZER_STUDY = OmegaConf.load(ROOT / "conf" / "study" / "optimizer.yaml")


def optimizer_space():
    return parse_space(
        OmegaConf.to_container(OPTIMIZER_STUDY.space.tiny),
        OmegaConf.to_container(OPTIMIZER_STUDY.conditional.tiny),
    )


def test_the_baseline_names_its_conditional_parameters_under_its_choice() -> None:
    baseline = dict(OmegaConf.to_container(OPTIMIZER_STUDY.baseline.tiny))
    params = baseline_params(baseline, optimizer_space().conditionals)
    assert params == {
        "optim": "adam_atan2",
        "optim.warmup_steps": 100,
        "train.ema": True,
        "optim.lr@adam_atan2": 1.0e-3,
        "optim.weight_decay@adam_atan2": 0.1,
        "optim.betas@adam_atan2": "[0.9,0.95]",
    }
    assert baseline["optim.lr"] == 1.0e-3 and "optim.lr@adam_atan2" not in baseline  # the baseline is not edited


@pytest.mark.parametrize("optimizer", ["adamw", "lion"])
def test_the_enqueued_baseline_is_what_the_first_trial_samples(optimizer: str) -> None:
    """The contract with sweeps/search/space.py: enqueued under these names, the baseline's values are the ones the
    trial's suggest calls return (under another name Optuna would sample the parameter instead)."""
    space = optimizer_space()
    baseline = {
        "optim": optimizer,
        "optim.warmup_steps": 60,
        "train.ema": False,
        "optim.lr": 1.0e-4 if optimizer == "lion" else 1.0e-3,
        "optim.weight_decay": 1.0,
        "optim.betas": "[0.9,0.99]",
    }
    study = fresh_study()
    study.enqueue_trial(baseline_params(baseline, space.conditionals), user_attrs={"baseline": True})
    trial = study.ask()
    assert space.sample(trial) == baseline


def test_a_choice_matches_regardless_of_case_and_type() -> None:
    """YAML may write the parent's value as `Lion` or a bool as `true`; the parsed choice is `lion` / True."""
    lr = FloatDistribution(1e-5, 1e-2, log=True)
    conditionals = [Conditional("optim", "lion", {"optim.lr": lr}), Conditional("train.ema", True, {"optim.ema": lr})]
    params = baseline_params({"optim": "Lion", "optim.lr": 1e-4, "train.ema": "true", "optim.ema": 0.99}, conditionals)
    assert params == {"optim": "Lion", "optim.lr@lion": 1e-4, "train.ema": "true", "optim.ema@True": 0.99}


def test_a_parameter_of_another_choice_keeps_its_plain_name() -> None:
    lr = FloatDistribution(1e-5, 1e-2, log=True)
    conditionals = [Conditional("optim", "lion", {"optim.lr": lr, "optim.betas": lr})]
    assert baseline_params({"optim": "adamw", "optim.lr": 1e-3}, conditionals) == {"optim": "adamw", "optim.lr": 1e-3}
    # A conditional parameter the baseline does not set is not invented.
    assert baseline_params({"optim": "lion"}, conditionals) == {"optim": "lion"}


def test_a_root_with_a_trailing_slash_gives_the_same_paths(tmp_path: Path) -> None:
    plain = StudyRoots.of(str(tmp_path), "gs://bucket/runs", "gs://bucket/ckpt", "halting", "abcdef0123")
    slashed = StudyRoots.of(str(tmp_path), "gs://bucket/runs/", "gs://bucket/ckpt/", "halting", "abcdef0123")
    assert slashed == plain and "//halting" not in slashed.trial(3, 3).checkpoint_url


def test_a_warmup_given_as_a_share_of_the_trial_is_resolved_in_steps() -> None:
    """conf/pruner/median_late.yaml: no verdict before half of train.steps, whatever a study's trial length; an
    integer warmup stays steps, and a wrapped pruner's lengths resolve too."""
    from sweeps.config.optuna_parts import pruner_spec, resolve_steps

    late = yaml.safe_load((Path(__file__).parents[1] / "conf/pruner/median_late.yaml").read_text())
    assert pruner_spec(late, 500)["n_warmup_steps"] == 250
    assert pruner_spec(late, 1200)["n_warmup_steps"] == 600
    assert resolve_steps({"n_warmup_steps": 150}, 500)["n_warmup_steps"] == 150
    wrapped = resolve_steps({"wrapped": {"n_warmup_steps": 0.25, "max_resource": "auto"}}, 800)["wrapped"]
    assert wrapped == {"n_warmup_steps": 200, "max_resource": 800}
