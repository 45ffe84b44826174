"""docs/architecture.md names every module of the five packages, and no module that does not exist; and what it
says that no linter checks."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

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


def test_trm_keeps_its_top_level_small_and_its_rooms_named() -> None:
    """docs/architecture.md, the trm/ tables: train.py's reading order over at most 25 modules at trm/'s top, the
    rest in rooms by job; every room the doc names exists and holds modules."""
    top = sorted(p.name for p in (ROOT / "trm").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 25, f"trm/ has {len(top)} modules at its top: put some in a room by job ({top})"
    rooms = set(re.findall(r"`trm/(\w+)/`", DOC.read_text()))
    assert {"links", "measures", "tracking", "checkpoints", "kernels", "runtime", "data"} <= rooms
    assert all(any((ROOT / "trm" / room).glob("*.py")) for room in rooms), rooms


def test_bench_keeps_its_top_level_small_and_its_rooms_named() -> None:
    """docs/architecture.md, bench/'s rooms: at most 25 modules at bench/'s top (the shared helpers and the one-off
    benches), the rest in rooms by job; every room the doc names exists and holds modules, and every room is named."""
    top = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 25, f"bench/ has {len(top)} modules at its top: put some in a room by job ({top})"
    named = set(re.findall(r"`bench/(\w+)/`", DOC.read_text()))
    rooms = {p.parent.name for p in (ROOT / "bench").glob("*/__init__.py")}
    assert {"trm_bench", "gpu", "pruning", "trainer"} <= named, named
    assert named == rooms, f"rooms of bench/ the doc does not name, or names wrongly: {sorted(named ^ rooms)}"


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


# Where a DictConfig may appear, in every package and bench/: where Hydra hands the config over, where it is composed
# and where it is typed (and every module of sweeps/config/, which composes and types the sweep).
DICTCONFIG_HOMES = {
    "trm/train.py": "the entry point's `main`: Hydra hands it the config, TrainJob.of types it",
    "sweeps/run.py": "the entry point's `main`: typed_sweep types it",
    "contracts/hydra_app.py": "the training config composed and typed (TrainJob, typed_train_config, train_values)",
    "contracts/train_config.py": "the schema's checks of a composed training config (check_train_config)",
    "contracts/schema_checks.py": "one block built from its schema, from a composed node",
    "contracts/hydra_run_dir.py": "a Hydra callback: Hydra hands it the config",
    "storage/hydra_secrets.py": "a Hydra callback: Hydra hands it the config",
    "bench/_common.py": "the benches' StepRunner steps a preset's composed config, as `trm.train` would compose it",
}
SEARCHED = (*PACKAGES, "bench")


def test_a_dictconfig_stops_where_the_doc_says() -> None:
    """docs/architecture.md, "The training config": a DictConfig appears only where Hydra hands the config over, where
    it is composed and where it is typed (DICTCONFIG_HOMES), in every package and in bench/."""
    found = {
        str(path.relative_to(ROOT))
        for package in SEARCHED
        for path in (ROOT / package).rglob("*.py")
        if re.search(r"\bDictConfig\b", path.read_text())
    }
    stray = sorted(p for p in found - set(DICTCONFIG_HOMES) if not p.startswith("sweeps/config/"))
    assert stray == [], f"a DictConfig below main in {stray}: take the typed config (or train_values' plain values)"
    assert sorted(set(DICTCONFIG_HOMES) - found) == [], "a home that holds no DictConfig any more: take it out"


# Composing a config: Hydra's own calls and this project's (contracts/hydra_app.py, sweeps/config/compose.py).
COMPOSERS = {"compose", "initialize", "initialize_config_module", "initialize_config_dir"}
COMPOSERS |= {"compose_config", "compose_train_config", "compose_sweep_config"}
COMPOSE_HOMES = ("contracts/hydra_app.py", "sweeps/config/compose.py")
# A composed config is typed (or one value read off it) where it is composed: these take it.
TYPERS = {"typed_sweep", "typed_train_config", "of"}
# Composes outside an entry point, and why: (module, function) -> the reason.
COMPOSE_CHECKS = {
    ("sweeps/validation/validate_trials.py", "_composes"): "a trial's training config composed to refuse it, unused",
    ("bench/_common.py", "train_config"): "the benches' StepRunner takes the composed config, the trainer's own",
}


def compose_calls(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function, problem) of each compose call in `source` that hands its config on untyped: its
    result is neither discarded, read for a value (`compose_...().key`), nor kept in a name that is only read for
    values or given to a typer (TYPERS) in the same function. Each call counts with problem "" when it is fine."""
    import ast

    found: list[tuple[int, str, str]] = []
    tree = ast.parse(source)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def name_of(func: ast.expr) -> str:
        return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""

    for function in functions or [tree]:
        for call in ast.walk(function):
            if not (isinstance(call, ast.Call) and name_of(call.func) in COMPOSERS):
                continue
            where = getattr(function, "name", "<module>")
            parent = parents.get(id(call))
            if isinstance(parent, ast.Expr | ast.Attribute | ast.withitem):  # discarded, a value read, a `with`
                found.append((call.lineno, where, ""))
                continue
            if not (
                isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)
            ):
                found.append((call.lineno, where, "handed on as it is"))
                continue
            name = parent.targets[0].id
            uses = [
                n
                for n in ast.walk(function)
                if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            ]
            untyped = [
                n
                for n in uses
                if not isinstance(parents.get(id(n)), ast.Attribute)
                and not (
                    isinstance(parents.get(id(n)), ast.Call) and name_of(parents[id(n)].func) in TYPERS  # type: ignore[attr-defined]
                )
            ]
            found.append((call.lineno, where, f"`{name}` handed on untyped" if untyped else ""))
    return sorted(found)


