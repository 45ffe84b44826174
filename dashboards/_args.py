"""`key=value` command-line arguments, as the other CLIs of this project take them (sweeps.status)."""
from __future__ import annotations

from optuna.storages import RDBStorage

from storage import StorageError, open_storage, resolve_url

DEFAULT_SQLITE = "outputs/optuna.db"  # the sweep's embedded default (conf/storage/sqlite.yaml)


class ArgumentError(ValueError):
    pass


def parse_args(argv: list[str], known: dict[str, str]) -> dict[str, str]:
    """`["port=8081", "storage.url=..."]` -> dict; unknown keys or items without `=` are an error naming them."""
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


def storage_from_args(args: dict[str, str]) -> tuple[str, RDBStorage]:
    """(URL, storage) from `storage.url=` / `storage.password_env=` (else $TRM_SWEEPS_STORAGE, else SQLite)."""
    url = resolve_url(args.get("storage.url"), DEFAULT_SQLITE)
    try:
        return url, open_storage(url, password_env=args.get("storage.password_env"))
    except StorageError as err:
        raise ArgumentError(str(err)) from None
