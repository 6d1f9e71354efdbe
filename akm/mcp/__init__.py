"""The MCP front (`akm mcp`): each tool is one `akm.api` call over stdio.

Like the CLI this package holds no workflow logic. It translates arguments,
runs the (blocking) api call in a worker thread, turns `AkmError` into an
`isError` result carrying the same code and message the CLI prints, and adds
its own hints — an agent is told which tool to call next, never a shell
command. `mcp` is imported only here: the CLI never pays for it.

This module builds and serves the server; the tools are in `tools`, their
output models in `schemas`, errors, hints and the argument-checking server
class in `errors`, the background drivers in `drives`, and `stdio` is the
transport and the one module touching SDK internals.

Long runs: the server drives a run in a background thread of its own
(`akm.mcp.drives`), so a unit longer than a call finishes, once. A `workflow_run`
call waits at most its bound (default 45 s, `AKM_MCP_CALL_BOUND` or the
`timeout` argument) and returns with the run finished, awaiting the agent, or
still going (`driving: true`, per-step `progress`); the next call attaches to
the same driver. A cancelled call only stops waiting; `stop=true` stops the
driver. When the session ends (stdin closes, SIGTERM) every driver is stopped
the way a signal stops `workflow run` and waited for: the runs stay
resumable. Progress notifications (per finished unit and step) leave the
driver through a bounded mailbox, never blocking it. Nothing but protocol
frames reaches stdout: units never inherit it (their output is captured) and
logging goes to stderr.
"""

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

INSTRUCTIONS = """akm runs durable markdown workflows. workflow_catalog lists the workflows and their params. The loop:
1. workflow_run(target=<file, workflows/<name> or run id>, params={...}) — akm runs every command unit itself, in
   the background: a call waits up to its bound; if the run is still going (driving: true), call workflow_run
   with the run id again to keep waiting (nothing is redone).
2. If the result's run.status is "awaiting_session", run.awaiting is the brief: the units you must do (prompt,
   context, output schema) or the gate verdict you must give (workflow_next(run_id) fetches it again).
3. Do each unit in your own session, then unit_report(**unit.report, result=...). The report that finishes the
   step's units answers with the judge brief when a gate needs your verdict:
   unit_report(**judge.report, verdict={"complete": bool, "missing": [...], "feedback": "..."}).
4. When a report's stepOutcome is completed, call workflow_run(target=<run id>) again; repeat until
   run.status is "completed". Every answer's `next` says what to do.
Results that miss their output schema are refused with the errors: fix and report again. Resending a report
whose answer you lost is safe: the same report again answers recorded "idempotent"."""


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


def serve() -> int:
    """`akm mcp`: speak MCP on stdin/stdout until the client goes away.

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
        anyio.run(sdk.serve_server, server)
    except BrokenPipeError:
        status = 0
    finally:
        server.drives.shutdown()
    return status
