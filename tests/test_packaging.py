"""The built wheel, installed in a fresh venv and run from an empty directory, as a user or a TPU worker
(`launcher.deploy=true`) runs it: configs shipped as package data, console scripts, dependency ranges that
admit the lock.

Issue: `pip install` of the wheel succeeded, then every app failed with `MissingConfigException ...
site-packages/conf` (the wheel had no YAML)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE_ROOTS = ("contracts", "trm", "sweeps", "storage", "dashboards")
SCRIPTS = ("trm-train", "trm-sweep", "trm-status", "trm-best", "trm-utilization", "trm-report", "trm-dashboard")


def test_every_package_on_disk_is_listed_in_pyproject() -> None:
    """pyproject.toml lists its packages (the conf/ -> trm_sweeps_conf mapping rules out `find`): a new
    subpackage left off the list would be missing from the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for root in CODE_ROOTS
        for init in (ROOT / root).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert set(setuptools["packages"]) == on_disk | {"trm_sweeps_conf"}
    assert setuptools["package-dir"] == {"trm_sweeps_conf": "conf"}
    assert (ROOT / "conf" / "__init__.py").is_file()


def test_project_ranges_admit_the_lock() -> None:
    """Ranges in [project], exact pins in requirements.lock: every pin must satisfy its range."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    for spec in project["dependencies"]:
        req = Requirement(spec)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{req.name} has a range in pyproject.toml but no pin in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req.specifier}"
    assert project["requires-python"] == ">=3.11"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with torch (first, pinned) and the built wheel with its dependencies from the lock."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("trm_sweeps-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # --no-compile: the apps compile what they import as they run; byte-compiling every installed file took half
    # of the install's time.
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, capture_output=True)
    proc = subprocess.run([*pip, "-c", str(ROOT / "requirements.lock"), str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


def run_in(venv: Path, cwd: Path, *argv: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """Run a command of the venv from `cwd`, with nothing of the checkout on the path."""
    # PYTHONDONTWRITEBYTECODE dropped too: the first command compiles what it imports (installed --no-compile),
    # the later ones read it back, as on a user's machine.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env.update(HOME=str(cwd), WANDB_MODE="disabled", PATH=f"{venv / 'bin'}:{env.get('PATH', '')}")
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_runs_from_a_fresh_venv(venv: Path, tmp_path: Path, data_root: Path) -> None:
    work = tmp_path / "work"
    where = run_in(
        venv,
        work,
        "python",
        "-c",
        "import json, trm, trm_sweeps_conf; print(json.dumps([trm.__file__, trm_sweeps_conf.__file__]))",
    )
    assert where.returncode == 0, where.stderr
    assert all(str(venv) in path for path in json.loads(where.stdout)), where.stdout  # the wheel, not the checkout
    check = run_in(venv, work, "python", "-m", "pip", "check")
    assert check.returncode == 0, check.stdout + check.stderr

    # --help on every console script: the Hydra apps list their config groups from the packaged YAML.
    helps = {}
    for script in SCRIPTS:
        proc = run_in(venv, work, script, "--help")
        assert proc.returncode == 0, f"{script} --help: {proc.stderr[-2000:]}"
        assert proc.stdout.strip(), script
        helps[script] = proc.stdout
    assert "optimizer" in helps["trm-sweep"]  # study group options
    assert "trm_mlp_t_sudoku" in helps["trm-train"]  # arch group options

    # A dry run of a shipped study, by console script and by `python -m`.
    for argv in (("trm-sweep",), ("python", "-m", "sweeps.run")):
        proc = run_in(venv, work, *argv, "study=model_scaling", "dry_run=true", "estimate.enabled=false")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "trial 0:" in proc.stdout and "-m trm.train" in proc.stdout

    # A user's own study next to the shipped ones (--config-dir), also a dry run.
    mine = work / "my_conf" / "study"
    mine.mkdir(parents=True)
    (mine / "lr_only.yaml").write_text(
        "defaults: [_base, _self_]\nname: lr_only\nspace:\n  tiny:\n    optim.lr: tag(log, interval(1e-4, 1e-2))\n"
    )
    proc = run_in(
        venv,
        work,
        "trm-sweep",
        "--config-dir",
        str(work / "my_conf"),
        "study=lr_only",
        "dry_run=true",
        "estimate.enabled=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "optim.lr=" in proc.stdout and "# study lr_only" in proc.stdout

    # A real (tiny) training run of the installed trainer.
    run = work / "run"
    proc = run_in(
        venv,
        work,
        "trm-train",
        "experiment=test_tiny",  # conf/experiment/test_tiny.yaml, shipped in the wheel's trm_sweeps_conf
        "train.steps=4",
        "train.eval_interval=4",
        "train.log_interval=2",
        "wandb.enabled=false",
        f"data.root={data_root}",
        f"out_dir={run}",
        f"checkpoint.url={work / 'ckpt'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["best_value"] is not None
