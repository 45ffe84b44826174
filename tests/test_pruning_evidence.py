"""The evidence-checking pruner (contracts/pruning/evidence.py) on real Optuna studies in SQLite: it lets the wrapped
pruner prune only at steps where the audit trials' values rank as their final values do."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from contracts.pruning.evidence import EvidencePruner
from dashboards.report_page import write_report
from storage import open_storage
from storage.heartbeat import retry_callback
from storage.study_record import StudyAttrs
from sweeps.config.compose import compose_sweep_config
from sweeps.config.optuna_parts import build, pruner_spec
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from tests.sweep_helpers import FAST_TRIAL, sweep_config
from tests.test_sweeps import with_space
from trm.links.trial import TrialLink

# A median pruner with one start-up trial prunes any trial below the completed trials' median at a step.
MEDIAN = {"_target_": "optuna.pruners.MedianPruner", "n_startup_trials": 1, "n_warmup_steps": 0}
SPEC = {"_target_": "contracts.pruning.evidence.EvidencePruner", "wrapped": MEDIAN, "audit_first": 4, "min_audit": 4}


def study_with_audits(
    tmp_path: Path, curves: list[dict[int, float]], finals: list[float], pruner: optuna.pruners.BasePruner
) -> optuna.Study:
    """A SQLite study whose first trials (the audit trials) reported `curves` and finished at `finals`."""
    study = optuna.create_study(
        study_name="evidence", storage=f"sqlite:///{tmp_path}/db.sqlite", direction="maximize", pruner=pruner
    )
    for curve, final in zip(curves, finals):
        trial = study.ask()
        for step, value in curve.items():
            trial.report(value, step)
            assert not trial.should_prune()  # an audit trial runs to its end whatever its values
        study.tell(trial, final)
    return study


def evidence_pruner(min_agreement: float = 0.5) -> EvidencePruner:
    return EvidencePruner(build(MEDIAN), audit_first=4, min_audit=4, min_agreement=min_agreement)


EARLY = [{100: 0.1, 200: 0.0}, {100: 0.2, 200: 0.0}, {100: 0.3, 200: 0.0}, {100: 0.4, 200: 0.0}]


@pytest.mark.parametrize(
    "finals,pruned",
    [
        ([0.1, 0.2, 0.3, 0.4], True),  # step 100 ranks the audit trials as they finished: the rung prunes
        ([0.4, 0.3, 0.2, 0.1], False),  # ... backwards (deeper recursion starts slower): it never prunes
    ],
)
def test_a_rung_prunes_only_where_the_audit_trials_ranks_agree(
    tmp_path: Path, finals: list[float], pruned: bool
) -> None:
    study = study_with_audits(tmp_path, EARLY, finals, evidence_pruner())
    trial = study.ask()
    trial.report(0.05, 100)  # below every audit trial at step 100: the bare median pruner prunes it
    assert build(MEDIAN).prune(study, study.trials[-1])
    assert trial.should_prune() is pruned
    rung = StudyAttrs.of(study.user_attrs).pruner_evidence["rungs"]["100"]
    assert rung == {"tau": 1.0 if pruned else -1.0, "n": 4, "on": pruned}


def test_a_rung_where_every_audit_value_is_equal_never_prunes(tmp_path: Path) -> None:
    # All audit trials read 0.0 at step 200 and finished apart: no ranking there, even at the loosest threshold.
    study = study_with_audits(tmp_path, EARLY, [0.6, 0.5, 0.4, 0.3], evidence_pruner(min_agreement=-1.0))
    trial = study.ask()
    trial.report(0.0, 200)
    trial.report(-1.0, 300)  # a step no audit trial reported at: no evidence either
    for step in (200, 300):
        frozen = study.trials[-1]
        frozen.intermediate_values = {step: frozen.intermediate_values[step]}
        assert study.pruner.prune(study, frozen) is False
    rungs = StudyAttrs.of(study.user_attrs).pruner_evidence["rungs"]
    assert rungs["200"] == {"tau": None, "n": 4, "on": False} and "300" not in rungs


def test_too_few_audit_trials_switch_every_rung_off(tmp_path: Path) -> None:
    study = study_with_audits(tmp_path, EARLY[:3], [0.1, 0.2, 0.3], evidence_pruner())
    trial = study.ask()  # trial 3: still an audit trial
    trial.report(0.0, 100)
    assert not trial.should_prune()
    study.tell(trial, state=TrialState.FAIL)  # no final value: not evidence
    trial = study.ask()
    trial.report(0.0, 100)
    assert not trial.should_prune()  # agreement 1.0, but over 3 audit trials of the 4 needed
    assert StudyAttrs.of(study.user_attrs).pruner_evidence["rungs"]["100"] == {"tau": 1.0, "n": 3, "on": False}


def test_audit_trials_are_the_first_and_every_nth_and_a_retry_keeps_its_status(tmp_path: Path) -> None:
    pruner = EvidencePruner(build(MEDIAN), audit_first=2, audit_every=3, min_audit=2)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/db.sqlite")
    trials = [study.ask() for _ in range(9)]
    audits = [t.number for t in trials if pruner.is_audit(study.trials[t.number])]
    assert audits == [0, 1, 2, 5, 8]
    # The driver's retry of trial 5 (Optuna's RetryHeartbeatStaleTrialCallback) is an audit trial too; of trial 4, not.
    for original in (5, 4):
        study.tell(trials[original], state=TrialState.FAIL)
        retry_callback()(study, study.trials[original])
    retried = list(study.get_trials(states=(TrialState.WAITING,)))
    assert [pruner.is_audit(t) for t in retried] == [True, False]


def test_what_it_measured_is_stored_and_a_switch_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="sweeps.pruning"):
        study = study_with_audits(tmp_path, EARLY, [0.1, 0.2, 0.3, 0.4], evidence_pruner())
        for _ in range(2):  # the second trial finds the record unchanged: no write, no second line
            trial = study.ask()
            trial.report(0.5, 100)
            assert not trial.should_prune()
            study.tell(trial, 0.5)
    record = StudyAttrs.of(study.user_attrs).pruner_evidence
    assert record["audit_trials"] == [0, 1, 2, 3] and (record["min_audit"], record["min_agreement"]) == (4, 0.5)
    assert record["rungs"]["200"]["on"] is False
    lines = [r.getMessage() for r in caplog.records if r.name == "sweeps.pruning"]
    assert lines == ["pruning at step 100 switched on: Kendall tau 1.0 over 4 audit trials (needs >= 0.5 over >= 4)"]


def test_the_job_builds_the_stored_evidence_pruner_and_prunes_with_it(tmp_path: Path) -> None:
    """The job rebuilds the pruner from the study record (trm/links/trial.py): the wrapper must pass its whitelist."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    study = study_with_audits(tmp_path, EARLY, [0.1, 0.2, 0.3, 0.4], evidence_pruner())
    StudyAttrs(objective="eval/exact_accuracy", pruner=SPEC).store(study.set_user_attr)
    trial = study.ask()
    link = TrialLink("evidence", trial.number, url)
    assert isinstance(link.study.pruner, EvidencePruner)
    assert link.report(100, {"eval/exact_accuracy": 0.05}) == "prune"
    study = optuna.load_study(study_name="evidence", storage=open_storage(url))
    assert StudyAttrs.of(study.user_attrs).pruner_evidence["rungs"]["100"]["on"] is True