def test_a_config_is_composed_only_at_the_entry_points() -> None:
    """docs/architecture.md, "The training config": a config is composed only in its compose homes, in an entry
    module (one run as `python -m`: a `__main__` guard) or where COMPOSE_CHECKS says why; and there it is typed, or a
    value read off it, before anything is handed on (sweeps/preflight.py once handed the composed training config to
    the pod's preflight)."""
    bad = (
        "def main():\n    cfg = compose_sweep_config(a)\n    sweep = typed_sweep(cfg)\n"
        "    peak = compose_sweep_config([]).estimate.peak\n    train = compose_train_config(o)\n    run(sweep, train)\n"
    )
    assert [p for _, _, p in compose_calls(bad)] == ["", "", "`train` handed on untyped"]  # the check sees it
    found = []
    for package in SEARCHED:
        for path in sorted((ROOT / package).rglob("*.py")):
            name, source = str(path.relative_to(ROOT)), path.read_text()
            if name in COMPOSE_HOMES:
                continue
            entry = re.search(r"^if __name__ == .__main__.:", source, re.MULTILINE) is not None
            for line, where, problem in compose_calls(source):
                if (name, where) in COMPOSE_CHECKS:
                    continue
                if not entry:
                    found.append(f"{name}:{line} ({where}): composes outside an entry point")
                elif problem:
                    found.append(f"{name}:{line} ({where}): {problem}")
    assert found == [], "compose at the entry point and hand down the typed config (or train_values' plain values)"


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
    # Every shipped pruner file (and a wrapped one) names a pruner the allowlist admits, with no line of its own
    # there: a new rule is its module in contracts/pruning/ and its conf/pruner/ file.
    specs = [yaml.safe_load(p.read_text()) or {} for p in sorted((ROOT / "conf" / "pruner").glob("*.yaml"))]
    named = [s["_target_"] for s in specs if "_target_" in s] + [
        s["wrapped"]["_target_"] for s in specs if "wrapped" in s
    ]
    named += list(MOVED_PRUNER_TARGETS.values())
    admitted = [t for t in PRUNER_TARGETS if t.endswith(".*")]
    assert len(named) >= 8 and all(any(t.startswith(p[:-1]) for p in admitted) for t in named), named
    assert all(issubclass(get_class(t), BasePruner) for t in named)
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


def launcher_classes() -> set[str]:
    """The names of sweeps' launcher classes: every class of sweeps/launchers/ (where `_target_` may name one,
    sweeps.config.optuna_parts.TARGETS) that has each Launcher member, the protocol itself included, and their
    bases (ThisMachine)."""
    import importlib
    import inspect
    from typing import Generic, Protocol

    from sweeps.launchers.base import LAUNCHER_MEMBERS

    found: set[type] = set()
    for path in sorted((ROOT / "sweeps" / "launchers").rglob("*.py")):
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and all(hasattr(cls, name) for name in LAUNCHER_MEMBERS):
                found |= {c for c in cls.__mro__ if c not in (object, Protocol, Generic)}
    return {cls.__name__ for cls in found}


def class_checks(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, class) of each `isinstance(x, C)` / `issubclass(x, C)` in `source` whose C (or one of a tuple's) is
    one of `names`, written as a name or an attribute (`module.C`)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
            if node.func.id not in ("isinstance", "issubclass"):
                continue
            second = node.args[1]
            for target in second.elts if isinstance(second, ast.Tuple) else [second]:
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", None)
                if name in names:
                    found.append((node.lineno, name))
    return found


def test_no_launcher_is_recognised_by_its_class() -> None:
    """docs/architecture.md, "The launcher interface": what is one launcher's own (the pod's preflight, the dry run's
    machine line) is a member of the Launcher protocol that every launcher answers, so nothing in sweeps/ asks a
    launcher's class."""
    names = launcher_classes()
    assert {"Launcher", "LocalLauncher", "TorchrunLauncher", "TpuPodLauncher", "ThisMachine"} <= names, names
    bad = "if isinstance(launcher, TpuPodLauncher): pass\nok = isinstance(x, (int, tpu.LocalLauncher))\n"
    assert class_checks(bad, names) == [(1, "TpuPodLauncher"), (2, "LocalLauncher")]  # the check sees them
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted((ROOT / "sweeps").rglob("*.py"))
        for line, name in class_checks(path.read_text(), names)
    ]
    assert found == [], "ask the launcher through a Launcher member (sweeps/launchers/base.py), not its class"
    assert "no launcher is recognised by its class" in DOC.read_text()
