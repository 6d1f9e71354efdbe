"""The MCP SDK internals akm touches, pinned: an SDK upgrade fails here, loudly, before anything else breaks.

`akm/mcp/stdio.py` is the one module that reaches into the `mcp` package's private modules and attributes
(its stdio stream claim, its tool table, its request handlers). It declares the SDK versions it was written
against and every internal it uses; this test holds the installed SDK to both, and holds the rest of the
front to touching none of them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
from pathlib import Path

from akm.mcp import build_server, handshake
from akm.mcp import stdio as sdk

MCP_DIR = Path(__file__).resolve().parent.parent / "akm" / "mcp"


def test_installed_sdk_is_in_the_tested_range():
    installed = importlib.metadata.version("mcp")
    outside = [spec for spec in sdk.SDK_TESTED if not handshake.version_satisfies(installed, spec)]
    assert not outside, (
        f"mcp {installed} is outside the range akm/mcp/stdio.py was written against {sdk.SDK_TESTED}: check every "
        "internal in SDK_MODULE_INTERNALS / SDK_SERVER_INTERNALS against the new SDK, then widen SDK_TESTED"
    )


def test_every_module_internal_exists():
    missing = []
    for module_name, names in sdk.SDK_MODULE_INTERNALS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing.append(f"{module_name} ({exc})")
            continue
        missing += [f"{module_name}.{name}" for name in names if not hasattr(module, name)]
    assert not missing, f"SDK internals akm/mcp/stdio.py imports are gone: {missing}"


def test_every_server_internal_exists():
    server = build_server(cwd=str(Path.cwd()))
    try:
        missing = []
        for path in sdk.SDK_SERVER_INTERNALS:
            obj: object = server
            for attr in path.split("."):
                if not hasattr(obj, attr):
                    missing.append(path)
                    break
                obj = getattr(obj, attr)
        assert not missing, f"SDK server internals akm/mcp/stdio.py reads are gone: {missing}"
        assert isinstance(sdk.tool_table(server), dict) and "workflow_run" in sdk.tool_table(server)
        assert sdk.tool_table_if_present(server) is sdk.tool_table(server)
        handlers = server._lowlevel_server._request_handlers
        assert isinstance(handlers, dict) and "tools/call" in handlers
        assert "prompts/list" not in handlers  # dropped by build_server through stdio.drop_request_handlers
    finally:
        server.drives.shutdown()


def test_only_stdio_touches_sdk_internals():
    """No other module of the front imports a private SDK module or name, or reads a private SDK attribute."""
    private_attrs = {part for path in sdk.SDK_SERVER_INTERNALS for part in path.split(".") if part.startswith("_")}
    offenders = []
    for path in sorted(MCP_DIR.rglob("*.py")):
        if path.name == "stdio.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mcp":
                private = [a.name for a in node.names if a.name.startswith("_")]
                if any(p.startswith("_") for p in node.module.split(".")) or private:
                    offenders.append(f"{path.name}:{node.lineno} from {node.module} import {private or '...'}")
            elif isinstance(node, ast.Import):
                offenders += [
                    f"{path.name}:{node.lineno} import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == "mcp" and any(p.startswith("_") for p in a.name.split("."))
                ]
            elif isinstance(node, ast.Attribute) and node.attr in private_attrs:
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in private_attrs:
                offenders.append(f"{path.name}:{node.lineno} {node.value!r}")  # getattr(x, "_tool_manager")
    assert not offenders, f"SDK internals touched outside akm/mcp/stdio.py: {offenders}"