@pytest.mark.slow
def test_a_study_stored_before_the_wrapper_moved_is_the_same_study_and_its_jobs_never_load_the_platform(
    tmp_path: Path,
) -> None:
    """The wrapper lived in sweeps/ until it moved to contracts/ (a layer the trainer imports). A study stored with
    its old name keeps its definition (no StudyDefinitionError on resume), and its jobs build the pruner under the
    new name: in a fresh interpreter, a job's TrialLink prunes with it and `sweeps` is never imported."""
    import subprocess
    import sys

    from contracts.pruners import current_pruner_spec
    from sweeps.search.definition import PARTS, study_changes

    old = {**SPEC, "_target_": "sweeps.pruning_evidence.EvidencePruner"}
    assert current_pruner_spec(old) == SPEC and current_pruner_spec({"wrapped": old})["wrapped"] == SPEC
    assert old["_target_"] == "sweeps.pruning_evidence.EvidencePruner"  # the stored value is left as it is
    contracts_era = {**SPEC, "_target_": "contracts.pruning_evidence.EvidencePruner"}  # before contracts/pruning/
    assert current_pruner_spec(contracts_era) == SPEC
    here = {part: [] for part in PARTS} | {"space": {}, "pruner": SPEC}
    assert study_changes({**here, "pruner": old}, [], here) == []
    assert [c.what for c in study_changes({**here, "pruner": {**old, "min_audit": 5}}, [], here)] == ["pruner"]
    url = f"sqlite:///{tmp_path}/db.sqlite"
    study = study_with_audits(tmp_path, EARLY, [0.1, 0.2, 0.3, 0.4], evidence_pruner())
    StudyAttrs(objective="eval/exact_accuracy", pruner=old).store(study.set_user_attr)
    number = study.ask().number
    job = (
        "import sys\n"
        "from trm.links.trial import TrialLink\n"
        f"link = TrialLink('evidence', {number}, {url!r})\n"
        "print(type(link.study.pruner).__module__, link.report(100, {'eval/exact_accuracy': 0.05}),"
        " sorted(m for m in sys.modules if m.split('.')[0] in ('sweeps', 'dashboards')))\n"
    )
    out = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["contracts.pruning.evidence", "prune", "[]"]


