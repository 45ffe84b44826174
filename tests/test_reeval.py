"""The winner decided beyond the eval's noise (sweeps/trials/reeval.py, trm/reeval.py): the top trials' checkpoints
evaluated again on the whole test split, each value stored with its standard error, ranked by it, and one line
when the top two are within one standard error. A real tiny study with real checkpoints and real re-eval jobs."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from contracts.eval_noise import binomial_stderr
from dashboards.report_page import write_report
from storage import exclusive
from storage.record import (
    DETAILS_ATTR,
    DUPLICATE_OF_ATTR,
    Reeval,
    reeval_attr,
    reevals,
)
from storage.study_record import StudyAttrs
from sweeps import best
from sweeps.config.config_values import SweepConfigError
from sweeps.config.schema import ReevalSettings
from sweeps.config.typed_config import typed_block, typed_sweep
from sweeps.driver import Driver
from sweeps.launchers.base import JobSpec
from sweeps.launchers.local import LocalLauncher
from sweeps.trials.reeval import (
    failure_line,
    interval,
    overlap_line,
    paired_lines,
    ranking,
    ranking_lines,
    reevaluate_at_end,
)
from sweeps.trials.wandb_summary import log_study_summary, study_summary
from tests.sweep_helpers import FAST_TRIAL, sweep_config
from tests.test_sweeps import with_space
from tests.wandb_offline import find_runs, read_offline_run

TRIAL = [*FAST_TRIAL, "train.eval_examples=16"]  # the trials' own eval: 16 of the 32 test puzzles


def record(trial: int, value: float, stderr: float | None, examples: int = 512) -> Reeval:
    return Reeval(trial, "eval/exact_accuracy", value, stderr, examples, 400, f"/ckpt/trial-{trial}/best.pt")


def study_with(reported: list[float], stored: list[Reeval]) -> optuna.Study:
    return study_of(None, reported, stored)


def test_the_ranking_follows_the_reevaluation_not_the_reported_value() -> None:
    """Trial 0 reported best on its small eval; the larger eval puts trial 1 first, and the two are further apart
    than their standard errors: no overlap line."""
    study = study_with([0.90, 0.80], [record(0, 0.60, 0.02), record(1, 0.70, 0.02)])
    ranked = ranking(study)
    assert [r.trial.number for r in ranked] == [1, 0]
    assert study.best_trial.number == 0 and study.best_value == 0.90  # Optuna's record is not rewritten
    assert overlap_line(ranked) is None
    lines = ranking_lines(study)
    assert lines[0] == "re-evaluated winner: trial 1 (x=0.8), eval/exact_accuracy = 0.7000 ± 0.0200 (512 puzzles)"
    assert "reported 0.8000" in lines[1] and len(lines) == 3


def test_a_trial_whose_latest_reevaluation_failed_is_left_out_of_the_ranking_and_says_why() -> None:
    """It was first by its earlier re-evaluation; its checkpoint has since gone: it is no winner to reuse."""
    gone = dataclasses.replace(record(0, 0.70, 0.02), failed="worker-0 exited with code 1")
    study = study_with([0.9, 0.8], [gone, record(1, 0.60, 0.02)])
    assert [r.trial.number for r in ranking(study)] == [1]
    lines = ranking_lines(study)
    assert lines[0].startswith("re-evaluated winner: trial 1 ")
    assert lines[-1] == (
        "trial 0 left out: its re-evaluation failed (worker-0 exited with code 1); an earlier one read "
        "0.7000 ± 0.0200 (512 puzzles)"
    )
    assert Reeval.of(record(1, 0.6, 0.02).as_dict() | {"failed": None}) == record(1, 0.6, 0.02)
    older = {k: v for k, v in record(1, 0.6, 0.02).as_dict().items() if k != "failed"}
    assert Reeval.of(older) == record(1, 0.6, 0.02)  # a record from before the field reads back


def test_a_failed_reevaluation_is_told_by_the_jobs_own_error_line() -> None:
    """Issue 57.5: a left-out re-evaluation quoted the launcher's line and the Hydra traceback after it."""
    log = (
        "worker-0 exited with code 1; last log lines:\nError executing job with overrides: ['reeval.run=true']\n"
        'Traceback (most recent call last):\n  File "/work/main/trm/reeval.py", line 79, in run\n'
        "trm.checkpoints.checkpoint.CheckpointError: "
        "no checkpoint at /out/trial-0/checkpoints: nothing to evaluate again"
    )
    assert failure_line(log, 1, 60) == (
        "trm.checkpoints.checkpoint.CheckpointError: "
        "no checkpoint at /out/trial-0/checkpoints: nothing to evaluate again"
    )
    assert (
        failure_line("worker-0 exited with code -9; last log lines:\nstep 3", -9, 60) == "worker-0 exited with code -9"
    )
    assert failure_line(None, None, 60) == "no result in 60 s" and failure_line(None, 2, 60) == "exit code 2"


