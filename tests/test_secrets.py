"""Issue 20: a secret on the command line is refused in one line and leaves no copy on disk.

Every app runs as a real subprocess from a fresh working directory, with HOME pointing inside the test's
tmp dir too, so anything it writes (Hydra's run directory and `<app>.log`, W&B files, a study database,
a report) lands where the test then reads every byte back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from contracts import train_config
from contracts.hydra_app import CONFIG_MODULE
from storage import open_storage
from storage.hydra_secrets import RefuseSecrets
from storage.secrets import (
    find_secret,
    has_url_credentials,
    is_secret_name,
    redact_credentials,
)
from storage.url import redact
from sweeps.config import schema
from tests.sweep_helpers import FAST_TRIAL, trial_list

SECRET = "Zq9-s3cr3t-w0rd-7781"
PG_URL = f"postgresql+psycopg2://postgres:{SECRET}@127.0.0.1:5432/somedb"
PG_FIX = ("~/.pgpass",)  # every database refusal also names the *_password_env key of its app


def app_place(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[Path, dict[str, str]]:
    """An app's working directory (`work`, made) and environment: HOME in the test's tmp dir, W&B offline."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("TRM_SWEEPS_STORAGE", "WANDB_API_KEY", "HYDRA_FULL_ERROR")}
    return work, {
        **base,
        "HOME": str(home),
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        **(env or {}),
    }


def run_app(
    tmp_path: Path,
    module: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: int = 120,
) -> subprocess.CompletedProcess[str]:
    work, full_env = app_place(tmp_path, env)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False,
        cwd=work,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def files_holding(root: Path, secret: str) -> list[Path]:
    """Every file under `root` (recursively, all bytes) that contains `secret`."""
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def assert_one_line_refusal(proc: subprocess.CompletedProcess[str], *names: str) -> str:
    output = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, output[-3000:]
    assert len(output.splitlines()) == 1, output[-3000:]
    assert output.startswith("error: ")
    assert SECRET not in output
    for name in names:
        assert name in output, (name, output)
    return output


def assert_refused_without_a_trace(tmp_path: Path, proc: subprocess.CompletedProcess[str], *names: str) -> None:
    assert_one_line_refusal(proc, *names)
    assert files_holding(tmp_path, SECRET) == []
    # Refused before Hydra (or anything) wrote: no run directory, no log file, no study, nothing.
    assert sorted((tmp_path / "work").rglob("*")) == []


# ------------------------------------------------------------------ a password in a storage URL, every app

DB_REFUSALS = {
    "sweeps.run": (
        ["study=halting", "storage=postgres", f"storage.url={PG_URL}", "n_trials=1"],
        "storage.password_env",
    ),
    "sweeps.run ?password=": (
        [
            "study=halting",
            f"storage.url='postgresql://postgres@127.0.0.1:5432/db?password={SECRET}'",
        ],
        "storage.password_env",
    ),
    "trm.train": (
        [
            f"sweep.storage={PG_URL}",
            "sweep.study=x",
            "sweep.trial_number=0",
            "train.steps=1",
        ],
        "sweep.password_env",
    ),
    "dashboards.serve": ([f"storage.url={PG_URL}", "port=0"], "storage.password_env"),
    "dashboards.report": (["study=x", f"storage.url={PG_URL}"], "storage.password_env"),
    "sweeps.status": ([f"storage.url={PG_URL}"], "storage.password_env"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DB_REFUSALS))
def test_a_password_in_a_storage_url_is_refused_in_one_line_and_leaves_no_copy(tmp_path: Path, case: str) -> None:
    args, password_env_key = DB_REFUSALS[case]
    proc = run_app(tmp_path, case.split(maxsplit=1)[0], *args)
    assert_refused_without_a_trace(tmp_path, proc, password_env_key, *PG_FIX)


# ------------------------------------------------------------------ other secrets on the command line


