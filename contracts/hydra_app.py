"""The training config outside a Hydra app (tools, the sweep driver's validation, tests), and typed access to it:
`TrainJob`, what an entry point's main (trm.train) converts its config to, once, for everything below it.

Kept free of torch so the sweep driver can validate trial overrides without importing the model. Knows only the
config package and `train.yaml`; the sweep's own config is composed in sweeps/config/compose.py."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from contracts import train_config
from contracts.schema_checks import ConfigSchemaError, config_error_line
from contracts.train_config import TrainApp

# The configs are a package (conf/ in the checkout, `trm_sweeps_conf` in the wheel: pyproject.toml), so an
# installed wheel finds them wherever it is run from. Both apps' `hydra.main` use CONFIG_PATH.
CONFIG_MODULE = "trm_sweeps_conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
# The callbacks of conf/hydra_app.yaml: both apps' `hydra.main(execution_whitelist=...)` trust these targets.
HYDRA_CALLBACKS = ["storage.hydra_secrets.RefuseSecrets", "contracts.hydra_run_dir.CheckRunDir"]
# The resolver conf/hydra_app.yaml's `help.template` calls: an app's `--help` lists the groups of its own defaults
# list, not every group on the search path (Hydra's $APP_CONFIG_GROUPS lists the sweep's groups in the trainer's
# help). Registered when this module is imported, which every app does before Hydra composes its config.
HELP_GROUPS_RESOLVER = "trm_app_groups"


def group_options(group: str) -> list[str]:
    """The options of a config group (`arch`, `storage/engine`): its YAML files, less the `_`-prefixed bases other
    options extend."""
    folder = resources.files(CONFIG_MODULE).joinpath(*group.split("/"))
    names = (entry.name for entry in folder.iterdir() if entry.is_file())
    return sorted(name.removesuffix(".yaml") for name in names if name.endswith(".yaml") and not name.startswith("_"))


def group_lines(choices: Mapping[str, object]) -> list[str]:
    """`  group: option, option` for each config group of an app's defaults list (`hydra.runtime.choices`),
    Hydra's own (`hydra/...`) left out, sorted. A group placed in another package keeps its `@package` in the
    name (`storage/engine@sweep.storage_engine`): that is the override Hydra accepts for it."""
    groups = sorted(str(g) for g in choices if not (str(g) == "hydra" or str(g).startswith("hydra/")))
    return [f"  {group}: {', '.join(group_options(group.split('@', 1)[0]))}" for group in groups]


def train_group_lines() -> list[str]:
    """group_lines of the training config (`python -m trm.train --help` lists the same), for tools that compose
    it without being a Hydra app (trm.info)."""
    train_config.register()
    return group_lines(compose_config("train", [], return_hydra_config=True).hydra.runtime.choices)


def _help_groups(*, _root_: DictConfig) -> str:
    return "\n".join(group_lines(_root_.hydra.runtime.choices))


OmegaConf.register_resolver(HELP_GROUPS_RESOLVER, _help_groups, replace=True)


def run_app(main: Callable[[], object]) -> None:
    """Run a Hydra app's `main` as a command (`python -m` and the console script): output piped into a reader
    that stops early (`--help | head`) ends it quietly, as the key=value CLIs do, not with a traceback."""
    try:
        main()
    except BrokenPipeError:
        # Python would hit the closed pipe again flushing stdout at exit: point stdout at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def compose_config(config_name: str, overrides: list[str], return_hydra_config: bool = False) -> DictConfig:
    """The config `config_name` of the config package with `overrides`, as its Hydra app would see it (without a
    Hydra run dir; with the `hydra` node when `return_hydra_config`)."""
    if GlobalHydra.instance().is_initialized():  # inside a Hydra app whose search path is conf/ too
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)
    with initialize_config_module(config_module=CONFIG_MODULE):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)


def compose_train_config(overrides: list[str]) -> DictConfig:
    """The training config as `python -m trm.train <overrides>` would see it (without a Hydra run dir), checked
    against its schema (contracts/train_config.py): a ConfigSchemaError (a Hydra error and a ValueError) names the
    key, the value and what is accepted; Hydra's other errors (a group option that does not exist) as they are."""
    train_config.register()
    try:
        cfg = compose_config("train", overrides)
    except (HydraException, OmegaConfBaseException) as err:
        line = config_error_line(err)
        if line is None:
            raise
        raise ConfigSchemaError(line) from err
    train_config.check_train_config(cfg)
    return cfg


