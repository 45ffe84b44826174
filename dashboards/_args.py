"""`key=value` command-line arguments, as the other CLIs of this project take them (sweeps.status)."""
from __future__ import annotations


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
