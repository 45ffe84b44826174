"""A dataset directory built atomically: every build writes into a unique temp dir next to ``out`` and renames
it into place, so a reader never sees half a dataset and concurrent builds cannot corrupt each other. While it
runs, a build holds an flock on ``.<out>.build-<token>.lock`` beside its temp dir: the next build of ``out``
removes the temp dirs of builds whose lock is free (killed: the kernel released it), never those of a build
that is still running."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .format import SPLITS, DatasetError, SplitMeta


def dataset_summary(out: Path, metas: dict[str, SplitMeta]) -> dict[str, Any]:
    return {
        "out": str(out),
        **{s: {"examples": m.examples, "groups": m.groups, "fingerprint": m.fingerprint} for s, m in metas.items()},
    }


def _is_replaceable(out: Path) -> bool:
    """Only an empty dir or one that looks like a dataset may be replaced (never `--out /tmp`)."""
    entries = {p.name for p in out.iterdir()}
    return not entries or (entries <= set(SPLITS) and all((out / s / "dataset.json").is_file() for s in entries))


# A temp dir with no lock file beside it (left by a build of an older version) is removed only when its
# process is gone from this machine *and* it was last touched this long ago (its pid may be another machine's).
STALE_UNLOCKED_AGE_S = 3600.0
_TOKEN = r"\d+-[0-9a-f]{8}"  # <pid>-<8 hex>: one build's temp dir, old dir and lock file share it

try:
    import fcntl
except ImportError:  # Windows: no flock; only the pid/age rule protects a running build
    fcntl = None  # type: ignore[assignment]


def _lock_path(out: Path, token: str) -> Path:
    return out.parent / f".{out.name}.build-{token}.lock"


def _hold_build_lock(out: Path, token: str) -> int | None:
    """Create and flock this build's lock file: held until the descriptor is closed or the process dies."""
    if fcntl is None:
        return None
    fd = os.open(_lock_path(out, token), os.O_CREAT | os.O_WRONLY, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _release_build_lock(out: Path, token: str, fd: int | None) -> None:
    if fd is None:
        return
    # OSError: removed by a cleaner that found it in the instant before our flock: nothing to undo
    with contextlib.suppress(OSError):
        os.unlink(_lock_path(out, token))
    os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's live process
        return True
    return True


def _lock_of_gone_owner(lock: Path) -> int | None:
    """A descriptor now holding ``lock`` if the build that owned it is gone, None while that build runs.
    Raises OSError (FileNotFoundError: no such lock file) if the lock cannot be opened."""
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def remove_stale_builds(out: str | os.PathLike[str]) -> list[Path]:  # noqa: C901 (each kind of leftover and its owner's lock)
    """Remove the temp dirs (``.<out>.tmp-*``, ``.<out>.old-*``) and lock files that killed builds of ``out``
    left beside it; return what was removed.

    A build that is still running holds the flock on its lock file and is left alone (in this process, another
    one, or another container on this machine). A temp dir without a lock file is removed only when its pid is
    not alive here and it is older than ``STALE_UNLOCKED_AGE_S``.
    """
    out = Path(out).absolute()
    prefix = re.escape(f".{out.name}.")
    dir_re = re.compile(rf"{prefix}(?:tmp|old)-({_TOKEN})")
    lock_re = re.compile(rf"{prefix}build-({_TOKEN})\.lock")
    builds: dict[str, list[Path]] = {}
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return []
    for entry in entries:
        if m := dir_re.fullmatch(entry.name):
            builds.setdefault(m[1], []).append(entry)
        elif m := lock_re.fullmatch(entry.name):
            builds.setdefault(m[1], [])
    removed: list[Path] = []
    for token, dirs in builds.items():
        lock = _lock_path(out, token)
        if fcntl is not None:
            try:
                fd = _lock_of_gone_owner(lock)
            except FileNotFoundError:
                pass  # no lock: an older version's build, or one that has just finished
            except OSError:
                continue
            else:
                if fd is None:
                    continue  # that build is running
                try:
                    for d in dirs:
                        shutil.rmtree(d, ignore_errors=True)
                    removed.extend(dirs)
                    with contextlib.suppress(OSError):
                        os.unlink(lock)
                        removed.append(lock)
                finally:
                    os.close(fd)
                continue
        if not dirs or _pid_alive(int(token.split("-")[0])):
            continue
        try:
            newest = max(d.stat().st_mtime for d in dirs)
        except OSError:
            continue
        if time.time() - newest > STALE_UNLOCKED_AGE_S:
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            removed.extend(dirs)
    return removed


def build_atomically(
    out: str | os.PathLike[str], write: Callable[[Path], dict[str, SplitMeta]], replace: bool
) -> tuple[dict[str, Any], bool]:
    """Run ``write(tmp_dir)`` then rename the temp dir to ``out``.

    Returns (summary, True) on success. If ``replace`` is False and ``out`` was filled by someone
    else meanwhile, discards our copy and returns ({}, False) so the caller can use theirs.
    First removes what killed builds of ``out`` left behind (``remove_stale_builds``).
    """
    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(out)
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp = out.parent / f".{out.name}.tmp-{token}"
    old: Path | None = None
    lock = _hold_build_lock(out, token)  # before the temp dir exists, released after it is gone
    try:
        tmp.mkdir()
        metas = write(tmp)
        if out.exists() and replace:
            if not out.is_dir() or not _is_replaceable(out):
                raise DatasetError(f"refusing to replace {out}: it exists and is not a dataset directory")
            old = out.parent / f".{out.name}.old-{token}"
            os.rename(out, old)
        try:
            os.rename(tmp, out)  # atomic; also replaces an empty directory
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR) and not replace:
                return {}, False
            raise
        return dataset_summary(out, metas), True
    finally:
        for p in (tmp, old):
            if p is not None and p.exists():
                shutil.rmtree(p, ignore_errors=True)
        _release_build_lock(out, token, lock)
