"""Config in one place: each knob's value lives in conf/, and where Python needs a default of its own (tests, the
key=value CLIs) it is the same value, checked here so that the two cannot drift apart. No database, no training."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contracts.hydra_app import compose_train_config, packaged_yaml, to_dict
from contracts.wandb_runs import default_project
from storage import StorageConfigError, engine_settings, open_storage
from storage.engine_config import RULES
from sweeps.config.compose import compose_sweep_config
from sweeps.config.typed_config import typed_sweep
from sweeps.trials.wandb_summary import trial_wandb_overrides
from trm.links.trial import RetryPolicy

CONF = Path(__file__).resolve().parents[1] / "conf"


def test_storage_engine_conf_and_open_storage_defaults_agree() -> None:
    """conf/storage/engine/default.yaml is the sweep's storage.engine and a trial's sweep.storage_engine; open_storage's
    keyword defaults (what a test or a key=value CLI gets) are the same values, and every key is one it reads."""
    conf = packaged_yaml("storage/engine/default.yaml")
    defaults = {name: p.default for name, p in inspect.signature(open_storage).parameters.items() if name in RULES}
    assert conf == defaults and set(conf) == set(RULES)
    assert to_dict(compose_sweep_config([]).storage.engine) == conf
    assert to_dict(compose_sweep_config(["site=pod"]).storage.engine) == conf
    assert to_dict(compose_train_config([]).sweep.storage_engine) == conf
    assert engine_settings(conf, "storage.engine") == conf


def test_report_retry_conf_and_retry_policy_defaults_agree() -> None:
    conf = to_dict(compose_train_config([]).sweep.report_retry)
    assert conf == dataclasses.asdict(RetryPolicy())
    assert RetryPolicy.from_config(conf) == RetryPolicy()


def test_the_wandb_keys_a_sweep_passes_on_are_the_shared_file() -> None:
    """conf/wandb/default.yaml holds the keys both apps share; the driver copies exactly those to its trials (a sweep's
    own values), and a run without a project gets that file's project."""
    shared = packaged_yaml("wandb/default.yaml")
    for cfg in (compose_train_config([]), compose_sweep_config([])):
        assert {key: cfg.wandb[key] for key in shared} == shared
    assert default_project() == shared["project"]
    changed = compose_sweep_config(
        ["wandb.mode=offline", "wandb.project=mine", "wandb.entity=team", "wandb.tags=[a]", "wandb.enabled=false"]
        + ["wandb.init_timeout_s=30", "wandb.finish_timeout_s=20"]
    )
    forwarded = {o.split("=", 1)[0] for o in trial_wandb_overrides(typed_sweep(changed).wandb)}
    assert forwarded == {f"wandb.{key}" for key in shared}


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_sets_what_train_yaml_leaves_to_it(experiment: str) -> None:
    """train.yaml marks the keys every experiment sets `???` (a value there would never take effect)."""
    left = {f"train.{key}" for key, value in packaged_yaml("train.yaml")["train"].items() if value == "???"}
    cfg = compose_train_config([f"experiment={experiment}", "out_dir=run"])  # out_dir: Hydra's run dir otherwise
    assert left and not OmegaConf.missing_keys(cfg) & left


