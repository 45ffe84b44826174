"""The sampler and the pruner, built as the driver builds them, and the arguments Optuna accepts at construction
but fails on later (in every trial, or at the first ask past start-up)."""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class

from sweeps.config.config_values import TYPE_NAMES, SweepConfigError, is_a, is_int
from sweeps.config.optuna_parts import TARGETS, build, pruner_spec, resolved_dict
from sweeps.config.schema import SweepConfig

# Sampler and pruner arguments Optuna takes at construction but fails on in every trial (Hyperband divides by
# zero with reduction_factor=1, takes a log of min_resource=0), or only at the first ask past start-up.
OPTUNA_MINIMUM = {
    "reduction_factor": 2,
    "min_resource": 1,
    "max_resource": 1,
    "bootstrap_count": 0,
    "min_early_stopping_rate": 0,
    "n_startup_trials": 0,
    "n_warmup_steps": 0,
    "interval_steps": 1,
    "n_min_trials": 1,
    "n_ei_candidates": 1,
    "population_size": 2,
}


def _annotation_types(annotation: Any) -> tuple[type, ...] | None:
    """The plain types of a constructor argument ("int | None" -> (int, NoneType)); None when it takes others."""
    names = [
        part.strip()
        for part in (annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "?")).split("|")
    ]
    plain = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}
    return tuple(plain[name] for name in names) if all(name in plain for name in names) else None


def _check_arguments(key: str, cls: type, arguments: dict[str, Any]) -> None:
    """Each argument exists, has the annotated type (a bool is no int, an int is a float) and Optuna's minimum."""
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for name, value in arguments.items():
        if name.startswith("_"):
            continue
        named = f"{key}.{name}={value!r}"
        if name not in params and not takes_any:
            raise SweepConfigError(f"{named}: not an argument of {cls.__name__}; accepted: {sorted(params)}")
        types = _annotation_types(params[name].annotation) if name in params else None
        if types is not None and not any(is_a(value, t) for t in types):
            accepted = " or ".join("null" if t is type(None) else TYPE_NAMES[t] for t in types)
            raise SweepConfigError(f"{named}: {cls.__name__} takes {accepted} here")
        minimum = OPTUNA_MINIMUM.get(name)
        if minimum is not None and is_int(value) and value < minimum:
            raise SweepConfigError(
                f"{named}: expected an integer >= {minimum} ({cls.__name__} would fail on it, if not at once then in the trials)"
            )


def check_optuna(sweep: SweepConfig, train_steps: int) -> None:
    """Build the sampler and the pruner exactly as the driver does (the pruner with max_resource resolved), so a
    bad `_target_` or argument is refused here, named, and not at the second ask or in every trial's report.
    A wrapped pruner (contracts/pruning/evidence.py) is checked the same way."""
    pruner = pruner_spec(sweep.pruner, train_steps)
    wrapped = [("pruner.wrapped", pruner["wrapped"])] if "wrapped" in pruner else []  # first: named as its own
    for key, node in (("sampler", sweep.sampler), *wrapped, ("pruner", pruner)):
        target = node.get("_target_")
        try:
            build(node)
            failure = None
        except InstantiationException as err:  # not whitelisted, or no such class: nothing was constructed
            raise SweepConfigError(
                f"{key}._target_={target!r}: {' '.join(str(err).split())} (accepted: {', '.join(TARGETS)})"
            ) from None
        except Exception as err:  # noqa: BLE001 (the constructor refused an argument: name it below if we can)
            failure = err
        try:
            cls = get_class(target)  # safe now: build() let the target past the whitelist
        except ValueError:  # a factory function, not a class: its arguments are its own business
            cls = None
        if cls is not None:
            _check_arguments(key, cls, resolved_dict(node))
        if failure is not None:
            raise SweepConfigError(f"{key} ({target}): {type(failure).__name__}: {failure}")
    _check_gp_has_torch(str(sweep.sampler.get("_target_")))


def _check_gp_has_torch(target: str) -> None:
    """Optuna's GPSampler fits its Gaussian process with torch, imported in the driver at its first fit (after the
    start-up trials ran): a driver installed without torch (the package does not require it) is refused now."""
    if target.endswith("GPSampler") and importlib.util.find_spec("torch") is None:
        raise SweepConfigError(
            f"sampler._target_={target!r}: Optuna's GPSampler needs torch in the driver's environment and it is not "
            "installed: install it (`pip install torch==2.13.0`, or the package's `cpu` extra) or choose another "
            "sampler (sampler=tpe)"
        )
