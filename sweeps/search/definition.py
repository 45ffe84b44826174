"""What defines a study, remembered on it, so that a driver with another definition cannot mix its trials in.

A study's best trial is only meaningful across trials that trained the same thing and were judged the same way:
its search space (every parameter with its distribution), its objectives and directions, the trial length
(train.steps), the experiment preset, the pruner, the other overrides every trial trains with (trial.overrides and
study.fixed, less those that say where or how a job runs: DOES_NOT_DEFINE), how a trial's value is read
(study.value) and how many seeds make it (study.seeds). The first driver stores them as the study attribute
`definition` (storage.study_record.StudyAttrs); a later driver whose definition differs is refused before it asks
Optuna for a trial, with every difference named and the two ways out: a new study.name, or
`study.allow_changed_definition=true` to continue the study as now defined (that driver stores its definition).

Some changes Optuna itself cannot hold in one study (a parameter's kind, log scale or choices: "Cannot set
different log configuration ...", raised only after a trial was asked): those are refused even with the override.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    check_distribution_compatibility,
    distribution_to_json,
    json_to_distribution,
)
from optuna.trial import FrozenTrial

from contracts.hydra_app import packaged_yaml
from contracts.overrides import parse_override
from contracts.pruners import current_pruner_spec
from contracts.training_keys import NOT_TRAINING_KEYS, under
from sweeps.config.config_values import UserConfigError
from sweeps.config.schema import Study
from sweeps.search.space import SearchSpace

ALLOW_KEY = "study.allow_changed_definition"
# The parts of a definition, in the order a refusal names them.
PARTS = ("objectives", "directions", "train_steps", "experiment", "pruner", "space", "overrides", "value", "seeds")
# Parts a study stored before they were part of its definition: absent there, they are not compared.
LATER_PARTS = ("overrides", "value", "seeds")
# Override keys (and their subkeys) that say where or how a job runs, not what it trains or how it is judged: those
# a checkpoint need not match, and how often it logs and which kernels compute the same step; the experiment and
# train.steps are parts of their own.
DOES_NOT_DEFINE = (
    *NOT_TRAINING_KEYS,
    "train.log_interval",
    "train.compile",
    "train.kernels",
    "experiment",
    "train.steps",
)


class StudyMismatchError(UserConfigError):
    """The study name exists with other objectives, directions or pruner metric: resuming it would mix them."""


class StudyDefinitionError(StudyMismatchError):
    """The study exists with another definition (sweeps/search/definition.py); names every difference and the way out."""


def study_directions(study: Study) -> list[str]:
    return [study.direction, *(o.direction for o in study.objectives)]


def objective_names(study: Study) -> list[str]:
    return [study.objective, *(o.name for o in study.objectives)]


def optuna_params(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Every parameter as Optuna stores it: a conditional one as `key@choice` (sweeps.search.space)."""
    params = dict(space.params)
    for cond in space.conditionals:
        params.update({f"{key}@{cond.choice}": dist for key, dist in cond.params.items()})
    return params


def experiment_preset(base_overrides: Sequence[str]) -> str:
    """The experiment preset the trials train (the last `experiment=` override, else conf/train.yaml's default)."""
    for override in reversed(base_overrides):
        parsed = parse_override(str(override))
        if parsed.key_or_group == "experiment":
            return str(parsed.value())
    for entry in packaged_yaml("train.yaml").get("defaults", []):
        if isinstance(entry, dict) and "experiment" in entry:
            return str(entry["experiment"])
    return "none"


def defining_overrides(base_overrides: Sequence[str]) -> list[str]:
    """The trials' overrides that change what they train or how they are judged, in order (the last one wins)."""
    kept = []
    for override in base_overrides:
        key = parse_override(str(override)).key_or_group
        if not under(key, DOES_NOT_DEFINE):
            kept.append(str(override).lstrip("+"))
    return kept


def study_definition(
    study: Study, pruner: Mapping[str, Any], space: SearchSpace, train_steps: int, base_overrides: Sequence[str]
) -> dict[str, Any]:
    """This config's definition of its study, as stored on the study (JSON: Optuna's own distribution form);
    `pruner` as sweeps.config.optuna_parts.pruner_spec resolves it."""
    return {
        "objectives": objective_names(study),
        "directions": [d.lower() for d in study_directions(study)],
        "train_steps": int(train_steps),
        "experiment": experiment_preset(base_overrides),
        "pruner": dict(pruner),
        "space": {name: json.loads(distribution_to_json(dist)) for name, dist in optuna_params(space).items()},
        "overrides": defining_overrides(base_overrides),
        "value": study.value,
        "seeds": int(study.seeds),
    }


