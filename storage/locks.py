"""A named lock shared by every process that uses the same storage (several drivers on one study).

Optuna has no atomic "ask only if the budget allows", so two drivers could both see 49 of 50 trials and
both ask. Holding this lock around count-then-ask makes that one step. PostgreSQL: a session advisory
lock (works across machines); SQLite: an flock on a file beside the database (one machine, as SQLite is).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy
from optuna.storages import RDBStorage


def _key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _lock_file(database: str, name: str) -> Path:
    """`<database>.<name>.lock`, the name made file-safe; a long name (a study created outside sweeps.run) is
    shortened and told apart by its hash, so the file name stays within the file system's 255 bytes."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    if len(safe) > 64:
        safe = f"{safe[:40]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return Path(f"{database}.{safe}.lock")


@contextlib.contextmanager
def exclusive(storage: RDBStorage, name: str) -> Iterator[None]:
    engine = storage.engine
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": _key(name)})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": _key(name)})
                conn.commit()
        return
    database = engine.url.database or ""
    if engine.dialect.name != "sqlite" or database in ("", ":memory:"):
        yield  # one process owns an in-memory database
        return
    import fcntl

    path = _lock_file(database, name)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
