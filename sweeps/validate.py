"""Validate a sweep before anything runs: one clear error naming the key, the value and what is accepted.

Everything here would otherwise fail every trial (or the driver, after the study was opened and its baseline
trial used up) while the driver itself exits 0. Checks:
  - the budget and the study definition: integers that are integers, metric names the trainer produces, a study
    name that can be a directory;
  - the search space against the training config: every searched key exists (the training config composed with
    each branch of the space, exactly as a trial would get it) and every range gives values of the key's type;
  - each trial's training config: positive step counts and batch sizes, a batch that splits over the launcher's
    world, a dataset given by path that exists where it can be checked;
  - the sampler and the pruner, built as the driver builds them, with the arguments Optuna accepts at
    construction but fails on later;
  - the machine: the interpreter of a local launcher, and an output_root this user can write.

Each check is a short independent function; validate_sweep at the end runs them in order, so this module is the
one place a user's mistake is caught.
"""

from __future__ import annotations

import contextlib
import inspect
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.errors import HydraException, InstantiationException
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from contracts.choices import check_device_choice, check_kernels_choice, check_precision_choice, compile_mode
from contracts.hydra_app import compose_train_config
from contracts.metric_names import EVAL_METRICS, MAXIMIZED, MINIMIZED, TRIAL_NUMBERS
from contracts.overrides import parse_override
from storage import study_name
from sweeps.estimate import Utilization, UtilizationError
from sweeps.launchers.base import Launcher
from sweeps.optuna_parts import TARGETS, build, pruner_spec, resolved_dict
from sweeps.space import SearchSpace, to_overrides

# Counts in the trial's training config that must be >= 1 (0 steps trains nothing; a 0 interval divides by zero).
POSITIVE_TRAIN_KEYS = (
    "train.steps",
    "train.eval_interval",
    "train.log_interval",
    "train.global_batch_size",
    "train.eval_batch_size",
)
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
_TYPE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string", list: "a list"}


class SweepConfigError(ValueError):
    pass


def _is_int(value: Any) -> bool:
    """An integer that is not a bool: YAML's `true` is an int to Python but never a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> type | None:
    """The plain type a config value has (bool before int: a bool is an int to Python), None for others."""
    if isinstance(value, ListConfig):
        return list
    return next((t for t in _TYPE_NAMES if isinstance(value, t)), None)


def _is_a(value: Any, kind: type) -> bool:
    """Whether `value` can stand for a `kind`: a bool is no int, an int is a float, a ListConfig is a list."""
    if kind is int:
        return _is_int(value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is list:
        return isinstance(value, (list, ListConfig))
    return isinstance(value, kind)


def _check_budget(cfg: DictConfig) -> None:
    if not _is_int(cfg.n_trials) or cfg.n_trials <= 0:
        raise SweepConfigError(f"n_trials={cfg.n_trials!r}: expected an integer > 0")
    if cfg.max_concurrent is not None and (not _is_int(cfg.max_concurrent) or cfg.max_concurrent < 1):
        raise SweepConfigError(
            f"max_concurrent={cfg.max_concurrent!r}: expected an integer >= 1, or null for one trial per slot"
        )
    if cfg.timeout is not None and (
        isinstance(cfg.timeout, bool) or not isinstance(cfg.timeout, (int, float)) or cfg.timeout <= 0
    ):
        raise SweepConfigError(f"timeout={cfg.timeout!r}: expected seconds > 0, or null for no limit")
    for key, value in (
        ("stall_timeout_s", cfg.stall_timeout_s),
        ("heartbeat.interval_s", cfg.heartbeat.interval_s),
        ("heartbeat.grace_s", cfg.heartbeat.grace_s),
        ("storage_outage_backoff.first_s", cfg.storage_outage_backoff.first_s),
        ("storage_outage_backoff.max_s", cfg.storage_outage_backoff.max_s),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise SweepConfigError(f"{key}={value!r}: expected seconds > 0")
    if cfg.heartbeat.grace_s <= cfg.heartbeat.interval_s:
        raise SweepConfigError(
            f"heartbeat.grace_s={cfg.heartbeat.grace_s} must exceed heartbeat.interval_s={cfg.heartbeat.interval_s}: "
            "a live driver's trials would look dead between two beats"
        )


def _check_estimate(estimate: DictConfig) -> None:
    """The dry run's pricing inputs (a bad utilization would only fail after every trial's FLOPs were counted)."""
    peak = estimate.peak_tflops
    if isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak <= 0:
        raise SweepConfigError(f"estimate.peak_tflops={peak!r}: expected the chip's peak in TFLOP/s, > 0")
    try:
        Utilization.parse(estimate.utilization)
    except UtilizationError as err:
        raise SweepConfigError(str(err)) from None


def _check_study(study: DictConfig, scale: str) -> None:
    _check_study_name(study.name)
    for key, value in (
        ("direction", study.direction),
        *((f"objectives[{i}].direction", o.direction) for i, o in enumerate(study.get("objectives") or [])),
    ):
        if str(value).lower() not in ("maximize", "minimize"):
            raise SweepConfigError(f"study.{key}={value!r}: expected 'maximize' or 'minimize'")
    if study.value not in ("best", "last"):
        raise SweepConfigError(f"study.value={study.value!r}: expected 'best' or 'last'")
    if study.objective not in EVAL_METRICS:
        raise SweepConfigError(
            f"study.objective={study.objective!r}: not a metric the trainer produces at its evals; expected one of {list(EVAL_METRICS)}"
        )
    for i, extra in enumerate(study.get("objectives") or []):
        if extra.get("name") not in (*TRIAL_NUMBERS, *EVAL_METRICS):
            raise SweepConfigError(
                f"study.objectives[{i}].name={extra.get('name')!r}: not a value a trial records; expected one of "
                f"{list(TRIAL_NUMBERS)} (stored by the job) or an eval metric {list(EVAL_METRICS)}"
            )
    _check_prune_metric(study)
    if scale not in study.space:
        raise SweepConfigError(f"scale={scale!r}: study {study.name!r} has ranges for {sorted(study.space)} only")
    if not _is_int(study.seeds) or study.seeds < 1:
        raise SweepConfigError(f"study.seeds={study.seeds!r}: expected an integer >= 1")


def _check_study_name(name: Any) -> None:
    """Everything the name becomes (storage/study_name.py); any other character is fine: the launchers quote it
    on the trial's command line (quote_literals)."""
    why = study_name.problem(name)
    if why is not None:
        shown = repr(name) if isinstance(name, str) else name
        raise SweepConfigError(f"study.name={shown}: {why}")


def _check_prune_metric(study: DictConfig) -> None:
    """The pruner compares reported values in the study's direction: a metric reported in its place must be an
    eval metric that is better in that same direction (an accuracy for maximize, a loss for minimize)."""
    metric = study.get("prune_metric")
    if metric is None:
        return
    if study.get("objectives"):
        raise SweepConfigError(
            f"study.prune_metric={metric!r}: this study has several objectives and Optuna prunes single-objective studies only; remove it"
        )
    accepted = [f"eval/{m}" for m in (MAXIMIZED if str(study.direction).lower() == "maximize" else MINIMIZED)]
    if metric not in accepted:
        raise SweepConfigError(
            f"study.prune_metric={metric!r}: for a study that is to {str(study.direction).lower()} expected null (the objective) or one of {accepted}"
        )


def compose_trial(base: list[str], values: dict[str, Any], where: str) -> DictConfig:
    """The training config one trial would get; Hydra's own error, with the study key named, if not."""
    overrides = [*base, *to_overrides(values)]
    try:
        return compose_train_config(overrides)
    except (HydraException, OmegaConfBaseException) as err:
        message = str(err).strip().splitlines()[0]
        culprit = next((k for k in values if k.split(".")[-1] in message or k in message), None)
        named = f"{where}[{culprit!r}]={values[culprit]!r}" if culprit else f"{where} ({' '.join(overrides)})"
        raise SweepConfigError(f"{named} does not fit the training config (conf/train.yaml): {message}") from None


def _ranges(cfg: DictConfig, space: SearchSpace) -> Iterator[tuple[str, str, str, BaseDistribution, dict[str, Any]]]:
    """(where, key, spec as written, distribution, the choice it is conditional on) for every searched key."""
    specs = dict(cfg.study.space[cfg.scale].items())
    for key, dist in space.params.items():
        yield f"study.space.{cfg.scale}", key, str(specs[key]), dist, {}
    branches = (cfg.study.get("conditional") or {}).get(cfg.scale) or {}
    for cond in space.conditionals:
        # The branch as written ("true" for the choice True), named as sweeps.space names it.
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
    kind = _kind(reference)
    return value is None or kind is None or _is_a(value, kind)


def _type_name(value: Any) -> str:
    kind = _kind(value)
    return _TYPE_NAMES[kind] if kind is not None else type(value).__name__