def test_the_top_two_within_one_standard_error_say_so_in_one_line() -> None:
    study = study_with([0.90, 0.80, 0.5], [record(0, 0.61, 0.02), record(1, 0.64, 0.02), record(2, 0.1, 0.01)])
    line = overlap_line(ranking(study))
    assert line == (
        "trials 1 and 0 overlap within one eval standard error (0.6400 ± 0.0200 (512 puzzles) vs 0.6100 ± 0.0200 "
        "(512 puzzles)): this eval cannot tell them apart"
    )
    assert ranking_lines(study)[-1] == line
    apart = study_with([0.9, 0.8], [record(0, 0.61, 0.01), record(1, 0.64, 0.01)])  # 0.03 > 0.01 + 0.01
    assert overlap_line(ranking(apart)) is None


def test_the_standard_error_is_wilsons_and_never_zero_at_a_share_of_zero_or_one() -> None:
    """The stored error is the half-width of scipy's Wilson score interval at one sigma, for whole counts; near the
    middle it is Wald's sqrt(p(1-p)/n); at 0 or 1 it is not 0. So a winner that solved all 32 puzzles is within
    noise of one that solved 31 (Fisher's exact test: p = 1), where Wald's zero error called them apart."""
    from scipy.stats import binomtest, fisher_exact

    one_sigma = math.erf(1 / math.sqrt(2))  # 0.6827
    for solved, n in ((0, 32), (2, 32), (16, 32), (32, 32), (307, 512), (511, 512)):
        ci = binomtest(solved, n).proportion_ci(confidence_level=one_sigma, method="wilson")
        assert binomial_stderr(solved / n, n) == pytest.approx((ci.high - ci.low) / 2, rel=1e-9)
    assert binomial_stderr(0.6, 512) == pytest.approx(math.sqrt(0.6 * 0.4 / 512), rel=0.01)
    assert binomial_stderr(0.0, 32) > 0.01 and binomial_stderr(1.0, 32) > 0.01
    assert fisher_exact([[32, 0], [31, 1]]).pvalue == pytest.approx(1.0)
    stored = [record(0, 1.0, binomial_stderr(1.0, 32), 32), record(1, 31 / 32, binomial_stderr(31 / 32, 32), 32)]
    assert (line := overlap_line(ranking(study_with([0.9, 0.8], stored)))) is not None
    assert line.startswith("trials 0 and 1 overlap within one eval standard error (1.0000 ± 0.0152 (32 puzzles)")
    wald = [record(0, 1.0, 0.0, 32), record(1, 31 / 32, math.sqrt(31 / 32 / 32 / 32), 32)]
    assert overlap_line(ranking(study_with([0.9, 0.8], wald))) is None  # what the old error said


def study_of(name: str | None, reported: list[float], stored: list[Reeval], storage: str | None = None) -> optuna.Study:
    """A maximizing study whose trials reported `reported` (parameter x = the value) and hold `stored` reevals."""
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    for value in reported:
        study.add_trial(create_trial(value=value, params={"x": value}, distributions={"x": FloatDistribution(0, 1)}))
    for r in stored:
        study.set_user_attr(reeval_attr(r.trial), r.as_dict())
    return study


