"""A study's SQLite file moved, deleted, replaced or made read-only while the study runs (issue 57.1): the driver
named nothing and retried forever ("storage unavailable (the study database is unreachable: attempt to write a
readonly database); retrying in 30 s"), and its job died with Optuna's "invalid data in the commit". Now the file
is named, the jobs are stopped with their grace, the driver exits 2, and the same command resumes once the file
is back."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from contracts.metrics_log import read_metrics
from contracts.train_config import RetryPolicy
from storage import close_storage, open_storage, trial_id_of
from storage.errors import StorageGoneError, StoragePermissionError, sqlite_file_lost, storage_failure
from storage.sqlite_file import SqliteFile
from sweeps.trials.running import storage_fatal
from tests.sweep_helpers import FAST_TRIAL, summary_of, sweep_overrides, trial_dir, trial_file_exists
from trm.links.trial import TrialLinkError, retry

OPTUNA_WORDS = "invalid data in the commit"


@contextlib.contextmanager
def _open_study(path: Path) -> Iterator[tuple[optuna.Study, optuna.trial.Trial, optuna.storages.RDBStorage]]:
    storage = open_storage(f"sqlite:///{path}")
    try:
        study = optuna.create_study(study_name="s", storage=storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield study, study.ask(), storage
    finally:
        close_storage(storage)


def _write_error(storage: optuna.storages.RDBStorage, trial: optuna.trial.Trial) -> BaseException:
    with pytest.raises(optuna.exceptions.StorageInternalError) as info:
        storage.set_trial_user_attr(trial_id_of(trial), "k", 1)
    assert OPTUNA_WORDS in str(info.value)  # what the driver and the job used to pass through
    return info.value


@pytest.mark.parametrize("how", ["moved", "deleted", "replaced"])
def test_a_lost_sqlite_file_is_named_and_its_writes_are_not_retried(tmp_path: Path, how: str) -> None:
    db = tmp_path / "db.sqlite"
    url = f"sqlite:///{db}"
    with _open_study(db) as (_, trial, storage):
        opened = SqliteFile.of(url)
        assert opened is not None and opened.problem() is None
        if how == "moved":
            db.rename(tmp_path / "elsewhere.sqlite")
        elif how == "deleted":
            db.unlink()
        else:  # a copy put in its place: another file, whatever it holds
            shutil.copy(db, tmp_path / "copy.sqlite")
            (tmp_path / "copy.sqlite").replace(db)
        err = _write_error(storage, trial)
        said = storage_failure(err)
        assert said == (
            "the study database cannot be written: the SQLite file was moved, deleted or replaced after it was "
            "opened (SQLITE_READONLY_DBMOVED)"
        )
        fatal = storage_fatal(err, url, opened)
        assert isinstance(fatal, StorageGoneError)
        expected = (
            "is gone (moved or deleted)"
            if how != "replaced"
            else "was replaced by another file after the study opened it"
        )
        assert f"the study's SQLite file {db} {expected}; its running jobs were stopped; " in str(fatal)
        assert isinstance(storage_fatal(err, url), StorageGoneError)  # without the file's identity: its own code
        # The job's link: no retry for a minute, the cause in its words.
        calls = []

        def write() -> None:
            calls.append(1)
            storage.set_trial_user_attr(trial_id_of(trial), "k", 1)

        with pytest.raises(TrialLinkError) as info:
            retry(write, "storing outcome", RetryPolicy(attempts=6, first_delay_s=1.0, max_delay_s=1.0))
        assert len(calls) == 1 and OPTUNA_WORDS not in str(info.value)
        assert str(info.value) == f"storing outcome failed: {said}"


def test_an_outage_is_still_waited_out_and_its_words_are_the_cause() -> None:
    """Only a lost file or database ends the study: an unreachable server is retried (tests/test_reliability.py)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine("postgresql+psycopg2://nobody@127.0.0.1:1/db")
    try:
        with pytest.raises(sqlalchemy.exc.OperationalError) as refused:
            engine.connect()
    finally:
        engine.dispose()
    assert sqlite_file_lost(refused.value) is None
    assert storage_fatal(refused.value, "postgresql://nobody@127.0.0.1:1/db") is None
    assert storage_failure(refused.value).startswith("the study database is unreachable: connection to server")