@pytest.mark.parametrize("study_name", ["curriculum", "halting"])
def test_studies_of_recursion_depth_ship_the_evidence_pruner(study_name: str) -> None:
    spec = pruner_spec(typed_sweep(compose_sweep_config([f"study={study_name}"])).pruner, train_steps=500)
    assert spec["_target_"] == "contracts.pruning.evidence.EvidencePruner"
    assert spec["wrapped"]["max_resource"] == 500  # `auto` resolved inside the wrapper too
    assert isinstance(build(spec), EvidencePruner)
    # the user's choice wins over the study's default; a study of something else keeps the global one
    assert compose_sweep_config([f"study={study_name}", "pruner=median"]).pruner._target_.endswith("MedianPruner")
    assert compose_sweep_config(["study=optimizer"]).pruner._target_.endswith("HyperbandPruner")


def test_the_report_shows_what_it_measured(tmp_path: Path) -> None:
    study = study_with_audits(tmp_path, EARLY, [0.4, 0.3, 0.2, 0.1], evidence_pruner())
    StudyAttrs(objective="eval/exact_accuracy").store(study.set_user_attr)
    trial = study.ask()
    trial.report(0.05, 100)
    assert not trial.should_prune()
    page = write_report(study, tmp_path / "report.html").read_text()
    line = re.search(r'<p class="meta" id="pruner-evidence">([^<]*)</p>', page)
    assert line is not None, "no evidence line in the report"
    assert "audit trials (never pruned) 0, 1, 2, 3" in line[1]
    assert "100: -1.00 (off, n 4), 200: n/a (off, n 4)" in line[1]
    # a study whose pruner measured nothing has no such line
    other = optuna.create_study(storage=f"sqlite:///{tmp_path}/other.sqlite")
    assert "pruner-evidence" not in write_report(other, tmp_path / "other.html").read_text()


