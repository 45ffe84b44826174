"""Study names: checked once at sweeps.run for everything a name becomes; the tools read the
odd names of studies created another way (Optuna's API or CLI) and keep every file they write in its directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from dashboards import report
from storage.locks import _lock_file
from sweeps import best, status
from sweeps.config.typed_config import typed_sweep
from sweeps.driver import Driver
from sweeps.validation.validate import SweepConfigError
from tests.sweep_helpers import sweep_config, sweep_overrides

LONG = "x" * 300


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_300_character_study_name_is_refused_in_one_line_before_anything_starts(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """It passed validation, then: SQLite, `OSError: [Errno 36] File name too long` from the lock file; PostgreSQL,
    trial 0 FAIL "launch failed" and a traceback."""
    url = f"sqlite:///{tmp_path}/db.sqlite" if backend == "sqlite" else request.getfixturevalue("fresh_pg_url")
    args = sweep_overrides(url, tmp_path / "out", f"study.name={LONG}", f"hydra.run.dir={tmp_path}/h")
    proc = subprocess.run([sys.executable, "-m", "sweeps.run", *args], capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(errors) == 1 and errors[0].startswith(f"error: study.name='{LONG}': it is 300 bytes long"), errors
    assert "at most 100 bytes" in errors[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "db.sqlite").exists()
    if backend == "postgres":  # nothing was opened: not even Optuna's tables were created
        engine = sqlalchemy.create_engine(url)
        try:
            assert sqlalchemy.inspect(engine).get_table_names() == []
        finally:
            engine.dispose()


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a,b", r"study.name='a,b': it contains ',' \(the tools' study separator\)"),
        ("../../../x", r"study.name='../../../x': it contains '/' \(a path separator\)"),
        ("tab\there", r"study.name='tab\\there': it contains a control character"),
        (" padded", r"study.name=' padded': it names the study's directory"),
        ("é" * 51, r"it is 102 bytes long"),  # bytes, not characters: the file system counts bytes
    ],
)
def test_names_the_tools_or_a_path_cannot_hold_are_refused(name: str, expected: str, tmp_path: Path) -> None:
    cfg = sweep_config(f"sqlite:///{tmp_path}/db.sqlite", tmp_path / "out")
    cfg.study.name = name
    with pytest.raises(SweepConfigError, match=expected):
        Driver(typed_sweep(cfg)).validate()
    assert not (tmp_path / "db.sqlite").exists()


def test_a_long_lock_name_still_fits_a_file_name(tmp_path: Path) -> None:
    """The SQLite lock file held the raw name: a study created with a long name outside sweeps.run (which refuses
    it) still gets a lock file the file system accepts, distinct per name."""
    one, two = (
        _lock_file(str(tmp_path / "db.sqlite"), f"budget:{LONG}"),
        _lock_file(str(tmp_path / "db.sqlite"), f"budget:{LONG}y"),
    )
    assert len(one.name.encode()) < 255 and one != two
    one.touch()


ODD_NAMES = [LONG, "a,b", "../../../x"]


def test_the_tools_read_odd_names_and_write_only_inside_their_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Studies created with Optuna's API under names sweeps.run refuses: dashboards.report, sweeps.best and
    sweeps.status work on each (no traceback), and the report of `../../../x` lands in outputs/reports, not three
    directories up; `study=a,b` names the study `a,b` when there is one."""
    work = tmp_path / "deep" / "er" / "work"
    work.mkdir(parents=True)
    url = f"sqlite:///{tmp_path}/odd.sqlite"
    for name in ODD_NAMES:
        study = optuna.create_study(study_name=name, storage=url, direction="maximize")
        study.optimize(lambda t: t.suggest_float("x", 0.0, 1.0), n_trials=2)
    monkeypatch.chdir(work)
    before = set(tmp_path.rglob("*"))
    for name in ODD_NAMES:
        args = [f"study={name}", f"storage.url={url}"]
        assert report.main(args) == 0, capsys.readouterr().err
        assert best.main(args) == 0, capsys.readouterr().err
        assert status.main(args) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "trial" in out and "Traceback" not in out
    written = set(tmp_path.rglob("*")) - before
    reports = work / "outputs" / "reports"
    files = sorted(p for p in written if p.is_file())
    assert len(files) == 3 and all(p.parent == reports for p in files), files
    assert all(len(p.name) <= 130 and not p.name.startswith(".") for p in files)
    assert not (tmp_path / "x.html").exists() and not list(tmp_path.glob("x*"))
