"""The code version of a job, two ways.

`code_fingerprint`: a sha256 over the `trm` package's source files, the identity every worker of a job must share
and that checkpoint.resume checks. Found without importing `trm` (importlib's spec of the top-level package), so the
driver and a pod VM's preflight probe compute the same value as a job does without loading torch.

`git_commit`: the git commit of the checkout the package is in and whether the work tree differs from it, what a
person checks out to get the code back (as W&B and MLflow record it); None where the code is not a checkout's."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Variables that point git at another repository than the one the package's directory is in.
_GIT_REDIRECTS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CEILING_DIRECTORIES")
GIT_TIMEOUT_S = 30


def _package_file(package: str) -> Path:
    """The package's `__init__.py` (resolved); ModuleNotFoundError if the interpreter has no such package."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no package {package!r} on this interpreter's path")
    return Path(spec.origin).resolve()


@lru_cache(maxsize=1)
def code_fingerprint(package: str = "trm") -> str:
    """sha256 over the package's source files (their paths and bytes, in sorted order)."""
    root = _package_file(package).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class GitCommit:
    commit: str  # HEAD's full sha
    dirty: bool  # the work tree differs from `commit`: a tracked file changed or staged, or a file not ignored added


def _git(cwd: Path, *args: str) -> str | None:
    """git's stdout, or None where it fails (not a repository, no commit yet, not installed, the repository
    refused as another user's, out of time)."""
    env = {k: v for k, v in os.environ.items() if k not in _GIT_REDIRECTS}
    try:
        # --no-optional-locks: status never takes the index lock (every trial of a study may ask at once).
        done = subprocess.run(["git", "--no-optional-locks", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


@lru_cache(maxsize=1)
def git_commit(package: str = "trm") -> GitCommit | None:
    """The commit of the git checkout the package's source is a tracked part of, and whether the whole work tree
    differs from it (`git status --porcelain`: untracked files count, ignored ones do not). None where the package is
    not tracked by a checkout (an installed wheel; a venv inside a checkout, which the checkout ignores) or git cannot
    say. Asked once per process (a job asks as it records its outcome: a file edited while it ran marks it dirty)."""
    init = _package_file(package)
    if _git(init.parent, "ls-files", "--error-unmatch", "--", init.name) is None:
        return None
    head = _git(init.parent, "rev-parse", "--verify", "HEAD")
    status = _git(init.parent, "status", "--porcelain")
    if head is None or status is None:
        return None
    return GitCommit(head.strip(), bool(status.strip()))
