"""tests/prereqs.py, the step `make test` runs before pytest: real processes, real PostgreSQL servers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from storage import up
from sweeps.launchers.torchrun import free_port
from tests import prereqs

pytestmark = pytest.mark.slow  # every test here starts processes or trains

ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres"  # nothing listens on port 1
# A bound, not a speed measurement: a check that installs or starts something would exceed it.
FEW_SECONDS = 10


def _bin(tmp_path: Path, *names: str) -> Path:
    """A directory to use as the whole PATH, holding stand-in executables ``names``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in names:
        exe = bindir / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return bindir


def _run_prereqs(path: Path, pg: str, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m tests.prereqs [flags] CMD`` where CMD writes the TRM_SWEEPS_TEST_PG it was given to ``out``."""
    cmd = [
        sys.executable,
        "-c",
        f"import os, pathlib; pathlib.Path({str(out)!r}).write_text(os.environ[{prereqs.PG_ENV!r}])",
    ]
    env = {**os.environ, "PATH": str(path), prereqs.PG_ENV: pg}
    return subprocess.run(
        [sys.executable, "-m", "tests.prereqs", *flags, *cmd],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=FEW_SECONDS,
    )


def test_missing_browser_that_cannot_be_installed_stops_before_the_suite(tmp_path: Path, pg_server_url: str) -> None:
    # PATH holds neither a browser nor apt-get nor sudo: nothing can install Chromium.
    out = tmp_path / "ran"
    done = _run_prereqs(_bin(tmp_path), pg_server_url, out)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "chromium" in lines[0] and "apt-get install -y chromium" in lines[0]
    # The server answers: only what is missing is named.
    assert "PostgreSQL" not in lines[0]
    assert not out.exists()  # the command (pytest, under make test) never started


def test_everything_present_runs_the_command_with_the_server(tmp_path: Path, pg_server_url: str) -> None:
    out = tmp_path / "ran"
    bindir = _bin(tmp_path, "chromium")
    done = _run_prereqs(bindir, pg_server_url, out)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == [f"prereqs: browser {bindir / 'chromium'}; PostgreSQL at {pg_server_url}"]
    assert out.read_text() == pg_server_url


def test_a_named_server_that_does_not_answer_is_not_replaced(tmp_path: Path) -> None:
    # TRM_SWEEPS_TEST_PG is the user's choice: no private server behind their back (even
    # where apt-get could install one), one line instead.
    out = tmp_path / "ran"
    done = _run_prereqs(_bin(tmp_path, "chromium", "apt-get"), UNREACHABLE, out)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert UNREACHABLE in lines[0] and f"unset {prereqs.PG_ENV}" in lines[0]
    assert not out.exists()


def test_no_server_at_the_default_starts_a_private_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert prereqs.server_binaries(), "the suite needs PostgreSQL's server binaries (Debian: postgresql)"
    # Not pytest's tmp_path for the data: its parents are 0700 root, and as root the
    # server runs as postgres.
    parent = Path(tempfile.mkdtemp(prefix="trm-sweeps-prereqs-pg-", dir="/tmp"))
    parent.chmod(0o755)
    port = free_port()
    monkeypatch.setattr(prereqs, "PG_DEFAULT", UNREACHABLE)
    monkeypatch.setattr(up, "default_dir", lambda: parent / "data")
    monkeypatch.setattr(up, "DEFAULT_PORT", port)
    env = {"PATH": f"{_bin(tmp_path, 'chromium')}{os.pathsep}{os.environ['PATH']}"}
    try:
        got = prereqs.prepare(env)
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        assert got[prereqs.PG_ENV] == url and prereqs.pg_problem(url) is None
        said = capsys.readouterr().out
        # The first line names what is missing; the output says how to stop the server.
        assert "127.0.0.1:1/postgres" in said.splitlines()[0]
        assert "storage.up --stop" in said

        # The next run finds it running.
        assert prereqs.prepare(env)[prereqs.PG_ENV] == url
    finally:
        up.stop(parent / "data")
        shutil.rmtree(parent, ignore_errors=True)


def _recording_bin(tmp_path: Path, ran: Path) -> Path:
    """A whole PATH whose apt-get and sudo append their command line to ``ran`` (and succeed): no browser."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("apt-get", "sudo"):
        exe = bindir / name
        exe.write_text(f'#!/bin/sh\necho "{name} $*" >> {ran}\nexit 0\n')
        exe.chmod(0o755)
    return bindir


def test_the_fast_lane_installs_nothing_and_names_what_the_slow_lane_lacks(tmp_path: Path, pg_server_url: str) -> None:
    # apt-get is there and would run (as root, or through the password-less sudo stub): --no-install never calls it.
    ran, out = tmp_path / "apt-ran", tmp_path / "ran"
    done = _run_prereqs(_recording_bin(tmp_path, ran), pg_server_url, out, prereqs.NO_INSTALL)
    assert done.returncode == 0, done.stderr
    assert not ran.exists(), ran.read_text()
    assert out.read_text() == pg_server_url  # the command (pytest, under make check) ran, with the server
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and done.stderr == "", done.stdout + done.stderr
    assert "installing nothing" in lines[0] and "chromium" in lines[0] and "`make test` provides them" in lines[0]
    assert "PostgreSQL" not in lines[0]  # the server answers: only what is missing is named


def test_the_fast_lane_starts_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No server at the default URL nor at the private server's port: prepare() would start one; --no-install names
    # it in its one line and leaves the suite without TRM_SWEEPS_TEST_PG (the storage tests then say what to run).
    port = free_port()
    monkeypatch.setattr(prereqs, "PG_DEFAULT", UNREACHABLE)
    monkeypatch.setattr(up, "DEFAULT_PORT", port)
    monkeypatch.setattr(up, "default_dir", lambda: tmp_path / "data")
    for provider in ("start_private_server", "apt_install"):
        monkeypatch.setattr(prereqs, provider, lambda *_a, _name=provider: pytest.fail(f"--no-install called {_name}"))
    env = {"PATH": str(_bin(tmp_path, "chromium", "apt-get"))}
    assert prereqs.report_missing(env) == env
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "PostgreSQL" in line and UNREACHABLE in line, line
    assert not (tmp_path / "data").exists()


def test_the_fast_lane_uses_the_private_server_a_full_run_left_running(
    monkeypatch: pytest.MonkeyPatch, pg_server_url: str, tmp_path: Path
) -> None:
    # Stand the suite's server in for the one `storage.up` starts: finding it running is not starting it.
    monkeypatch.setattr(prereqs, "PG_DEFAULT", UNREACHABLE)
    monkeypatch.setattr(prereqs, "private_server_url", lambda: pg_server_url)
    env = {"PATH": str(_bin(tmp_path, "chromium"))}
    assert prereqs.report_missing(env) == {**env, prereqs.PG_ENV: pg_server_url}


def test_make_check_runs_the_fast_lane_without_installing_and_make_test_provides() -> None:
    def prereqs_line(target: str) -> str:
        shown = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return next(line for line in shown.replace("\\\n", " ").splitlines() if "-m tests.prereqs" in line)

    check, test = prereqs_line("check"), prereqs_line("test")
    assert f"-m tests.prereqs {prereqs.NO_INSTALL} " in check and "-m pytest" in check and '"not slow"' in check
    assert prereqs.NO_INSTALL not in test and "-m pytest" in test
