"""What the tools say is what happened (issue 45, items 4 and 5): `sweeps.utilization` runs as the README shows it
and answers a missing study in one line; a `timeout=` that ends the study says so; the progress count never reads
past the budget as `3/2`; a heartbeat warning while the database is down says it is unreachable."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import TrialState, create_trial
from sqlalchemy.orm import scoped_session, sessionmaker

from storage import HeartbeatThread
from storage.record import DETAILS_ATTR, THROUGHPUT_DETAIL
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.trials.progress import ProgressView
from sweeps.trials.running import explain_heartbeat_warnings
from tests.sweep_helpers import sweep_config

MEASURED = {"flops_per_s": 2e9, "devices": 1, "examples_per_device": 8, "samples_per_s": 100.0}


def _utilization(*args: str) -> subprocess.CompletedProcess:
    """`python -m sweeps.utilization ...` in its own interpreter: nothing registered before it runs, as for a user."""
    return subprocess.run(
        [sys.executable, "-m", "sweeps.utilization", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_utilization_runs_as_the_readme_shows_it_and_a_missing_study_is_one_line(tmp_path: Path) -> None:
    """Issue: without peak_tflops it failed with "MissingConfigException: In 'sweep': Could not load
    'sweep_schema'" (a traceback, even for `study=nope`)."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    study = optuna.create_study(study_name="measured", storage=url)
    study.add_trial(create_trial(value=0.5, user_attrs={"device": "cpu", DETAILS_ATTR: {THROUGHPUT_DETAIL: MEASURED}}))

    proc = _utilization("study=measured", f"storage.url={url}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = compose_sweep_config([]).estimate.peak_tflops  # conf/sweep.yaml's, the default it reads
    assert f"against {peak:g} TFLOP/s per device" in proc.stdout
    assert f"cpu: estimate.utilization={{8:{2e9 / (peak * 1e12):.3g}}}" in proc.stdout

    missing = _utilization("study=nope", f"storage.url={url}")
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr.strip().splitlines() == [f"error: study='nope' not found in {url}"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_timeout_that_ends_the_study_says_so(
    tmp_path: Path, data_root: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue: the last line read "1/10 done ... ETA 7m16s", and nothing said the timeout had stopped the study."""
    monkeypatch.setenv("TRM_DATA_DIR", str(data_root))
    caplog.set_level(logging.INFO)
    cfg = sweep_config(
        f"sqlite:///{tmp_path}/db.sqlite", tmp_path, "study=halting", "study.name=timed", "n_trials=10", "timeout=1",
        "pruner=none", "max_concurrent=1",
    )  # fmt: skip
    study = Driver(typed_sweep(cfg)).run()
    assert len(study.trials) == 1 and study.trials[0].state == TrialState.COMPLETE  # the running one finished
    lines = [r.getMessage() for r in caplog.records if r.name == "sweeps"]
    said = [line for line in lines if line.startswith("timeout=1s reached after ")]
    assert len(said) == 1 and said[0].endswith("no new trial starts; waiting for 1 running trial(s)"), said
    final = [line for line in lines if line.startswith("study timed: ")][-1]
    assert final.endswith("stopped by timeout=1s") and "ETA" not in final, final
    # Issue 57.5: `ETA 17m05s` was still printed after the timeout, on the running trials' lines: no ETA after it.
    after = lines[lines.index(said[0]) + 1 :]
    ended = [line for line in after if line.startswith("trial 0 COMPLETE")]
    assert ended and ended[0].endswith(", stopped by timeout=1s]"), after
    assert not any("ETA" in line for line in after), after


def test_the_progress_count_never_reads_past_the_budget(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue: a second driver on a 2-trial budget printed "3/2 done": the count is the study's (every driver's, every
    earlier run's), so past this driver's n_trials it says what it counts."""
    caplog.set_level(logging.INFO)
    study = optuna.create_study(study_name="more", storage=f"sqlite:///{tmp_path}/db.sqlite", direction="maximize")
    for value in (0.1, 0.2, 0.3):
        study.add_trial(create_trial(value=value))
    view = ProgressView("more", 2, 1, 60.0, tty=False)
    assert view.note(study).startswith(" [3 done (the study's, past this driver's n_trials=2), running 0, ")
    view.close(study)
    final = [r.getMessage() for r in caplog.records if r.name == "sweeps"][-1]
    assert final.startswith("study more: 3 done (the study's, past this driver's n_trials=2) (complete 3, ")
    assert "3/2" not in final


class _DownStorage:
    """A storage whose database refused the connection: each heartbeat goes through Optuna's own session scope,
    which wraps the error in its StorageInternalError ("invalid data in the commit, e.g. exceeding max length")."""

    def __init__(self) -> None:
        self.engine = sqlalchemy.create_engine("postgresql+psycopg2://postgres@127.0.0.1:1/gone")  # nothing listens
        self.tried = threading.Event()
        self.calls = 0

    def record_heartbeat(self, trial_id: int) -> None:
        self.calls += 1
        if self.calls == 1:
            return  # the first beat (start) went through: the database went down after
        try:
            with _create_scoped_session(scoped_session(sessionmaker(bind=self.engine))) as session:
                session.execute(sqlalchemy.text("SELECT 1"))
        finally:
            self.tried.set()

    def remove_session(self) -> None:
        pass


def test_a_heartbeat_while_the_database_is_down_says_it_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    """Issue: the heartbeat warnings printed Optuna's "invalid data in the commit, e.g. exceeding max length"."""
    caplog.set_level(logging.WARNING, logger="storage.heartbeat")
    explain_heartbeat_warnings()  # what the driver installs when it runs (Driver.run)
    storage = _DownStorage()
    beat = HeartbeatThread(storage, 7, 0.05)  # type: ignore[arg-type]
    beat.start()
    assert storage.tried.wait(30)
    beat.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "storage.heartbeat"]
    assert said and "invalid data" not in said[0], said
    assert re.match(
        r"heartbeat for trial id 7 failed: the study database is unreachable: .*Connection refused", said[0]
    )


ENOSPC = (
    "CheckpointError: could not write checkpoint /runs/a-long-study-name/0123abcd/trial-12/checkpoints/latest.pt: "
    "[Errno 28] No space left on device (not retried: no space left on the device (ENOSPC) fails again on a retry; "
    "free space or fix the rights, then run it again)"
)


def test_a_long_reason_is_cut_after_a_whole_word_never_mid_word(tmp_path: Path) -> None:
    """Issue 57.5: the ENOSPC reason was cut mid-word (`no space left on the de`) in the tables and the summary."""
    from sweeps.run import all_failed
    from sweeps.status import trial_row
    from sweeps.trials.outcome import clip_line

    study = optuna.create_study(study_name="full", storage=f"sqlite:///{tmp_path}/db.sqlite")
    study.add_trial(create_trial(state=TrialState.FAIL, user_attrs={"fail_reason": ENOSPC}))
    cell = trial_row(study.trials[0])["reason"]
    summary = all_failed(study)
    assert summary is not None
    for shown, limit in ((cell, 120), (summary.split("most often (1x): ", 1)[1], 200)):
        assert len(shown) <= limit and shown.endswith(" ...") and ENOSPC.startswith(shown[: -len(" ...")]), shown
        assert ENOSPC[len(shown) - len(" ...")] == " ", shown  # it ends on a whole word
    assert clip_line(ENOSPC, len(ENOSPC)) == ENOSPC and clip_line("short", 10) == "short"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_to_the_driver_exits_143_as_the_shell_convention_says(tmp_path: Path) -> None:
    """Issue 57.5: SIGTERM exited 130, Ctrl-C's code: a scheduler or `timeout` reads 128 + the signal's number."""
    import signal
    import time

    from tests.sweep_helpers import FAST_TRIAL, sweep_overrides, trial_file_exists

    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=5000"]
    argv = sweep_overrides(
        f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "out", "study=halting", "study.name=termed", "n_trials=1",
        "pruner=none", f"hydra.run.dir={tmp_path}/h", trial=slow,
    )  # fmt: skip
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen([sys.executable, "-m", "sweeps.run", *argv], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 200
        while not trial_file_exists(tmp_path / "out" / "termed", 0, "run/metrics.jsonl"):
            assert time.monotonic() < deadline and driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.2)
        driver.send_signal(signal.SIGTERM)
        code = driver.wait(timeout=120)
    text = (tmp_path / "driver.log").read_text()
    assert code == 143, text[-3000:]
    assert text.strip().splitlines()[-1].startswith("interrupted (SIGTERM): every job stopped; run the same command")
