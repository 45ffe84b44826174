"""Every first-party module imports on its own, and the first-party import graph has no cycle.

The graph is read from the source (ast), so it sees every import statement whether or not it runs here:
- module-level imports (including those under `if`/`try` at module level) must form no cycle;
- imports made at call time (inside a function) are listed in DEFERRED with why, so a new one is a decision
  and not a quiet way around a cycle; a cycle through one is allowed only where DEFERRED says it breaks one;
- names a package imports lazily through importlib are listed in DYNAMIC and count as deferred edges.
Importing a module runs its package's `__init__` first: an import of `a.b.c` is an edge to `a` and `a.b` too,
except to the importer's own packages (already being imported when it runs).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trm", "sweeps", "storage", "dashboards")

# Modules that need an optional dependency: imported by the test only where that dependency is installed.
OPTIONAL = {"trm.runtime.xla": "torch_xla"}

# (importer, imported) made at call time -> (why, breaks a cycle?)
DEFERRED: dict[tuple[str, str], tuple[str, bool]] = {
    ("trm.runtime", "trm.runtime.xla"): ("torch_xla is optional: imported only when the backend is xla", False),
    ("trm.tracking", "storage"): ("only a tracked sweep trial reads the study storage (SQLAlchemy, Optuna)", False),
    ("trm.train", "trm.reeval"): ("reeval.run=true evaluates instead of training, with the trainer's set-up", True),
    ("sweeps.best", "sweeps.config"): (
        "only reeval=true composes the sweep config: the read-only uses stay light",
        False,
    ),
    ("sweeps.best", "sweeps.driver"): ("only reeval=true builds a launcher: the read-only uses stay light", False),
}
# Lazy names of a package (`__getattr__` + importlib): (package, module) -> why.
DYNAMIC: dict[tuple[str, str], str] = {
    ("trm.data", "trm.data.loader"): "torch-facing loaders: data building never imports torch",
    ("trm.data", "trm.data.build"): "`python -m trm.data.build` must not find itself pre-imported by the package",
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(importer: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The first-party modules an import statement runs (the most specific module each name resolves to)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = importer.split(".") if MODULES[importer].name == "__init__.py" else importer.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    out = set()
    for name in names:
        while name and name not in MODULES:  # `import a.b.c` of a non-module attribute: its module
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
            out.update(a for a in _ancestors(name) if a not in _ancestors(importer) and a != importer)
    return out


def import_edges() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(module-level edges, call-time edges) of the first-party graph."""
    top: set[tuple[str, str]] = set()
    deferred: set[tuple[str, str]] = set()

    def visit(module: str, node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, child):
                    if target != module:
                        (deferred if nested else top).add((module, target))
            visit(module, child, nested)

    for module, path in MODULES.items():
        visit(module, ast.parse(path.read_text(), str(path)), False)
    return top, deferred


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """One cycle (as a closed path) per strongly connected component with more than one module (Tarjan)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_closed_path(graph, set(c)) for c in components]


def _closed_path(graph: dict[str, list[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, as a closed path [a, b, ..., a]."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in graph.get(v, []):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w in component and w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle in {sorted(component)}")


def test_the_module_level_import_graph_has_no_cycle() -> None:
    top, _ = import_edges()
    assert cycles(top) == []


def test_every_call_time_import_is_listed_with_a_reason() -> None:
    top, deferred = import_edges()
    deferred -= top  # imported at module level too: nothing is deferred
    assert sorted(deferred - set(DEFERRED)) == [], "add to DEFERRED, with why, or import at module level"
    assert sorted(set(DEFERRED) - deferred) == [], "stale DEFERRED entries"


def test_a_cycle_only_through_an_import_listed_as_breaking_it() -> None:
    top, deferred = import_edges()
    everything = top | deferred | set(DYNAMIC)
    breakers = {edge for edge, (_, breaks) in DEFERRED.items() if breaks}
    for cycle in cycles(everything):
        steps = set(zip(cycle, cycle[1:]))
        assert steps & breakers, f"import cycle {' -> '.join(cycle)} (deferred imports: {sorted(steps & deferred)})"
    for edge in breakers:  # each listed breaker still breaks a cycle: drop the flag once it no longer does
        assert any(edge in set(zip(c, c[1:])) for c in cycles(everything)), f"{edge} breaks no cycle any more"


def test_dynamic_imports_name_real_modules() -> None:
    import trm.data

    lazy = {("trm.data", f"trm.data.{module}") for module in trm.data._LAZY.values()}
    assert lazy == set(DYNAMIC)
    assert all(target in MODULES for _, target in DYNAMIC)


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