def _check_range_types(cfg: DictConfig, space: SearchSpace, base: list[str]) -> None:
    """Every value a range can give must have the type the key has in the training config: a float for an integer
    key (`interval(2, 7)` for arch.L_layers) or a string for a number composes today and fails the trial that
    draws it. A choice of a config group (optim: choice(adamw, lion)) must name existing options, each of them."""
    configs: dict[tuple[tuple[str, Any], ...], DictConfig] = {}

    def config_with(choice: dict[str, Any], where: str) -> DictConfig:
        key = tuple(choice.items())
        if key not in configs:
            configs[key] = compose_trial(base, choice, where)
        return configs[key]

    for where, key, spec, dist, condition in _ranges(cfg, space):
        reference = OmegaConf.select(
            config_with(condition, where), key, default=None, throw_on_resolution_failure=False
        )
        named = f"{where}[{key!r}]={spec!r}"
        if isinstance(reference, DictConfig):  # a config group: each choice must be one of its options
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
                        f"{named}: {key} is {_type_name(reference)} in the training config (now {reference!r}) but the "
                        f"choice {choice!r} is {_type_name(value)}; give choices of that type"
                    )
        elif isinstance(dist, FloatDistribution) and not _fits(float(dist.low), reference):
            hint = (
                f"; use range({int(dist.low)}, {int(dist.high) + 1}) or choice(...) of integers"
                if _is_int(reference)
                else ""
            )
            raise SweepConfigError(
                f"{named}: {key} is {_type_name(reference)} in the training config (now {reference!r}) but interval(...) draws floats{hint}"
            )
        elif isinstance(dist, IntDistribution) and not _fits(int(dist.low), reference):
            raise SweepConfigError(
                f"{named}: {key} is {_type_name(reference)} in the training config (now {reference!r}) but range(...) draws integers; use choice(...)"
            )


def _check_trial_config(
    train_cfg: DictConfig, world_size: int, launcher_name: str, local_data: bool, slot_chips: int | None
) -> None:
    for key in POSITIVE_TRAIN_KEYS:
        value = OmegaConf.select(train_cfg, key)
        if not _is_int(value) or value < 1:
            raise SweepConfigError(
                f"{key}={value!r} in the trials' training config: expected an integer >= 1 (from trial.overrides, the study's fixed overrides or its search space)"
            )
    try:  # the job would refuse these at start; a sweep refuses them before its first trial
        check_precision_choice(train_cfg.train.precision, train_cfg.train.bf16_mode)
        compile_mode(train_cfg.train.compile)
        check_kernels_choice(train_cfg.train.kernels)
        check_device_choice(OmegaConf.select(train_cfg, "runtime.device", default="auto"))
    except ValueError as e:
        raise SweepConfigError(f"{e} (in the trials' training config)") from None
    examples = train_cfg.train.eval_examples
    if examples is not None and (not _is_int(examples) or examples < 1):
        raise SweepConfigError(
            f"train.eval_examples={examples!r} in the trials' training config: expected an integer >= 1, or null for the whole test split"
        )
    batch = train_cfg.train.global_batch_size
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
    if local_data and train_cfg.data.source == "path":
        path = OmegaConf.select(train_cfg, "data.path", throw_on_missing=False)
        if path in (None, "???") or not (Path(path) / "train" / "dataset.json").exists():
            raise SweepConfigError(
                f"data.path={path!r}: no dataset there (expected train/dataset.json); build one with "
                f"`python -m trm.data.build --source csv ...` or use data=sudoku_generated"
            )


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
        if types is not None and not any(_is_a(value, t) for t in types):
            accepted = " or ".join("null" if t is type(None) else _TYPE_NAMES[t] for t in types)
            raise SweepConfigError(f"{named}: {cls.__name__} takes {accepted} here")
        minimum = OPTUNA_MINIMUM.get(name)
        if minimum is not None and _is_int(value) and value < minimum:
            raise SweepConfigError(
                f"{named}: expected an integer >= {minimum} ({cls.__name__} would fail on it, if not at once then in the trials)"
            )


def _check_optuna(cfg: DictConfig, train_steps: int) -> None:
    """Build the sampler and the pruner exactly as the driver does (the pruner with max_resource resolved), so a
    bad `_target_` or argument is refused here, named, and not at the second ask or in every trial's report.
    A wrapped pruner (sweeps/pruning_evidence.py) is checked the same way."""
    pruner = OmegaConf.create(pruner_spec(cfg, train_steps))
    wrapped = [("pruner.wrapped", pruner.wrapped)] if "wrapped" in pruner else []  # checked first: named as its own
    for key, node in (("sampler", cfg.sampler), *wrapped, ("pruner", pruner)):
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


def _check_launcher_python(cfg: DictConfig, launcher: Launcher) -> None:
    """A local launcher's interpreter must exist and have this project: otherwise each trial's job dies at start."""
    python = cfg.launcher.get("python")
    if python is None or not launcher.shares_filesystem:
        return  # the driver's own interpreter, or one on remote machines
    found = shutil.which(str(python))
    fix = f"give an interpreter that has this project installed, or null for the driver's own ({sys.executable})"
    if found is None:
        raise SweepConfigError(f"launcher.python={python!r}: no such executable (not a file, or not on PATH); {fix}")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('trm') is None)"
    try:  # from another directory, as the jobs run in their trial directories
        answer = subprocess.run(
            [found, "-c", probe], check=False, cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=60
        )
        ok = answer.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise SweepConfigError(f"launcher.python={python!r}: it cannot import trm (the training package); {fix}")


def _check_output_root(output_root: Any) -> None:
    """Trial directories are made under output_root once the study is open: a root that cannot be written would
    fail the driver there, with the baseline trial used up. Make it and a file in it now; leave nothing behind."""
    root = Path(str(output_root)).resolve()
    created = [path for path in (root, *root.parents) if not path.exists()]  # deepest first
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-"):
            pass
    except OSError as err:
        raise SweepConfigError(
            f"output_root={str(output_root)!r}: cannot write there ({err.strerror or err}); choose a directory this user can write"
        ) from None
    finally:
        for path in created:
            with contextlib.suppress(OSError):
                path.rmdir()


# What `sweeps.run` reads at the top level (conf/sweep.yaml and its groups). Anything else there was added with `+`
# and nothing reads it: `+train.steps=60` or `+arch=...` would be silently ignored by every trial.
SWEEP_KEYS = frozenset(
    {
        "study",
        "storage",
        "launcher",
        "sampler",
        "preflight",
        "pruner",
        "scale",
        "n_trials",
        "timeout",
        "max_concurrent",
        "dry_run",
        "seed",
        "output_root",
        "heartbeat",
        "draws",
        "reeval",
        "estimate",
        "stall_timeout_s",
        "poll_s",
        "storage_outage_backoff",
        "progress_interval_s",
        "wandb",
        "trial",
        "hydra",
    }
)


# What `trial` holds. The trial length is no longer a key of its own: it is train.steps of the trial's training
# config (trial.overrides or the experiment's), the one source for the job and for the pruner's max resource.
TRIAL_KEYS = frozenset({"overrides", "run_root", "checkpoint_root"})


def trial_length(base_overrides: list[str]) -> int:
    """train.steps of every trial: the training config that trial.overrides (and the study's fixed overrides) make.
    It is the pruner's max resource and the progress display's 100%."""
    steps = compose_trial(base_overrides, {}, "trial.overrides").train.steps
    if not _is_int(steps) or steps < 1:
        raise SweepConfigError(f"train.steps={steps!r} (in trial.overrides): expected an integer >= 1")
    return int(steps)


def _check_trial_keys(cfg: DictConfig, space: SearchSpace) -> None:
    unknown = sorted(set(cfg.trial.keys()) - TRIAL_KEYS)
    if "train_steps" in unknown:
        raise SweepConfigError(
            "trial.train_steps is gone: the trial length is train.steps in trial.overrides, one source for the "
            "trials and the pruner (e.g. 'trial.overrides=[experiment=tiny_cpu,train.steps=60]')"
        )
    if unknown:
        raise SweepConfigError(
            f"trial.{unknown[0]}: not a trial setting, so nothing would read it; accepted: {sorted(TRIAL_KEYS)}"
        )
    searched = [*space.params, *(key for cond in space.conditionals for key in cond.params)]
    if "train.steps" in searched:
        raise SweepConfigError(
            f"study.space.{cfg.scale}['train.steps']: the trial length is the pruner's max resource, the same for every "
            "trial; set it in trial.overrides (or a study's `fixed`), or run one study per length"
        )


def _check_no_ignored_keys(cfg: DictConfig) -> None:
    ignored = sorted({str(key) for key in cfg} - SWEEP_KEYS)
    if ignored:
        raise SweepConfigError(
            f"{ignored} are not sweep settings, so every trial would ignore them. Training keys for every trial go "
            "in trial.overrides (e.g. 'trial.overrides=[experiment=tiny_cpu,train.steps=60]': the list replaces the "
            "site's, so repeat what you keep), searched keys in a study's "
            "space (--config-dir with your own study/*.yaml)"
        )


def validate_sweep(cfg: DictConfig, space: SearchSpace, base_overrides: list[str], launcher: Launcher) -> None:
    _check_no_ignored_keys(cfg)
    _check_trial_keys(cfg, space)
    _check_budget(cfg)
    _check_estimate(cfg.estimate)
    _check_study(cfg.study, cfg.scale)
    name = type(launcher).__name__
    slots = launcher.slots()  # launcher.slots parsed and checked against the launcher's machines
    slot_chips = slots[0].chips  # None: a launcher that counts no chips (local, torchrun: world_size above)
    for values in space.representative():
        train_cfg = compose_trial([*base_overrides, *slots[0].overrides], values, f"study.space.{cfg.scale}")
        _check_trial_config(train_cfg, launcher.world_size, name, launcher.shares_filesystem, slot_chips)
    _check_range_types(cfg, space, base_overrides)
    _check_optuna(cfg, trial_length(base_overrides))
    _check_launcher_python(cfg, launcher)
    _check_output_root(cfg.output_root)  # last: the only check that touches the disk
