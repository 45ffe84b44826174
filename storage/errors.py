"""The project's user-error root (`UserError`, and the wrapper every app runs under), and the storage package's errors.

`UserError` is the bottom layer's, so every package derives its user-facing errors from it (storage's
StorageError and ArgumentError, contracts' ConfigSchemaError, sweeps' UserConfigError) and every app turns it into
one line and exit 2 (`exit_on_user_error`), never a traceback.

The storage package's errors are of two kinds, because callers react differently: a config mistake is fixed by the user
(exit with a clear message), an unavailable server may be retried or waited for. A database that is
gone (dropped) is neither: :func:`database_gone` tells it from an outage, :class:`StorageGoneError` says so; nor is a
SQLite file moved, deleted, replaced or made read-only under an open connection (:func:`sqlite_file_lost`).
:func:`storage_failure` says what a failed storage call met, in one line, instead of Optuna's wrapper.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from typing import ParamSpec

import optuna
import sqlalchemy

P = ParamSpec("P")
USER_ERROR_EXIT = 2  # every app's exit code for what the user fixes (a bad input, a storage not there)


class UserError(Exception):
    """What the user fixes (a key's value, a study's name, the storage's URL or server, the pod's state): each app
    prints its one line and exits USER_ERROR_EXIT. Every error of the project raised for the user derives from it."""


def exit_on_user_error(task: Callable[P, int]) -> Callable[P, int]:
    """Wrap an app's `main`: a UserError raised anywhere below it becomes one `error: ...` line on stderr and exit
    code 2; anything else goes on up (a bug keeps its traceback). lightning-hydra-template's task_wrapper's job."""

    @functools.wraps(task)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return task(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return USER_ERROR_EXIT

    return wrapped


class StorageError(UserError):
    """Base class for every error this package raises on purpose."""


class StorageConfigError(StorageError, ValueError):
    """The storage configuration is wrong (bad URL, password in URL, missing env var)."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The storage could not be reached or opened (server down, bad host, no database)."""


class StorageGoneError(StorageUnavailableError):
    """The study database itself is gone (dropped, its tables deleted): waiting for it will not bring it back."""


# SQLSTATEs meaning the database or its tables do not exist: invalid_catalog_name, undefined_table.
_GONE_SQLSTATES = {"3D000": "the database does not exist", "42P01": "the study tables do not exist"}
# The same said in words: connecting to a dropped PostgreSQL database fails before a SQLSTATE is sent, and
# SQLite has none ("no such table" once its file was deleted and a new connection made an empty one).
_GONE_PHRASES = ("does not exist", "no such table")
_GONE_SUBJECTS = ('database "', 'relation "', "no such table")


class StoragePermissionError(StorageError, PermissionError):
    """The database role lacks a privilege the study needs: granting it is the fix; waiting or retrying is not."""


def _causes(error: BaseException) -> list[BaseException]:
    """`error` and what caused it: `__cause__` / `__context__` and SQLAlchemy's `.orig`, each once."""
    seen: set[int] = set()
    found: list[BaseException] = []
    todo: list[BaseException | None] = [error]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        found.append(err)
        todo.extend((err.__context__, err.__cause__, getattr(err, "orig", None)))  # the driver's own error first
    return found


# PostgreSQL's insufficient_privilege, and its message: "permission denied for table studies".
_DENIED_SQLSTATE = "42501"
_DENIED = re.compile(r'permission denied for (table|relation|sequence|schema|database|function) "?([\w.$]+)"?')
GRANTS = (
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO <role>; "
    "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO <role>"
)


def permission_denied(error: BaseException) -> str | None:
    """The privilege and the object a storage call was denied, in one line with the grant that fixes it; None when
    `error` is not a permission error. (Optuna wraps it in a `StorageInternalError` whose words, "invalid data in
    the commit", hide it.) The privilege is the denied statement's verb (INSERT, UPDATE, ...), USAGE for a
    sequence."""
    causes = _causes(error)
    for err in causes:
        text = " ".join(str(err).split())
        match = _DENIED.search(text)
        if match is None and getattr(err, "pgcode", None) != _DENIED_SQLSTATE:
            continue
        if match is None:
            return f"permission denied ({_first_clause(text)}); the study needs: {GRANTS}"
        kind, name = match.groups()
        statement = next((str(s) for s in (getattr(e, "statement", None) for e in causes) if s), "")
        verb = statement.split(None, 1)[0].upper() if statement.strip() else "a privilege"
        privilege = "USAGE" if kind == "sequence" else verb
        return f"the database role lacks {privilege} on {kind} {name} (permission denied); the study needs: {GRANTS}"
    return None


