"""`python -m sweeps.run --help` shows the sweep's config groups, not the training groups it refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.config.help import SWEEP_GROUPS, group_options, help_text

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_each_sweep_group_with_its_options_and_no_training_group() -> None:
    text = help_text()
    for group in SWEEP_GROUPS:
        options = sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml") if not p.name.startswith("_"))
        assert group_options(group) == options
        assert f"  {group}: {', '.join(options)}" in text.splitlines()
    for training_group in ("arch", "optim", "data", "curriculum", "halting", "experiment"):
        assert not any(line.startswith(f"  {training_group}:") for line in text.splitlines())


@pytest.mark.slow
def test_the_help_flag_prints_it_and_exits_0() -> None:
    out = subprocess.run([sys.executable, "-m", "sweeps.run", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == help_text()
