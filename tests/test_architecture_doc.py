"""docs/architecture.md names every module of the five packages, and no module that does not exist; and what it
says that no linter checks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contracts", "trm", "sweeps", "storage", "dashboards")
DOC = ROOT / "docs" / "architecture.md"


def test_the_architecture_doc_lists_every_module_and_only_real_ones() -> None:
    modules = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }
    pattern = r"`((?:" + "|".join(PACKAGES) + r")/[\w/]+\.py)`"
    named = set(re.findall(pattern, DOC.read_text()))
    assert sorted(modules - named) == [], "add these modules to docs/architecture.md"
    assert sorted(named - modules) == [], "docs/architecture.md names modules that do not exist"


def test_what_the_doc_says_of_the_preflight_probe_and_bench_holds() -> None:
    """Two claims no linter checks: the probe parses as Python 3.8 (it must run on an interpreter too old for the
    project, to report it), and bench/ imports nothing from tests/ (import-linter covers the five packages only)."""
    import ast

    source = (ROOT / "sweeps" / "launchers" / "preflight_probe.py").read_text()
    ast.parse(source, feature_version=(3, 8))  # a SyntaxError on grammar newer than 3.8 (match, except*, ...)
    for path in (ROOT / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "tests" or n.startswith("tests.") for n in names), f"{path} imports tests"


def test_a_dictconfig_stops_where_the_doc_says() -> None:
    """trm/: only the entry point's `main`; sweeps/: config/ and run.py (docs/architecture.md, "The training
    config")."""
    allowed = {"trm/train.py", "sweeps/run.py"}
    found = {
        str(path.relative_to(ROOT))
        for package in ("trm", "sweeps")
        for path in (ROOT / package).rglob("*.py")
        if re.search(r"\bDictConfig\b", path.read_text())
    }
    stray = sorted(p for p in found - allowed if not p.startswith("sweeps/config/"))
    assert stray == [], f"a DictConfig below main in {stray}: take the typed config (or train_values' plain values)"