def database_gone(error: BaseException) -> str | None:
    """Why ``error`` means the study database is gone for good (dropped, or its tables deleted), in one line;
    None when it is anything else: a server that is restarting or unreachable, a dropped connection, a conflict.

    ``error`` is what a storage call raised, usually Optuna's ``StorageInternalError`` ("An exception is raised
    during the commit. This typically happens due to invalid data in the commit ...") whatever the cause; the
    cause is looked for along ``__cause__`` / ``__context__`` and SQLAlchemy's ``.orig``. A driver that retries
    storage outages should stop on this one and say so (e.g. raise :class:`StorageGoneError`).
    """
    for err in _causes(error):
        code = getattr(err, "pgcode", None)
        text = " ".join(str(err).split())
        if code in _GONE_SQLSTATES:
            return f"{_GONE_SQLSTATES[code]} ({_first_clause(text)})"
        lowered = text.lower()
        if any(p in lowered for p in _GONE_PHRASES) and any(s in lowered for s in _GONE_SUBJECTS):
            return _first_clause(text)
    return None


# SQLite's extended result codes (Python 3.11's `sqlite_errorname`) that no wait or retry on this connection gets
# past: the file it opened was unlinked or renamed (a new file at the path is not the one it holds), or it cannot
# be written. Their words ("attempt to write a readonly database", "unable to open database file") do not say which.
_SQLITE_LOST = {
    "SQLITE_READONLY_DBMOVED": "the SQLite file was moved, deleted or replaced after it was opened",
    "SQLITE_READONLY": "the SQLite file is read-only",
    "SQLITE_READONLY_DIRECTORY": "the SQLite file's directory is read-only",
    "SQLITE_READONLY_CANTINIT": "the SQLite file is read-only",
    "SQLITE_READONLY_CANTLOCK": "the SQLite file is read-only",
    "SQLITE_READONLY_ROLLBACK": "the SQLite file is read-only",
    "SQLITE_READONLY_RECOVERY": "the SQLite file is read-only",
    # A write's journal cannot be created beside the file: its directory was made read-only, or removed.
    "SQLITE_CANTOPEN": "the SQLite file's journal cannot be created (its directory read-only or gone)",
}


def sqlite_file_lost(error: BaseException) -> str | None:
    """Why a storage call on a SQLite file failed for good, in one line (`the SQLite file was moved, deleted or
    replaced after it was opened (SQLITE_READONLY_DBMOVED)`); None for any other error. Which file is not in the
    error: storage.sqlite_file.SqliteFile names it where the caller knows the URL."""
    for err in _causes(error):
        name = getattr(err, "sqlite_errorname", None)
        if name in _SQLITE_LOST:
            return f"{_SQLITE_LOST[name]} ({name})"
    return None


def storage_failure(error: BaseException) -> str:
    """What a failed storage call met, in one line. Optuna wraps every database error in a StorageInternalError
    whose words ("invalid data in the commit, e.g. exceeding max length") blame the data: the cause is said instead
    (a SQLite file lost, a database gone or refused, or a connection that failed: "the study database is
    unreachable: ..."). The driver's heartbeat and loop lines and a job's storage errors all read this."""
    if isinstance(error, StorageError):  # this package's own words already say it
        return str(error)
    if lost := sqlite_file_lost(error):
        return f"the study database cannot be written: {lost}"
    if gone := database_gone(error):
        return f"the study database is gone: {gone}"
    if denied := permission_denied(error):
        return denied
    causes = _causes(error)
    for cause in causes:
        if isinstance(cause, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):  # not the data's
            text = " ".join(str(getattr(cause, "orig", None) or cause).split())
            return f"the study database is unreachable: {_first_clause(text)}"
    wrapper = optuna.exceptions.StorageInternalError  # its words are never the cause
    deepest = next((c for c in reversed(causes) if not isinstance(c, wrapper)), causes[0])
    return f"{type(deepest).__name__}: {_first_clause(' '.join(str(deepest).split()))}"


def _first_clause(text: str) -> str:
    """The driver's own words without SQLAlchemy's '[SQL: ...]' / '(Background on this error ...)' tails."""
    for tail in (" [SQL:", " (Background on this error", " LINE "):
        text = text.split(tail, 1)[0]
    return re.sub(r"^\([\w.]+\) ", "", text.strip())  # SQLAlchemy's "(psycopg2.OperationalError) " prefix
