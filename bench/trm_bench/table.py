"""TRM-Bench-tiny read back: one seed's table of learning curves (bench/results/trm_bench_tiny.json, recorded by
bench/trm_bench/tiny.py), with what a replay is judged against.

The target of a study on a seed's table is the table's best objective (the best exact accuracy over a
configuration's evals, as a study's `value: best`) less one eval standard error at that accuracy and the eval's
puzzle count (contracts.eval_noise.binomial_stderr, as the study's re-evaluation): a study that holds a configuration at or
above it has found "the best, within the eval's noise".

Over several seeds' tables, `seed_truth` judges a configuration by its mean over the training seeds, within one
seed-inclusive standard error: the training seed moves a configuration's accuracy 2-4x more than the eval's noise
(issue 55's audit), so a one-seed best is no truth for a user who trains the winner again.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.eval_noise import binomial_stderr

Config = frozenset[tuple[str, Any]]  # {training key: value}, order-free (as sweeps.search.distinct_draws.as_config)
EVAL_EXAMPLES = 256  # the tiny table's eval puzzles (bench/trm_bench/table_specs.py TRIAL: train.eval_examples)
POOLED_OVER = 10  # the training-seed SD is pooled over this many configurations with the best seed-mean
METRICS = {"eval/exact_accuracy": "exact", "eval/blank_accuracy": "blank"}  # study metric -> the table's column


@dataclass(frozen=True)
class Point:
    step: int
    exact: float
    blank: float
    gflops: float  # training FLOPs spent up to this eval (evals are not counted: a study's compute is its training)
    wall_s: float
    eval_s: float | None = None  # this eval's own seconds, within wall_s (tables exported before it was kept: None)

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
    eval_examples: int = EVAL_EXAMPLES

    @property
    def best(self) -> float:
        return max(c.value for c in self.curves.values())

    @property
    def se(self) -> float:
        return binomial_stderr(self.best, self.eval_examples)

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
            tuple(
                Point(p["step"], p["exact"], p["blank"], p["gflops"], p["wall_s"], p.get("eval_s"))
                for p in row["curve"]
            ),
        )
        for row in rows
    }
    return Table(seed, curves, eval_examples(saved))


def eval_examples(saved: dict[str, Any]) -> int:
    """The table's eval puzzles: the last train.eval_examples of its trials' overrides (the recorder sets one)."""
    found = [int(o.split("=", 1)[1]) for o in trial_overrides(saved) if o.startswith("train.eval_examples=")]
    return found[-1] if found else EVAL_EXAMPLES


def trial_overrides(saved: dict[str, Any]) -> list[str]:
    """The trial overrides in the recorder's sweeps.run command line (trial.overrides=['a=1','b=2'])."""
    for arg in saved.get("sweeps_run", []):
        if arg.startswith("trial.overrides="):
            return [o.strip("'") for o in arg.split("=", 1)[1].strip("[]").split(",") if o]
    return []


@dataclass(frozen=True)
class SeedTruth:
    """Each configuration judged by its mean over several training seeds' tables."""

    seeds: tuple[int, ...]
    means: dict[Config, float]  # over the seeds, of each configuration's value (its best exact accuracy)
    seed_sd: float  # the pooled training-seed SD (eval noise included: each seed's value carries it)
    pooled_over: int

    @property
    def best(self) -> float:
        return max(self.means.values())

    @property
    def best_params(self) -> str:
        top = max(self.means, key=lambda c: self.means[c])
        return "/".join(str(v) for _, v in sorted(top, key=lambda kv: KEY_ORDER.get(kv[0], 9)))

    @property
    def se(self) -> float:
        """One seed-inclusive standard error of a mean over the seeds."""
        return self.seed_sd / math.sqrt(len(self.seeds))

    @property
    def target(self) -> float:
        return self.best - self.se

    def near_best(self, c: Config) -> bool:
        return self.means[c] >= self.target - 1e-12

    def summary(self) -> dict[str, Any]:
        return {
            "seeds": list(self.seeds),
            "best": self.best,
            "best_params": self.best_params,
            "seed_sd": self.seed_sd,
            "pooled_over": self.pooled_over,
            "se": self.se,
            "target": self.target,
            "near_best": sum(self.near_best(c) for c in self.means),
        }


KEY_ORDER = {"arch.hidden_size": 0, "arch.L_layers": 1, "arch.H_cycles": 2, "arch.L_cycles": 3, "arch.mixer": 4}


def seed_truth(tables: Sequence[Table], pooled_over: int = POOLED_OVER) -> SeedTruth:
    """The seed-mean of every configuration that all `tables` hold, and the training-seed SD pooled (the root of
    the mean sample variance) over the `pooled_over` configurations with the best means: a configuration's own SD
    from 2 or 3 seeds is too noisy to stand alone, and the top is where a winner is chosen."""
    if len(tables) < 2:
        raise ValueError(f"a seed-mean truth needs at least 2 seeds' tables, got {len(tables)}")
    shared = set.intersection(*(set(t.curves) for t in tables))
    values = {c: [t.curves[c].value for t in tables] for c in shared}
    means = {c: statistics.fmean(v) for c, v in values.items()}
    top = sorted(means, key=lambda c: means[c], reverse=True)[:pooled_over]
    seed_sd = math.sqrt(statistics.fmean(statistics.variance(values[c]) for c in top))
    return SeedTruth(tuple(t.seed for t in tables), means, seed_sd, len(top))


def provenance(path: Path) -> dict[str, Any]:
    """What the table says of how it was recorded (commit, command, machines), without its curves."""
    saved = json.loads(path.read_text())
    return {k: v for k, v in saved.items() if k != "seeds"} | {
        "curves": {s: len(rows) for s, rows in saved["seeds"].items()}
    }
