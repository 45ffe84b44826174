"""The `key=value` convention of this project's small CLIs (sweeps.status, sweeps.best, dashboards.*).

One parser for all of them, so they agree: `--help` prints the usage, an unknown key or an item without `=` is one
error naming it and the accepted keys, and a reader never creates a database (a mistyped path is an error).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.storages import RDBStorage

from storage.engine import open_storage
from storage.errors import UserError, exit_on_user_error
from storage.url import redact, resolve_url

STORAGE_KEYS = {"storage.url": None, "storage.password_env": None}


class ArgumentError(UserError, ValueError):
    """A CLI argument the user fixes (named with what is accepted)."""


@dataclass(frozen=True)
class HelpRequested(Exception):
    usage: str


def parse_args(argv: list[str], known: dict[str, str | None], usage: str = "") -> dict[str, str]:
    """`["port=8081", "storage.url=..."]` -> dict with the defaults in `known` (None: no default).

    `-h`/`--help` raises HelpRequested(usage); unknown keys or items without `=` are an ArgumentError naming them."""
    if any(item in ("-h", "--help") for item in argv):
        raise HelpRequested(usage or f"accepted keys: {sorted(known)}")
    args: dict[str, str] = {}
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep:
            raise ArgumentError(f"argument {item!r} is not key=value; accepted keys: {sorted(known)}")
        if key not in known:
            raise ArgumentError(f"unknown argument {key!r}; accepted keys: {sorted(known)}")
        args[key] = value
    return {**{k: v for k, v in known.items() if v is not None}, **args}


def parse_bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ArgumentError(f"{key}={value!r}: expected true or false")


def storage_from_args(args: dict[str, str], must_exist: bool = True) -> tuple[str, RDBStorage]:
    """(URL, storage) from `storage.url=` / `storage.password_env=` (else $TRM_SWEEPS_STORAGE, else SQLite).

    A reader opens what exists (`must_exist`): a mistyped path is an error, not a new empty database. A StorageError
    is the user's (a UserError): the app's one line."""
    url = resolve_url(args.get("storage.url"), create_dir=not must_exist)
    return url, open_storage(url, password_env=args.get("storage.password_env"), must_exist=must_exist)


def run_cli(main_body: Callable[[list[str]], int], argv: list[str] | None) -> int:
    """Run `main_body(argv)`: help to stdout (exit 0), a UserError (an ArgumentError, a storage or config error) as
    one `error:` line (exit 2, `exit_on_user_error`), and no traceback when the output is piped into `head` and
    closed early."""
    try:
        return exit_on_user_error(main_body)(sys.argv[1:] if argv is None else argv)
    except HelpRequested as help_:
        print(help_.usage)
        return 0
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (`| head`): nothing left to say
        return 0


def study_from_args(args: dict[str, str]) -> optuna.Study:
    """The study `study=` names, in the storage the arguments name: a missing name or study is one error."""
    if not args.get("study"):
        raise ArgumentError("study=NAME is required (python -m sweeps.status lists the studies)")
    url, storage = storage_from_args(args)
    try:
        return optuna.load_study(study_name=args["study"], storage=storage)
    except KeyError:
        raise ArgumentError(f"study={args['study']!r} not found in {redact(url)}") from None
