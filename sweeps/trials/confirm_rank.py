"""The confirmed ranking's arithmetic, on plain values (pure: tested branch by branch in tests/test_confirm.py).

A configuration's values are its trial's own (one per seed it trained) and its confirm seeds' (sweeps/trials/confirm.py),
each with the eval's standard error (contracts/eval_noise.py; None for an objective that is not a share). Each value
is the configuration's true value plus a training-seed deviation plus the eval's noise, so the spread of a
configuration's values measures both: the training-seed variance is that spread less the eval's variance. With few
values per configuration it is pooled across the confirmed configurations (every one trained the same way, so one
variance serves them all); a configuration with `own_variance_at` values or more uses its own.

The error bar of a configuration's mean over its m values is
    se = sqrt(seed_var / m + sum(eval_se_i^2) / m^2)           ("eval + seed")
and where no configuration has two values the seed variance is unknown and se is the eval's alone ("eval"): every
line says which.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EVAL = "eval"
EVAL_AND_SEED = "eval + seed"
OWN, POOLED = "own", "pooled"


@dataclass(frozen=True)
class SeedValue:
    """One training of a configuration: its objective, the eval's standard error of it, and where it comes from."""

    value: float
    eval_se: float | None  # None: not a share of puzzles (a loss): no binomial noise known
    seed: int | None = None  # the training seed where known (a confirm seed's; the trial's own: None)
    source: str = "trial"  # "trial" (the trial's own seeds) or "confirm"


@dataclass(frozen=True)
class Confirmed:
    """A configuration's confirmed standing: its mean over seeds and that mean's error bar."""

    trial: int
    values: tuple[SeedValue, ...]
    mean: float
    eval_se: float  # the eval's noise of the mean alone
    seed_sd: float | None  # the training-seed standard deviation used; None: unknown (no configuration has 2 values)
    seed_sd_from: str | None  # OWN, POOLED, or None where unknown
    se: float  # the mean's standard error: eval + seed where seed_sd is known, else the eval's alone

    @property
    def se_kind(self) -> str:
        """Which standard error `se` is: "eval + seed" or "eval"."""
        return EVAL if self.seed_sd is None else EVAL_AND_SEED

    @property
    def n(self) -> int:
        return len(self.values)


def _eval_var(values: Sequence[SeedValue]) -> float:
    """The mean eval variance of one value (an unknown eval error counts 0: a loss has no binomial noise)."""
    return statistics.fmean((v.eval_se or 0.0) ** 2 for v in values)


def seed_variance(values: Sequence[SeedValue]) -> float | None:
    """One configuration's training-seed variance: its values' sample variance less the eval's; None under 2 values."""
    if len(values) < 2:
        return None
    return max(0.0, statistics.variance([v.value for v in values]) - _eval_var(values))


def pooled_seed_variance(configs: Sequence[Sequence[SeedValue]]) -> float | None:
    """The training-seed variance pooled over configurations (each weighted by its degrees of freedom, m - 1): the
    pooled sample variance less the pooled eval variance, at least 0; None when no configuration has 2 values."""
    weighted = [(len(vs) - 1, vs) for vs in configs if len(vs) >= 2]
    dof = sum(w for w, _ in weighted)
    if not dof:
        return None
    sample = sum(w * statistics.variance([v.value for v in vs]) for w, vs in weighted) / dof
    noise = sum(w * _eval_var(vs) for w, vs in weighted) / dof
    return max(0.0, sample - noise)


def rank(configs: Mapping[int, Sequence[SeedValue]], maximize: bool, own_variance_at: int) -> list[Confirmed]:
    """Every configuration (by its trial's number) with at least one value, best mean first (ties: lower trial)."""
    present = {trial: tuple(vs) for trial, vs in configs.items() if vs}
    pooled = pooled_seed_variance(list(present.values()))
    out = []
    for trial, vs in present.items():
        m = len(vs)
        own = seed_variance(vs) if m >= own_variance_at else None
        var, source = (own, OWN) if own is not None else (pooled, POOLED if pooled is not None else None)
        eval_part = sum((v.eval_se or 0.0) ** 2 for v in vs) / (m * m)
        se = math.sqrt((var or 0.0) / m + eval_part)
        out.append(
            Confirmed(
                trial=trial,
                values=vs,
                mean=statistics.fmean(v.value for v in vs),
                eval_se=math.sqrt(eval_part),
                seed_sd=None if var is None else math.sqrt(var),
                seed_sd_from=source,
                se=se,
            )
        )
    return sorted(out, key=lambda c: (-c.mean if maximize else c.mean, c.trial))


def interval(c: Confirmed) -> str:
    """`0.6120 ± 0.0415 (eval + seed SE, 3 seeds)`: the mean and one standard error, saying which."""
    return f"{c.mean:.4f} ± {c.se:.4f} ({c.se_kind} SE, {c.n} seed{'s' if c.n != 1 else ''})"


def apart(first: Confirmed, second: Confirmed) -> bool:
    """Whether two means are further apart than their standard errors together (value ± one SE do not overlap)."""
    return abs(first.mean - second.mean) > first.se + second.se


def tie_line(ranked: Sequence[Confirmed]) -> str | None:
    """One line when the top two confirmed configurations cannot be told apart within one standard error (of the
    kind each has); None when they can, or when fewer than two were confirmed."""
    if len(ranked) < 2 or apart(ranked[0], ranked[1]):
        return None
    first, second = ranked[0], ranked[1]
    kind = first.se_kind if first.se_kind == second.se_kind else f"{first.se_kind} / {second.se_kind}"
    return (
        f"the configurations of trials {first.trial} and {second.trial} cannot be told apart: within one {kind} "
        f"standard error ({interval(first)} vs {interval(second)})"
    )
