"""Search spaces in hydra-optuna-sweeper's grammar, turned into Optuna distributions and trial overrides.

A study's space is a mapping `training.key: "choice(a, b)" | "interval(lo, hi)" | "tag(log, interval(lo, hi))"
| "range(start, stop[, step])"` parsed by hydra-optuna-sweeper itself, plus optional *conditional* spaces:
parameters that exist only when another parameter takes a given choice (Lion wants its own lr range).
A conditional parameter is named `<key>@<choice>` in Optuna so that each choice keeps a distribution of
its own; its override is still `<key>=value`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from sweeps.config.config_values import UserConfigError

GRAMMAR = (
    "choice(a, b, ...), interval(low, high), tag(log, interval(low, high)) with 0 < low, range(start, stop[, step])"
)


class SearchSpaceError(UserConfigError):
    """A study definition that cannot be searched; the message names the key and the value."""


@dataclass
class Conditional:
    """Parameters sampled only when `parent` takes the value `choice`."""

    parent: str
    choice: Any
    params: dict[str, BaseDistribution]


@dataclass
class SearchSpace:
    params: dict[str, BaseDistribution]
    conditionals: list[Conditional] = field(default_factory=list)

    def sample(self, trial: optuna.Trial) -> dict[str, Any]:
        """Sample every parameter (conditionals only under their choice); returns training overrides."""
        values: dict[str, Any] = {}
        for key, dist in self.params.items():
            values[key] = suggest(trial, key, dist)
        for cond in self.conditionals:
            if values.get(cond.parent) == cond.choice:
                for key, dist in cond.params.items():
                    values[key] = suggest(trial, f"{key}@{cond.choice}", dist)
        return values

    def drawn_whole(self, params: Mapping[str, Any]) -> bool:
        """Whether a trial's stored parameters are a whole draw of this space (`sample` writes them one by one: a
        draw cut by a database outage leaves a RUNNING trial with only some of them)."""
        if any(key not in params for key in self.params):
            return False
        return all(
            f"{key}@{cond.choice}" in params
            for cond in self.conditionals
            if params.get(cond.parent) == cond.choice
            for key in cond.params
        )

    def representative(self) -> list[dict[str, Any]]:
        """One assignment per conditional branch (and one for the plain space), for validation."""
        base = {key: _some_value(dist) for key, dist in self.params.items()}
        assignments = [base]
        for cond in self.conditionals:
            branch = {**base, cond.parent: cond.choice}
            branch.update({key: _some_value(dist) for key, dist in cond.params.items()})
            assignments.append(branch)
        return assignments


def suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    """Optuna's public suggest_* call for a parsed distribution."""
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise TypeError(f"unsupported distribution for {name}: {dist!r}")


def takes(dist: BaseDistribution, value: Any) -> bool:
    """Whether Optuna counts `value` as inside `dist`. For a value it is given (an enqueued trial, a baseline) it only
    warns when not ("Fixed parameter ... is out of range") and trains it anyway: the verdict is its own check."""
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except ValueError:  # a choice the distribution does not list
        return False


def _some_value(dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[0]
    return dist.low  # type: ignore[attr-defined]


def _parse(params: Mapping[str, str], where: str) -> dict[str, BaseDistribution]:
    out: dict[str, BaseDistribution] = {}
    for key, raw in params.items():
        spec = str(raw).strip()
        if spec.replace(" ", "") == "choice()":
            raise SearchSpaceError(
                f"{where}[{key!r}]={spec!r}: an empty choice; give at least one value, e.g. choice(a, b)"
            )
        try:
            distributions, fixed, _ = create_params_from_overrides([f"{key}={spec}"])
        except Exception as err:  # noqa: BLE001 (Hydra's grammar errors and Optuna's range checks alike)
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise SearchSpaceError(
                f"{where}[{key!r}]={spec!r} is not a valid search range ({reason}); accepted: {GRAMMAR}"
            ) from None
        if key not in distributions:
            raise SearchSpaceError(
                f"{where}[{key!r}]={spec!r} is a fixed value, not a search range; accepted: {GRAMMAR}"
            )
        dist = distributions[key]
        if isinstance(dist, CategoricalDistribution) and len(dist.choices) < 1:
            raise SearchSpaceError(f"{where}[{key!r}]={spec!r}: a choice needs at least one value")
        out[key] = dist
    return out


def parse_space(
    params: Mapping[str, str] | None,
    conditional: Mapping[str, Mapping[str, Mapping[str, str]]] | None = None,
    where: str = "study.params",
) -> SearchSpace:
    """Parse `params` and `conditional = {parent: {choice: {key: spec}}}`; errors name key and value."""
    if not params:
        raise SearchSpaceError(f"{where} is empty: a study needs at least one parameter to search")
    space = SearchSpace(_parse(params, where))
    for parent, branches in (conditional or {}).items():
        parent_dist = space.params.get(parent)
        if not isinstance(parent_dist, CategoricalDistribution):
            raise SearchSpaceError(
                f"study.conditional[{parent!r}]: conditional parameters need {parent!r} to be a choice(...) in {where}"
            )
        for choice, cond_params in branches.items():
            matches = [c for c in parent_dist.choices if str(c).lower() == str(choice).lower()]
            if not matches:
                raise SearchSpaceError(
                    f"study.conditional[{parent!r}][{choice!r}]: {choice!r} is not one of the choices of "
                    f"{parent!r}: {list(parent_dist.choices)}"
                )
            parsed = _parse(cond_params, f"study.conditional[{parent!r}][{choice!r}]")
            space.conditionals.append(Conditional(parent, matches[0], parsed))
    return space


def to_overrides(values: Mapping[str, Any]) -> list[str]:
    """Hydra overrides `key=value` for trm.train."""
    return [f"{key}={_format(value)}" for key, value in values.items()]


def _format(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def params_to_values(params: Mapping[str, Any]) -> dict[str, Any]:
    """Optuna's stored params (conditionals named `key@choice`) back to training keys."""
    return {name.split("@", 1)[0]: value for name, value in params.items()}
