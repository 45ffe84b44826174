"""What a config schema's checks share (contracts/train_config.py, sweeps/config/schema.py): the range checks a
__post_init__ runs and the one-line refusal they raise, OmegaConf's error as one line naming the key, the value and
what is accepted, and a block built from its schema.

A schema's dataclass checks ranges and relations in __post_init__ (`require`, `at_least`; `Checks` for another
error class): Hydra checks the keys, types and choices as it composes, but never constructs the dataclass, so
`build` (one block) or a config's own check (train_config.check_train_config, sweeps.config.typed_config) does."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, TypeVar, cast

from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from storage.errors import UserError

T = TypeVar("T")


class ConfigSchemaError(ConfigCompositionException, UserError, ValueError):
    """A composed config its schema refuses, in one line naming the key, the value and what is accepted. A Hydra
    composition error (what the sweep's validation catches) and a ValueError (what a bad value is)."""


def shown(value: Any) -> str:
    """A value as the user wrote it: a float field's 0 reads `0`, not `0.0` (OmegaConf made it a float); a string
    is quoted. A float that `:g` would round reads as its repr."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return repr(value)


@dataclass(frozen=True)
class Checks:
    """The range checks of a schema's __post_init__, each refusing in one line, `key=value: expected <what is
    accepted>`, with `error`: a ValueError for the training config's schemas, SweepConfigError for the sweep's
    (sweeps/config/schema.py; what the sweep's CLI reports)."""

    error: type[ValueError] = ValueError

    def require(self, key: str, value: Any, ok: bool, accepted: str) -> None:
        """Refuse `key=value` unless `ok`."""
        if not ok:
            raise self.error(f"{key}={shown(value)}: expected {accepted}")

    def at_least(self, key: str, value: Any, low: float, none: str | None = None, what: str = "a whole number") -> None:
        """`value` >= `low`, `what` naming the kind (`a whole number`, `gigabytes`); with `none`, null is accepted
        too and means that."""
        if value is None and none is not None:
            return
        self.require(key, value, value is not None and value >= low, f"{what} >= {low:g}{_or_null(none)}")

    def seconds(self, key: str, value: Any, none: str | None = None) -> None:
        """A duration > 0; with `none`, null is accepted too and means that."""
        if value is None and none is not None:
            return
        self.require(key, value, value is not None and value > 0, f"seconds > 0{_or_null(none)}")

    def one_of(self, key: str, value: Any, accepted: Sequence[Any]) -> None:
        self.require(key, value, value in accepted, f"one of {list(accepted)}")


def _or_null(none: str | None) -> str:
    return f", or null ({none})" if none else ""


_VALUE_ERRORS = Checks()  # the training config's schemas (contracts/train_config.py) raise ValueError
require = _VALUE_ERRORS.require
at_least = _VALUE_ERRORS.at_least
seconds = _VALUE_ERRORS.seconds
one_of = _VALUE_ERRORS.one_of


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
