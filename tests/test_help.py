"""`--help` on every entry point prints its usage and exits 0, with no traceback; each Hydra app's help lists the
config groups that app reads, not every group on the search path.

The entry points: each `python -m` module README.md, docs/usage.md and the Makefile run, and each console script of
pyproject.toml, so a command added to either is covered without editing this file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from contracts import train_config
from contracts.hydra_app import compose_config, train_group_lines
from sweeps.config.help import SWEEP_GROUPS

ROOT = Path(__file__).resolve().parents[1]
WHERE_USERS_LOOK = ("README.md", "docs/usage.md", "Makefile")
_MODULE = re.compile(r"(?:python3?|\$\(PY\)) -m ([a-z_]+(?:\.[a-z_]+)+)")  # dotted: pip and pytest are not ours
# Issue 46 names these; the documents must keep running them (a floor under the list found in them).
NAMED = {"trm.train", "trm.info", "sweeps.run", "sweeps.preflight", "sweeps.best", "sweeps.status",
         "sweeps.utilization", "dashboards.serve", "dashboards.report", "storage.up", "storage.check"}  # fmt: skip
# The sweep's groups the trainer cannot use (Hydra's own help listed them in `python -m trm.train --help`).
SWEEP_ONLY = {"launcher", "pruner", "sampler", "site", "study", "storage"}
TRAINER_APPS = {"trm.train", "trm-train", "trm.info"}
SWEEP_APPS = {"sweeps.run", "trm-sweep", "sweeps.preflight"}
# The groups block: the lines after a heading that ends in "(group=option)" (Hydra's, ours), up to a blank line.
_GROUP_BLOCK = re.compile(r"\(group=option\):?\n\n?((?:  [\w/@.]+: .*\n?)+)")


def modules() -> list[str]:
    text = "\n".join((ROOT / name).read_text(encoding="utf-8") for name in WHERE_USERS_LOOK)
    return sorted(set(_MODULE.findall(text)))


def scripts() -> list[str]:
    return sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def listed_groups(text: str) -> set[str]:
    """The groups a help text lists in its groups block (the config it may print after it is not read)."""
    block = _GROUP_BLOCK.search(text)
    return {line.split(":", 1)[0].strip() for line in block.group(1).splitlines()} if block else set()


def test_the_documents_run_every_named_entry_point() -> None:
    assert set(modules()) >= NAMED, sorted(NAMED - set(modules()))
    assert {"trm-train", "trm-sweep", "trm-best", "trm-status", "trm-report"} <= set(scripts())


def test_the_trainers_help_lists_the_groups_of_its_own_config_only() -> None:
    train_config.register()
    template = compose_config("train", [], return_hydra_config=True).hydra.help.template  # resolved: the groups
    groups = listed_groups(template)
    assert {"arch", "optim", "data", "curriculum", "halting", "experiment"} <= groups
    assert not groups & SWEEP_ONLY, sorted(groups & SWEEP_ONLY)
    assert groups == listed_groups("\n".join(["(group=option)", *train_group_lines()]))  # trm.info lists the same


def _help(entry: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    bindir = Path(sys.executable).parent
    argv = [sys.executable, "-m", entry] if "." in entry else [str(bindir / entry)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return entry, subprocess.run([*argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_entry_point_answers_help_with_its_usage() -> None:
    entries = [*modules(), *scripts()]
    with ThreadPoolExecutor(max_workers=4) as pool:  # ~25 interpreters, most of the time in imports
        results = dict(pool.map(_help, entries))
    failures = []
    for entry, done in results.items():
        said = done.stdout + done.stderr
        if done.returncode != 0 or "Traceback" in said or not done.stdout.strip():
            failures.append(f"{entry} --help: exit {done.returncode}: {said[-600:]}")
            continue
        # Usage: argparse's, the key=value CLIs' and sweeps.run's own `python -m ...` line, Hydra's groups.
        if not ("usage:" in done.stdout or "python -m " in done.stdout or "(group=option)" in done.stdout):
            failures.append(f"{entry} --help prints no usage: {done.stdout[:300]}")
        groups = listed_groups(done.stdout)
        if entry in TRAINER_APPS and (groups & SWEEP_ONLY or not {"arch", "optim"} <= groups):
            failures.append(
                f"{entry} --help lists {sorted(groups)}: the trainer's groups, none of {sorted(SWEEP_ONLY)}"
            )
        if entry in SWEEP_APPS and groups != set(SWEEP_GROUPS):
            failures.append(f"{entry} --help lists {sorted(groups)}, not the sweep's {sorted(SWEEP_GROUPS)}")
    assert not failures, "\n".join(failures)
