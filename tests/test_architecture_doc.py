"""docs/architecture.md names every module of the five packages, and no module that does not exist."""

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