def train_values(overrides: list[str]) -> dict[str, Any]:
    """compose_train_config's result as plain data for the sweep's checks, which read a trial's training config
    without a Hydra run (its errors, the same). Every value resolved that resolves there; one that cannot (`out_dir`
    needs the run, and what is built on it) is None; a mapping is a dict, so a config group's node reads as one."""
    cfg = compose_train_config(overrides)

    def values(node: DictConfig, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in node:
            key = str(name)  # a config read from YAML has string keys
            value = OmegaConf.select(cfg, f"{prefix}{key}", default=None, throw_on_resolution_failure=False)
            if isinstance(value, DictConfig):
                out[key] = values(value, f"{prefix}{key}.")
            elif isinstance(value, ListConfig):
                try:
                    out[key] = OmegaConf.to_container(value, resolve=True)
                except OmegaConfBaseException:
                    out[key] = None
            else:
                out[key] = value
        return out

    return values(cfg, "")


def typed_train_config(cfg: DictConfig) -> TrainApp:
    """A composed training config as its typed blocks (`OmegaConf.to_object`: every block's __post_init__ run,
    every interpolation resolved: `out_dir` needs Hydra's run or an override). A ConfigSchemaError names the key and
    why: a value out of range (as check_train_config says it), a value not given (`???`), one that does not resolve."""
    try:
        return cast(TrainApp, OmegaConf.to_object(cfg))
    except OmegaConfBaseException as err:  # OmegaConf's: `???`, an interpolation, a resolved value of a wrong type
        raise ConfigSchemaError(f"{err.full_key}: {str(err.msg or err).splitlines()[0]}") from None
    except ValueError as err:  # a __post_init__'s, naming its key
        raise ConfigSchemaError(str(err).splitlines()[0]) from None


@dataclass(frozen=True)
class TrainJob:
    """A training job's config, converted once by its entry point's main (`of`): `app`, the typed blocks every
    function below main reads, and `written`, the config as composed with its interpolations unresolved, for the
    two readers that need the config as data: the fingerprints every worker and a resumed checkpoint compare (a
    worker-local path stays `${...}`: trm/fingerprint.py) and the W&B run's config (an env value masked before it
    resolves: trm/tracking/run_config.py). Readers copy `written`, never change it."""

    app: TrainApp
    written: Mapping[str, Any]
    overrides: tuple[str, ...] = ()  # the job's own command line (Hydra's task overrides); () where composed here

    @classmethod
    def of(cls, cfg: DictConfig, overrides: tuple[str, ...] = ()) -> TrainJob:
        """`cfg` composed (Hydra's `main`, compose_train_config) as a job: typed_train_config's errors."""
        return cls(typed_train_config(cfg), to_dict(cfg, resolve=False), overrides)


def packaged_yaml(relative: str) -> dict[str, Any]:
    """One YAML file of the config package as written (`wandb/default.yaml`), without composing: for a default
    that code outside a composed config needs, so that the value has one home in conf/ and no copy in Python.

    FileNotFoundError if the package has no such file; TypeError if its top level is not a mapping."""
    text = resources.files(CONFIG_MODULE).joinpath(relative).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise TypeError(f"{CONFIG_MODULE}/{relative}: expected a mapping at the top level, got {type(data).__name__}")
    return cast(dict[str, Any], data)


def to_dict(node: Any, resolve: bool = True) -> dict[str, Any]:
    """A mapping node of a config as plain Python (`OmegaConf.to_container`), typed as the dict it is.

    TypeError if the node is not a mapping (a list, a scalar): every caller here reads a mapping."""
    container = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(container, dict):
        raise TypeError(f"expected a config mapping, got {type(container).__name__}")
    return cast(dict[str, Any], container)  # keys of a DictConfig read from YAML are strings
