"""The composed sweep config as typed objects (sweeps/config/schema.py), and any error on the way as one line.

`typed_sweep` is where the schema's `__post_init__` checks run, and where keys added with `+` (struct mode lets
them through) are refused; `composition_error_line` turns Hydra's and OmegaConf's errors composing against the
schema (several lines, the key on one and the value on another) into the key, the value and what is accepted."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from contracts.schema_checks import shown
from sweeps.config.config_values import SweepConfigError
from sweeps.config.schema import SweepConfig

T = TypeVar("T")

SWEEP_KEYS = frozenset(f.name for f in fields(SweepConfig))
IGNORED_HINT = (
    "are not sweep settings, so every trial would ignore them. Training keys for every trial go in trial.overrides "
    '(e.g. \'trial.overrides=["experiment=tiny_cpu","train.steps=60"]\': the list replaces the site\'s, so repeat what you '
    "keep), searched keys in a study's space (--config-dir with your own study/*.yaml)"
)
GONE = {
    "trial.train_steps": "the trial length is train.steps in trial.overrides, one source for the trials and the "
    'pruner (e.g. \'trial.overrides=["experiment=tiny_cpu","train.steps=60"]\')'
}


def unknown_keys_line(path: str, schema: type, unknown: list[str]) -> str:
    """The one line for keys a block of the schema does not have (added with `+`, which struct mode lets through)."""
    if not path:
        return f"{unknown} {IGNORED_HINT}"
    key = f"{path}.{unknown[0]}"
    if key in GONE:
        return f"{key} is gone: {GONE[key]}"
    accepted = sorted(f.name for f in fields(schema))
    return f"{key}: not a {path} setting, so nothing would read it; accepted: {accepted}"


def _check_known_keys(node: DictConfig, path: str = "") -> None:
    schema = OmegaConf.get_type(node)
    if schema is None or not is_dataclass(schema):
        return  # an open mapping (a `_target_` node, a study's space)
    names = {f.name for f in fields(schema)}
    unknown = sorted(str(key) for key in node if key not in names)
    if unknown:
        raise SweepConfigError(unknown_keys_line(path, schema, unknown))
    for name in names:
        child = node._get_node(name)
        items = child if isinstance(child, ListConfig) else [child]
        for i, item in enumerate(items):
            if isinstance(item, DictConfig):
                _check_known_keys(item, f"{path}.{name}".lstrip(".") + (f"[{i}]" if child is not item else ""))


def typed_sweep(cfg: DictConfig) -> SweepConfig:
    """The composed config as a SweepConfig: each block's `__post_init__` checks run here (SweepConfigError).
    A config composed without the schema (or changed since) is merged onto it first, so it is checked the same."""
    checked = cfg if OmegaConf.get_type(cfg) is SweepConfig else OmegaConf.merge(OmegaConf.structured(SweepConfig), cfg)
    if not isinstance(checked, DictConfig):
        raise TypeError(f"expected the sweep config mapping, got {type(checked).__name__}")
    _check_known_keys(checked)
    typed = OmegaConf.to_object(checked)
    if not isinstance(typed, SweepConfig):
        raise TypeError(f"expected the sweep config, got {type(typed).__name__}")
    return typed


ACCEPTED = {"Integer": "an integer", "Float": "a number", "Boolean": "a boolean (true/false)", "String": "a string"}


def composition_error_line(err: BaseException) -> str:
    """One line for Hydra's or OmegaConf's error composing the sweep config: `key=value: expected ...`."""
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    text = str(cause)
    missing = re.search(r"Key '([^']+)' not in '(\w+)'", text)
    if missing and missing.group(2) == SweepConfig.__name__:  # `+arch=tiny`: a group nothing reads
        return unknown_keys_line("", SweepConfig, [missing.group(1)])
    where = re.search(r"override '([^']+)'", str(err))  # Hydra's "Could not override 'study.objectives'."
    if isinstance(cause, ConfigKeyError) and missing and where and is_dataclass(cause.object_type):
        return unknown_keys_line(where.group(1), cause.object_type, [missing.group(1)])
    if isinstance(cause, ValidationError) and cause.full_key:
        message = str(cause.msg).strip().splitlines()[0]
        kind = re.search(r"could not be converted to (\w+)", message)
        accepted = ACCEPTED.get(kind.group(1), kind.group(1)) if kind else None
        if accepted:
            return f"{cause.full_key}={shown(cause.value)}: expected {accepted}, not {type(cause.value).__name__}"
        return f"{cause.full_key}={shown(cause.value)}: {message}"
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:  # e.g. a key the chosen launcher lacks
        hint = " ".join(str(err).split()) if cause is not err else ""
        return f"{cause.full_key}: {str(cause.msg).strip().splitlines()[0]}" + (f" ({hint})" if hint else "")
    return " ".join(
        text.split("Config search path:", maxsplit=1)[0].split()
    )  # e.g. study=nope: the options, on one line


def typed_block(key: str, schema: type[T], node: DictConfig | Mapping[str, Any]) -> T:
    """One block of the sweep config (`draws`, `reeval`) checked and typed on its own: errors named `key.<field>`."""
    try:
        merged = OmegaConf.merge({key: OmegaConf.structured(schema)}, {key: node})  # errors name `key.<field>`
        block = merged.get(key) if isinstance(merged, DictConfig) else None
        if not isinstance(block, DictConfig):
            raise TypeError(f"{key}: expected a mapping, got {type(node).__name__}")
        _check_known_keys(block, key)
        typed = OmegaConf.to_object(block)
    except OmegaConfBaseException as err:
        raise SweepConfigError(composition_error_line(err)) from None
    if not isinstance(typed, schema):
        raise TypeError(f"{key}: expected {schema.__name__}, got {type(typed).__name__}")
    return typed
