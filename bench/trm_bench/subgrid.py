"""The part of a study's space that a TRM-Bench table can replay a sampler on: a sampler draws from a product
space, so a table that holds only some configurations of the space (TRM-Bench-long: every MLP-t configuration, 8
of the 36 attention ones) is replayed on the choices of one key whose whole sub-grid it holds. The table is cut to
that sub-grid too, so that its unpruned grid (the cost's denominator) and its seed-mean best are the sub-grid's.
A table that holds the whole space is replayed on it unchanged.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from bench.trm_bench.table import Config, Table, config
from sweeps.search.space import SearchSpace

SPLIT_KEY = "arch.mixer"  # the key whose choices a partial table is cut along (the long table holds MLP-t whole)


def choices(key: str, dist: BaseDistribution) -> list[Any]:
    """Every value a grid distribution takes (a continuous one has no grid: refused, naming the key)."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, IntDistribution) and not dist.log:
        return list(range(dist.low, dist.high + 1, dist.step))
    raise ValueError(f"{key}: {dist} is not a grid; a table replays only spaces of choices and integer ranges")


def grid(space: SearchSpace) -> list[dict[str, Any]]:
    """Every configuration of a space without conditionals, as training overrides."""
    if space.conditionals:
        raise ValueError("a table replays only spaces without conditional parameters")
    keys = list(space.params)
    values = [choices(k, space.params[k]) for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def subgrid_space(space: SearchSpace, held: Collection[Config], key: str = SPLIT_KEY) -> SearchSpace:
    """`space` with `key` cut to the choices whose every configuration is in `held`; the space itself when `held`
    covers it. Raises when no choice's sub-grid is whole (the table cannot be replayed yet)."""
    configurations = grid(space)
    if all(config(c) in held for c in configurations):
        return space
    kept = [
        choice
        for choice in choices(key, space.params[key])
        if all(config(c) in held for c in configurations if c[key] == choice)
    ]
    if not kept:
        missing = sum(config(c) not in held for c in configurations)
        raise ValueError(
            f"the table holds no whole sub-grid of the space along {key} ({missing} of {len(configurations)} "
            "configurations missing): record more of it before replaying a sampler on it"
        )
    return replace(space, params={**space.params, key: CategoricalDistribution(kept)})


def cut(table: Table, space: SearchSpace) -> Table:
    """`table` with only the curves of configurations in `space`."""
    inside = {config(c) for c in grid(space)}
    return replace(table, curves={c: curve for c, curve in table.curves.items() if c in inside})
