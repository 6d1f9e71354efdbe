"""The MCP SDK internals akm touches, pinned: an SDK upgrade fails here, loudly, before anything else breaks.

`akm/mcp/stdio.py` is the one module that reaches into the `mcp` package's private modules (its stdio stream
claim). It declares the SDK versions it was written against and every internal it uses; this test holds the
installed SDK to both, and holds the rest of the front to touching none of them (the server is the SDK's
public low-level `Server`).
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


def test_the_server_is_the_sdks_public_low_level_server():
    """No SDK internals are needed to build the server: it is the public low-level `Server` with akm's
    handlers, so the capabilities the SDK derives from them are what akm serves (no prompts)."""
    from mcp.server import Server

    server = build_server(cwd=str(Path.cwd()))
    try:
        assert isinstance(server, Server)
        assert server.get_request_handler("tools/call") is not None
        assert server.get_request_handler("prompts/list") is None  # akm has no prompts: none is advertised
        caps = server.get_capabilities()
        assert caps.prompts is None and caps.tools is not None and caps.resources is not None
    finally:
        server.drives.shutdown()


def test_only_stdio_touches_sdk_internals():
    """No other module of the front imports a private SDK module or name, or reads a private SDK attribute."""
    private_attrs = {"_tool_manager", "_tools", "_lowlevel_server", "_request_handlers"}  # MCPServer's, once used
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
