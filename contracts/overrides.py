"""Hydra's override grammar, the one parser of `key=value` strings here: a job, the driver and W&B read an
override's value exactly as Hydra does (`choice("[0.9,0.95]")` is a list, `'123'` a string, `1e-3` a float)."""

from __future__ import annotations

import functools
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override


@functools.cache
def _parser() -> OverridesParser:
    return OverridesParser.create()


def parse_override(override: str) -> Override:
    """The parsed override; Hydra's OverrideParseException (a HydraException) if the grammar refuses it."""
    return _parser().parse_override(override)


def override_values(overrides: list[str]) -> dict[str, Any]:
    """`["arch.hidden_size=64", "optim=lion"]` -> `{"arch.hidden_size": 64, "optim": "lion"}` as Hydra reads
    them; `+key`/`++key` name `key`, and deletions (`~key`) and sweeps over several values are left out."""
    values: dict[str, Any] = {}
    for override in overrides:
        parsed = parse_override(str(override))
        if parsed.is_delete() or parsed.is_sweep_override():
            continue
        values[parsed.key_or_group] = parsed.value()
    return values
