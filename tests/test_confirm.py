"""A winner that holds when trained again (sweeps/trials/confirm.py, confirmed.py, confirm_rank.py; trm/links/confirm.py):
the top configurations trained on fresh seeds by real jobs, ranked by their mean over seeds with an eval + seed
standard error, resumed after an interruption without training a seed twice, and priced by a dry run."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from contracts.eval_noise import binomial_stderr
from dashboards.report_page import write_report
from storage.confirm_record import ConfirmSeed, confirm_attr, confirmations
from storage.record import (
    DETAILS_ATTR,
    SEED_VALUES_ATTR,
    Reeval,
    reeval_attr,
    reevals,
)
from sweeps import best, status
from sweeps.config.config_values import SweepConfigError
from sweeps.config.schema import ConfirmSettings
from sweeps.config.typed_config import typed_block, typed_sweep
from sweeps.driver import Driver
from sweeps.testing import LAUNCHER_ENV
from sweeps.trials.confirm import cost_lines, fresh_seeds, plan
from sweeps.trials.confirm_rank import (
    EVAL,
    EVAL_AND_SEED,
    OWN,
    POOLED,
    SeedValue,
    pooled_seed_variance,
    rank,
    seed_variance,
    tie_line,
)
from sweeps.trials.confirmed import configuration_values, confirmed_lines, confirmed_ranking, ranking_eval
from sweeps.trials.wandb_summary import study_summary
from tests.sweep_helpers import FAST_TRIAL, sweep_config
from tests.test_sweeps import with_space

TRIAL = [*FAST_TRIAL, "train.eval_examples=16"]  # every training's eval: 16 of the 32 test puzzles


def sv(value: float, se: float | None = 0.0) -> SeedValue:
    return SeedValue(value, se)


# The ranking's arithmetic, branch by branch.


def test_a_configurations_seed_variance_is_its_spread_less_the_evals_noise() -> None:
    assert seed_variance([sv(0.5, 0.01)]) is None  # one value: no spread to measure
    values = [sv(0.6, 0.02), sv(0.7, 0.02), sv(0.8, 0.02)]
    assert seed_variance(values) == pytest.approx(0.01 - 0.0004)  # sample variance 0.01, eval 0.02^2
    assert seed_variance([sv(0.60, 0.05), sv(0.61, 0.05)]) == 0.0  # the eval's noise explains the spread: not < 0
    assert seed_variance([sv(0.6, None), sv(0.8, None)]) == pytest.approx(0.02)  # a loss: no eval noise known


def test_the_pooled_seed_variance_weights_each_configuration_by_its_degrees_of_freedom() -> None:
    two = [sv(0.6), sv(0.8)]  # variance 0.02, 1 degree of freedom
    three = [sv(0.5), sv(0.5), sv(0.5)]  # variance 0, 2 degrees of freedom
    assert pooled_seed_variance([two, three, [sv(0.9)]]) == pytest.approx(0.02 / 3)  # the single value adds none
    assert pooled_seed_variance([[sv(0.9)], [sv(0.1)]]) is None  # nobody has two values


def test_a_configuration_with_few_values_takes_the_pooled_variance_and_one_with_many_its_own() -> None:
    few = [sv(0.70, 0.02), sv(0.74, 0.02)]
    many = [sv(0.50, 0.02), sv(0.60, 0.02), sv(0.70, 0.02), sv(0.55, 0.02), sv(0.65, 0.02)]
    ranked = rank({3: few, 8: many}, maximize=True, own_variance_at=5)
    assert [c.trial for c in ranked] == [3, 8]
    top, other = ranked
    pooled = pooled_seed_variance([few, many])
    assert pooled is not None and top.seed_sd_from == POOLED and top.seed_sd == pytest.approx(math.sqrt(pooled))
    assert top.se == pytest.approx(math.sqrt(pooled / 2 + 2 * 0.02**2 / 4))  # seed_var/m + sum(eval_se^2)/m^2
    assert top.eval_se == pytest.approx(0.02 / math.sqrt(2)) and top.se_kind == EVAL_AND_SEED
    own = seed_variance(many)
    assert own is not None and other.seed_sd_from == OWN and other.seed_sd == pytest.approx(math.sqrt(own))
    assert other.mean == pytest.approx(0.6) and other.n == 5


def test_without_any_second_value_the_error_bar_is_the_evals_alone_and_says_so() -> None:
    ranked = rank({0: [sv(0.6, 0.03)], 1: [sv(0.5, 0.04)], 2: []}, maximize=True, own_variance_at=5)
    assert [c.trial for c in ranked] == [0, 1]  # a configuration without values is not ranked
    assert ranked[0].seed_sd is None and ranked[0].seed_sd_from is None and ranked[0].se_kind == EVAL
    assert ranked[0].se == pytest.approx(0.03)


def test_a_minimized_objective_ranks_the_lowest_mean_first_and_ties_by_trial_number() -> None:
    ranked = rank({5: [sv(1.0, None)], 2: [sv(1.0, None)], 4: [sv(0.5, None)]}, maximize=False, own_variance_at=5)
    assert [c.trial for c in ranked] == [4, 2, 5]


def test_one_line_says_when_the_top_two_cannot_be_told_apart_and_which_standard_error() -> None:
    close = rank({0: [sv(0.70, 0.02), sv(0.66, 0.02)], 1: [sv(0.67, 0.02), sv(0.65, 0.02)]}, True, 5)
    line = tie_line(close)
    assert line is not None and line.startswith(
        "the configurations of trials 0 and 1 cannot be told apart: within one eval + seed standard error (0.6800 ± "
    )
    apart = rank({0: [sv(0.90, 0.01), sv(0.91, 0.01)], 1: [sv(0.50, 0.01), sv(0.52, 0.01)]}, True, 5)
    assert tie_line(apart) is None
    assert tie_line(apart[:1]) is None  # one configuration: nothing to tell apart
    eval_only = rank({0: [sv(0.61, 0.02)], 1: [sv(0.60, 0.02)]}, True, 5)
    assert "within one eval standard error" in (tie_line(eval_only) or "")


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"top_k": 0}, r"confirm.top_k=0: expected a whole number >= 1"),
        ({"seeds": 0}, r"confirm.seeds=0: expected a whole number >= 1"),
        ({"first_seed": -1}, r"confirm.first_seed=-1: expected a whole number >= 0"),
        ({"own_variance_at": 1}, r"confirm.own_variance_at=1: expected a whole number >= 2"),
    ],
)
def test_bad_confirm_knobs_are_refused_naming_key_and_value(node: dict, message: str) -> None:
    base = {"at_end": False, "top_k": 2, "seeds": 1, "first_seed": 1000, "own_variance_at": 5}
    with pytest.raises(SweepConfigError, match=message):
        typed_block("confirm", ConfirmSettings, base | node)


def test_confirm_seeds_are_fresh_for_the_trial_and_the_same_every_time() -> None:
    dist = {"x": FloatDistribution(0, 1)}
    own = create_trial(value=0.5, params={"x": 0.5}, distributions=dist,
                       user_attrs={DETAILS_ATTR: {"train_overrides": ["seed=1001", "optim.lr=0.001"]}})  # fmt: skip
    assert fresh_seeds(own, 3, 1000, study_seeds=1) == [1000, 1002, 1003]  # its own seed skipped
    assert fresh_seeds(own, 1, 0, study_seeds=3) == [3]  # seeds 0..2 trained it (study.seeds=3)
    assert ConfirmSeed.of({"trial": 1}) is None and ConfirmSeed.of("x") is None  # not a record: not read


# The stage with real jobs and real storage.


def trial_attrs(tmp_path: Path, n: int, seed_values: list[float] | None = None) -> dict:
    attrs = {
        DETAILS_ATTR: {"train_overrides": TRIAL, "final_metrics": {"eval/halted_examples": 16}},
        "checkpoint_url": f"{tmp_path}/ckpt-{n}",
        "train_seconds": 10.0 + n,  # its job's time (TrialOutcome.train_seconds): what a dry run prices a seed by
    }
    return attrs | ({SEED_VALUES_ATTR: seed_values} if seed_values else {})


def stored_study(tmp_path: Path, name: str, values: list[float]) -> tuple[str, optuna.Study]:
    """A study opened by the driver (its uid and definition), whose trials trained `TRIAL` and reported `values`."""
    db = f"sqlite:///{tmp_path}/db.sqlite"
    driver = Driver(typed_sweep(sweep_config(db, tmp_path, f"study.name={name}", "study.objective=eval/accuracy")))
    study = driver.open_study()
    for n, value in enumerate(values):
        study.add_trial(
            create_trial(value=value, params={"x": value}, distributions={"x": FloatDistribution(0, 1)},
                         user_attrs=trial_attrs(tmp_path, n))
        )  # fmt: skip
    return db, study


def best_argv(db: str, tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [f"study={name}", f"storage.url={db}", f"output_root={tmp_path}", "wandb.enabled=false", *extra]


def test_a_dry_run_prints_the_stages_plan_and_cost_and_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, study = stored_study(tmp_path, "priced", [0.5, 0.7, 0.6])
    seed_1000 = ConfirmSeed(1, 1000, "COMPLETE", "eval/accuracy", 0.7, 20, 0.7, 16, 20, 9.0, f"{tmp_path}/c")
    study.set_user_attr(confirm_attr(1, 1000), seed_1000.as_dict())  # one seed done already: not priced
    argv = best_argv(db, tmp_path, "priced", "confirm=true", "dry_run=true", "confirm.top_k=2", "confirm.seeds=2")
    assert best.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "confirm stage: top 2 configurations x 2 fresh seed(s): 3 training job(s) to run, 1 done already"
    assert out[1:4] == [
        "  trial 1 seed 1001: as long as the trial (11 s)",
        "  trial 2 seed 1000: as long as the trial (12 s)",
        "  trial 2 seed 1001: as long as the trial (12 s)",
    ]
    assert out[4] == "confirm stage cost: about 35 s of training, 106% of the study's 33 s (the trials' own job times)"
    assert not list(tmp_path.glob("priced/*/trial-*/confirm"))  # nothing ran
    assert best.main(["study=priced", f"storage.url={db}", "dry_run=true"]) == 2  # a dry run of nothing
    assert "goes with confirm=true" in capsys.readouterr().err


@pytest.mark.slow  # starts `python -m sweeps.run`
def test_the_sweeps_dry_run_prints_the_confirm_stages_cost(tmp_path: Path) -> None:
    """`python -m sweeps.run dry_run=true` with confirm.at_end: its extra trainings beside the study's."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    argv = ["study=model_scaling", "dry_run=true", "estimate.enabled=false", "n_trials=8", "confirm.at_end=true",
            "confirm.top_k=2", "confirm.seeds=2", f"output_root={tmp_path}", f"hydra.run.dir={tmp_path}/h",
            f"storage.url=sqlite:///{tmp_path}/db.sqlite"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "sweeps.run", *argv], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == (
        "# confirm stage (confirm.at_end): top 2 configurations x 2 fresh seed(s) = 4 training job(s) after the "
        "study, 50% of its n_trials=8"
    )


