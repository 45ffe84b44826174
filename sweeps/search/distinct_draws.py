"""Draws that are not wasted: a configuration the study already has is drawn again, and a finite space the
budget covers a large share of is enumerated.

Optuna cannot take a trial back once `ask` created it (a refused draw would have to be told FAIL and stay in the
record), so a repeat is caught before it reaches the storage: `DistinctSampler` wraps the study's sampler and,
at a trial's first independent parameter, draws the whole configuration ahead from the wrapped sampler, again
(up to `max_redraws` times) while it equals one the study trained, trains or will train. Optuna has no sampler
option for this (its samplers draw one parameter at a time and never look at whole configurations), hence this
wrapper; it changes no draw of the wrapped sampler, it only repeats it.

When the space is finite and the budget covers `enumerate_share` of it or more, Optuna's BruteForceSampler is the
choice: it enumerates configurations not tried (running ones included) instead of drawing them at random.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, BruteForceSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from storage.record import DUPLICATE_OF_ATTR
from sweeps.config.schema import Draws
from sweeps.search.budget import TRAINS
from sweeps.search.space import SearchSpace

log = logging.getLogger("sweeps")

RELATIVE_ATTEMPTS = 3  # joint draws tried before the parameters are drawn one by one (each may be an optimization)
RANDOM_ATTEMPTS = 200  # uniform draws (cheap) after the wrapped sampler's max_redraws all repeated
Config = frozenset[tuple[str, Any]]  # a configuration as Optuna stores it: {param name: value}, order-free


def _choices(dist: BaseDistribution) -> int | None:
    """How many values a distribution has; None when infinite (a float without a step)."""
    if isinstance(dist, CategoricalDistribution):
        return len(dist.choices)
    if isinstance(dist, IntDistribution):
        return (dist.high - dist.low) // dist.step + 1
    if isinstance(dist, FloatDistribution) and dist.step is not None:
        return int(math.floor((dist.high - dist.low) / dist.step + 1e-9)) + 1
    return None


def space_size(space: SearchSpace) -> int | None:
    """The number of configurations in the space (each branch of a conditional counted with its own
    parameters); None when it is infinite."""
    size = 1
    for key, dist in space.params.items():
        branches = [c for c in space.conditionals if c.parent == key]
        if branches and isinstance(dist, CategoricalDistribution):
            count = 0
            for choice in dist.choices:
                under = 1
                for cond in (c for c in branches if c.choice == choice):
                    for sub in cond.params.values():
                        n = _choices(sub)
                        if n is None:
                            return None
                        under *= n
                count += under
            size *= count
            continue
        n = _choices(dist)
        if n is None:
            return None
        size *= n
    return size


def _values(dist: BaseDistribution) -> list[Any] | None:
    """Every value of a finite distribution; None when it is infinite."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    count = _choices(dist)
    if count is None:
        return None
    low, step = dist.low, dist.step  # type: ignore[attr-defined]
    return [low + i * step for i in range(count)]


def leaves_room(space: SearchSpace, fixed: Mapping[str, Any], taken: Mapping[Config, int]) -> bool:
    """Whether some configuration with the `fixed` values is not taken (True for an infinite space: a repeat there
    is a coincidence the redraws handle). Walks the configurations until the first free one, so at most
    len(taken) + 1 of them."""

    def walk(values: dict[str, Any]) -> Iterator[dict[str, Any] | None]:
        open_names = [(n, d) for n, d in named_distributions(space, values) if n not in values]
        if not open_names:
            yield values
            return
        name, dist = open_names[0]
        options = [fixed[name]] if name in fixed else _values(dist)
        if options is None:
            yield None
            return
        for value in options:
            yield from walk({**values, name: value})

    return any(config is None or as_config(config) not in taken for config in walk({}))


def named_distributions(space: SearchSpace, values: Mapping[str, Any]) -> Iterator[tuple[str, BaseDistribution]]:
    """The space's parameters under their Optuna names, in the order SearchSpace.sample suggests them; a
    conditional one only once `values` holds its parent's choice."""
    yield from space.params.items()
    for cond in space.conditionals:
        if values.get(cond.parent) == cond.choice:
            for key, dist in cond.params.items():
                yield f"{key}@{cond.choice}", dist


def as_config(params: Mapping[str, Any]) -> Config:
    return frozenset(params.items())


def trained_configs(trials: Sequence[FrozenTrial], but: int | None = None) -> dict[Config, int]:
    """{configuration: trial number} of the trials that trained, train or will train (not refused duplicates)."""
    return {
        as_config(t.params): t.number
        for t in trials
        if t.state in TRAINS and t.params and t.number != but and DUPLICATE_OF_ATTR not in t.user_attrs
    }


class EnumeratingSampler(BruteForceSampler):
    """Optuna's BruteForceSampler for a study driven by ask and tell: its `after_trial` calls `study.stop()`
    once the space is covered, which Optuna refuses outside `study.optimize` (a RuntimeError at tell). The
    driver sees the exhausted space itself (draw.py), so that call is left out."""

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        return None


