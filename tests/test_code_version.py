"""contracts/code_version.py's git_commit: the commit and dirty flag of the checkout a package is tracked in, and
None where the package is no checkout's (an installed wheel, a venv the checkout ignores) or git cannot say.

Real git repositories in tmp_path; the study run that stores them on a trial and sweeps.best that prints them are
tests/test_everyday.py's test_the_best_trial_can_be_reused."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts.code_version import GitCommit, git_commit

pytestmark = pytest.mark.slow  # every test here runs git

PACKAGE = "cv_probe_pkg"  # a name no installed package has


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *ident, *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def _package(parent: Path) -> Path:
    package = parent / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    return package


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """Put a directory first on sys.path for PACKAGE; git_commit's cache is emptied around each use."""

    def put(directory: Path) -> None:
        monkeypatch.syspath_prepend(str(directory))
        sys.modules.pop(PACKAGE, None)
        importlib.invalidate_caches()
        git_commit.cache_clear()

    yield put
    sys.modules.pop(PACKAGE, None)
    git_commit.cache_clear()


def _ask() -> GitCommit | None:
    git_commit.cache_clear()
    return git_commit(PACKAGE)


def test_a_checkout_gives_its_head_and_whether_the_work_tree_differs(
    tmp_path: Path, on_path: Callable[[Path], None]
) -> None:
    repo = tmp_path / "repo"
    package = _package(repo / "src")
    (repo / ".gitignore").write_text("outputs/\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    on_path(repo / "src")
    head = _git(repo, "rev-parse", "HEAD")
    assert _ask() == GitCommit(head, dirty=False)

    (repo / "outputs").mkdir()
    (repo / "outputs" / "run.log").write_text("ignored\n")
    assert _ask() == GitCommit(head, dirty=False)  # an ignored file is no change to the code
    (package / "__init__.py").write_text("VALUE = 2\n")
    assert _ask() == GitCommit(head, dirty=True)  # a tracked file changed
    _git(repo, "checkout", "-q", "--", ".")
    (package / "extra.py").write_text("")
    assert _ask() == GitCommit(head, dirty=True)  # a file added and not committed is code HEAD does not have
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "second")
    assert _ask() == GitCommit(_git(repo, "rev-parse", "HEAD"), dirty=False) != GitCommit(head, dirty=False)


def test_a_package_the_checkout_ignores_or_outside_any_checkout_has_no_commit(
    tmp_path: Path, on_path: Callable[[Path], None]
) -> None:
    # An installed wheel in a venv inside a checkout: git would answer with the checkout's HEAD, which is not the
    # code that ran.
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitignore").write_text(".venv/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    site = repo / ".venv" / "lib" / "site-packages"
    _package(site)
    on_path(site)
    assert _ask() is None

    elsewhere = tmp_path / "wheel"
    _package(elsewhere)
    on_path(elsewhere)
    assert _ask() is None


def test_without_git_there_is_no_commit(
    tmp_path: Path, on_path: Callable[[Path], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    _package(repo)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    on_path(repo)
    assert _ask() is not None
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # git is not installed
    assert _ask() is None
