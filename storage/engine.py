"""Open an Optuna RDBStorage with the engine settings this project needs.

Why not ``optuna.storages.RDBStorage(url)`` directly: PostgreSQL needs a bounded pool with
liveness checks, a connect timeout, the password kept out of the URL, and the schema created
under a lock so that several drivers starting together do not race on ``CREATE TABLE``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from storage.errors import StorageConfigError, StorageUnavailableError
from storage.url import driver_url, is_postgres, redact

APPLICATION_NAME = "trm-sweeps"
# Fixed key for pg_advisory_lock; advisory locks are per database, so one key is enough.
SCHEMA_LOCK_KEY = 0x74726D5F73636865  # "trm_sche"

FailedTrialCallback = Callable[[optuna.Study, FrozenTrial], None]


def open_storage(
    url: str,
    *,
    password_env: str | None = None,
    # The engine settings (storage/engine_config.py reads them from a config): these defaults are
    # conf/storage/engine/default.yaml's values, for callers without a config (tests/test_conf_defaults.py).
    pool_size: int = 2,
    max_overflow: int = 2,
    connect_timeout_s: int = 10,
    schema_lock_timeout_s: int = 120,
    sqlite_busy_timeout_s: float = 60.0,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    failed_trial_callback: FailedTrialCallback | None = None,
    create_schema: bool = True,
    must_exist: bool = False,
) -> RDBStorage:
    """Open (and if needed create) the study storage at ``url``.

    ``password_env`` names an env var holding the PostgreSQL password; it is handed to the
    driver as a connect argument, never put in the URL. Without it libpq reads ~/.pgpass /
    PGPASSFILE. ``heartbeat_interval``/``grace_period``/``failed_trial_callback`` are Optuna's
    heartbeat settings (the callback is passed as Optuna 5's ``heartbeat_stale_trial_callback``).
    ``create_schema=False`` (a training job attaching to a study its driver opened) skips table creation and
    the schema version check, which the driver already did: a trial's start-up need not pay for them again.
    ``must_exist=True`` (a reader such as ``sweeps.status``) creates nothing: a SQLite file that is not there,
    or a database without Optuna's tables, is a :class:`StorageConfigError` saying so (a mistyped path must
    not leave an empty database behind).
    ``pool_size``/``max_overflow``/``connect_timeout_s``/``schema_lock_timeout_s`` apply to PostgreSQL,
    ``sqlite_busy_timeout_s`` to SQLite: the keys of ``storage.engine`` (conf/storage/engine/default.yaml says what
    each does).

    Raises :class:`StorageConfigError` for a bad URL, a missing password variable, a heartbeat setting Optuna
    would refuse (named as the sweep's ``heartbeat.interval_s`` / ``heartbeat.grace_s``) or a SQLite location
    that cannot be written, and :class:`StorageUnavailableError` (redacted URL + driver reason) if the server
    cannot be used.
    """
    parsed = driver_url(url)
    shown = redact(url)
    _check_heartbeat(heartbeat_interval, grace_period)
    secret = _read_password(password_env)
    if must_exist:
        create_schema = False
        _check_sqlite_exists(parsed, shown)
    engine_kwargs: dict[str, Any]
    lock: contextlib.AbstractContextManager[None]
    if is_postgres(parsed):
        connect_args = _pg_connect_args(connect_timeout_s, secret)
        engine_kwargs = {
            "pool_pre_ping": True,
            "pool_size": pool_size,
            "max_overflow": max_overflow,
            "connect_args": connect_args,
        }
        lock = (
            _pg_schema_lock(parsed, connect_args, schema_lock_timeout_s) if create_schema else contextlib.nullcontext()
        )
    else:
        engine_kwargs = {"connect_args": {"timeout": sqlite_busy_timeout_s}}
        lock = _sqlite_schema_lock(parsed, shown) if create_schema else contextlib.nullcontext()
    try:
        if must_exist:  # before RDBStorage, which writes its version rows into a database that has none
            _check_optuna_tables(parsed, engine_kwargs["connect_args"], shown)
        with lock, warnings.catch_warnings():
            # heartbeat_interval is "experimental" in Optuna; the warning is noise for us.
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                parsed.render_as_string(hide_password=False),
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=failed_trial_callback,
                skip_compatibility_check=not create_schema,
                skip_table_creation=not create_schema,
            )
    except (sqlalchemy.exc.DBAPIError, optuna.exceptions.StorageInternalError) as e:
        # `from None`: the chained driver exception is summarised (and scrubbed) in the message.
        raise StorageUnavailableError(f"cannot open storage {shown}: {_reason(e, secret)}") from None


def check_reachable(url: str, *, password_env: str | None = None, connect_timeout_s: int = 10) -> None:
    """Connect once to a PostgreSQL ``url`` as open_storage's engine does (driver, credentials, timeout) and ask
    nothing of Optuna's tables, which the driver may not have created yet: whether a trial's rank 0 could report
    from this machine (the pod's preflight asks it on every VM). Raises what open_storage raises."""
    parsed = driver_url(url)
    secret = _read_password(password_env)
    if not is_postgres(parsed):
        return
    engine = sqlalchemy.create_engine(
        parsed, poolclass=NullPool, connect_args=_pg_connect_args(connect_timeout_s, secret)
    )
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sqlalchemy.exc.DBAPIError as e:
        raise StorageUnavailableError(f"cannot open storage {redact(url)}: {_reason(e, secret)}") from None
    finally:
        engine.dispose()


def _pg_connect_args(connect_timeout_s: int, secret: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {"connect_timeout": max(1, int(connect_timeout_s)), "application_name": APPLICATION_NAME}
    if secret is not None:
        args["password"] = secret
    return args


def schema_version(storage: RDBStorage) -> str:
    """Alembic revision of the Optuna schema in this storage (for health checks and logs)."""
    return storage.get_current_version()


def close_storage(storage: RDBStorage) -> None:
    """Return this thread's session and close pooled connections (before dropping a DB, at exit)."""
    storage.remove_session()
    storage.engine.dispose()


def _check_heartbeat(interval: int | None, grace: int | None) -> None:
    """Optuna refuses a heartbeat interval or grace period <= 0 without naming the setting: name it here."""
    for key, arg, value in (
        ("heartbeat.interval_s", "heartbeat_interval", interval),
        ("heartbeat.grace_s", "grace_period", grace),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise StorageConfigError(
                f"{key} = {value!r} (the storage's {arg}): expected a whole number of seconds >= 1"
            )


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL; None for PostgreSQL, an in-memory database or a ``file:`` URI."""
    if is_postgres(url):
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database).expanduser()


def _check_sqlite_exists(url: URL, shown: str) -> None:
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        raise StorageConfigError(
            f"storage.url = {shown!r}: the database {str(path)!r} does not exist (nothing was created): "
            "check the path; a sweep (python -m sweeps.run) creates it"
        )


def _check_optuna_tables(url: URL, connect_args: dict[str, Any], shown: str) -> None:
    engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    try:
        inspector = sqlalchemy.inspect(engine)
        missing = [t for t in ("studies", "version_info") if not inspector.has_table(t)]
    finally:
        engine.dispose()
    if missing:
        raise StorageConfigError(
            f"storage.url = {shown!r}: that database holds no Optuna studies (no table {missing[0]!r}): "
            "check the URL; a sweep (python -m sweeps.run) creates them"
        )


def _read_password(password_env: str | None) -> str | None:
    if password_env is None:
        return None
    value = os.environ.get(password_env)
    if not value:
        raise StorageConfigError(
            f"storage.password_env = {password_env!r} names an environment variable that is not "
            "set or empty; set it, or unset storage.password_env to use ~/.pgpass / PGPASSFILE."
        )
    return value


def _reason(error: BaseException, secret: str | None) -> str:
    """The driver's own message, on one line, with the password (if any) removed."""
    cause: BaseException = error
    if isinstance(error, optuna.exceptions.StorageInternalError) and error.__cause__:
        cause = error.__cause__
    orig = getattr(cause, "orig", None) or cause
    text = " ".join(str(orig).split()) or type(orig).__name__
    if secret:
        text = text.replace(secret, "***")
    return text


@contextlib.contextmanager
def _pg_schema_lock(url: URL, connect_args: dict[str, Any], timeout_s: int) -> Iterator[None]:
    """Hold a session advisory lock while Optuna creates tables and stamps the schema version.

    Optuna's create_all and version stamping are check-then-create, so concurrent first starts
    fail with duplicate-key errors; serialising them on a fixed lock key avoids that. A driver waits
    ``timeout_s`` for another one to finish (``storage.engine.schema_lock_timeout_s``).
    """
    engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=connect_args, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(
                sqlalchemy.text("SELECT set_config('lock_timeout', :v, false)"),
                {"v": f"{timeout_s}s"},
            )
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": SCHEMA_LOCK_KEY})
            try:
                yield
            finally:
                with contextlib.suppress(sqlalchemy.exc.DBAPIError):
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": SCHEMA_LOCK_KEY})
    finally:
        engine.dispose()


@contextlib.contextmanager
def _sqlite_schema_lock(url: URL, shown: str) -> Iterator[None]:
    """Same idea for SQLite: an exclusive flock on ``<db>.lock`` around schema creation.

    A location that cannot be written (a read-only filesystem or directory, a parent that is a file) is one
    :class:`StorageConfigError` naming the path, not the OSError's traceback."""
    path = sqlite_path(url)
    if path is None:
        yield
        return
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise StorageConfigError(f"storage.url = {shown!r}: directory {str(path.parent)!r} {what}")
    try:
        import fcntl
    except ImportError:  # Windows: no flock; the SQLite busy timeout is all we have
        yield
        return
    try:
        handle = open(f"{path}.lock", "a")  # noqa: SIM115 (held for the whole context, closed below)
    except OSError as err:
        raise StorageConfigError(
            f"storage.url = {shown!r}: cannot write next to the database {str(path)!r} "
            f"({err.strerror or err}: {err.filename or path}): the SQLite file and its directory must be "
            "writable (a read-only filesystem?); choose another path"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