class DistinctSampler(BaseSampler):
    """The wrapped sampler's draws, with a repeated configuration drawn again (see the module's docstring).

    Values the trial fixed before its first independent parameter (an enqueued baseline or retry, a relative
    sampler's joint draw, a one-value range) are kept: only the rest is drawn again."""

    def __init__(self, base: BaseSampler, space: SearchSpace, max_redraws: int, seed: int | None = None):
        self.base, self.space, self.max_redraws = base, space, max_redraws
        self.fallback = RandomSampler(seed=seed)  # where the wrapped sampler keeps returning to a configuration
        self._relative: tuple[int, dict[str, Any]] = (-1, {})  # the latest trial's relative draw
        self._plan: tuple[int, dict[str, Any]] = (-1, {})  # the latest trial's whole configuration, drawn ahead
        self.redraws = 0  # draws repeated so far (for the log and tests)

    def __str__(self) -> str:
        return str(self.base)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """The wrapped sampler's joint draw (multivariate TPE, GP, CMA-ES, NSGA-II), drawn again while it completes
        a configuration the study has; one that keeps repeating itself (an acquisition optimum is the same point
        each time) is dropped after RELATIVE_ATTEMPTS, and the parameters are drawn one by one instead."""
        taken = trained_configs(study.get_trials(deepcopy=False), but=trial.number)
        values: dict[str, Any] = {}
        for _ in range(min(RELATIVE_ATTEMPTS, self.max_redraws + 1)):
            values = self.base.sample_relative(study, trial, search_space)
            if leaves_room(self.space, {**trial.params, **values}, taken):
                break
            self.redraws += 1
        else:
            log.info(
                "trial %d: the sampler's joint draw repeats the study's configurations: drawn one by one", trial.number
            )
            values = {}
        self._relative = (trial.number, dict(values))
        return values

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        number, plan = self._plan
        if number != trial.number or param_name not in plan:
            plan = self._draw_whole(study, trial)
            self._plan = (trial.number, plan)
        if param_name in plan:
            return plan[param_name]
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()

    def _draw_whole(self, study: Study, trial: FrozenTrial) -> dict[str, Any]:
        """A whole configuration for `trial`, drawn again while the study has it (at most max_redraws times)."""
        taken = trained_configs(study.get_trials(deepcopy=False), but=trial.number)
        relative = self._relative[1] if self._relative[0] == trial.number else {}
        values: dict[str, Any] = {}
        for attempt in range(self.max_redraws + 1):
            values = self._candidate(study, trial, relative, self.base)
            twin = taken.get(as_config(values))
            if twin is None:
                return values
            self.redraws += 1
            if attempt < self.max_redraws:
                log.info("trial %d drew trial %d's configuration again: drawing it again", trial.number, twin)
        if self.max_redraws:  # a model-based sampler sure of one point returns to it: explore uniformly instead
            for _ in range(RANDOM_ATTEMPTS):
                values = self._candidate(study, trial, relative, self.fallback)
                if as_config(values) not in taken:
                    log.info("trial %d: the sampler kept repeating configurations; drawn at random", trial.number)
                    return values
        return values  # still a repeat: draw.py refuses it

    def _candidate(
        self, study: Study, trial: FrozenTrial, relative: Mapping[str, Any], sampler: BaseSampler
    ) -> dict[str, Any]:
        scratch = copy.copy(trial)  # sampled values grow here, never in the storage
        scratch.params, scratch.distributions = dict(trial.params), dict(trial.distributions)
        for name, dist in named_distributions(self.space, scratch.params):
            if name in scratch.params:
                continue
            if name in relative:
                value = relative[name]
            elif dist.single():
                value = optuna.distributions._get_single_value(dist)
            else:
                value = sampler.sample_independent(study, scratch, name, dist)
            scratch.params = {**scratch.params, name: value}
            scratch.distributions = {**scratch.distributions, name: dist}
        return scratch.params


def grid_refusal(space: SearchSpace) -> str | None:
    """Why sampler=grid (BruteForceSampler) cannot run on `space`: its infinite ranges; None when it is finite."""
    infinite = [name for name, dist in space.params.items() if _choices(dist) is None]
    infinite += [
        f"{c.parent}={c.choice}: {k}" for c in space.conditionals for k, d in c.params.items() if _choices(d) is None
    ]
    if not infinite:
        return None
    return (
        f"sampler=grid enumerates a finite space, but {', '.join(infinite)} is a float range without a step: give "
        "it a step (range(low, high, step=...)) or a choice(...), or pick another sampler (sampler=tpe)"
    )


def choose_sampler(sampler: BaseSampler, space: SearchSpace, n_trials: int, draws: Draws, seed: int) -> BaseSampler:
    """The study's sampler for this driver: BruteForceSampler when it is the one configured (sampler=grid) or the
    space is finite and n_trials covers `draws.enumerate_share` of it, else the configured one; either way wrapped
    so that repeats are drawn again."""
    redraws, share = draws.max_redraws, draws.enumerate_share
    size = space_size(space)
    if isinstance(sampler, BruteForceSampler):
        refusal = grid_refusal(space)
        if refusal:
            raise ValueError(refusal)
        sampler = EnumeratingSampler(seed=seed)
    elif share is not None and size is not None and n_trials >= share * size:
        log.info(
            "the search space has %d configurations and n_trials=%d covers %.0f%% of it: BruteForceSampler "
            "enumerates it (instead of %s)",
            size,
            n_trials,
            min(100.0, 100.0 * n_trials / size),
            type(sampler).__name__,
        )
        sampler = EnumeratingSampler(seed=seed)
    return DistinctSampler(sampler, space, redraws, seed)


def space_exhausted(trials: Sequence[FrozenTrial], space: SearchSpace) -> int | None:
    """The space's size when every configuration of a finite space trained, trains or will train; else None."""
    size = space_size(space)
    return size if size is not None and len(trained_configs(trials)) >= size else None


def exhausted_line(trials: Sequence[FrozenTrial], space: SearchSpace, n_trials: int) -> str:
    """The one line a study that ran out of configurations ends with."""
    size = space_size(space)
    trained = len(trained_configs(trials))
    whole = f"all {size} configurations of the search space" if size is not None else "its configurations"
    return f"search space exhausted: {whole} trained ({trained} trials), before n_trials={n_trials}"
