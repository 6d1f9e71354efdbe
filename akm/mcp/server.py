"""Builds and serves akm's MCP server (`akm.mcp` re-exports it; see that package's docstring)."""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

from akm import __version__
from akm.mcp import drives as drives_mod
from akm.mcp import stdio as sdk
from akm.mcp import tools
from akm.mcp.errors import _HINTS, _TOOL_ARGS, _AkmServer, _error_result, _ok
from akm.mcp.handshake import INSTRUCTIONS, EarlyStart
from akm.mcp.schemas import (
    CatalogModel,
    EventPageModel,
    McpReportResult,
    McpRunResult,
    RunListModel,
    RunViewModel,
)
from akm.mcp.tools import DEFAULT_CALL_BOUND_S

__all__ = [
    "DEFAULT_CALL_BOUND_S",
    "INSTRUCTIONS",
    "CatalogModel",
    "EventPageModel",
    "McpReportResult",
    "McpRunResult",
    "RunListModel",
    "RunViewModel",
    "_HINTS",
    "_error_result",
    "_ok",
    "build_server",
    "serve",
]


def build_server(*, holder: str | None = None, cwd: str | None = None) -> _AkmServer:
    """The akm MCP server (also used in-process by tests)."""
    holder = holder or f"mcp:{uuid.uuid4()}"
    base_cwd = cwd or os.getcwd()
    server = _AkmServer(name="akm", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    server.drives = drives_mod.Drives(cwd=base_cwd)
    tools.register(server, server.drives, holder=holder, base_cwd=base_cwd)
    _finish_tools(server)
    _drop_prompts(server)
    return server


def _drop_prompts(server: MCPServer) -> None:
    """akm has no prompts: a server that answers prompts/list advertises the capability (and an empty list)."""
    sdk.drop_request_handlers(server, ("prompts/list", "prompts/get"))


def _finish_tools(server: MCPServer) -> None:
    """What a client sees of each tool: the input schema generated from its request model (strict), a
    description without the docstring's indentation, and a title."""
    import inspect

    from akm.api import _models as api_models

    for name, tool in sdk.tool_table(server).items():
        spec = _TOOL_ARGS.get(name)
        if spec is not None:
            model, only, renames = spec
            schema = api_models.tool_input_schema(getattr(api_models, model), only=only, renames=renames)
            schema.pop("description", None)
            tool.parameters = schema
        tool.description = inspect.cleandoc(tool.description or "")
        if tool.title is None and tool.annotations is not None and tool.annotations.title:
            tool.title = tool.annotations.title


def serve(early: EarlyStart | None = None) -> int:
    """`akm mcp`: speak MCP on stdin/stdout until the client goes away (`early`: the first line, read and
    perhaps answered while the SDK was imported, `akm.mcp.handshake`).

    However the session ends — stdin closed, SIGTERM, SIGHUP, SIGINT — every background driver is stopped
    (its running units killed and journaled as aborted, its lease released) and waited for before the process
    exits, so no unit outlives the server and each run stays resumable.
    """
    import signal

    sys.stdout.flush()
    server = build_server()

    def on_signal(signum: int, _frame: Any) -> None:
        # The SDK's stdin reader thread may sit in a read that never returns; leaving through the event loop
        # would wait for it forever. Stop the drivers here, then exit at once.
        signal.signal(signum, signal.SIG_DFL)  # a second signal kills at once
        server.drives.shutdown()
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, on_signal)
    status = 0
    try:
        anyio.run(sdk.serve_server, server, early)
    except BrokenPipeError:
        status = 0
    finally:
        server.drives.shutdown()
    return status