def seed_record(trial: int, seed: int, value: float, again: float | None = None, examples: int = 32) -> ConfirmSeed:
    return ConfirmSeed(trial, seed, "COMPLETE", "eval/accuracy", value, 20, value, 16, 20, 9.0, "/c",
                       reeval_value=again, reeval_examples=examples if again is not None else None)  # fmt: skip


def trial_reeval(trial: int, value: float, examples: int = 32) -> Reeval:
    return Reeval(trial, "eval/accuracy", value, binomial_stderr(value, examples), examples, 20, f"/ckpt-{trial}")


def test_the_ranking_takes_the_reevaluations_values_only_once_every_value_has_one_on_one_count(
    tmp_path: Path,
) -> None:
    """A subset and the whole split differ in difficulty: one eval for the whole ranking. Until each confirmed
    configuration's values (its trial's and its seeds') are all re-evaluated on one count, every value is the
    trials' own eval; and a trained seed not yet re-evaluated is what the stage plans next (no training)."""
    db, study = stored_study(tmp_path, "evals", [0.30, 0.32])
    for r in (trial_reeval(0, 0.50), trial_reeval(1, 0.55)):
        study.set_user_attr(reeval_attr(r.trial), r.as_dict())
    study.set_user_attr(confirm_attr(0, 1000), seed_record(0, 1000, 0.28, again=0.48).as_dict())
    study.set_user_attr(confirm_attr(1, 1000), seed_record(1, 1000, 0.34).as_dict())  # not re-evaluated yet
    assert configuration_values(study)[1] == [SeedValue(0.32, binomial_stderr(0.32, 16)),
                                              SeedValue(0.34, binomial_stderr(0.34, 16), 1000, "confirm")]  # fmt: skip
    assert ranking_eval(study) == "the trials' own eval (not every value was re-evaluated on one count)"
    settings = ConfirmSettings(at_end=False, top_k=2, seeds=1, first_seed=1000, own_variance_at=5)
    planned = plan(study, settings)
    assert [(j.trial.number, j.seed, j.train) for j in planned.jobs] == [(1, 1000, False)] and planned.examples == 32
    assert cost_lines(study, settings)[0] == (
        "confirm stage: top 2 configurations x 1 fresh seed(s): 0 training job(s) to run, 1 done already, each "
        "re-evaluated on 32 puzzles as its trial was (1 re-evaluation job(s))"
    )
    study.set_user_attr(confirm_attr(1, 1000), seed_record(1, 1000, 0.34, again=0.52, examples=24).as_dict())
    assert ranking_eval(study).startswith("the trials' own eval")  # another count: still not one eval
    study.set_user_attr(confirm_attr(1, 1000), seed_record(1, 1000, 0.34, again=0.52).as_dict())
    assert ranking_eval(study) == "the re-evaluation's 32 puzzles"
    ranked = confirmed_ranking(study)
    assert [c.trial for c in ranked] == [1, 0] and [v.value for v in ranked[0].values] == [0.55, 0.52]
    assert plan(study, settings).jobs == []