def test_a_read_only_sqlite_file_is_named(tmp_path: Path) -> None:
    """A read-only mount under the study's file (root writes through file modes, not through a read-only mount).
    Skipped where this process may not mount."""
    directory = tmp_path / "studies"
    directory.mkdir()
    db = directory / "db.sqlite"
    with _open_study(db) as (_, trial, storage):
        opened = SqliteFile.of(f"sqlite:///{db}")
        assert opened is not None
        bind = subprocess.run(["mount", "--bind", str(directory), str(directory)], capture_output=True)
        if bind.returncode != 0:
            pytest.skip(f"mount --bind refused here: {bind.stderr.decode().strip()}")
        try:
            remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], capture_output=True)
            assert remount.returncode == 0, remount.stderr
            fatal = opened.problem("its running jobs were stopped")
            assert isinstance(fatal, StoragePermissionError)
            assert str(fatal) == (
                f"the study's SQLite file {db} is read-only; its running jobs were stopped; make it writable, then "
                "run the same command to continue the study"
            )
            said = storage_failure(_write_error(storage, trial))
            assert OPTUNA_WORDS not in said and "read" in said, said
        finally:
            subprocess.run(["umount", str(directory)], check=True)
    assert opened.problem() is None


def _job_processes(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a test's temporary directory): its jobs left behind."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_study_file_moved_mid_run_ends_the_driver_naming_it_and_the_same_command_resumes(tmp_path: Path) -> None:
    """Done when (issue 57): the driver ends within 2 minutes with one line naming the file, and the same command
    resumes after the file is back."""
    db, away = tmp_path / "db.sqlite", tmp_path / "away.sqlite"
    slow = [o for o in FAST_TRIAL if not o.startswith("train.steps")] + ["train.steps=300"]
    argv = sweep_overrides(
        f"sqlite:///{db}", tmp_path / "out", "study=halting", "study.name=moved", "n_trials=1", "pruner=none",
        f"hydra.run.dir={tmp_path}/h", trial=slow,
    )  # fmt: skip
    cmd = [sys.executable, "-m", "sweeps.run", *argv]
    root = tmp_path / "out" / "moved"
    with open(tmp_path / "first.log", "w") as log:
        driver = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while not (trial_file_exists(root, 0, "checkpoints/latest.pt")
                   and "eval/" in (trial_dir(root, 0) / "run" / "metrics.jsonl").read_text()):  # fmt: skip
            assert time.monotonic() < deadline and driver.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.2)
        db.rename(away)
        moved_at = time.monotonic()
        code = driver.wait(timeout=120)
        took = time.monotonic() - moved_at
    first = (tmp_path / "first.log").read_text()
    print(f"[fault] SQLite file moved: the driver exited {code} after {took:.1f} s")
    assert code == 2, first[-3000:]
    assert first.strip().splitlines()[-1] == (
        f"error: the study's SQLite file {db} is gone (moved or deleted); its running jobs were stopped; put it "
        "back, then run the same command to continue the study"
    )
    assert not _job_processes(str(tmp_path / "out")), "a job of the study still runs"
    job_log = (trial_dir(root, 0) / "worker-0.log").read_text()
    assert OPTUNA_WORDS not in first and OPTUNA_WORDS not in job_log, job_log[-3000:]
    assert not db.exists()  # nothing made an empty database where the study's file was

    away.rename(db)
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    trials = optuna.load_study(study_name="moved", storage=f"sqlite:///{db}").get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]  # the moved-out trial, resumed
    assert trials[1].params == trials[0].params
    retried = trial_dir(root, 1)
    assert summary_of(retried)["steps"] == 300
    assert min(r["step"] for r in read_metrics(retried / "run")) > 10  # from the checkpoint, not from step 0
