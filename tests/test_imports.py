"""Every first-party module imports on its own, in a fresh interpreter and in any order.

Which package may import which (and that none has an import cycle) is not tested here: `make lint` checks the
import-linter contracts in pyproject.toml ([tool.importlinter]) over every import statement.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contracts", "trm", "sweeps", "storage", "dashboards")

# Modules that need an optional dependency: imported by the test only where that dependency is installed.
OPTIONAL = {"trm.runtime.xla": "torch_xla"}


def modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append(".".join(parts))
    return found


MODULES = modules()


def test_lazy_names_of_trm_data_name_real_modules() -> None:
    """trm.data imports its torch-facing loaders and its builder lazily (by name): each name must exist."""
    import trm.data

    for name, module in trm.data._LAZY.items():
        assert f"trm.data.{module}" in MODULES
        assert hasattr(importlib.import_module(f"trm.data.{module}"), name), (name, module)


FRESH_IMPORTS = """
import importlib, json, sys, traceback
first_party, wanted = json.loads(sys.argv[1]), json.loads(sys.argv[2])
failures = {}
for name in wanted:
    for loaded in [m for m in sys.modules if m.split(".")[0] in first_party]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


@pytest.mark.slow
def test_every_module_imports_on_its_own_in_a_fresh_interpreter() -> None:
    """One new interpreter; before each module, every first-party module is dropped from sys.modules, so each
    imports from scratch in its own order (third-party ones such as torch stay loaded, which only saves time)."""
    wanted = [m for m in MODULES if m not in OPTIONAL or importlib.util.find_spec(OPTIONAL[m]) is not None]
    out = subprocess.run(
        [sys.executable, "-c", FRESH_IMPORTS, json.dumps(PACKAGES), json.dumps(wanted)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{name}:\n{tb}" for name, tb in failures.items())