def test_paired_studies_agree_on_the_same_winner_or_within_one_standard_error() -> None:
    """The demo and its pruned twin (make demo-unpruned): the same draws, and the same re-evaluated winner or two
    within one standard error agree; winners further apart, or other draws, are said to differ."""
    demo = study_of("demo", [0.9, 0.8, 0.7], [record(0, 0.60, 0.02), record(1, 0.70, 0.02)])
    same_draws = "studies 'demo' and 'twin' trained the same 3 configurations in the same order"
    twin = study_of("twin", [0.9, 0.8, 0.7], [record(0, 0.61, 0.02), record(1, 0.69, 0.02)])
    assert paired_lines(demo, twin) == [
        same_draws,
        "the same re-evaluated winner (x=0.8): trial 1 0.7000 ± 0.0200 (512 puzzles) vs trial 1 0.6900 ± 0.0200 "
        "(512 puzzles)",
    ]
    close = study_of("twin", [0.9, 0.8, 0.7], [record(0, 0.73, 0.02), record(1, 0.69, 0.02)])  # 0.03 <= 0.02 + 0.02
    assert paired_lines(demo, close)[1].startswith(
        "different re-evaluated winners, within one eval standard error of each other (agree): trial 1 0.7000"
    )
    apart = study_of("twin", [0.9, 0.8, 0.7], [record(0, 0.80, 0.01), record(1, 0.69, 0.01)])  # 0.10 > 0.02 + 0.01
    assert "further apart than one eval standard error (disagree)" in paired_lines(demo, apart)[1]
    other = study_of("twin", [0.9, 0.5, 0.7], [record(0, 0.70, 0.02)])
    assert paired_lines(demo, other)[0] == (
        "studies 'demo' and 'twin' trained different configurations: 1 of the 3 of the first not in the second"
    )
    bare = study_of("twin", [0.9, 0.8, 0.7], [])
    assert paired_lines(demo, bare) == [
        same_draws,
        "no re-evaluated trial in 'twin': run `python -m sweeps.best study=twin reeval=true`",
    ]


