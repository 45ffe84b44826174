"""A run directory this user cannot create is refused in one line by both apps (contracts/hydra_run_dir.py), after
the secret check and before Hydra tries to make it (it would print a traceback of its own internals)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from contracts import train_config
from contracts.hydra_app import CONFIG_MODULE, HYDRA_CALLBACKS
from contracts.hydra_run_dir import CheckRunDir
from sweeps.config import schema


@pytest.mark.parametrize("app", ["sweep", "train"])
def test_both_apps_check_the_run_dir_after_the_secrets(
    app: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    schema.register(), train_config.register()  # the schemas the apps' defaults name
    with initialize_config_module(config_module=CONFIG_MODULE):
        bad = compose(config_name=app, overrides=[f"hydra.run.dir={blocker}/run"], return_hydra_config=True)
        good = compose(config_name=app, overrides=[f"hydra.run.dir={tmp_path}/new/run"], return_hydra_config=True)
    callbacks = bad.hydra.callbacks
    assert list(callbacks) == ["refuse_secrets", "check_run_dir"]  # a secret is refused before anything is made
    assert [c._target_ for c in callbacks.values()] == HYDRA_CALLBACKS
    with pytest.raises(SystemExit) as refused:
        CheckRunDir().on_run_start(bad)
    assert refused.value.code == 2
    assert capsys.readouterr().err == (
        f"error: hydra.run.dir='{blocker}/run': cannot create it (Not a directory); choose a directory this user "
        "can write\n"
    )
    # A directory that is there but cannot be written (procfs refuses even root).
    with initialize_config_module(config_module=CONFIG_MODULE):
        there = compose(config_name=app, overrides=["hydra.run.dir=/proc/1"], return_hydra_config=True)
    with pytest.raises(SystemExit):
        CheckRunDir().on_run_start(there)
    assert capsys.readouterr().err == (
        "error: hydra.run.dir='/proc/1': it is not writable; choose a directory this user can write\n"
    )
    CheckRunDir().on_run_start(good)
    assert (tmp_path / "new" / "run").is_dir()
    # A `~` is a name to Hydra, which makes ./~/run: so does the check, and nothing under the home directory.
    with initialize_config_module(config_module=CONFIG_MODULE):
        tilde = compose(config_name=app, overrides=["hydra.run.dir='~/run'"], return_hydra_config=True)
    monkeypatch.chdir(tmp_path)
    CheckRunDir().on_run_start(tilde)
    assert (tmp_path / "~" / "run").is_dir()


@pytest.mark.slow
def test_an_unwritable_run_dir_ends_the_app_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "sweeps.run", "dry_run=true", f"hydra.run.dir={blocker}/run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: hydra.run.dir='{blocker}/run': cannot create it (Not a directory); choose a directory this user "
        "can write"
    ], proc.stderr
