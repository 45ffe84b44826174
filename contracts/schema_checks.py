"""What a config schema's checks share (contracts/train_config.py): the refusal a __post_init__ raises, OmegaConf's
error as one line naming the key, the value and what is accepted, and a block built from its schema.

A schema's dataclass checks ranges and relations in __post_init__, with `require`: Hydra checks the keys, types and
choices as it composes, but never constructs the dataclass, so `build` (one block) or a config's own check
(train_config.check_train_config) does."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar, cast

from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

T = TypeVar("T")


class ConfigSchemaError(ConfigCompositionException, ValueError):
    """A composed config its schema refuses, in one line naming the key, the value and what is accepted. A Hydra
    composition error (what the sweep's validation catches) and a ValueError (what a bad value is)."""


def require(key: str, value: Any, ok: bool, accepted: str) -> None:
    """Refuse `key=value` unless `ok`: the ValueError a schema's __post_init__ raises."""
    if not ok:
        raise ValueError(f"{key}={value!r}: expected {accepted}")


def at_least(key: str, value: Any, low: int, none: str | None = None) -> None:
    """`value` >= `low`; with `none`, null is accepted too and means that."""
    if value is None and none is not None:
        return
    accepted = f"a whole number >= {low}" + (f", or null ({none})" if none else "")
    require(key, value, value is not None and value >= low, accepted)


def config_error_line(err: BaseException, where: str = "") -> str | None:
    """One line from Hydra's composition error whose cause is OmegaConf's (that one knows the key): the key (under
    `where`), the value, why (an unknown key: the accepted ones), and Hydra's context (the override or the config
    file). None for other errors."""
    cause = err if isinstance(err, OmegaConfBaseException) else (err.__cause__ or err.__context__)
    if not isinstance(cause, OmegaConfBaseException) or not cause.full_key:
        return None
    reason = str(cause.msg or cause).splitlines()[0]
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        value = ""
        if is_dataclass(cause.object_type):
            reason += f"; accepted: {sorted(f.name for f in fields(cause.object_type))}"
    else:
        value = f"={cause.value!r}"
    context = "" if cause is err else f" ({str(err).splitlines()[0].rstrip(':')})"
    return f"{where}{cause.full_key}{value}: {reason}{context}"


def build(cls: Callable[..., T], values: Mapping[str, Any] | DictConfig | None, where: str) -> T:
    """`values` as a `cls` (one of the schemas) for the block at `where` (`sweep.report_retry`): OmegaConf checks
    keys and types, __post_init__ the ranges; a ValueError names the key, the value and what is accepted. For a
    block read outside a composed config."""
    try:
        node = OmegaConf.merge(OmegaConf.structured(cls), values or {})
        return cast(T, OmegaConf.to_object(node))
    except OmegaConfBaseException as err:
        raise ValueError(config_error_line(err, f"{where}.") or str(err).splitlines()[0]) from None
