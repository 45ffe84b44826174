"""The search space and each trial's training config, checked against the trainer's own config before anything
runs: every searched key exists (the training config composed with each branch of the space, exactly as a trial
would get it), every range gives values of the key's type, step counts and batch sizes are positive, a batch
splits over the launcher's world, a dataset given by path exists where it can be checked."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from contracts.hydra_app import compose_train_config, train_values
from contracts.overrides import parse_override
from sweeps.config.config_values import SweepConfigError, is_a, is_int, kind_of, type_name
from sweeps.config.schema import SweepConfig
from sweeps.search.budget import baseline_params
from sweeps.search.definition import describe, optuna_params
from sweeps.search.space import SearchSpace, takes, to_overrides


def compose_trial(base: list[str], values: dict[str, Any], where: str) -> dict[str, Any]:
    """The training config one trial would get, as plain values (contracts.hydra_app.train_values); if Hydra refuses it, its error naming whose setting it is: the
    first of the trials' own overrides (`base`: trial.overrides, study.fixed) that fails, else the searched value
    that fails on top of them."""
    overrides = [*base, *to_overrides(values)]
    try:
        return train_values(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        message = str(err).strip().splitlines()[0]
    # Composed again, a piece at a time, only on this error path: a word of the message may name another key
    # (Hydra lists what it accepts), so the culprit is the piece that fails.
    failing = next((i for i in range(len(base)) if not _composes(base[: i + 1])), None)
    if failing is not None:
        named = f"trial.overrides: {base[failing]!r}"
    else:
        culprit = next((k for k in values if not _composes([*base, *to_overrides({k: values[k]})])), None)
        named = f"{where}[{culprit!r}]={values[culprit]!r}" if culprit else f"{where} ({' '.join(overrides)})"
    raise SweepConfigError(f"{named} does not fit the training config (conf/train.yaml): {message}")


def _composes(overrides: list[str]) -> bool:
    try:
        compose_train_config(overrides)
    except (HydraException, OmegaConfBaseException):
        return False
    return True


def _ranges(sweep: SweepConfig, space: SearchSpace) -> Iterator[tuple[str, str, str, BaseDistribution, dict[str, Any]]]:
    """(where, key, spec as written, distribution, the choice it is conditional on) for every searched key."""
    specs = dict(sweep.study.space[sweep.scale].items())
    for key, dist in space.params.items():
        yield f"study.space.{sweep.scale}", key, str(specs[key]), dist, {}
    branches = (sweep.study.conditional or {}).get(sweep.scale) or {}
    for cond in space.conditionals:
        # The branch as written ("true" for the choice True), named as sweeps.search.space names it.
        choice, written = next(
            (c, params) for c, params in branches[cond.parent].items() if str(c).lower() == str(cond.choice).lower()
        )
        for key, dist in cond.params.items():
            yield (
                f"study.conditional[{cond.parent!r}][{choice!r}]",
                key,
                str(dict(written.items())[key]),
                dist,
                {cond.parent: cond.choice},
            )


def _as_the_job_reads(key: str, value: Any) -> Any:
    """A sampled value as trm.train will read it from its command line (choice("[0.9,0.95]") is a list there)."""
    override = to_overrides({key: value})[0]
    parsed = parse_override(override)
    if parsed.is_sweep_override():
        raise HydraException(
            f"`{override}` is a list of several values on a command line; quote the value inside the choice"
        )
    return parsed.value()


def _fits(value: Any, reference: Any) -> bool:
    """Whether a value can stand where the training config has `reference` (null always may: e.g. eval_examples)."""
    kind = kind_of(reference)
    return value is None or kind is None or is_a(value, kind)


def check_range_types(sweep: SweepConfig, space: SearchSpace, base: list[str]) -> None:
    """Every value a range can give must have the type the key has in the training config: a float for an integer
    key (`interval(2, 7)` for arch.L_layers) or a string for a number composes today and fails the trial that
    draws it. A choice of a config group (optim: choice(adamw, lion)) must name existing options, each of them."""
    configs: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}

    def config_with(choice: dict[str, Any], where: str) -> dict[str, Any]:
        key = tuple(choice.items())
        if key not in configs:
            configs[key] = compose_trial(base, choice, where)
        return configs[key]

    for where, key, spec, dist, condition in _ranges(sweep, space):
        reference = lookup(config_with(condition, where), key)
        named = f"{where}[{key!r}]={spec!r}"
        if isinstance(reference, dict):  # a config group: each choice must be one of its options
            for choice in dist.choices if isinstance(dist, CategoricalDistribution) else ():
                config_with({**condition, key: choice}, where)
            continue
        if isinstance(dist, CategoricalDistribution):
            for choice in dist.choices:
                try:
                    value = _as_the_job_reads(key, choice)
                except HydraException as err:
                    raise SweepConfigError(
                        f"{named}: the choice {choice!r} does not survive the trial's command line: {str(err).strip().splitlines()[0]}"
                    ) from None
                if not _fits(value, reference):
                    raise SweepConfigError(
                        f"{named}: {key} is {type_name(reference)} in the training config (now {reference!r}) but the "
                        f"choice {choice!r} is {type_name(value)}; give choices of that type"
                    )
        elif isinstance(dist, FloatDistribution) and not _fits(float(dist.low), reference):
            hint = (
                f"; use range({int(dist.low)}, {int(dist.high) + 1}) or choice(...) of integers"
                if is_int(reference)
                else ""
            )
            raise SweepConfigError(
                f"{named}: {key} is {type_name(reference)} in the training config (now {reference!r}) but interval(...) draws floats{hint}"
            )
        elif isinstance(dist, IntDistribution) and not _fits(int(dist.low), reference):
            raise SweepConfigError(
                f"{named}: {key} is {type_name(reference)} in the training config (now {reference!r}) but range(...) draws integers; use choice(...)"
            )


def lookup(values: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted `key` of compose_trial's values; None where the config has no such key."""
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def check_trial_config(
    train_cfg: Mapping[str, Any], world_size: int, launcher_name: str, local_data: bool, slot_chips: int | None
) -> None:
    """The checks that span the composed training config and the sweep (its types, choices and ranges were checked
    composing it: contracts/train_config.py)."""
    batch = train_cfg["train"]["global_batch_size"]
    if batch % world_size:
        raise SweepConfigError(
            f"train.global_batch_size={batch} is not divisible by the world size {world_size} of launcher "
            f"{launcher_name}: use a multiple of {world_size}"
        )
    if slot_chips and batch % slot_chips:
        raise SweepConfigError(
            f"train.global_batch_size={batch} is not divisible by the {slot_chips} chips of each slot "
            f"(launcher.slots): the global batch stays what the study says and each chip takes an equal share; "
            f"use a multiple of {slot_chips} or other slots"
        )
    if local_data and train_cfg["data"]["source"] == "path":
        path = train_cfg["data"].get("path")
        if path is None or not (Path(path) / "train" / "dataset.json").exists():
            raise SweepConfigError(
                f"data.path={path!r}: no dataset there (expected train/dataset.json); build one with "
                f"`python -m trm.data.build --source csv ...` or use data=sudoku_generated"
            )