@pytest.mark.parametrize("optim", sorted(p.stem for p in (CONF / "optim").glob("[!_]*.yaml")))
def test_every_optimizer_sets_what_its_base_leaves_to_it(optim: str) -> None:
    left = {f"optim.{key}" for key, value in packaged_yaml("optim/_base.yaml").items() if value == "???"}
    cfg = compose_train_config([f"optim={optim}", "out_dir=run"])
    assert left and not OmegaConf.missing_keys(cfg) & left and cfg.optim.name == optim


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"pool_size": 0}, r"storage\.engine\.pool_size=0: expected a whole number >= 1"),
        ({"max_overflow": 1.5}, r"storage\.engine\.max_overflow=1\.5: expected a whole number >= 0"),
        ({"connect_timeout_s": True}, r"storage\.engine\.connect_timeout_s=True: expected a whole number >= 1"),
        ({"sqlite_busy_timeout_s": "x"}, r"storage\.engine\.sqlite_busy_timeout_s='x': expected a number >= 0"),
        ({"poolsize": 2}, r"storage\.engine\.poolsize: not an engine setting; accepted: \['connect_timeout_s'"),
    ],
)
def test_a_bad_engine_setting_is_named(block: dict, expected: str) -> None:
    with pytest.raises(StorageConfigError, match=expected):
        engine_settings(block, "storage.engine")


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"attempts": 0}, r"sweep\.report_retry\.attempts=0: expected a whole number >= 1"),
        ({"first_delay_s": -1}, r"sweep\.report_retry\.first_delay_s=-1: expected seconds >= 0"),
        ({"tries": 3}, r"sweep\.report_retry\.tries: Key 'tries' not in 'RetryPolicy'; accepted: \['attempts'"),
    ],
)
def test_a_bad_retry_setting_is_named(block: dict, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        RetryPolicy.from_config(block)


@pytest.mark.parametrize("name", ["local", "torchrun", "tpu_pod"])
def test_every_launcher_knob_in_conf_is_its_constructors_default(name: str) -> None:
    """conf/launcher/<name>.yaml names every argument of its launcher (no knob left only in Python), and where the
    constructor has a default of its own it is the conf's value (`???` marks what a user must give; an
    interpolation of a sweep key, e.g. `dry_run: ${dry_run}`, is that key's value in the composed sweep)."""
    from hydra.utils import get_class

    from sweeps.config.compose import compose_sweep_config

    sweep = compose_sweep_config([f"launcher={name}"])

    conf = packaged_yaml(f"launcher/{name}.yaml")
    assert conf.pop("defaults") == ["_base", "_self_"]  # shared knobs: conf/launcher/_base.yaml, its own win
    conf = {**packaged_yaml("launcher/_base.yaml"), **conf}
    launcher = get_class(conf.pop("_target_"))
    params = inspect.signature(launcher).parameters
    assert set(conf) == set(params), f"conf/launcher/{name}.yaml vs the constructor"
    for key, value in conf.items():
        default = params[key].default
        if key == "env" and default is None:  # tpu_pod: None stands for its constructor's module's DEFAULT_ENV
            default = sys.modules[launcher.__init__.__module__].DEFAULT_ENV
        interpolated = isinstance(value, str) and value.startswith("${") and value.endswith("}")
        shipped = OmegaConf.select(sweep, value[2:-1]) if interpolated else value
        if shipped != "???":
            assert shipped == default, f"launcher.{key}: conf {value!r} ({shipped!r}), Python {default!r}"


# What a clean checkout must have: every config, the code, the docs. Not run outputs (a bench's study folders,
# Hydra's .hydra/ copies, logs), which their own .gitignore entries keep out on purpose.
SHIPPED = ("conf/**/*", "trm/**/*.py", "sweeps/**/*.py", "storage/**/*.py", "dashboards/**/*.py", "tests/**/*.py",
           "bench/*.py", "docs/*.md")  # fmt: skip


@pytest.mark.slow
def test_no_config_or_source_file_is_git_ignored(tmp_path: Path) -> None:
    """A file that exists here but matches .gitignore never reaches a clean checkout: `wandb/` once hid
    conf/wandb/default.yaml and CI failed 208 tests with "Could not find 'wandb/default'". The names are
    replayed as empty files in a scratch repo, so the check needs no .git in the checkout (`git check-ignore`)."""
    root = CONF.parent
    names = [
        p.relative_to(root).as_posix()
        for pattern in SHIPPED
        for p in root.glob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert any(n == "conf/wandb/default.yaml" for n in names)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text((root / ".gitignore").read_text())
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    found = subprocess.run(
        ["git", "-C", str(tmp_path), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(names),
        capture_output=True,
        text=True,
    )
    assert found.returncode in (0, 1), found.stderr  # 1: nothing ignored
    assert found.stdout.split() == [], f".gitignore hides these files from a clean checkout: {found.stdout.split()}"