@pytest.mark.parametrize(
    ("module", "args", "names"),
    [
        (
            "trm.train",
            ["+wandb.api_key=" + SECRET, "train.steps=1"],
            ["wandb.api_key", "WANDB_API_KEY"],
        ),
        (
            "trm.train",
            ["+my.access_token=" + SECRET, "train.steps=1"],
            ["my.access_token"],
        ),
        (
            "trm.train",
            [f"checkpoint.url=gs://user:{SECRET}@bucket/run", "train.steps=1"],
            ["checkpoint.url", "gs://user:***@bucket/run"],
        ),
        (
            "trm.train",
            [f"checkpoint.url=https://user:{SECRET}@host/run", "train.steps=1"],
            ["checkpoint.url", "~/.netrc"],
        ),
        (
            "trm.train",
            [
                f"checkpoint.url='https://host/run?X-Goog-Signature={SECRET}'",
                "train.steps=1",
            ],
            ["checkpoint.url"],
        ),
        (
            "trm.train",
            [
                "-m",
                f"checkpoint.url=gs://user:{SECRET}@bucket/run,/tmp/elsewhere",
                "train.steps=1",
            ],
            ["checkpoint.url"],
        ),
        (
            "sweeps.run",
            ["study=halting", "+wandb.api_key=" + SECRET],
            ["wandb.api_key", "WANDB_API_KEY"],
        ),
        # A secret the driver would hand on to every trial's command line.
        (
            "sweeps.run",
            ["study=halting", f"trial.overrides=['+wandb.api_key={SECRET}']"],
            ["+wandb.api_key", "trial.overrides"],
        ),
        (
            "sweeps.run",
            ["study=halting", f"trial.checkpoint_root=gs://u:{SECRET}@bucket/ckpt"],
            ["trial.checkpoint_root"],
        ),
    ],
    ids=[
        "wandb-key",
        "token",
        "gs-userinfo",
        "https-userinfo",
        "signed-url",
        "multirun",
        "sweep-wandb-key",
        "sweep-trial-overrides",
        "sweep-checkpoint-root",
    ],
)
@pytest.mark.slow
def test_other_secrets_are_refused_in_one_line_and_leave_no_copy(
    tmp_path: Path, module: str, args: list[str], names: list[str]
) -> None:
    proc = run_app(tmp_path, module, *args)
    assert_refused_without_a_trace(tmp_path, proc, *names)


@pytest.mark.slow
def test_a_refused_sweep_creates_no_study(tmp_path: Path) -> None:
    db = tmp_path / "work" / "study.db"
    proc = run_app(
        tmp_path,
        "sweeps.run",
        "study=halting",
        f"storage.url=sqlite:///{db}",
        "n_trials=1",
        f"trial.overrides=['+wandb.api_key={SECRET}']",
    )
    assert_refused_without_a_trace(tmp_path, proc, "+wandb.api_key")
    assert not db.exists()


@pytest.mark.slow
def test_a_sweep_with_its_password_in_the_environment_runs_and_stores_it_nowhere(pg_url: str, tmp_path: Path) -> None:
    """The allowed way (storage.password_env) runs end to end on PostgreSQL through the check, W&B on: the trial's
    job (trm.train, under the same callback) completes, and so do the jobs of the study's end (re-evaluation,
    confirm). The secret is in no command line of any process while it runs, no output or file, and nothing the
    study stores."""
    out = tmp_path / "work" / "sweeps"
    work, env = app_place(tmp_path, {"TRM_TEST_SECRET_PW": SECRET})
    argv = [
        sys.executable, "-m", "sweeps.run", "study=halting", "study.name=env_pw", f"storage.url={pg_url}",
        "storage.password_env=TRM_TEST_SECRET_PW", "n_trials=1", "pruner=none", f"output_root={out}",
        f"trial.overrides={trial_list(FAST_TRIAL)}", "heartbeat.interval_s=1", "poll_s=0.2", "wandb.summary=false",
    ]  # fmt: skip
    log = tmp_path / "driver.log"  # its output: under tmp_path, so files_holding reads it too
    command_lines: list[str] = []
    with open(log, "w") as sink:
        driver = subprocess.Popen(argv, cwd=work, env=env, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while driver.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            command_lines += subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
            time.sleep(0.5)
    assert driver.returncode == 0, log.read_text()[-3000:]
    assert any("trm.train" in line for line in command_lines)  # the job's command line was seen
    assert all(list(out.glob(f"env_pw/*/trial-0/{stage}")) for stage in ("reeval", "confirm"))  # the end's jobs ran
    assert not [line for line in command_lines if SECRET in line]
    assert list((tmp_path / "work").rglob(".hydra/config.yaml"))  # Hydra did save the driver's and the trial's runs
    assert files_holding(tmp_path, SECRET) == []
    study = optuna.load_study(study_name="env_pw", storage=open_storage(pg_url))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]
    dumped = json.dumps(
        [
            study.user_attrs,
            [(t.user_attrs, t.system_attrs, t.params) for t in study.trials],
        ],
        default=str,
    )
    assert SECRET not in dumped


