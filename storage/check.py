"""``python -m storage.check [URL]``: one-line health check of the study storage.

For humans and scripts before a sweep: is the storage reachable, which Optuna schema does it
have, how many studies. Opening goes through ``open_storage``, so a fresh database gets the
schema created (the same thing the driver would do on its first start).
"""

from __future__ import annotations

import argparse
import sys

from storage.engine import close_storage, open_storage, schema_version
from storage.engine_config import EngineSettings
from storage.errors import StorageError
from storage.url import DEFAULT_SQLITE_PATH, ENV_VAR, redact, resolve_url


def check(url: str, password_env: str | None = None, connect_timeout_s: int | None = None) -> tuple[bool, str]:
    """Return (ok, one-line report) for ``url``; ``connect_timeout_s`` None: open_storage's default (the
    ``storage.engine.connect_timeout_s`` of conf/storage/engine/default.yaml)."""
    shown = redact(url)
    timeout: EngineSettings = {} if connect_timeout_s is None else {"connect_timeout_s": connect_timeout_s}
    try:
        storage = open_storage(url, password_env=password_env, **timeout)
        try:
            version = schema_version(storage)
            n_studies = len(storage.get_all_studies())
        finally:
            close_storage(storage)
    except StorageError as e:
        return False, f"{shown} error: {e}"
    return True, f"{shown} ok schema={version} studies={n_studies}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storage.check", description=__doc__)
    parser.add_argument(
        "url",
        nargs="?",
        default=None,
        help=f"storage URL (default: ${ENV_VAR}, else sqlite:///{DEFAULT_SQLITE_PATH})",
    )
    parser.add_argument("--password-env", default=None, help="name of an env var holding the PostgreSQL password")
    parser.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="connect timeout in seconds (default: connect_timeout_s of conf/storage/engine/default.yaml)",
    )
    args = parser.parse_args(argv)
    try:
        url = resolve_url(args.url)
    except StorageError as e:
        print(f"error: {e}")
        return 1
    ok, line = check(url, args.password_env, args.timeout)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
