"""Whether a study's SQLite file is still the file the driver opened: gone, replaced or read-only, named.

A SQLite connection holds its file open: after the file is moved or deleted, reads still answer (from the unlinked
file) and only writes fail, with "attempt to write a readonly database", so a driver that took that for an outage
retried forever while its jobs trained into a file nobody would read. The file's identity (device and inode, taken
when the study opens) is checked instead: a stat per check, cheap enough for every pass of the driver's loop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from storage.engine import sqlite_path
from storage.errors import StorageError, StorageGoneError, StoragePermissionError
from storage.url import driver_url

_CONTINUE = "run the same command to continue the study"


@dataclass(frozen=True)
class SqliteFile:
    """The study's SQLite file as opened: its path and identity."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, url: str) -> SqliteFile | None:
        """The file of a SQLite `url` as it is now; None for PostgreSQL, an in-memory database, or no file yet."""
        path = sqlite_path(driver_url(url))
        if path is None:
            return None
        try:
            found = path.resolve().stat()
        except OSError:
            return None
        return cls(path.resolve(), found.st_dev, found.st_ino)

    def problem(self, done: str = "") -> StorageError | None:
        """Why the study cannot go on in this file, in one line naming it, then `done` (what the caller did about
        it), then the fix: StorageGoneError when no file is at its path or another file is (a copy put back is
        another file: this process's connections still hold the old one), StoragePermissionError when it or its
        directory (where SQLite writes its journal) cannot be written; None while it is the file opened, writable."""
        done = f"; {done}" if done else ""
        try:
            now = self.path.stat()
        except FileNotFoundError:
            return StorageGoneError(
                f"the study's SQLite file {self.path} is gone (moved or deleted){done}; put it back, then {_CONTINUE}"
            )
        except OSError as err:
            return StorageGoneError(f"the study's SQLite file {self.path} cannot be read ({err.strerror}){done}")
        if (now.st_dev, now.st_ino) != (self.device, self.inode):
            return StorageGoneError(
                f"the study's SQLite file {self.path} was replaced by another file after the study opened it{done}; "
                f"{_CONTINUE} in the file now there"
            )
        for what, where in (("file", self.path), ("file's directory", self.path.parent)):
            if not os.access(where, os.W_OK):
                return StoragePermissionError(
                    f"the study's SQLite {what} {where} is read-only{done}; make it writable, then {_CONTINUE}"
                )
        return None