# ------------------------------------------------------------------ the detection itself (storage/secrets.py)


@pytest.mark.parametrize(
    "text",
    [
        PG_URL,
        f"postgresql://postgres@h/db?password={SECRET}",
        f"postgresql://postgres:a/{SECRET}@h/db",  # SQLAlchemy accepts a '/' in the password
        f"gs://user:{SECRET}@bucket/x",
        f"https://user:{SECRET}@host/x",
        f"s3://bucket/x?X-Amz-Signature={SECRET}&a=b",
        f"['a=gs://u:{SECRET}@b/x', 'b=c@d']",
    ],
)
def test_urls_with_credentials_are_found_and_redacted(text: str) -> None:
    assert has_url_credentials(text)
    assert SECRET not in redact_credentials(text) and "***" in redact_credentials(text)


@pytest.mark.parametrize(
    "text",
    [
        "sqlite:////tmp/x.db",
        "postgresql://postgres@127.0.0.1:5432/trm_sweeps",
        "gs://bucket/run",
        "https://host:8080/a/b@c",
        "${oc.env:TRM_SWEEPS_STORAGE,postgresql://postgres@h/db}",
    ],
)
def test_urls_without_credentials_pass(text: str) -> None:
    assert not has_url_credentials(text) and redact_credentials(text) == text


def test_secret_names() -> None:
    assert all(
        is_secret_name(n)
        for n in (
            "+wandb.api_key",
            "hydra.job.env_set.WANDB_API_KEY",
            "db.password",
            "x.client_secret",
            "gh.token",
        )
    )
    # The env var's *name* is how a secret is passed; Hydra's exclude_keys is a list of key names.
    assert not any(
        is_secret_name(n)
        for n in (
            "storage.password_env",
            "sweep.password_env",
            "exclude_keys",
            "train.steps",
            "wandb.entity",
        )
    )


def test_redact_of_an_unparsable_url_still_hides_the_password() -> None:
    assert SECRET not in redact(f"postgresql://postgres:{SECRET} x@127.0.0.1:notaport/db")


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("sweep", []),
        ("sweep", ["site=pod", "storage=postgres"]),
        ("train", []),
        ("train", ["experiment=paper_sudoku"]),
    ],
)
def test_the_shipped_configs_hold_no_secret(name: str, overrides: list[str]) -> None:
    """No false positive on the project's own configs: otherwise every run would be refused."""
    schema.register(), train_config.register()  # the schemas the apps' defaults name (alone, nothing else does)
    with initialize_config_module(config_module=CONFIG_MODULE):
        cfg = compose(config_name=name, overrides=overrides, return_hydra_config=True)
    assert find_secret(OmegaConf.to_container(cfg, resolve=False)) is None  # type: ignore[arg-type]
    # ... and the check is on: the callback is registered in both apps' configs.
    assert cfg.hydra.callbacks.refuse_secrets._target_ == f"{RefuseSecrets.__module__}.{RefuseSecrets.__name__}"


def test_a_nested_secret_names_the_key_but_never_the_value() -> None:
    refusal = find_secret({"trial": {"overrides": ["train.steps=5", f"+wandb.api_key={SECRET}"]}})
    assert refusal is not None and "+wandb.api_key (in trial.overrides)" in refusal and SECRET not in refusal
    assert find_secret({"wandb": {"api_key": None}, "storage": {"password_env": "PGPW"}}) is None