def confirm_records(db: str, name: str) -> dict[tuple[int, int], dict]:
    study = optuna.load_study(study_name=name, storage=db)
    return {(t, s): r.as_dict() for t, seeds in confirmations(study.user_attrs).items() for s, r in seeds.items()}


@pytest.mark.slow
@pytest.mark.timeout(600)
def gated_python(tmp_path: Path) -> tuple[Path, Path]:
    """The jobs' interpreter (launcher.python) and its gate: this Python, except that every training job after the
    first waits until the gate's `release` exists. So a Ctrl-C sent once the first job's seed is stored lands while
    the second job runs, however loaded the machine (it used to finish first now and then: the stage then ended with
    both seeds)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    script = tmp_path / "python-gated"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = trm.train ]; then\n'
        f"  if [ -e {gate}/first ]; then while [ ! -e {gate}/release ]; do sleep 0.1; done; fi\n"
        f"  touch {gate}/first\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return script, gate / "release"


def test_an_interrupted_stage_resumes_with_the_same_command_and_trains_no_seed_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sweeps.best confirm=true` is stopped by Ctrl-C once its first job has stored its seed (the second held at its
    start: gated_python); the same command then runs only the seed that lacks a record (the first's record is the
    same one), and the ranking, sweeps.best, sweeps.status, the report and the W&B summary show the configurations
    confirmed."""
    db, study = stored_study(tmp_path, "resumed", [0.30, 0.32, 0.1])
    python, release = gated_python(tmp_path)
    argv = best_argv(
        db,
        tmp_path,
        "resumed",
        "confirm=true",
        "confirm.top_k=2",
        "confirm.seeds=1",
        "max_concurrent=1",
        f"launcher.python={python}",
    )
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV} | {"OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "sweeps.best", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.time() + 300
    while not confirm_records(db, "resumed") and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    first = confirm_records(db, "resumed")
    assert len(first) == 1, proc.communicate()[0][-3000:]
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the second job (held at its start, or not started yet) is stopped
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and len(confirm_records(db, "resumed")) == 1, out[-3000:]
    release.touch()  # the same command's jobs run through
    ((done_trial, done_seed),) = first
    assert done_trial == 1 and done_seed == 1000  # trial 1 reported best: confirmed first, on the first fresh seed

    capsys.readouterr()
    logging.getLogger("sweeps").setLevel(logging.INFO)
    assert best.main(argv) == 0  # the same command
    text = capsys.readouterr().out
    after = confirm_records(db, "resumed")
    assert sorted(after) == [(0, 1000), (1, 1000)]
    assert after[(1, 1000)] == first[(1, 1000)]  # not trained again: the same record (its time, its values)
    study = optuna.load_study(study_name="resumed", storage=db)
    for (trial, seed), record in after.items():
        assert record["outcome"] == "COMPLETE" and record["examples"] == 16 and record["metric"] == "eval/accuracy"
        assert record["checkpoint_url"].endswith(f"/trial-{trial}/confirm/seed-{seed}/checkpoints")
        assert Path(record["checkpoint_url"], "best.pt").is_file()
    workdirs = sorted(p.relative_to(tmp_path) for p in tmp_path.glob("resumed/*/trial-*/confirm/seed-*"))
    assert [p.parts[-3:] for p in workdirs] == [
        ("trial-0", "confirm", "seed-1000"),
        ("trial-1", "confirm", "seed-1000"),
    ]

    ranked = confirmed_ranking(study)
    assert sorted(c.trial for c in ranked) == [0, 1] and all(c.n == 2 for c in ranked)
    for c in ranked:  # its own trial's value, then its confirm seed's, each with the 16 puzzles' standard error
        own = study.trials[c.trial].value
        seed_value = after[(c.trial, 1000)]["best_value"]
        assert [v.value for v in c.values] == [own, seed_value]
        assert c.values[1].eval_se == pytest.approx(binomial_stderr(seed_value, 16))
        assert c.mean == pytest.approx((own + seed_value) / 2) and c.se_kind == "eval + seed"
    winner = ranked[0].trial
    lines = confirmed_lines(study)
    assert lines[0].startswith(f"confirmed winner: trial {winner} (x=")
    assert lines[0] in text and "(eval + seed SE, 2 seeds) (mean over seeds)" in lines[0]
    assert lines[1] == (
        "it is the trials' own winner" if winner == 1 else "it differs from the trials' own winner, trial 1"
    )

    assert best.main(["study=resumed", f"storage.url={db}", "format=json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["trial"] == winner and shown["confirmed"]["rank"] == 1 and shown["confirmed"]["n"] == 2
    assert shown["confirm_checkpoints"] == {"1000": f"{after[(winner, 1000)]['checkpoint_url']}/best.pt"}
    assert shown["retrain"][:3] == ["python", "-m", "trm.train"] and shown["trials_winner"] == 1
    assert status.main(["study=resumed", f"storage.url={db}"]) == 0
    table = capsys.readouterr().out
    assert "confirmed" in table.splitlines()[1] and lines[0] in table
    summary = study_summary(study)
    assert summary["best/number"] == winner and [r["trial"] for r in summary["confirm/ranking"]] == [
        c.trial for c in ranked
    ]
    assert summary["confirm/differs_from_trials_winner"] == (winner != 1)
    page = write_report(study, tmp_path / "report.html").read_text()
    assert 'id="confirm-table"' in page and 'id="reeval-table"' not in page


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_study_ends_with_its_winner_confirmed_on_a_fresh_seed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """confirm.at_end: the driver's end trains the top configuration again on a job of its launcher, after the
    study's own trials and their re-evaluation, re-evaluates the seed's checkpoint on the same 32 puzzles, and logs
    the confirmed winner (ranked on the re-evaluation's values) and whether it is the trials' own."""
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        db, tmp_path, "study.name=ended", "n_trials=2", "pruner=none", "study.enqueue_baseline=false",
        "confirm.at_end=true", "confirm.top_k=1", "confirm.seeds=1", "study.objective=eval/accuracy",
        "reeval.at_end=true", "reeval.top_k=1", trial=TRIAL,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="sweeps"):
        Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.001, 0.003)"}))).run()
    study = optuna.load_study(study_name="ended", storage=db)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    top = max(study.trials, key=lambda t: float(t.value or 0)).number
    assert list(confirmations(study.user_attrs)) == [top] and list(confirmations(study.user_attrs)[top]) == [1000]
    record = confirmations(study.user_attrs)[top][1000]
    trial_reeval = reevals(study.user_attrs)[top]
    assert record.reeval_examples == 32 == trial_reeval.examples and record.reeval_value is not None
    assert ranking_eval(study) == "the re-evaluation's 32 puzzles"
    (confirmed,) = confirmed_ranking(study)
    assert [v.value for v in confirmed.values] == [trial_reeval.value, record.reeval_value]
    messages = [r.getMessage() for r in caplog.records]
    assert f"confirming trial {top} on seed 1000" in messages
    assert f"re-evaluating trial {top}'s seed 1000 on 32 puzzles" in messages
    assert any(m.startswith(f"confirmed winner: trial {top} ") for m in messages)
    assert "it is the trials' own winner" in messages
