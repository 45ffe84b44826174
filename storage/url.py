"""Storage URL resolution, validation and redaction.

The URL travels on job command lines and in logs, so it must never carry a password
(the secret comes from ~/.pgpass / PGPASSFILE or an env var named by
``storage.password_env``) and every display goes through :func:`redact`.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from storage.errors import StorageConfigError
from storage.secrets import password_in_url_message, redact_credentials

ENV_VAR = "TRM_SWEEPS_STORAGE"
# The embedded default, relative to where a command runs (Hydra's convention for outputs; every start says
# which storage it uses): the sweep driver, sweeps.status/best, dashboards.* and storage.check all mean this file.
DEFAULT_SQLITE_PATH = "outputs/optuna.db"
CONFIG_KEY = "storage.url"
ACCEPTED = "sqlite:///PATH, postgresql://USER@HOST:PORT/DB, postgresql+psycopg2://USER@HOST:PORT/DB"
_SCHEMES = {"sqlite", "sqlite+pysqlite", "postgresql", "postgresql+psycopg2"}


def redact(url: str) -> str:
    """Return ``url`` safe to print: password (userinfo or ``?password=``) replaced by ``***``."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 (malformed: fall back to storage.secrets' patterns, never echo the raw value)
        return redact_credentials(url, unparsed=True)
    if "password" in parsed.query:
        parsed = parsed.update_query_dict({"password": "***"})
    return parsed.render_as_string(hide_password=True).replace("password=%2A%2A%2A", "password=***")


def _error(key: str, url: str, why: str) -> StorageConfigError:
    return StorageConfigError(f"{key} = {redact(url)!r} is not usable: {why}. Accepted: {ACCEPTED}.")


def validate_url(url: str, key: str = CONFIG_KEY) -> URL:
    """Parse and check ``url``; raise :class:`StorageConfigError` naming ``key`` if unusable."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - SQLAlchemy raises several types for an unparsable URL
        # The parser's message may quote parts of the URL; say only that it did not parse.
        raise _error(key, url, "it cannot be parsed as a URL") from None
    if parsed.drivername not in _SCHEMES:
        hint = " (write 'postgresql://', not 'postgres://')" if parsed.drivername == "postgres" else ""
        raise _error(key, url, f"scheme {parsed.drivername!r} is not supported{hint}")
    if parsed.password is not None or "password" in parsed.query:
        raise StorageConfigError(password_in_url_message(key, redact(url)))
    if not parsed.database:
        raise _error(key, url, "it names no database (or SQLite file)")
    return parsed


def resolve_url(
    url: str | None, default_sqlite_path: str | os.PathLike[str] = DEFAULT_SQLITE_PATH, *, create_dir: bool = True
) -> str:
    """Pick the storage URL: explicit config value, else ``$TRM_SWEEPS_STORAGE``, else SQLite.

    The SQLite fallback keeps the laptop demo zero-setup; its parent directory is created (unless
    ``create_dir=False``: a reader such as ``sweeps.status`` creates nothing).
    """
    if url:
        return _absolute_sqlite(url, validate_url(url, CONFIG_KEY))
    env = os.environ.get(ENV_VAR)
    if env:
        return _absolute_sqlite(env, validate_url(env, f"{CONFIG_KEY} (from env {ENV_VAR})"))
    path = Path(default_sqlite_path).expanduser().resolve()
    if create_dir:
        path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def _absolute_sqlite(url: str, parsed: URL) -> str:
    """A SQLite URL with a relative path made absolute against this process's directory: a trial's job runs in
    its own directory and would otherwise open another, empty file there."""
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return url
    path = Path(parsed.database).expanduser()
    if path.is_absolute() and parsed.database == str(path):
        return url
    return parsed.set(database=str(path.resolve())).render_as_string(hide_password=False)


def is_postgres(url: str | URL) -> bool:
    """True for any PostgreSQL URL."""
    parsed = make_url(url) if isinstance(url, str) else url
    return parsed.get_backend_name() == "postgresql"


def driver_url(url: str) -> URL:
    """URL with the installed driver spelled out.

    SQLAlchemy 2.1 maps plain ``postgresql://`` to psycopg 3, which this project does not
    install; we ship psycopg2, so name it explicitly.
    """
    parsed = validate_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed
