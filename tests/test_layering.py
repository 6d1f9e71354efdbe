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
    "akm.api_models",
    "akm.cli",
    "akm.cli_render",
    "akm.mcp",
    "akm.mcp_stdio",
    "akm.drives",
    "akm.detach",
    "akm.setup",
    "akm.report",
)


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


def test_the_check_sees_lazy_imports(tmp_path):
    """The walker must catch an import inside a function, the form a shortcut usually takes."""
    probe = AKM / "store" / "_layering_probe.py"
    probe.write_text("def f():\n    from akm.engine import drive\n", encoding="utf-8")
    try:
        assert (2, "akm.engine") in _imports(probe)
    finally:
        probe.unlink()