def trial_length(base_overrides: list[str]) -> int:
    """train.steps of every trial: the training config that trial.overrides (and the study's fixed overrides) make.
    It is the pruner's max resource and the progress display's 100%."""
    steps = compose_trial(base_overrides, {}, "trial.overrides")["train"]["steps"]
    if not is_int(steps) or steps < 1:
        raise SweepConfigError(f"train.steps={steps!r} (in trial.overrides): expected an integer >= 1")
    return int(steps)


def check_baseline(sweep: SweepConfig, space: SearchSpace) -> None:
    """The baseline the driver enqueues as a new study's first trial lies inside the space: otherwise that trial
    fails before it starts (sweeps/search/draw.py), and a study is only ever given its baseline once."""
    if not sweep.study.enqueue_baseline:
        return
    baseline = dict(sweep.study.baseline.get(sweep.scale) or {})
    named = optuna_params(space)
    for name, value in baseline_params(baseline, space.conditionals).items():
        dist = named.get(name)
        if dist is not None and not takes(dist, value):
            raise SweepConfigError(
                f"study.baseline.{sweep.scale}.{name.split('@')[0]}={value!r}: outside this study's space "
                f"({describe(dist)}); give a value the space takes, or study.enqueue_baseline=false"
            )


def check_searched_keys(sweep: SweepConfig, space: SearchSpace) -> None:
    """The trial length is the pruner's max resource: one value for the whole study, never searched."""
    searched = [*space.params, *(key for cond in space.conditionals for key in cond.params)]
    if "train.steps" in searched:
        raise SweepConfigError(
            f"study.space.{sweep.scale}['train.steps']: the trial length is the pruner's max resource, the same for every "
            "trial; set it in trial.overrides (or a study's `fixed`), or run one study per length"
        )
