"""Fault-injecting fsspec filesystems over a local disk, for checkpoint uploads: a slow store and a broken one.

`register()` makes them known to fsspec as `slowlocal://` and `brokenlocal://` in this process; `site_dir(tmp)`
writes a sitecustomize.py that registers them in every Python process started with that directory on PYTHONPATH
(a training job's ranks)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

ROOT = Path(__file__).resolve().parents[1]
DELAY_ENV = "TRM_TEST_STORE_DELAY_S"


class SlowFileSystem(LocalFileSystem):
    """A local disk on which each file written lands half, then the rest `TRM_TEST_STORE_DELAY_S` (1.5 s) later:
    a slow object store's PUT, with a partial file to find (and kill) mid-way."""

    protocol = "slowlocal"
    writes: list[str] = []  # the paths opened for writing in this process, in order

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        handle = super()._open(path, mode, *args, **kwargs)
        if "w" in mode:
            SlowFileSystem.writes.append(str(path))
            write, delay = handle.write, float(os.environ.get(DELAY_ENV, "1.5"))

            def slow_write(data: Any) -> int:
                view = memoryview(data).cast("B")
                half = view.nbytes // 2
                write(view[:half])
                handle.flush()
                time.sleep(delay)
                write(view[half:])
                return view.nbytes

            handle.write = slow_write
        return handle


class BrokenFileSystem(LocalFileSystem):
    """A store that lists and reads but refuses every write (a revoked bucket permission)."""

    protocol = "brokenlocal"

    def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            raise PermissionError(f"403 Forbidden: no write access to {path}")
        return super()._open(path, mode, *args, **kwargs)


def register() -> None:
    for cls in (SlowFileSystem, BrokenFileSystem):
        fsspec.register_implementation(cls.protocol, cls, clobber=True)


def site_dir(tmp_path: Path) -> Path:
    """A directory whose sitecustomize.py registers these stores in any Python started with it on PYTHONPATH."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path.append({str(ROOT)!r})\nfrom tests.fault_stores import register\nregister()\n"
    )
    return site
