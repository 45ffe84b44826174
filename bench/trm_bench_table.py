"""TRM-Bench-tiny read back: one seed's table of learning curves (bench/results/trm_bench_tiny.json, recorded by
bench/trm_bench_tiny.py), with what a replay is judged against.

The target of a study on a seed's table is the table's best objective (the best exact accuracy over a
configuration's evals, as a study's `value: best`) less one eval standard error at that accuracy and the eval's
puzzle count (contracts.eval_noise.binomial_stderr, as the study's re-evaluation): a study that holds a configuration at or
above it has found "the best, within the eval's noise".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.eval_noise import binomial_stderr

Config = frozenset[tuple[str, Any]]  # {training key: value}, order-free (as sweeps.search.distinct_draws.as_config)
EVAL_EXAMPLES = 256  # the table's eval puzzles (bench/trm_bench_tiny.py TRIAL: train.eval_examples)
METRICS = {"eval/exact_accuracy": "exact", "eval/blank_accuracy": "blank"}  # study metric -> the table's column


@dataclass(frozen=True)
class Point:
    step: int
    exact: float
    blank: float
    gflops: float  # training FLOPs spent up to this eval (evals are not counted: a study's compute is its training)
    wall_s: float

    def metric(self, name: str) -> float:
        return float(getattr(self, METRICS[name]))


@dataclass(frozen=True)
class Curve:
    params: dict[str, Any]
    points: tuple[Point, ...]

    @property
    def value(self) -> float:
        """What a study records for the trial: its best exact accuracy over the evals."""
        return max(p.exact for p in self.points)

    @property
    def gflops(self) -> float:
        return self.points[-1].gflops


@dataclass(frozen=True)
class Table:
    seed: int
    curves: dict[Config, Curve]

    @property
    def best(self) -> float:
        return max(c.value for c in self.curves.values())

    @property
    def se(self) -> float:
        return binomial_stderr(self.best, EVAL_EXAMPLES)

    @property
    def target(self) -> float:
        """A study's best at or above this holds a configuration within one standard error of the table's best."""
        return self.best - self.se

    @property
    def grid_gflops(self) -> float:
        """What the unpruned grid costs: every configuration trained to its end."""
        return sum(c.gflops for c in self.curves.values())

    @property
    def steps(self) -> int:
        return max(c.points[-1].step for c in self.curves.values())


def config(params: dict[str, Any]) -> Config:
    return frozenset(params.items())


def load(path: Path, seed: int) -> Table:
    """One seed's table from the recorder's JSON (only complete curves are in it)."""
    saved = json.loads(path.read_text())
    rows = saved["seeds"].get(str(seed))
    if not rows:
        recorded = [s for s, r in saved["seeds"].items() if r]
        raise ValueError(f"{path}: no curves for seed {seed} (seeds with curves: {recorded or 'none'})")
    curves = {
        config(row["params"]): Curve(
            dict(row["params"]),
            tuple(Point(p["step"], p["exact"], p["blank"], p["gflops"], p["wall_s"]) for p in row["curve"]),
        )
        for row in rows
    }
    return Table(seed, curves)


def provenance(path: Path) -> dict[str, Any]:
    """What the table says of how it was recorded (commit, command, machines), without its curves."""
    saved = json.loads(path.read_text())
    return {k: v for k, v in saved.items() if k != "seeds"} | {
        "curves": {s: len(rows) for s, rows in saved["seeds"].items()}
    }
