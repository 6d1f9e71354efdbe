"""The MCP tools: each one `akm.api` call, declared by the api request model it takes.

A tool is its request model (the one contract: the input schema clients see is generated from it, and every
call is validated by it before the tool runs), its output model (the outputSchema), a title and behaviour
hints, and a handler that translates the request into an api call and adds what this front knows — the `next`
an agent should call (`akm.mcp.guidance`) and progress notifications. `@tool` registers them in `TOOLS`, in
the order clients list them; the server (`akm.mcp.server`) serves that table and nothing else.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import anyio
import anyio.to_thread
from mcp_types import CallToolResult, ResourceLink, TextContent, ToolAnnotations

from akm import api, views
from akm.errors import AkmError
from akm.mcp import drives as drives_mod
from akm.mcp import guidance
from akm.mcp.errors import error_result, ok_result
from akm.mcp.fit import RUNS_PAGE, UNITS_PAGE
from akm.mcp.progress import ProgressReporter
from akm.mcp.schemas import (
    CatalogModel,
    EventPageModel,
    McpReportResult,
    McpRewindResult,
    McpRunResult,
    McpStatusResult,
    McpWaitResult,
    RunListModel,
    RunViewModel,
    lint_model,
)
from akm.report.timeline_svg import duration_text

if TYPE_CHECKING:
    from pydantic import BaseModel

DEFAULT_CALL_BOUND_S = 45.0
# The first `workflow_run` of a new run answers by then with the run id (unless it names its own timeout).
FIRST_ANSWER_S = 10.0


@dataclass
class Call:
    """What a tool handler has besides its request: this server's drivers, default claim holder and
    directory, and the SDK's context of the request (for progress)."""

    drives: drives_mod.Drives
    holder: str
    cwd: str
    progress: Callable[[float, float, str], Awaitable[None]] | None = None  # the request's progress channel
    protocol_version: str | None = None  # the version the client speaks (what a result may hold)
    trace_parent: str | None = None  # the W3C `traceparent` of the request's `_meta` (a run started is its child)

    async def answer(self, shape: Callable[[Any], Any] | None, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run a blocking api call off the event loop: its result (`shape(result)`: this front's additions)
        as a tool result, an AkmError as an isError result."""
        try:
            result = await anyio.to_thread.run_sync(lambda: fn(*args, **kw))
        except AkmError as exc:
            return error_result(exc)
        return ok_result(shape(result) if shape is not None else result)


Handler = Callable[[Call, Any], Awaitable[CallToolResult]]


@dataclass(frozen=True)
class Tool:
    """One tool: its name, the api request model it takes, its output model, how it behaves, its handler."""

    name: str
    request: type[api.Request]
    output: type[BaseModel]
    annotations: ToolAnnotations
    description: str
    handler: Handler

    def input_schema(self) -> dict[str, Any]:
        return untitled(api.tool_input_schema(self.request))

    def output_schema(self) -> dict[str, Any]:
        return terse(untitled(self.output.model_json_schema()))


_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def terse(schema: Any) -> Any:
    """An output schema said shorter, meaning the same: `anyOf` of plain types as one `type` list
    (`["string", "null"]`), and no `default` (an answer has every key; defaults say nothing of it)."""
    if isinstance(schema, list):
        return [terse(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "default":
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: terse(sub) for name, sub in value.items()}
        else:
            out[key] = terse(value)
    kinds = _plain_types(out.get("anyOf"))
    if kinds is not None:
        del out["anyOf"]
        out["type"] = kinds
    return out


def _plain_types(branches: Any) -> list[str] | None:
    """The type names of an `anyOf` whose every branch is only a plain `type`, or None if it is not one."""
    if isinstance(branches, list) and all(isinstance(b, dict) and set(b) == {"type"} for b in branches):
        kinds = [b["type"] for b in branches]
        if all(isinstance(k, str) for k in kinds):
            return kinds
    return None


def untitled(schema: Any) -> Any:
    """A JSON schema without the `title` pydantic gives every model and field ("Createdat"): they tell a client
    nothing the property names do not, and were a fifth of `tools/list`. Properties named `title` stay."""
    if isinstance(schema, list):
        return [untitled(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: untitled(sub) for name, sub in value.items()}
        else:
            out[key] = untitled(value)
    return out


TOOLS: dict[str, Tool] = {}


def tool(
    request: type[api.Request],
    output: type[BaseModel],
    *,
    title: str,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
) -> Callable[[Handler], Handler]:
    """Register the decorated handler as the tool of its name, taking `request` and answering `output`; its
    docstring is the tool's description."""

    def register(fn: Handler) -> Handler:
        TOOLS[fn.__name__] = Tool(
            name=fn.__name__,
            request=request,
            output=output,
            annotations=ToolAnnotations(
                title=title,
                read_only_hint=read_only,
                destructive_hint=destructive,
                idempotent_hint=idempotent,
                open_world_hint=open_world,
            ),
            description=inspect.cleandoc(fn.__doc__ or ""),
            handler=fn,
        )
        return fn

    return register


def bound_s() -> float:
    """How long a `workflow_run` call waits by default (`AKM_MCP_CALL_BOUND`, seconds)."""
    raw = os.environ.get("AKM_MCP_CALL_BOUND", "").strip()
    if not raw:
        return DEFAULT_CALL_BOUND_S
    try:
        return max(0.1, float(raw.rstrip("s")))
    except ValueError:
        return DEFAULT_CALL_BOUND_S


def _stop_run(drives: drives_mod.Drives, run_id: str) -> dict[str, Any]:
    """`workflow_run(stop=true)`: stop this server's driver of the run; the run stays active and resumable."""
    view = api.run_status(run_id)  # a coded error for an unknown run or a run id that is not one
    stopped = drives.stop(view.run_id)
    result = views.RunResult(
        run=api.run_status(view.run_id) if stopped else view,
        aborted=stopped,
        abort_reason="stopped" if stopped else None,
    )
    body = result.to_json()
    body["next"] = (
        f'Stopped. Continue later with workflow_run(target="{view.run_id}").'
        if stopped
        else "This server has no driver of that run running; nothing was stopped."
    )
    return body


@tool(api.RunToolRequest, McpRunResult, title="Run a workflow", open_world=True)
async def workflow_run(call: Call, req: api.RunToolRequest) -> CallToolResult:
    """Start or continue a workflow run. akm drives it in the background (command units run in this server's
    process); the call waits up to its bound and returns when the run completes, fails, or needs you (status
    awaiting_session: see workflow_next) — or with the run still going (driving: true) and per-step progress.
    Calling again attaches to the same driver; cancelling a call only stops waiting."""
    cwd = req.cwd or call.cwd
    if req.stop:
        return await call.answer(None, _stop_run, call.drives, req.target)
    if req.plan:
        return await call.answer(
            guidance.plan_answer,
            api.plan_run,
            req.target,
            params=req.params or None,
            new=req.new,
            from_run=req.from_run,
            cwd=cwd,
        )
    try:
        drive, opened = await anyio.to_thread.run_sync(
            lambda: call.drives.start_requested(req, cwd=cwd, trace_parent=call.trace_parent)
        )
    except AkmError as exc:
        return error_result(exc)
    if req.timeout is not None:
        wait_s = int(req.timeout) / 1000.0  # ms once validated (the schema also takes text: 30s)
    else:  # the call that starts a run names it soon: a client with a short tool timeout still learns its id
        wait_s = min(bound_s(), FIRST_ANSWER_S) if opened.started else bound_s()
    listener = drive.listen()
    reporter = ProgressReporter(call.progress)
    try:
        with anyio.move_on_after(wait_s):
            while True:
                await reporter.send(listener.take())
                if drive.finished.is_set():
                    break
                if reporter.due():
                    waited = duration_text(reporter.elapsed_s())
                    await reporter.heartbeat(f"run {drive.run_id}: {drive.now_text()}; {waited} waited")
                await anyio.sleep(0.05)
        await reporter.send(listener.take())
    finally:
        drive.unlisten(listener)  # a cancelled call stops waiting; the driver goes on
    try:
        if drive.finished.is_set():
            result = drives_mod.final(drive, opened)
        else:
            result = await anyio.to_thread.run_sync(drives_mod.snapshot, drive, opened)
    except AkmError as exc:
        return error_result(exc)
    return ok_result({**result.to_json(), "next": guidance.after_run(result)})


@tool(api.WaitRequest, McpWaitResult, title="Wait for a run", read_only=True, idempotent=True)
async def workflow_wait(call: Call, req: api.WaitRequest) -> CallToolResult:
    """Wait, up to the bound, for a run driven elsewhere — another session, a detached `akm workflow run`,
    workers — until it is no longer active: completed, failed, blocked, or awaiting you (the answer then
    holds the brief in run.awaiting). Changes nothing; progress notifications say what it is on meanwhile."""
    wait_ms = req.timeout if req.timeout is not None else int(bound_s() * 1000)
    cancel = api.Cancellation()
    reporter = ProgressReporter(call.progress)
    outcome: dict[str, Any] = {}

    async def wait() -> None:
        try:
            outcome["result"] = await anyio.to_thread.run_sync(
                lambda: api.wait_run(req.run_id, timeout=wait_ms, cancel=cancel), abandon_on_cancel=True
            )
        except AkmError as exc:
            outcome["error"] = exc

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            while not outcome:
                await anyio.sleep(0.1)
                if reporter.due() and not outcome:
                    try:
                        view = await anyio.to_thread.run_sync(lambda: api.run_status(req.run_id))
                    except AkmError:
                        continue
                    on = f"at step {view.current_step_id}" if view.current_step_id else "starting"
                    holder = f", driven by {view.engine_lease.holder}" if view.engine_lease else ", not driven"
                    waited = duration_text(reporter.elapsed_s())
                    await reporter.heartbeat(f"run {view.run_id}: {view.status} {on}{holder}; {waited} waited")
    finally:
        cancel.trip("call ended")  # a cancelled call stops the wait's thread at its next poll
    if "error" in outcome:
        return error_result(outcome["error"])
    result = outcome["result"]
    return ok_result({**result.to_json(), "next": guidance.after_wait(result)})


@tool(api.NextToolRequest, api.Brief, title="What to do now", read_only=True, idempotent=True)
async def workflow_next(call: Call, req: api.NextToolRequest) -> CallToolResult:
    """What you should do now for a run: its session units (prompt, context, schema, how to report) or the
    gate verdict it awaits. Never changes the run. Each unit's `report` names the unit_report arguments in
    camelCase: runId -> run_id, unitId -> unit_id, expectStep -> expect_step, status, rerun. A unit fetched
    whole (unit_id) comes with a large prompt in pages (promptPage names the next call)."""
    return await call.answer(None, api.next_brief, req.run_id, unit_id=req.unit_id)


@tool(api.ReportToolRequest, McpReportResult, title="Report a unit", idempotent=True)
async def unit_report(call: Call, req: api.ReportToolRequest) -> CallToolResult:
    """Record a unit you did (or a gate verdict). When it completes the step's work the step finishes; then
    call workflow_run to continue the run. A refused report changes nothing."""
    return await call.answer(
        guidance.report_answer,
        api.report_unit,
        req.run_id,
        req.unit_id,
        status=req.status,
        result=req.result,
        verdict=req.verdict,
        tokens=req.tokens,
        failure_reason=req.failure_reason,
        expect_step=req.expect_step,
        rerun=req.rerun,
        attempt_id=req.attempt_id,
        gate_loop=req.gate_loop,
        holder=req.holder or call.holder,
        cwd=call.cwd,
    )


def _report_link(rid: str) -> ResourceLink:
    """The run's HTML report as a resource to read (`resources/read`), not inlined: it grows with the run."""
    return ResourceLink(
        type="resource_link",
        uri=report_uri(rid),
        name="report.html",
        title=f"Run {rid[:8]} report",
        description="A self-contained HTML report of the run (steps, units, timeline).",
        mime_type="text/html",
    )


def report_uri(rid: str) -> str:
    return f"akm://runs/{rid}/report.html"


# Protocol versions whose tool results may carry a resource link (it came with 2025-06-18).
_LINKS_SINCE = "2025-06-18"


@tool(api.StatusToolRequest, McpStatusResult, title="Run status", read_only=True, idempotent=True)
async def workflow_status(call: Call, req: api.StatusToolRequest) -> CallToolResult:
    """Where a run stands: steps, their outputs (large ones clipped: pass step for one whole, in pages when
    it is large), and (with units) the unit attempts, a page at a time (offset, limit; unitsPage has the
    total), the superseded ones of its rewinds too; format html links the run's self-contained HTML report
    (a resource to read). For a failed, blocked or abandoned run, next (and recovery) say what moves it on."""
    limit = req.limit if req.limit is not None else (UNITS_PAGE if req.units else None)
    result: CallToolResult = await call.answer(
        guidance.status_answer,
        api.run_status,
        req.run_id,
        units=req.units,
        step=req.step,
        offset=req.offset,
        limit=limit,
    )
    if req.format == "html" and not result.is_error:
        rid = (result.structured_content or {}).get("runId", req.run_id)  # a prefix or @last, resolved
        if (call.protocol_version or _LINKS_SINCE) >= _LINKS_SINCE:
            result.content.append(_report_link(rid))
        else:
            result.content.append(TextContent(type="text", text=f"The HTML report: resources/read {report_uri(rid)}"))
    return result


@tool(api.ListRunsToolRequest, RunListModel, title="List runs", read_only=True, idempotent=True)
async def workflow_list(call: Call, req: api.ListRunsToolRequest) -> CallToolResult:
    """Runs of this project, newest first, a page at a time (offset, limit; page has the total)."""
    return await call.answer(
        None,
        api.list_runs,
        active_only=req.active,
        ref=req.ref,
        cwd=call.cwd,
        offset=req.offset,
        limit=req.limit if req.limit is not None else RUNS_PAGE,
    )


@tool(api.LintRequest, lint_model(), title="Lint workflows", read_only=True, idempotent=True)
async def workflow_lint(call: Call, req: api.LintRequest) -> CallToolResult:
    """Check workflow files: every problem with file, line, code and a fix."""
    resolved = [p if os.path.isabs(p) else str(Path(call.cwd) / p) for p in req.paths]
    return await call.answer(None, api.lint, resolved)


@tool(api.RunIdRequest, RunViewModel, title="Resume a run", idempotent=True)
async def workflow_resume(call: Call, req: api.RunIdRequest) -> CallToolResult:
    """Reopen a failed or blocked run (its current step is retried on the next workflow_run)."""
    return await call.answer(None, api.resume, req.run_id)


@tool(api.RewindRequest, McpRewindResult, title="Rewind a run")
async def workflow_rewind(call: Call, req: api.RewindRequest) -> CallToolResult:
    """Take a run back to a step (completed, failed, blocked or active run): the step and every later one are
    reopened, in one transaction. Nothing is lost: the superseded results stay in the run's history. The
    step's units you did are offered again (action rerun) so you can report a corrected result; other units
    whose inputs did not change are reused instead of run. Then call workflow_run."""
    return await call.answer(guidance.rewind_answer, api.rewind, req.run_id, req.to_step, redo=req.redo)


@tool(api.RunIdRequest, RunViewModel, title="Abandon a run", destructive=True)
async def workflow_abandon(call: Call, req: api.RunIdRequest) -> CallToolResult:
    """Give up on a run for good."""
    return await call.answer(None, api.abandon, req.run_id)


@tool(api.CatalogRequest, CatalogModel, title="Workflow catalog", read_only=True, idempotent=True)
async def workflow_catalog(call: Call, req: api.CatalogRequest) -> CallToolResult:
    """The workflows this project can run by name: its .akm/workflows/ then the user library, each with
    its ref (pass it to workflow_run as target), description, steps and params (name, type, description,
    required, default)."""
    return await call.answer(None, api.workflow_catalog, cwd=req.cwd or call.cwd)


@tool(api.EventsRequest, EventPageModel, title="Journal events", read_only=True, idempotent=True)
async def workflow_events(call: Call, req: api.EventsRequest) -> CallToolResult:
    """Journal events, cursor-paged: pass nextOffset back as since=@offset:N."""
    return await call.answer(None, api.events, run_id=req.run_id, since=req.since, limit=req.limit)


@tool(api.SetupRequest, api.SetupResult, title="Set up engines", idempotent=True, open_world=True)
async def setup(call: Call, req: api.SetupRequest) -> CallToolResult:
    """Set up engines for akm on this machine: what was found, what was written, what can run now.
    Never asks anything. With no arguments it is a preview: it detects and verifies, writes nothing."""
    dry_run = not req.yes and req.config is None and not req.probe
    return await call.answer(
        None,
        api.setup,
        yes=req.yes,
        config=req.config,
        probe=req.probe,
        project=req.project,
        cwd=call.cwd,
        dry_run=dry_run,
    )
