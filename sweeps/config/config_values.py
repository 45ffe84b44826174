"""What a config value is, as the sweep's checks compare it (a YAML `true` is no count, an int is a number), and
the error every check raises: one line naming the key, the value and what is accepted."""

from __future__ import annotations

from typing import Any

from omegaconf import ListConfig

from storage.errors import UserError

TYPE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string", list: "a list"}


class UserConfigError(UserError, ValueError):
    """What the user fixes in a sweep (a key's value, the pod's state, the study's name): a UserError (the project's
    root, storage/errors.py), so each app prints its one line and exits 2, never a traceback."""


class SweepConfigError(UserConfigError):
    pass


def is_int(value: Any) -> bool:
    """An integer that is not a bool: YAML's `true` is an int to Python but never a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def kind_of(value: Any) -> type | None:
    """The plain type a config value has (bool before int: a bool is an int to Python), None for others."""
    if isinstance(value, ListConfig):
        return list
    return next((t for t in TYPE_NAMES if isinstance(value, t)), None)


def is_a(value: Any, kind: type) -> bool:
    """Whether `value` can stand for a `kind`: a bool is no int, an int is a float, a ListConfig is a list."""
    if kind is int:
        return is_int(value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, (list, ListConfig))
    return isinstance(value, kind)


def type_name(value: Any) -> str:
    kind = kind_of(value)
    return TYPE_NAMES[kind] if kind is not None else type(value).__name__
