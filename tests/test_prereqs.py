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


def _run_prereqs(path: Path, pg: str, out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tests.prereqs CMD`` where CMD writes the TRM_SWEEPS_TEST_PG it was given to ``out``."""
    cmd = [
        sys.executable,
        "-c",
        f"import os, pathlib; pathlib.Path({str(out)!r}).write_text(os.environ[{prereqs.PG_ENV!r}])",
    ]
    env = {**os.environ, "PATH": str(path), prereqs.PG_ENV: pg}
    return subprocess.run(
        [sys.executable, "-m", "tests.prereqs", *cmd],
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
