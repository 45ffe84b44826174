"""Every command the README shows runs as written: each of this project's commands in a ```bash
block is dry-run (tests/readme_commands.py: it parses its arguments as the real command does, then stops), and
every Hydra override the prose shows in `inline code` parses. The README's own `trial.overrides=[...]` form was
one Hydra rejects; this fails on any such form, whatever the README says next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from tests.readme_commands import (
    DRY_RUN_MARK,
    HYDRA_APPS,
    SHELL_SETUP,
    bash_blocks,
    commands,
    inline_overrides,
    module_of,
)

ROOT = Path(__file__).resolve().parents[1]
# The README and the guide it links for the rest (docs/usage.md): what a user copies from either must run.
README = "\n".join((ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/usage.md"))


def _dry_runs(requests: list[tuple[str, list[str], Path]]) -> list[tuple[int, str]]:
    """Dry-run the commands (module, args, cwd) in one interpreter (tests/readme_commands.py): (exit code, output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    lines = "".join(json.dumps([m, a, str(c)]) + "\n" for m, a, c in requests)
    proc = subprocess.run([sys.executable, "-m", "tests.readme_commands"], input=lines, env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [tuple(json.loads(line)) for line in proc.stdout.splitlines()]
    assert len(results) == len(requests), f"{len(results)} results for {len(requests)} commands: {proc.stderr[-2000:]}"
    return results  # type: ignore[return-value]


@pytest.mark.slow
def test_every_command_in_the_readme_parses_as_written(tmp_path: Path) -> None:
    """Each block runs in a directory of its own (a block's `mkdir`/`cat > file` prepares what its later commands
    read); `make` targets are checked with `make -n`; other programs (pip, export, wandb) are not ours."""
    requests: list[tuple[str, list[str], Path]] = []
    texts, failures = [], []
    for i, block in enumerate(bash_blocks(README)):
        cwd = tmp_path / f"block-{i}"
        cwd.mkdir()
        for command in commands(block):
            found = module_of(command.argv)
            if found is not None:
                requests.append((*found, cwd))
                texts.append(command.text)
            elif command.argv[0] == "make":
                make = subprocess.run(["make", "-n", *command.argv[1:]], cwd=ROOT, capture_output=True, text=True)
                if make.returncode != 0:
                    failures.append(f"{command.text}\n  -> {make.stderr.strip()[-600:]}")
            elif command.argv[0] in SHELL_SETUP:
                subprocess.run(["bash", "-e", "-c", command.text], cwd=cwd, check=True, timeout=30)
    assert len(requests) >= 5, "the README's bash blocks hold this project's commands: the extraction found too few"
    for text, (module, _, _), (code, output) in zip(texts, requests, _dry_runs(requests)):
        if code != 0 or (DRY_RUN_MARK not in output and module not in HYDRA_APPS):
            failures.append(f"{text}\n  -> exit {code}: {output.strip()[-600:]}")
    assert not failures, "README commands that do not run as written:\n" + "\n".join(failures)


def test_every_override_the_readme_shows_inline_parses() -> None:
    overrides = inline_overrides(README)
    assert any(o.startswith("trial.overrides=") for o in overrides), "the inline overrides were not found"
    parser = OverridesParser.create()
    refused = []
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except Exception as err:  # Hydra's grammar errors (OverrideParseException) and anything else it raises
            refused.append(f"{override}: {err}")
    assert not refused, "\n".join(refused)


BROKEN_AND_NOT = [
    ("python -m sweeps.run 'trial.overrides=[experiment=tiny_cpu,train.steps=60]' dry_run=true\n", True),
    ('python -m sweeps.run \'trial.overrides=["experiment=tiny_cpu","train.steps=60"]\' dry_run=true\n', False),
    ("python -m sweeps.status [study=NAME] formt=csv > x.csv   # a typo\n", True),
    ("python -m trm.data.build --source csv --train-csv a.csv --test-csv b.csv --out d --subsample x\n", True),
]


@pytest.mark.slow
def test_a_broken_form_fails_the_dry_run(tmp_path: Path) -> None:
    """The check itself: the README's old override form, a mistyped key, a value of the wrong type all fail;
    the quoted form passes."""
    requests = []
    for block, _ in BROKEN_AND_NOT:
        (command,) = commands(block)
        found = module_of(command.argv)
        assert found is not None
        requests.append((*found, tmp_path))
    results = _dry_runs(requests)
    assert [code != 0 for code, _ in results] == [bad for _, bad in BROKEN_AND_NOT], results