def test_sweeps_best_paired_prints_the_comparison_and_refuses_a_missing_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/paired.db"
    study_of("demo", [0.9, 0.8], [record(0, 0.60, 0.02), record(1, 0.70, 0.02)], db)
    study_of("twin", [0.9, 0.8], [record(0, 0.62, 0.02), record(1, 0.71, 0.02)], db)
    with warnings.catch_warnings():
        warnings.simplefilter("error", optuna.exceptions.ExperimentalWarning)  # none in the CLI's output
        assert best.main(["study=twin", f"storage.url={db}", "paired=demo"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("study twin, trial 1 (COMPLETE)")
    assert out[-2:] == [
        "paired: studies 'twin' and 'demo' trained the same 2 configurations in the same order",
        "paired: the same re-evaluated winner (x=0.8): trial 1 0.7100 ± 0.0200 (512 puzzles) vs trial 1 0.7000 "
        "± 0.0200 (512 puzzles)",
    ]
    assert best.main(["study=twin", f"storage.url={db}", "paired=dmeo"]) == 2
    assert capsys.readouterr().err.strip() == f"error: study='dmeo' not found in {db}"


@pytest.mark.parametrize(
    "node, message",
    [
        # OmegaConf's bool grammar takes yes/no/on/off; anything else is refused
        (
            {"at_end": "maybe", "top_k": 3, "examples": None},
            r"reeval.at_end='maybe': Value 'maybe' is not a valid bool",
        ),
        ({"at_end": True, "top_k": 0, "examples": None}, r"reeval.top_k=0: expected a whole number >= 1"),
        ({"at_end": True, "top_k": 2, "examples": -5}, r"reeval.examples=-5: expected a whole number >= 1, or null"),
    ],
)
def test_bad_reeval_knobs_are_refused_naming_key_and_value(node: dict, message: str) -> None:
    with pytest.raises(SweepConfigError, match=message):
        typed_block("reeval", ReevalSettings, node)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_study_reevaluates_its_top_trials_on_the_whole_test_split(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two trained trials; at the end each best checkpoint is evaluated again by a real job (the local launcher,
    `python -m trm.train ... reeval.run=true`) on all 32 test puzzles (the trials evaluated 16). The stored value
    is that eval's, with its standard error over 32 puzzles; Optuna's values are untouched; sweeps.best ranks by it and, on demand,
    runs it again on a count the user sets."""
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        db, tmp_path, "study.name=reeval", "n_trials=2", "pruner=none", "study.enqueue_baseline=false",
        "reeval.at_end=true", "reeval.top_k=2", "study.objective=eval/accuracy", trial=TRIAL,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="sweeps"):
        Driver(typed_sweep(with_space(cfg, {"optim.lr": "choice(0.001, 0.003)"}))).run()
    study = optuna.load_study(study_name="reeval", storage=db)
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    stored = reevals(study.user_attrs)
    assert sorted(stored) == [0, 1]
    for t in trials:
        r = stored[t.number]
        assert r.examples == 32 and r.metric == "eval/accuracy"  # the whole split, not the trial's 16
        assert 0 < r.value < 1
        assert r.stderr == pytest.approx(binomial_stderr(r.value, 32))
        assert r.step == t.user_attrs["best_step"] and r.checkpoint.endswith("/checkpoints/best.pt")
        assert t.value == t.user_attrs["best_value"]  # the trial's own value, as reported
        job_log = (Path(t.user_attrs["workdir"]) / "reeval" / "worker-0.log").read_text()
        assert '"event": "reeval"' in job_log  # a job of its own, through the launcher
    order = [r.trial.number for r in ranking(study)]
    assert order == sorted(stored, key=lambda n: stored[n].value, reverse=True)
    assert any(r.getMessage().startswith(f"re-evaluated winner: trial {order[0]}") for r in caplog.records)

    summary = study_summary(study)  # the W&B study summary ranks by the re-evaluation too
    assert summary["best/number"] == order[0] and summary["best/reeval"] == stored[order[0]].as_dict()
    assert [row["trial"] for row in summary["reeval/ranking"]] == order
    assert summary["reeval/winner"] == f"trial {order[0]}: {interval(stored[order[0]])}"
    page = write_report(study, tmp_path / "report.html").read_text()
    table = page.split('id="reeval-table"', 1)[1].split("</table>", 1)[0]
    assert [int(row.split("</td><td>", 2)[1]) for row in table.split("<tr><td>")[1:]] == order
    assert interval(stored[order[0]]).replace("±", "&#177;") in page or interval(stored[order[0]]) in page

    capsys.readouterr()  # the driver's own lines
    assert best.main(["study=reeval", f"storage.url={db}", "format=json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["trial"] == order[0] and shown["reeval"]["examples"] == 32  # the re-evaluated winner
    assert [row["trial"] for row in shown["ranking"]] == order

    argv = ["study=reeval", f"storage.url={db}", "reeval=true", "reeval.examples=24", f"output_root={tmp_path}"]
    argv += ["reeval.top_k=1"]
    assert best.main(argv) == 0
    text = capsys.readouterr().out
    again = reevals(optuna.load_study(study_name="reeval", storage=db).user_attrs)
    top = max(trials, key=lambda t: float(t.value or 0)).number  # top_k=1: the best by reported value
    assert again[top].examples == 24 and "re-evaluated winner" in text

    # Its checkpoint gone, a re-evaluation fails: the earlier value stays, marked, and it wins nothing.
    checkpoint_dir = Path(again[top].checkpoint).parent
    for file in checkpoint_dir.glob("*.pt"):
        file.unlink()
    assert best.main(argv) == 0
    text = capsys.readouterr().out
    marked = reevals(optuna.load_study(study_name="reeval", storage=db).user_attrs)[top]
    assert marked.failed and marked.value == again[top].value
    # Issue 57.5: the line quoted the launcher's head and a 20-line Hydra traceback; now the job's own error.
    assert re.search(
        rf"trial {top} left out: its re-evaluation failed "
        r"\((trm\.checkpoints\.checkpoint\.)?CheckpointError: no checkpoint at",
        text,
    ), text
    assert "Error executing job" not in text and "Traceback" not in text
    assert f"re-evaluated winner: trial {top} " not in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_reevaluates_its_own_checkpoint_and_refuses_another_runs(tmp_path: Path) -> None:
    """`python -m trm.train <the run's overrides> reeval.run=true` outside a sweep: the run's best checkpoint on
    the whole split (reeval.json beside it); with another training config it is refused, naming the key."""
    run = [*TRIAL, f"out_dir={tmp_path}/run", "hydra.run.dir=" + str(tmp_path / "hydra")]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TRM_DATA_DIR": str(tmp_path / "data")}
    subprocess.run([sys.executable, "-m", "trm.train", *run], check=True, env=env, capture_output=True)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    again = [*run, "reeval.run=true", f"out_dir={tmp_path}/again", f"checkpoint.url={tmp_path}/run/checkpoints"]
    proc = subprocess.run([sys.executable, "-m", "trm.train", *again], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stored = json.loads((tmp_path / "again" / "reeval.json").read_text())
    assert stored["examples"] == 32 and stored["step"] == summary["best_step"]
    assert stored["checkpoint"] == f"{tmp_path}/run/checkpoints/best.pt"
    other = [*again, "optim.lr=0.5"]
    proc = subprocess.run([sys.executable, "-m", "trm.train", *other], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "optim.lr: 0.001 there, 0.5 here" in proc.stderr


@pytest.mark.slow
def test_the_wandb_summary_run_ranks_by_the_reevaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The study-summary run, written offline and read back: best/* is the re-evaluated winner with its interval,
    the overlap line is there, and the counts leave a refused repeat out."""
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(var, raising=False)  # no credentials: mode auto is offline
    storage = f"sqlite:///{tmp_path}/db.sqlite"
    study = optuna.create_study(study_name="ranked", storage=storage, direction="maximize")
    StudyAttrs(uid="0123456789abcdef0123456789abcdef").store(study.set_user_attr)
    dist = {"x": FloatDistribution(0, 1)}
    for value in (0.9, 0.8):
        study.add_trial(create_trial(value=value, params={"x": value}, distributions=dist))
    study.add_trial(
        create_trial(state=TrialState.FAIL, params={"x": 0.9}, distributions=dist, user_attrs={DUPLICATE_OF_ATTR: 0})
    )
    for r in (record(0, 0.62, 0.02), record(1, 0.65, 0.02)):
        study.set_user_attr(reeval_attr(r.trial), r.as_dict())
    assert (
        log_study_summary(
            study, typed_sweep(sweep_config(storage, tmp_path, "study.name=ranked", "wandb.enabled=true"))
        )
        is not None
    )
    (run,) = [read_offline_run(p) for p in find_runs(tmp_path)]
    assert run.summary["best/number"] == 1 and run.summary["count/fail"] == 0 and run.summary["count/total"] == 2
    assert run.summary["reeval/winner"] == "trial 1: 0.6500 ± 0.0200 (512 puzzles)"
    assert run.summary["reeval/overlap"].startswith("trials 1 and 0 overlap within one eval standard error")


def test_drivers_ending_together_reevaluate_each_trial_once(tmp_path: Path) -> None:
    """Four drivers of one study each ran every top trial's re-eval job at its end (12 jobs for 3 trials). Now the
    end takes a lock on the study: a driver that waits on another finds its records and launches nothing."""
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(db, tmp_path, "study.name=ends", "n_trials=1", "reeval.top_k=1", trial=TRIAL)
    driver = Driver(typed_sweep(cfg))
    study = driver.open_study()
    study.add_trial(
        create_trial(
            params={"x": 0.5},
            distributions={"x": FloatDistribution(0, 1)},
            value=0.5,
            user_attrs={DETAILS_ATTR: {"train_overrides": TRIAL}, "checkpoint_url": f"{tmp_path}/ckpt"},
        )
    )
    number = study.trials[-1].number
    ended: list[list] = []
    with exclusive(driver.storage, "reeval:ends"):  # another driver re-evaluating
        waiting = threading.Thread(
            target=lambda: ended.append(
                reevaluate_at_end(study, driver.storage, driver.sweep, driver.launcher, driver.roots, "UID", db)
            )
        )
        waiting.start()
        waiting.join(timeout=3)
        assert waiting.is_alive()  # it waits for the other's end
        study.set_user_attr(reeval_attr(number), record(number, 0.55, 0.02).as_dict())  # which stored its record
    waiting.join(timeout=60)
    assert not waiting.is_alive() and [r.trial.number for r in ended[0]] == [number]
    assert not (driver.roots.workdir(number) / "reeval").exists()  # no second job


# A stand-in re-eval job: stamps when it starts and ends, and stores its record on the study as trm/reeval.py does.
# It stamps its start before its imports: jobs launched together start within milliseconds, and each lasts over
# 1.5 s (the sleep, then optuna's import and the store), so two allowed at once always overlap.
STAND_IN_JOB = """
import sys, time
db, name, number, stamps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(stamps, "a") as f:
    f.write(f"{number} start {time.time()}\\n")
time.sleep(1.0)
import optuna
from storage.record import Reeval, reeval_attr
record = Reeval(number, "eval/exact_accuracy", 0.5 + number / 100, 0.02, 512, 500, "/ckpt/best.pt")
optuna.load_study(study_name=name, storage=db).set_user_attr(reeval_attr(number), record.as_dict())
with open(stamps, "a") as f:
    f.write(f"{number} end {time.time()}\\n")
"""


class StandInLauncher(LocalLauncher):
    """The local launcher, whose job is STAND_IN_JOB instead of `python -m trm.train`."""

    def __init__(self, db: str, stamps: Path):
        super().__init__()
        self.db, self.stamps = db, stamps

    def command(self, spec: JobSpec) -> list[str]:
        values = dict(o.split("=", 1) for o in spec.overrides if o.startswith(("sweep.study=", "sweep.trial_number=")))
        number, name = values["sweep.trial_number"], values["sweep.study"]
        return [sys.executable, "-c", STAND_IN_JOB, self.db, name, number, str(self.stamps)]


def most_at_once(stamps: Path) -> int:
    events = sorted(
        (float(t), +1 if kind == "start" else -1) for _, kind, t in map(str.split, stamps.read_text().splitlines())
    )
    at_once = peak = 0
    for _, change in events:
        at_once += change
        peak = max(peak, at_once)
    return peak


@pytest.mark.slow  # starts a process per re-evaluation
@pytest.mark.timeout(300)
@pytest.mark.parametrize("max_concurrent", [1, 2])
def test_reevaluations_run_up_to_max_concurrent_at_once(tmp_path: Path, max_concurrent: int) -> None:
    """The end of a study re-evaluated its top trials one after another, leaving a laptop's other core idle; now
    up to max_concurrent jobs run at once, as trials do, and every trial still gets its record, once."""
    db = f"sqlite:///{tmp_path}/db.sqlite"
    cfg = sweep_config(
        db, tmp_path, "study.name=at_once", "n_trials=3", "reeval.top_k=3", f"max_concurrent={max_concurrent}", trial=TRIAL
    )  # fmt: skip
    driver = Driver(typed_sweep(cfg))
    study = driver.open_study()
    for value in (0.5, 0.6, 0.7):
        study.add_trial(
            create_trial(
                params={"x": value},
                distributions={"x": FloatDistribution(0, 1)},
                value=value,
                user_attrs={DETAILS_ATTR: {"train_overrides": TRIAL}, "checkpoint_url": f"{tmp_path}/ckpt"},
            )
        )
    stamps = tmp_path / "stamps.txt"
    ranked = reevaluate_at_end(
        study, driver.storage, driver.sweep, StandInLauncher(db, stamps), driver.roots, "UID", db
    )
    assert sorted(r.trial.number for r in ranked) == [0, 1, 2]
    assert sorted(reevals(study.user_attrs)) == [0, 1, 2]
    assert most_at_once(stamps) == max_concurrent
    assert len(stamps.read_text().splitlines()) == 6  # one job per trial
