"""The layering is a contract (spec/architecture.md): the lower packages never reach up.

`store/`, `dispatch/`, `format/` and `plan/` import nothing of `engine/`, the api, the fronts or `setup/` —
lazy imports inside functions included (they are the ones that creep in).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

AKM = Path(__file__).resolve().parent.parent / "akm"
LOWER = ("store", "dispatch", "format", "plan")
UPPER = (
    "akm.engine",
    "akm.api",
    "akm.cli",
    "akm.mcp",
    "akm.setup",
    "akm.report",
)
# The fronts (`akm.cli`, `akm.mcp`) sit above everything; `setup/` is service code the api calls, so it
# never reaches back up to the api or a front (the interactive wizard lives in `akm.cli`).
FRONTS = ("akm.api", "akm.cli", "akm.mcp")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = ".".join(("akm", *path.relative_to(AKM).parent.parts))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{a.name}") for a in node.names if name == "akm"]
    return found


@pytest.mark.parametrize("layer", LOWER)
def test_lower_layers_import_nothing_above_them(layer):
    bad = []
    for path in sorted((AKM / layer).rglob("*.py")):
        for line, name in _imports(path):
            if any(name == up or name.startswith(up + ".") for up in UPPER):
                bad.append(f"{path.relative_to(AKM.parent)}:{line} imports {name}")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def _upward(layer: str, upper: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((AKM / layer).rglob("*.py")):
        for line, name in _imports(path):
            if any(name == up or name.startswith(up + ".") for up in upper):
                bad.append(f"{path.relative_to(AKM.parent)}:{line} imports {name}")
    return bad


def test_setup_imports_neither_the_api_nor_a_front():
    bad = _upward("setup", FRONTS)
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_nothing_below_the_fronts_imports_them():
    """Only the fronts import the fronts: the api, engine and the rest never reach into `akm.cli`/`akm.mcp`."""
    bad = []
    for path in sorted(AKM.rglob("*.py")):
        rel = path.relative_to(AKM)
        if rel.parts[0] in ("cli", "mcp") or rel.name == "__main__.py":
            continue
        for line, name in _imports(path):
            if any(name == up or name.startswith(up + ".") for up in ("akm.cli", "akm.mcp")):
                bad.append(f"akm/{rel}:{line} imports {name}")
    assert not bad, "imports of a front:\n" + "\n".join(bad)


# What a front may import of akm: the api (with `akm.views`, the records its calls return), the errors and
# their codes, the report renderings, its own package, and the version.
FRONT_MAY_IMPORT = ("akm.api", "akm.views", "akm.errors", "akm.codes", "akm.report")


@pytest.mark.parametrize("front", ("cli", "mcp"))
def test_the_fronts_import_only_the_api_errors_and_report(front):
    """A front is an adapter over the api: it never reaches past it into the engine, the format, the store or
    the config (what it needs from there, the api re-exports), so the api is the one surface to keep stable."""
    own = f"akm.{front}"
    # the process entry starts the other front for `akm mcp` (its `serve`, nothing inside it)
    entry = ("akm.mcp",) if front == "cli" else ()
    bad = []
    for path in sorted((AKM / front).rglob("*.py")):
        for line, name in _imports(path):
            if not name.startswith("akm") or name in ("akm", "akm.__version__", *entry):
                continue
            if not any(name == ok or name.startswith(ok + ".") for ok in (*FRONT_MAY_IMPORT, own)):
                bad.append(f"{path.relative_to(AKM.parent)}:{line} imports {name}")
    assert not bad, "a front reaching past the api:\n" + "\n".join(bad)


def test_report_does_not_import_the_api():
    """report/ renders what the api returns; the api imports it (the HTML report), never the other way."""
    bad = _upward("report", ("akm.api", "akm.cli", "akm.mcp"))
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_check_sees_lazy_imports(tmp_path):
    """The walker must catch an import inside a function, the form a shortcut usually takes."""
    probe = AKM / "store" / "_layering_probe.py"
    probe.write_text("def f():\n    from akm.engine import drive\n", encoding="utf-8")
    try:
        assert (2, "akm.engine") in _imports(probe)
    finally:
        probe.unlink()


def _module_graph() -> dict[str, set[str]]:
    """akm's modules and what each imports (lazy imports included), `from pkg import mod` read as `pkg.mod`."""
    modules = {}
    for path in AKM.rglob("*.py"):
        parts = list(path.relative_to(AKM.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{up}.{base}" if base else up
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in map(resolve, targets):
                if target and target not in (name, "akm"):
                    graph[name].add(target)
    return graph


def test_no_import_cycles():
    """No module imports one that imports it back, directly or around a loop (lazy imports count: a cycle
    hidden in a function is still two modules that cannot be read, or changed, one without the other).
    Importing a package's `__init__` from its own submodule counts too (the api <-> models cycle was one)."""
    graph = _module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


_SQL_START = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "BEGIN", "PRAGMA", "CREATE", "DROP", "ALTER")


def _sql_calls(path: Path) -> list[int]:
    """Lines calling `x.query/query_one/execute/executemany(...)` with SQL text as the first argument."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        if node.func.attr not in ("query", "query_one", "execute", "executemany", "executescript"):
            continue
        first = node.args[0]
        parts = first.values if isinstance(first, ast.JoinedStr) else [first]
        head = parts[0] if parts else None
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            if head.value.lstrip().upper().startswith(_SQL_START):
                found.append(node.lineno)
    return found


def test_no_sql_outside_store():
    """The journal's SQL lives in `store/` (spec/journal.md): the engine, the api and the rest call store functions."""
    bad = []
    for path in sorted(AKM.rglob("*.py")):
        if path.relative_to(AKM).parts[0] != "store":
            bad += [f"akm/{path.relative_to(AKM)}:{line}" for line in _sql_calls(path)]
    assert not bad, "SQL outside store/:\n" + "\n".join(bad)
