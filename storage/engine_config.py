"""The engine settings of a config as ``open_storage`` keyword arguments, checked.

The sweep reads them from ``storage.engine``, a trial's job from ``sweep.storage_engine`` (both from
conf/storage/engine/default.yaml). Checked here, at the config's edge, so that a typo or a pool of -1 is one error
naming the key, and not a SQLAlchemy traceback at the first connection or a setting nothing reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from storage.errors import StorageConfigError


class EngineSettings(TypedDict, total=False):
    """``open_storage``'s engine keywords; a key left out keeps open_storage's default."""

    pool_size: int
    max_overflow: int
    connect_timeout_s: int
    schema_lock_timeout_s: int
    sqlite_busy_timeout_s: float


# Each setting: (smallest value accepted, whether a fraction is accepted).
RULES: dict[str, tuple[int, bool]] = {
    "pool_size": (1, False),
    "max_overflow": (0, False),
    "connect_timeout_s": (1, False),
    "schema_lock_timeout_s": (1, False),
    "sqlite_busy_timeout_s": (0, True),
}


def engine_settings(node: Mapping[str, Any] | None, where: str) -> EngineSettings:
    """The settings in ``node`` (a config's engine block; None: none, open_storage's defaults), named ``where``
    in errors (``storage.engine``). Raises :class:`StorageConfigError` naming the key, its value and what is
    accepted."""
    settings: dict[str, Any] = {}
    for name, value in (node or {}).items():
        if name not in RULES:
            raise StorageConfigError(f"{where}.{name}: not an engine setting; accepted: {sorted(RULES)}")
        minimum, fraction = RULES[name]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (not fraction and not isinstance(value, int)) or value < minimum:
            kind = "a number" if fraction else "a whole number"
            raise StorageConfigError(f"{where}.{name}={value!r}: expected {kind} >= {minimum}")
        settings[str(name)] = float(value) if fraction else int(value)
    return cast(EngineSettings, settings)  # its keys and types checked against RULES above
