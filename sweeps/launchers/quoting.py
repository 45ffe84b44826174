"""Override quoting: the job's literal values (sweeps/launchers/job_command.py LITERAL_KEYS, names and paths the
driver builds) quoted so that Hydra reads each back as the very string the driver wrote."""

from __future__ import annotations

import re
from collections.abc import Sequence

from hydra.errors import HydraException

from contracts.overrides import parse_override
from sweeps.launchers.job_command import LITERAL_KEYS


def hydra_quote(value: str) -> str:
    """`value` as a quoted Hydra override value that the job reads back unchanged: quotes (and the backslashes
    before them) escaped, and `${` escaped so that OmegaConf does not resolve it as an interpolation."""
    value = re.sub(r"(\\+)(?='|\$\{|$)", lambda m: m.group(1) * 2, value)
    return "'" + value.replace("'", "\\'").replace("${", "\\${") + "'"


def _reads_back(key: str, value: str) -> bool:
    """Whether Hydra parses `key=value` as the plain string `value` (not a sweep, a number or an error)."""
    if "${" in value:
        return False
    try:
        parsed = parse_override(f"{key}={value}")
    except HydraException:  # the grammar refuses a quote, a non-ASCII letter, `=`, `#` ...
        return False
    return not parsed.is_sweep_override() and isinstance(parsed.value(), str) and parsed.value() == value


def quote_literals(overrides: Sequence[str]) -> list[str]:
    """The job's overrides with each literal value (LITERAL_KEYS) quoted where Hydra would not read it back as
    itself: a comma would make a sweep, a quote or `é` a grammar error, `123` a number. Other values are unchanged,
    so the usual command line stays as it was."""
    out = []
    for override in overrides:
        key, _, value = override.partition("=")
        out.append(f"{key}={hydra_quote(value)}" if key in LITERAL_KEYS and not _reads_back(key, value) else override)
    return out