def describe(dist: BaseDistribution | None) -> str:
    """A distribution in a few words: `float [0.0001, 0.01] log`, `int [20, 200] step 20`, `choice(a, b)`."""
    if dist is None:
        return "absent"
    if isinstance(dist, CategoricalDistribution):
        return "choice(" + ", ".join(map(str, dist.choices)) + ")"
    if isinstance(dist, (FloatDistribution, IntDistribution)):
        kind = "float" if isinstance(dist, FloatDistribution) else "int"
        step = "" if dist.step is None or (kind == "int" and dist.step == 1) else f" step {dist.step}"
        return f"{kind} [{dist.low}, {dist.high}]{' log' if dist.log else ''}{step}"
    return repr(dist)


@dataclass(frozen=True)
class Change:
    what: str  # "train_steps", "space optim.lr"
    stored: str  # as the study has it
    here: str  # as this config has it
    optuna_refuses: bool = False  # one study cannot hold both (Optuna's distribution compatibility)

    def __str__(self) -> str:
        return f"{self.what}: {self.stored} in the study, {self.here} here"


def _compatible(old: BaseDistribution, new: BaseDistribution) -> bool:
    try:
        check_distribution_compatibility(old, new)
    except ValueError:
        return False
    return True


def space_changes(stored: Mapping[str, BaseDistribution], here: Mapping[str, BaseDistribution]) -> list[Change]:
    """Parameters added, removed or with another distribution; `optuna_refuses` where one study cannot hold both."""
    changes = []
    for name in sorted(set(stored) | set(here)):
        old, new = stored.get(name), here.get(name)
        if old != new:
            refused = old is not None and new is not None and not _compatible(old, new)
            changes.append(Change(f"space {name}", describe(old), describe(new), refused))
    return changes


def _distributions(space: Mapping[str, Any]) -> dict[str, BaseDistribution]:
    return {name: json_to_distribution(json.dumps(spec)) for name, spec in space.items()}


def changes(stored: Mapping[str, Any], here: Mapping[str, Any]) -> list[Change]:
    """Every difference between the study's stored definition and this config's."""
    found = []
    for part in PARTS:
        if part in LATER_PARTS and part not in stored:
            continue  # a study defined before this part was: nothing to compare it with
        if part == "space":
            found += space_changes(_distributions(stored.get("space") or {}), _distributions(here["space"]))
        elif part == "overrides" and stored[part] != here[part]:
            old, new = (
                [o for o in stored[part] if o not in here[part]],
                [o for o in here[part] if o not in stored[part]],
            )
            if not old and not new:  # the same overrides in another order (the last of a key wins)
                old, new = stored[part], here[part]
            found.append(Change(part, " ".join(old) or "none", " ".join(new) or "none"))
        elif stored.get(part) != here[part]:
            # Optuna keeps one list of directions per study; the objectives are what its values mean.
            refused = part in ("objectives", "directions")
            found.append(Change(part, json.dumps(stored.get(part)), json.dumps(here[part]), refused))
    return found


def study_changes(
    stored: Mapping[str, Any] | None, trials: Iterable[FrozenTrial], here: Mapping[str, Any]
) -> list[Change]:
    """What differs between a study and this definition: its stored definition, or for a study from before
    definitions were stored, what Optuna would refuse against its trials' distributions."""
    if stored is not None:  # a moved pruner class is the same pruner (contracts.pruners.current_pruner_spec)
        return changes({**stored, "pruner": current_pruner_spec(stored.get("pruner"))}, here)
    sampled: dict[str, BaseDistribution] = {}
    for trial in trials:
        sampled.update(trial.distributions)
    return [c for c in space_changes(sampled, _distributions(here["space"])) if c.optuna_refuses]


def refusal(name: str, found: Sequence[Change], allowed: bool) -> str | None:
    """Why a driver with this definition may not continue study `name`; None when it may (no change, or changes
    that the override allows and Optuna can hold)."""
    if not found:
        return None
    refused = [c for c in found if c.optuna_refuses]
    if allowed and not refused:
        return None
    listed = "; ".join(map(str, found))
    if refused:
        return (
            f"study.name={name!r} exists with another definition: {listed}. One Optuna study cannot hold "
            f"{', '.join(c.what for c in refused)} both ways ({ALLOW_KEY} cannot help): choose a new study.name"
        )
    return (
        f"study.name={name!r} exists with another definition: {listed}. Its trials would be compared with trials "
        f"that trained or were judged otherwise: choose a new study.name, or set {ALLOW_KEY}=true to continue the "
        "study as defined here"
    )
