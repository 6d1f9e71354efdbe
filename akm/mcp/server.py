"""Builds and serves akm's MCP server (`akm.mcp` re-exports it; see that package's docstring).

The server is the SDK's low-level `Server` given akm's handlers, on the SDK's own terms: `tools/list`
lists `akm.mcp.tools.TOOLS` (each input schema generated from the tool's api request model), `tools/call`
validates the arguments with that same model and runs the tool (a `workflow_run` of a client that declares
the tasks extension becomes a task: `akm.mcp.tasks`), and the resources are the run list, the runs and their
HTML reports. Nothing is registered that akm does not serve (no prompts), so the capabilities the SDK derives are
the ones akm has, in both protocol eras.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from functools import cache
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from akm import __version__, api
from akm.codes import Code
from akm.errors import AkmError, InternalError
from akm.mcp import drives as drives_mod
from akm.mcp import stdio as sdk
from akm.mcp.arguments import parse_json_strings, uncoerced
from akm.mcp.errors import _HINTS, error_result
from akm.mcp.fit import fitted
from akm.mcp.handshake import INSTRUCTIONS, EarlyStart
from akm.mcp.tasks import Tasks, declared
from akm.mcp.tools import DEFAULT_CALL_BOUND_S, TOOLS, Call

__all__ = [
    "DEFAULT_CALL_BOUND_S",
    "INSTRUCTIONS",
    "_HINTS",
    "AkmServer",
    "build_server",
    "list_tools",
    "serve",
]

log = logging.getLogger("akm.mcp")

RUNS_URI = "akm://runs"
RUN_URI_PREFIX = "akm://runs/"
# Every protocol version served: the 2026 one (per-request envelope), then the handshake ones, newest first.
SUPPORTED_VERSIONS = (*MODERN_PROTOCOL_VERSIONS, *reversed(HANDSHAKE_PROTOCOL_VERSIONS))


@cache
def list_tools() -> list[types.Tool]:
    """What `tools/list` answers: every tool of `TOOLS`, its input schema from its request model."""
    return [
        types.Tool(
            name=t.name,
            title=t.annotations.title,
            description=t.description,
            input_schema=_wire_order(t.input_schema()),
            output_schema=_wire_order(t.output_schema()),
            annotations=t.annotations,
        )
        for t in TOOLS.values()
    ]


def _wire_order(schema: dict[str, Any]) -> dict[str, Any]:
    """`properties`, `required`, `type` first, as the SDK's 2025 models write a tool schema: then both protocol
    eras put the same bytes on the wire (the 2026 one writes the dict as it is), one early answer for both."""
    head: dict[str, Any] = {k: schema[k] for k in ("properties", "required", "type") if k in schema}
    return {**head, **{k: v for k, v in schema.items() if k not in head}}


@cache
def resources() -> list[types.Resource]:
    """The resources `resources/list` lists (a run is a template, `resource_templates`)."""
    return [
        types.Resource(
            uri=RUNS_URI,
            name="runs",
            title="Runs of this project",
            description="This project's runs, newest first (as workflow_list).",
            mime_type="application/json",
        )
    ]


@cache
def resource_templates() -> list[types.ResourceTemplate]:
    return [
        types.ResourceTemplate(
            uri_template=RUN_URI_PREFIX + "{run_id}",
            name="run",
            title="A run",
            description="Where a run stands (as workflow_status; large outputs clipped).",
            mime_type="application/json",
        ),
        types.ResourceTemplate(
            uri_template=RUN_URI_PREFIX + "{run_id}/report.html",
            name="report",
            title="A run's report",
            description='A self-contained HTML report of the run (what workflow_status(format="html") links).',
            mime_type="text/html",
        ),
    ]


@cache
def _input_schemas() -> dict[str, dict[str, Any]]:
    return {t.name: t.input_schema for t in list_tools()}


class AkmServer(Server[Any]):
    """The SDK's low-level server with akm's handlers, and the background drivers of its runs (`drives`)."""

    def __init__(self, *, holder: str, cwd: str) -> None:
        super().__init__(
            "akm",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
        )
        self.add_request_handler("server/discover", types.RequestParams, self._discover)
        # tools/call as a request handler (public, like on_call_tool) whose answer may be a task's mapping
        self.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self.holder = holder
        self.cwd = cwd
        self.drives = drives_mod.Drives(cwd=cwd)
        self.tasks = Tasks(self, self.drives, holder, cwd)

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list_tools())

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | dict[str, Any]:
        """One tool call: arguments checked by the tool's request model, every failure a coded tool error."""
        name, arguments = params.name, params.arguments or {}
        tool = TOOLS.get(name)
        if tool is None:
            return error_result(
                AkmError(f"Unknown tool: {name}. Tools: {', '.join(sorted(TOOLS))}.", code=Code.UNKNOWN_TOOL)
            )
        schema = _input_schemas()[name]
        arguments = parse_json_strings(arguments, schema)
        problems = uncoerced(arguments, schema)
        if problems:
            return error_result(
                AkmError(f"Invalid arguments for {name}: {'; '.join(problems)}.", code=Code.INVALID_ARGUMENT)
            )
        try:
            request = api.front_request(tool.request, arguments, call=name)
        except AkmError as exc:
            return error_result(exc)
        call = Call(
            self.drives,
            self.holder,
            self.cwd,
            progress=ctx.session.report_progress,
            protocol_version=ctx.protocol_version,
            trace_parent=_traceparent_of(params),
        )
        try:
            if isinstance(request, api.RunToolRequest) and not (request.stop or request.plan) and declared(ctx):
                return await self.tasks.create(call, request)  # a task (CreateTaskResult), answered at once
            result = await tool.handler(call, request)
        except Exception as exc:
            # The last line of defence, as at the CLI: a coded INTERNAL error (the traceback on stderr), never a
            # bare "Error executing tool".
            log.exception("tool %s failed", name)
            return error_result(
                InternalError(
                    f"unexpected {type(exc).__name__}: {exc}",
                    code=Code.INTERNAL,
                    hint="this is a bug in akm; the server's stderr has the traceback.",
                )
            )
        return fitted(name, request, result)

    async def _list_resources(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=resources())

    async def _list_resource_templates(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=resource_templates())

    async def _discover(self, ctx: Any, params: types.RequestParams | None) -> types.DiscoverResult:
        return self.discover(ctx.protocol_version)

    def discover(self, protocol_version: str) -> types.DiscoverResult:
        """The `server/discover` answer: the SDK's, but naming every protocol version this server speaks (a
        client may open a connection with `initialize` in any handshake version as well)."""
        return types.DiscoverResult(
            supported_versions=list(SUPPORTED_VERSIONS),
            capabilities=self.get_capabilities(protocol_version=protocol_version),
            instructions=self.instructions,
        )

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        try:
            found = await anyio.to_thread.run_sync(self._resource, uri)
        except AkmError as exc:
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"error[{exc.code}]: {exc.message}", data={"uri": uri}
            ) from None
        if found is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown resource: {uri}", data={"uri": uri})
        text, mime_type = found
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, text=text, mime_type=mime_type)])

    def _resource(self, uri: str) -> tuple[str, str] | None:
        """(text, MIME type) of the resource at `uri`, or None when there is none."""
        import json

        from akm.mcp import compact

        if uri == RUNS_URI:
            return json.dumps(api.list_runs(cwd=self.cwd).to_json(), ensure_ascii=False), "application/json"
        if not uri.startswith(RUN_URI_PREFIX):
            return None
        rest = uri[len(RUN_URI_PREFIX) :]
        if rest.endswith("/report.html") and rest.count("/") == 1:
            return api.run_report_html(rest.split("/")[0]), "text/html"
        if "/" in rest:
            return None
        view = api.run_status(rest)
        return json.dumps(compact.compact_run(view.to_json()), ensure_ascii=False), "application/json"


def build_server(*, holder: str | None = None, cwd: str | None = None) -> AkmServer:
    """The akm MCP server (also used in-process by tests)."""
    return AkmServer(holder=holder or f"mcp:{uuid.uuid4()}", cwd=cwd or os.getcwd())


def serve(early: EarlyStart | None = None) -> int:
    """`akm mcp`: speak MCP on stdin/stdout until the client goes away (`early`: the first lines, read and
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


def _traceparent_of(params: types.CallToolRequestParams) -> str | None:
    """The W3C `traceparent` a request carries in its `_meta` (MCP's trace context), if any."""
    meta = params.meta
    value = meta.get("traceparent") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None
