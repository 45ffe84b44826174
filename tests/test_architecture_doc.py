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

    source = (ROOT / "sweeps" / "launchers" / "tpu" / "probe.py").read_text()
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


# Where a study's or a trial's attributes are read or written by key: `x.user_attrs[...]` / `.get(...)` (and
# `system_attrs`, and a mapping named `...attrs`), `set_user_attr(key, ...)`, `set_system_attr(key, ...)`, the
# storage's `set_trial_user_attr(id, key, ...)` / `set_study_user_attr(id, key, ...)`, and `user_attrs={key: ...}`.
ATTR_MAPPINGS = ("user_attrs", "system_attrs")
SETTERS = {"set_user_attr": 0, "set_system_attr": 0, "set_trial_user_attr": 1, "set_study_user_attr": 1}
OUTSIDE_STORAGE = ("contracts", "trm", "sweeps", "dashboards", "bench")


def record_keys() -> set[str]:
    """The study record's keys: the typed records' fields and every name storage/record.py gives an attribute."""
    from dataclasses import fields

    from storage import record
    from storage.study_record import StudyAttrs
    from storage.trial_record import TrialLaunch, TrialOutcome

    keys = {f.name for cls in (StudyAttrs, TrialLaunch, TrialOutcome) for f in fields(cls)}
    named = (v for k, v in vars(record).items() if k.endswith(("_ATTR", "_DETAIL")) and isinstance(v, str))
    return keys | set(named)


def _is_attr_mapping(node: object) -> bool:
    import ast

    if isinstance(node, ast.Attribute):
        return node.attr in ATTR_MAPPINGS
    return isinstance(node, ast.Name) and node.id.endswith("attrs")


def literal_keys(source: str, keys: set[str]) -> list[tuple[int, str]]:
    """(line, key) of each record key written or read as a string literal in `source` (see ATTR_MAPPINGS)."""
    import ast

    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        literals: list[ast.expr] = []
        if isinstance(node, ast.Subscript) and _is_attr_mapping(node.value):
            literals.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and _is_attr_mapping(node.func.value) and node.args:
                literals.append(node.args[0])
            elif node.func.attr in SETTERS and len(node.args) > SETTERS[node.func.attr]:
                literals.append(node.args[SETTERS[node.func.attr]])
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in ATTR_MAPPINGS and isinstance(kw.value, ast.Dict):
                    literals.extend(k for k in kw.value.keys if k is not None)
        found += [
            (n.lineno, n.value)
            for n in literals
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in keys
        ]
    return found


def test_no_record_key_is_a_string_literal_outside_storage() -> None:
    """docs/architecture.md, "The study record": outside storage/ (and tests/, which write older records), a study or
    trial attribute is read and written through its record (StudyAttrs, TrialLaunch, TrialOutcome) or a name
    storage/record.py gives it, never as a string literal."""
    keys = record_keys()
    assert {"objective", "sampler", "uid", "slot", "outcome", "fail_reason"} <= keys
    bad = 'a = study.user_attrs.get("sampler")\nt.set_user_attr("fail_reason", "x")\nattrs["objective"]\n'
    assert [k for _, k in literal_keys(bad, keys)] == ["sampler", "fail_reason", "objective"]  # the check sees them
    found = [
        f"{path.relative_to(ROOT)}:{line}: {key!r}"
        for package in OUTSIDE_STORAGE
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, key in literal_keys(path.read_text(), keys)
    ]
    assert found == [], "read or write these through storage/'s records or names"
    assert "no study or trial attribute key is written or read as a string literal" in DOC.read_text()


def test_the_bottom_layer_names_no_class_above_it_and_the_pruner_targets_resolve() -> None:
    """docs/architecture.md, rule 3: import-linter cannot see a class named in a string, so storage/ holds no
    first-party dotted name above it (a docstring may mention one); the pruners a job may build are contracts/'s,
    beside the wrapper, and each names a pruner that exists."""
    import ast

    from hydra.utils import get_class
    from optuna.pruners import BasePruner

    from contracts.pruners import MOVED_PRUNER_TARGETS, PRUNER_TARGETS

    above = re.compile(r"^(contracts|trm|sweeps|dashboards|bench)\.\w+(\.\w+)*$")
    found = []
    for path in sorted((ROOT / "storage").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        found += [
            f"{path.relative_to(ROOT)}:{n.lineno}: {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
            if above.match(n.value)
        ]
    assert found == [], "storage/ names a class of a layer above it"
    named = [t for t in PRUNER_TARGETS if not t.endswith("*")] + list(MOVED_PRUNER_TARGETS.values())
    assert named and all(issubclass(get_class(t), BasePruner) for t in named)
    assert "`contracts/pruners.py`'s `PRUNER_TARGETS`" in DOC.read_text()


def test_every_noqa_names_its_reason() -> None:
    """A `# noqa` silences a linter rule: the line says why (`# noqa: BLE001 - tracking never fails a run`)."""
    bare = re.compile(r"#\s*noqa(?::\s*[A-Z]+\d+(?:\s*,\s*[A-Z]+\d+)*)?\s*$")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in (*PACKAGES, "bench", "tests")
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert found == [], "say why after the rule: # noqa: RULE - why"