@pytest.mark.slow
def test_a_real_sweep_records_its_evidence_from_the_jobs(tmp_path: Path) -> None:
    """The evidence pruner (the depth studies' default) through the driver and real training jobs: the jobs' pruner writes the
    record, the audit trials run to their end, and a trial is pruned only at a step the record has on."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        url, tmp_path, "study.name=audited", "n_trials=4", "sampler=random",
        "pruner=evidence", "pruner.audit_first=2", "pruner.min_audit=2", "pruner.wrapped.min_resource=10",
    )  # fmt: skip
    study = Driver(typed_sweep(with_space(cfg, {"optim.lr": "interval(0.0005, 0.005)"}))).run()
    trials = study.get_trials()
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials) and len(trials) == 4
    record = StudyAttrs.of(study.user_attrs).pruner_evidence
    assert record["audit_trials"] == [0, 1] and set(record["rungs"]) == {"10", "20"}
    assert record == EvidencePruner(build(MEDIAN), audit_first=2, min_audit=2).evidence(trials)  # as measured
    for t in trials:
        if t.state == TrialState.PRUNED:
            assert record["rungs"][str(t.last_step)]["on"], (t.number, record)


def near_best_pruner() -> EvidencePruner:
    return EvidencePruner(build(MEDIAN), audit_first=4, min_audit=4, check="near_best", eval_examples=256)


def test_near_best_switches_a_rung_off_where_the_rule_would_cut_a_best_audit(tmp_path: Path) -> None:
    # Audits 0 and 1 end within one eval standard error of the best (0.50 on 256 puzzles: 0.031); at step 100 they
    # sit below the others' median, so the median rule would have cut them there; at step 200 it keeps them.
    curves = [{100: 0.10, 200: 0.50}, {100: 0.15, 200: 0.45}, {100: 0.30, 200: 0.20}, {100: 0.40, 200: 0.10}]
    study = study_with_audits(tmp_path, curves, [0.50, 0.49, 0.30, 0.10], near_best_pruner())
    trial = study.ask()
    trial.report(0.0, 100)  # below the median: the bare rule prunes here ...
    assert build(MEDIAN).prune(study, study.trials[-1])
    assert not trial.should_prune()  # ... but it would have cut the best audits at this step
    trial.report(0.0, 200)
    assert trial.should_prune()
    record = StudyAttrs.of(study.user_attrs).pruner_evidence
    assert record["check"] == "near_best" and record["near_best"] == [0, 1]
    assert record["rungs"]["100"] == {"tau": None, "n": 4, "on": False, "near_best_cut": [0, 1]}
    assert record["rungs"]["200"] == {"tau": None, "n": 4, "on": True, "near_best_cut": []}


def test_near_best_prunes_once_hopeless_trials_finished_where_rank_agreement_never_does(tmp_path: Path) -> None:
    # Issue 42: four near-equal audit trials (all within one SE of the best) agree on no ranking at step 100, so the
    # agreement check keeps pruning off for good. Trials at 0 that finished unpruned show the rule would keep every
    # near-best audit there: the near-best check switches the rung on.
    curves = [{100: 0.30}, {100: 0.35}, {100: 0.32}, {100: 0.31}]
    finals = [0.50, 0.49, 0.48, 0.47]
    for name, pruner in (("agreement", evidence_pruner()), ("near_best", near_best_pruner())):
        (tmp_path / name).mkdir()
        study = study_with_audits(tmp_path / name, curves, finals, pruner)
        for _ in range(3):  # hopeless trials, 0 at step 100 and at the end: three put the median below every audit
            trial = study.ask()
            trial.report(0.0, 100)
            assert not trial.should_prune()  # too few of them yet: the near-best audits would still be cut
            study.tell(trial, 0.0)
        trial = study.ask()
        trial.report(0.0, 100)
        assert trial.should_prune() is (name == "near_best")


def test_near_best_needs_the_eval_count_and_the_sweep_checks_it_is_the_trials(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"check=near_best with eval_examples=None"):
        EvidencePruner(build(MEDIAN), check="near_best")
    with pytest.raises(ValueError, match=r"check='rank': expected one of agreement, near_best"):
        EvidencePruner(build(MEDIAN), check="rank")
    cfg = sweep_config(
        f"sqlite:///{tmp_path}/db.sqlite",
        tmp_path / "out",
        "pruner=evidence",
        "+pruner.check=near_best",
        "+pruner.eval_examples=7",
        trial=[*FAST_TRIAL, "train.eval_examples=16"],
    )
    with pytest.raises(Exception, match=r"pruner.eval_examples=7 with pruner.check=near_best: expected the trials' "):
        Driver(typed_sweep(cfg)).validate()
