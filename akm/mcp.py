"""The MCP front (`akm mcp`): each tool is one `akm.api` call over stdio.

Like the CLI this module holds no workflow logic. It translates arguments,
runs the (blocking) api call in a worker thread, turns `AkmError` into an
`isError` result carrying the same code and message the CLI prints, and adds
its own hints — an agent is told which tool to call next, never a shell
command. `mcp` is imported only here: the CLI never pays for it.

Long runs: a `workflow_run` call returns after at most `call_bound` seconds
(default 45, `AKM_MCP_CALL_BOUND` or the `timeout` argument make it shorter
or longer) with the run still `active` and `next` saying to call
`workflow_run` again — the run continues exactly where it stopped. Progress
notifications are sent per finished unit and step. A cancelled call stops
dispatch, kills running units and releases the run lease: the run stays
resumable. Nothing but protocol frames reaches stdout: units never inherit it
(their output is captured) and logging goes to stderr.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import types
import typing
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.alias_generators import to_camel

from akm import __version__, api, views
from akm.engine.budget import MAX_UNIT_TOKENS as MAX_REPORT_TOKENS
from akm.errors import EXIT_INTERNAL, AkmError

DEFAULT_CALL_BOUND_S = 45.0

INSTRUCTIONS = """akm runs durable markdown workflows. workflow_catalog lists the workflows and their params. The loop:
1. workflow_run(target=<file, workflows/<name> or run id>, params={...}) — akm runs every command unit itself.
2. If the result's run.status is "awaiting_session", run.awaiting is the brief: the units you must do (prompt,
   context, output schema) or the gate verdict you must give (workflow_next(run_id) fetches it again).
3. Do each unit in your own session, then unit_report(**unit.report, result=...). The report that finishes the
   step's units answers with the judge brief when a gate needs your verdict:
   unit_report(**judge.report, verdict={"complete": bool, "missing": [...], "feedback": "..."}).
4. When a report's stepOutcome is completed, call workflow_run(target=<run id>) again; repeat until
   run.status is "completed". Every answer's `next` says what to do.
Results that miss their output schema are refused with the errors: fix and report again. Resending a report
whose answer you lost is safe: the same report again answers recorded "idempotent"."""

# Hints in MCP terms for error codes whose CLI hint names shell commands.
_HINTS = {
    "RUN_NOT_FOUND": "List runs with workflow_list.",
    "RUN_NOT_ACTIVE": "Reopen a failed or blocked run with workflow_resume, then workflow_run.",
    "LEASE_HELD": "Another invocation is driving this run; wait for it, then call workflow_next again.",
    "WORKFLOW_INVALID": "Call workflow_lint on the file for every problem and its fix.",
    "UNKNOWN_UNIT": "Call workflow_next for the units of the current step.",
    "STEP_MISMATCH": "The run moved on: call workflow_next and report against the new step.",
    "STEP_CLOSED": "Start a new run to change a finished step's output: workflow_run(target=<the workflow file>, "
                   "params=..., new=true).",
    "STALE_REPORT": "Call workflow_next: report the current attempt (its attemptId) with the gate's feedback.",
    "REPLAY_DIVERGED": "The journal no longer matches the run's plan: start a new run with workflow_run(target=<the "
                       "workflow file>, new=true).",
    "BUDGET_EXCEEDED": "The run's budget is spent: start a new run (or raise the workflow's budget) to go on.",
    "RESULT_INVALID": "Correct the result so it matches the unit's outputSchema and report again.",
    "RESULT_REQUIRED": "Report the unit's result (a JSON value matching its outputSchema).",
    "REPORT_CONFLICT": "Pass rerun=true to replace the recorded result.",
    "UNIT_TERMINAL": "Pass rerun=true to do the finished unit again.",
    "CLAIM_EXPIRED": "Report status=\"running\" to claim the unit again, then report its result.",
    "NOT_AWAITING_VERDICT": "Call workflow_next to see what the run needs now.",
    "RUN_ALREADY_ACTIVE": "Continue that run with workflow_run(target=<its run id>).",
    "RUN_ABANDONED": "The run was abandoned for good: start a new one with workflow_run(target=<the workflow file>).",
    "PARAMS_ON_EXISTING_RUN": "Params are fixed when a run starts: start a new run with workflow_run(target=<the "
                              "workflow file>, params=..., new=true).",
    "NEW_RUN_NEEDS_WORKFLOW": "new=true starts a run of a workflow: pass the workflow file or workflows/<name>, "
                              "not a run id.",
    "CORRUPT_RUN": "The run's journal rows are damaged: inspect it with workflow_status, or give it up with "
                   "workflow_abandon.",
}


def _error_result(exc: AkmError) -> CallToolResult:
    body = exc.to_dict()
    body["exitCode"] = exc.exit_status
    hint = _HINTS.get(exc.code)
    if exc.code == "RUN_NOT_ACTIVE" and (exc.details or {}).get("status") not in (None, "failed", "blocked"):
        hint = None  # resuming is for failed or blocked runs; the message says what the run is
    if hint:
        body["hint"] = hint
    elif "hint" in body and ("akm " in body["hint"] or "--" in body["hint"]):
        body.pop("hint")  # a shell hint helps nobody here
    text = f"error[{exc.code}]: {exc.message}" + (f"\nhint: {body['hint']}" if body.get("hint") else "")
    import json

    # No structuredContent on errors: clients validate it against the tool's outputSchema (the TypeScript SDK
    # does so even for isError results), so the error object travels as a second, JSON text block.
    return CallToolResult(content=[TextContent(type="text", text=text),
                                   TextContent(type="text", text=json.dumps(body, ensure_ascii=False))],
                          is_error=True)


def _ok(model: Any) -> CallToolResult:
    import json

    if isinstance(model, dict):
        data = model
    elif hasattr(model, "to_json"):
        data = model.to_json()
    else:
        data = model.model_dump(mode="json", by_alias=True)

    return CallToolResult(content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))],
                          structured_content=data)


async def _call(fn: Any, *args: Any, **kwargs: Any) -> CallToolResult:
    """Run a blocking api call off the event loop; AkmError becomes an isError result."""
    return await _call_then(None, fn, *args, **kwargs)


async def _call_then(shape: Any, fn: Any, *args: Any, **kwargs: Any) -> CallToolResult:
    """`_call`, with `shape(result)` giving the answer's JSON (this front's additions)."""
    try:
        result = await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
    except AkmError as exc:
        return _error_result(exc)
    return _ok(shape(result) if shape is not None else result)


def _with_next_after_report(res: Any) -> dict[str, Any]:
    data = res.to_json()
    data["next"] = _next_after_report(data)
    return data


def _schema_model(cls: type, extra: dict[str, Any] | None = None) -> type[BaseModel]:
    """A pydantic model with the camelCase wire shape of an api view (for a tool's outputSchema).

    The api's read paths return plain records (`akm.views`) so that the CLI never imports pydantic;
    this front derives the schema models once, recursively, at server start.
    """
    cached = _SCHEMA_MODELS.get((cls, tuple(extra or ())))
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    fields_: dict[str, Any] = {}
    for name, default in views.fields_of(cls):
        if default is views.REQUIRED:
            default = ...
        elif isinstance(default, views._Factory):
            default = Field(default_factory=default.make)
        fields_[name] = (_schema_type(hints[name]), default)
    for name, (kind, default) in (extra or {}).items():
        fields_[name] = (kind, default)
    model = create_model(cls.__name__ + ("Result" if extra else ""), __doc__=cls.__doc__,
                         __config__=ConfigDict(alias_generator=to_camel, populate_by_name=True), **fields_)
    _SCHEMA_MODELS[(cls, tuple(extra or ()))] = model
    return model


def _schema_type(hint: Any) -> Any:
    if isinstance(hint, type) and issubclass(hint, views.View):
        return _schema_model(hint)
    args = typing.get_args(hint)
    if not args:
        return hint
    origin = typing.get_origin(hint)
    converted = tuple(_schema_type(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return typing.Union[converted]
    if origin is typing.Literal:
        return hint
    return origin[converted] if len(converted) > 1 else origin[converted[0]]


_SCHEMA_MODELS: dict[Any, type[BaseModel]] = {}
McpRunResult = _schema_model(views.RunResult, {"next": (str | None, None)})  # the run JSON + what to call next
McpReportResult = create_model("McpReportResult", __base__=api.ReportResult, next=(str | None, None))
RunViewModel = _schema_model(views.RunView)
RunListModel = _schema_model(views.RunList)
EventPageModel = _schema_model(views.EventPage)
CatalogModel = _schema_model(views.Catalog)


def _next_step_for(result: views.RunResult, bound_hit: bool) -> str | None:
    status = result.run.status
    rid = result.run.run_id
    if status == "awaiting_session":
        return _next_for_brief((result.run.awaiting or {}), rid)
    if status == "active" and bound_hit:
        return f"The run is still going (this call returns after its time bound). Call " \
               f"workflow_run(target=\"{rid}\") to continue from where it stopped."
    if status == "active":
        return f"Call workflow_run(target=\"{rid}\") to continue."
    if status in ("failed", "blocked"):
        return f"Inspect with workflow_status(run_id=\"{rid}\"); fix the cause, then workflow_resume and " \
               "workflow_run to retry (completed units are reused)."
    return None


def _next_for_brief(brief: dict[str, Any], rid: str) -> str:
    """What to do with a brief the answer already holds (run.awaiting, or a report's brief)."""
    kind = brief.get("kind")
    if kind == "units":
        return ("Do each unit in run.awaiting.units (prompt, context, outputSchema) and report it with "
                "unit_report(**unit.report, result=...); the report that finishes the step's units answers with "
                f"the judge brief if a gate needs a verdict, else call workflow_run(target=\"{rid}\").")
    if kind == "judge":
        return ("Judge run.awaiting.judge.artifact against its criteria and report unit_report(**judge.report, "
                "verdict={\"complete\": bool, \"missing\": [...], \"feedback\": \"...\"}).")
    return f"Call workflow_next(run_id=\"{rid}\") for what the run needs now."


def _next_after_report(res: dict[str, Any]) -> str | None:
    """A report answer's `next`: what its own fields already say the agent must do."""
    rid, outcome, status = res["runId"], res.get("stepOutcome") or {}, res.get("runStatus")
    brief = res.get("brief")
    if status == "completed":
        return None
    if brief and brief.get("kind") == "judge":
        return ("The step's units are done: judge brief.judge.artifact against its criteria and report "
                "unit_report(**brief.judge.report, verdict={\"complete\": bool, \"missing\": [...], "
                "\"feedback\": \"...\"}).")
    if brief and brief.get("kind") == "units":
        return ("The gate sent the step back: redo each unit in brief.units with brief.gateFeedback and report it "
                "with unit_report(**unit.report, result=...) (it names the new attemptId).")
    if status in ("failed", "blocked"):
        return (f"The run is {status}: inspect it with workflow_status(run_id=\"{rid}\"), fix the cause, then "
                f"workflow_resume(run_id=\"{rid}\") and workflow_run(target=\"{rid}\").")
    if outcome.get("kind") == "completed" or status == "active":
        return f"Call workflow_run(target=\"{rid}\") to go on: its answer carries the next brief in run.awaiting."
    if res.get("recorded") == "heartbeat" or res.get("status") == "running":
        return "Report the unit's result with unit_report (status completed) before its claim expires."
    if res.get("remainingUnits"):
        return f"{res['remainingUnits']} unit(s) of the step still need a report."
    return None


def _bound_s() -> float:
    raw = os.environ.get("AKM_MCP_CALL_BOUND", "").strip()
    if not raw:
        return DEFAULT_CALL_BOUND_S
    try:
        return max(0.1, float(raw.rstrip("s")))
    except ValueError:
        return DEFAULT_CALL_BOUND_S


# Each tool's arguments are one api request model's fields (`akm.api_models`): the tool's input schema is
# generated from it and every call is checked by it before the SDK sees the arguments, so an unknown or
# misspelt argument is INVALID_ARGUMENT naming it, never dropped. (model, the fields taken, renames)
_TOOL_ARGS: dict[str, tuple[str, tuple[str, ...] | None, dict[str, str] | None]] = {
    "workflow_run": ("RunRequest", ("target", "params", "max_steps", "timeout", "cwd", "new"), None),
    "workflow_next": ("NextRequest", None, None),
    "unit_report": ("ReportRequest", ("run_id", "unit_id", "status", "result", "verdict", "tokens",
                                      "failure_reason", "rerun", "expect_step", "attempt_id", "gate_loop",
                                      "holder"), None),
    "workflow_status": ("StatusRequest", None, None),
    "workflow_list": ("ListRunsRequest", ("active_only", "ref"), {"active": "active_only"}),
    "workflow_lint": ("LintRequest", None, None),
    "workflow_resume": ("RunIdRequest", None, None),
    "workflow_abandon": ("RunIdRequest", None, None),
    "workflow_events": ("EventsRequest", None, None),
    "workflow_catalog": ("CatalogRequest", None, None),
    "setup": ("SetupRequest", None, None),
}


def _checked_arguments(name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """The call's arguments checked by the tool's request model, keyed as the tool function names them."""
    from akm import api_models

    spec = _TOOL_ARGS.get(name)
    if spec is None:
        return arguments or {}
    model, only, renames = spec
    given = api_models.front_arguments(getattr(api_models, model), dict(arguments or {}), only=only,
                                       renames=renames, call=name)
    back = {field: front for front, field in (renames or {}).items()}
    return {back.get(k, k): v for k, v in given.items()}


def _compacted(name: str, arguments: dict[str, Any], result: Any) -> Any:
    """A tool's answer within `akm.compact.ANSWER_LIMIT`: large outputs, inputs and prompts clipped, each
    with its size and the call that returns it whole (which itself answers unclipped)."""
    from akm import compact

    if not isinstance(result, CallToolResult) or result.is_error or not isinstance(result.structured_content, dict):
        return result
    data = result.structured_content
    if name == "workflow_run" and isinstance(data.get("run"), dict):
        compact.compact_run(data["run"])
    elif name in ("workflow_status", "workflow_resume", "workflow_abandon") and arguments.get("step") is None:
        compact.compact_run(data)
    elif name == "workflow_next" and arguments.get("unit_id") is None:
        compact.compact_brief(data)
    elif name == "unit_report" and isinstance(data.get("brief"), dict):
        compact.compact_brief(data["brief"])
    else:
        return result
    return _ok(data)


class _AkmServer(MCPServer):
    """MCPServer whose argument errors carry a code like every other akm error."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError
        from pydantic import ValidationError

        try:
            arguments = _checked_arguments(name, arguments)
        except AkmError as exc:
            return _error_result(exc)
        try:
            return _compacted(name, arguments, await super().call_tool(name, arguments, context))
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                                     for e in cause.errors())
                return _error_result(AkmError(f"Invalid arguments for {name}: {problems}.", code="INVALID_ARGUMENT",
                                              exit_status=2))
            if str(exc).startswith("Unknown tool"):
                return _error_result(AkmError(f"{exc}. Tools: {', '.join(sorted(self._tool_manager._tools))}.",
                                              code="UNKNOWN_TOOL", exit_status=2))
            if cause is not None and not isinstance(cause, AkmError):
                # The last line of defence, as at the CLI: a coded INTERNAL error (the SDK logged the traceback
                # to stderr), never a bare "Error executing tool".
                return _error_result(AkmError(f"unexpected {type(cause).__name__}: {cause}", code="INTERNAL",
                                              exit_status=EXIT_INTERNAL,
                                              hint="this is a bug in akm; the server's stderr has the traceback."))
            raise


def build_server(*, holder: str | None = None, cwd: str | None = None) -> MCPServer:
    """The akm MCP server (also used in-process by tests)."""
    holder = holder or f"mcp:{uuid.uuid4()}"
    base_cwd = cwd or os.getcwd()
    server = _AkmServer(name="akm", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def _read_only(title: str) -> ToolAnnotations:
        return ToolAnnotations(title=title, read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                               open_world_hint=False)

    @server.tool(annotations=ToolAnnotations(title="Run a workflow", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=False, open_world_hint=True))
    async def workflow_run(
        target: Annotated[str, Field(description="A workflow file path, a workflows/<name> ref, or a run id to continue")],
        ctx: Context,
        params: Annotated[dict[str, Any], Field(description="Run params (only when starting a run)")] = {},  # noqa: B006
        max_steps: Annotated[int | str | None, Field(description="Finish at most this many steps now (0: start "
                                                                 "the run, drive nothing)")] = None,
        timeout: Annotated[int | str | None, Field(description="Stop this call after a duration like 30s or 5m "
                                                               "(or ms); the run stays active and continues on "
                                                               "the next call")] = None,
        cwd: Annotated[str | None, Field(description="Project directory (default: the server's)")] = None,
        new: Annotated[bool, Field(description="Start a new run even if one with the same params is active")] = False,
    ) -> Annotated[CallToolResult, McpRunResult]:
        """Start or continue a workflow run; akm runs command units itself and stops when the calling agent
        must act (status awaiting_session: see workflow_next) or the run finishes."""
        from akm.engine.cancel import Cancellation

        cancel = Cancellation()
        bound = _bound_s()
        try:
            timeout_ms = api.parse_duration_ms(timeout) if timeout is not None else None
        except AkmError as exc:
            return _error_result(exc)
        limit_ms = timeout_ms if timeout_ms is not None else int(bound * 1000)
        loop = anyio.lowlevel.current_token()  # progress arrives on the engine's worker threads

        sent = itertools.count(1)  # MCP progress must increase with every notification of a call
        sent_lock = threading.Lock()

        def progress(p: Any) -> None:
            if p.kind == "step":
                message = f"step {p.step_id} {p.status}"
            else:
                message = (f"step {p.step_id}: unit {p.done}/{p.total} {p.attempt_id} "
                           + ("ok" if p.ok else f"failed ({p.failure_reason})"))
            try:
                with sent_lock:  # numbered and sent in one order, whichever worker thread reports
                    anyio.from_thread.run(ctx.report_progress, next(sent), None, message, token=loop)
            except Exception:
                pass  # progress is advisory; a gone client must not stop the run

        def call() -> views.RunResult:
            kwargs: dict[str, Any] = dict(params=params or None, max_steps=max_steps, timeout_ms=limit_ms,
                                          cancel=cancel, on_progress=progress, cwd=cwd or base_cwd)
            if new:
                kwargs["new"] = True
            return api.run_workflow(target, **kwargs)

        try:
            result = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
        except AkmError as exc:
            return _error_result(exc)
        except anyio.get_cancelled_exc_class():
            cancel.trip("cancelled")  # the worker stops dispatch, kills units, releases the lease
            raise
        bound_hit = result.timed_out and timeout_ms is None
        if bound_hit:
            result.timed_out = False  # the call's own bound is not a user timeout
            result.aborted = False
        return _ok({**result.to_json(), "next": _next_step_for(result, bound_hit)})

    @server.tool(annotations=_read_only("What to do now"))
    async def workflow_next(
        run_id: Annotated[str, Field(description="The run id")],
        unit_id: Annotated[str | None, Field(description="Only this unit, whole")] = None,
    ) -> Annotated[CallToolResult, api.Brief]:
        """What you should do now for a run: its session units (prompt, context, schema, how to report) or the
        gate verdict it awaits. Never changes the run. Each unit's `report` names the unit_report arguments in
        camelCase: runId -> run_id, unitId -> unit_id, expectStep -> expect_step, status, rerun."""
        return await _call(api.next_brief, run_id, unit_id=unit_id)

    @server.tool(annotations=ToolAnnotations(title="Report a unit", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=True, open_world_hint=False))
    async def unit_report(
        run_id: Annotated[str, Field(description="The run id")],
        unit_id: Annotated[str, Field(description="The unitId from workflow_next (or STEP.gate:lN for a verdict)")],
        status: Annotated[Literal["completed", "failed", "running"],
                          Field(description="completed | failed | running (claims the unit)")] = "completed",
        result: Annotated[Any, Field(description="The unit's result: a JSON value matching its outputSchema, "
                                                 "or text")] = None,
        verdict: Annotated[dict[str, Any] | None, Field(description='A gate verdict {"complete": bool, "missing": '
                                                                    '[str], "feedback": str}')] = None,
        tokens: Annotated[int | None, Field(ge=0, le=MAX_REPORT_TOKENS,
                                             description="Tokens spent (counted against the budget)")] = None,
        failure_reason: Annotated[str | None, Field(description="Why the unit failed (e.g. timeout)")] = None,
        rerun: Annotated[bool, Field(description="Replace a result already recorded")] = False,
        expect_step: Annotated[str | None, Field(description="Refuse unless the run is still on this step")] = None,
        holder: Annotated[str | None, Field(description="Claim holder (default: this server); give parallel "
                                                        "sub-agents their own")] = None,
        attempt_id: Annotated[str | None, Field(description="The brief's attemptId")] = None,
        gate_loop: Annotated[int | None, Field(description="The brief's gateLoop")] = None,
    ) -> Annotated[CallToolResult, McpReportResult]:
        """Record a unit you did (or a gate verdict). When it completes the step's work the step finishes; then
        call workflow_run to continue the run. A refused report changes nothing."""
        return await _call_then(_with_next_after_report, api.report_unit, run_id, unit_id, status=status,
                                result=result, has_result=result is not None, verdict=verdict,
                                has_verdict=verdict is not None, tokens=tokens, failure_reason=failure_reason,
                                expect_step=expect_step, rerun=rerun, attempt_id=attempt_id, gate_loop=gate_loop,
                                holder=holder or holder_default, cwd=base_cwd)

    holder_default = holder

    @server.tool(annotations=_read_only("Run status"))
    async def workflow_status(
        run_id: Annotated[str, Field(description="The run id")],
        units: Annotated[bool, Field(description="Include every journaled unit attempt")] = False,
        step: Annotated[str | None, Field(description="Only this step, its output whole")] = None,
    ) -> Annotated[CallToolResult, RunViewModel]:
        """Where a run stands: steps, their outputs (large ones clipped: pass step for one whole), and (with
        units) every unit attempt."""
        return await _call(api.run_status, run_id, units=units, step=step)

    @server.tool(annotations=_read_only("List runs"))
    async def workflow_list(
        active: Annotated[bool, Field(description="Only runs that can still be driven")] = False,
        ref: Annotated[str | None, Field(description="Only runs of this workflow")] = None,
    ) -> Annotated[CallToolResult, RunListModel]:
        """Runs of this project, newest first."""
        return await _call(api.list_runs, active_only=active, ref=ref, cwd=base_cwd)

    @server.tool(annotations=_read_only("Lint workflows"))
    async def workflow_lint(
        paths: Annotated[list[str], Field(min_length=1, description="Workflow files or directories")],
    ) -> Annotated[CallToolResult, _lint_model()]:
        """Check workflow files: every problem with file, line, code and a fix."""
        resolved = [p if os.path.isabs(p) else str(Path(base_cwd) / p) for p in paths]
        return await _call(api.lint, resolved)

    @server.tool(annotations=ToolAnnotations(title="Resume a run", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=True, open_world_hint=False))
    async def workflow_resume(run_id: Annotated[str, Field(description="The run id")]) -> Annotated[CallToolResult,
                                                                                                    RunViewModel]:
        """Reopen a failed or blocked run (its current step is retried on the next workflow_run)."""
        return await _call(api.resume, run_id)

    @server.tool(annotations=ToolAnnotations(title="Abandon a run", read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=False, open_world_hint=False))
    async def workflow_abandon(run_id: Annotated[str, Field(description="The run id")]) -> Annotated[CallToolResult,
                                                                                                     RunViewModel]:
        """Give up on a run for good."""
        return await _call(api.abandon, run_id)

    @server.tool(annotations=_read_only("Workflow catalog"))
    async def workflow_catalog(
        cwd: Annotated[str | None, Field(description="Project directory (default: the server's)")] = None,
    ) -> Annotated[CallToolResult, CatalogModel]:
        """The workflows this project can run by name: its .akm/workflows/ then the user library, each with
        its ref (pass it to workflow_run as target), description, steps and params (name, type, description,
        required, default)."""
        return await _call(api.workflow_catalog, cwd=cwd or base_cwd)

    @server.tool(annotations=_read_only("Journal events"))
    async def workflow_events(
        run_id: Annotated[str | None, Field(description="Only this run's events")] = None,
        since: Annotated[str | None, Field(description="@offset:N (a previous nextOffset) or an ISO time")] = None,
        limit: Annotated[int | None, Field(ge=1, description="At most this many events")] = None,
    ) -> Annotated[CallToolResult, EventPageModel]:
        """Journal events, cursor-paged: pass nextOffset back as since=@offset:N."""
        return await _call(api.events, run_id=run_id, since=since, limit=limit)

    @server.tool(annotations=ToolAnnotations(title="Set up engines", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=True, open_world_hint=True))
    async def setup(
        yes: Annotated[bool, Field(description="Detect local model servers and agent CLIs, verify them, and write "
                                               "an llm and an agent engine where no default is set")] = False,
        config: Annotated[dict[str, Any] | None, Field(
            description="Config to deep-merge (engines, defaults, workflow, modelAliases); API keys only as "
                        "${ENV_NAME} references, never values")] = None,
        probe: Annotated[bool, Field(description="Also probe the default LLM engine for json_schema support and "
                                                 "record supportsJsonSchema")] = False,
        project: Annotated[bool, Field(description="Write the project file (.akm/config.json) instead of the "
                                                   "user file")] = False,
    ) -> Annotated[CallToolResult, api.SetupResult]:
        """Set up engines for akm on this machine: what was found, what was written, what can run now.
        Never asks anything. With no arguments it is a preview: it detects and verifies, writes nothing."""
        dry_run = not yes and config is None and not probe
        return await _call(api.setup, yes=yes, config=config, probe=probe, project=project, cwd=base_cwd,
                           dry_run=dry_run)

    @server.resource("akm://runs", name="runs", title="Runs of this project",
                     description="This project's runs, newest first (as workflow_list).", mime_type="application/json")
    def runs_resource() -> str:
        import json

        return json.dumps(api.list_runs(cwd=base_cwd).to_json(), ensure_ascii=False)

    @server.resource("akm://runs/{run_id}", name="run", title="A run",
                     description="Where a run stands (as workflow_status; large outputs clipped).",
                     mime_type="application/json")
    def run_resource(run_id: str) -> str:
        import json

        from akm import compact

        return json.dumps(compact.compact_run(api.run_status(run_id).to_json()), ensure_ascii=False)

    _finish_tools(server)
    _drop_prompts(server)
    return server


def _drop_prompts(server: MCPServer) -> None:
    """akm has no prompts: a server that answers prompts/list advertises the capability (and an empty list)."""
    try:
        handlers = server._lowlevel_server._request_handlers
    except AttributeError:  # an SDK that moved it: the capability stays advertised, with no prompts
        return
    for method in ("prompts/list", "prompts/get"):
        handlers.pop(method, None)


def _finish_tools(server: MCPServer) -> None:
    """What a client sees of each tool: the input schema generated from its request model (strict), a
    description without the docstring's indentation, and a title."""
    import inspect

    from akm import api_models

    for name, tool in server._tool_manager._tools.items():
        spec = _TOOL_ARGS.get(name)
        if spec is not None:
            model, only, renames = spec
            schema = api_models.tool_input_schema(getattr(api_models, model), only=only, renames=renames)
            schema.pop("description", None)
            tool.parameters = schema
        tool.description = inspect.cleandoc(tool.description or "")
        if tool.title is None and tool.annotations is not None and tool.annotations.title:
            tool.title = tool.annotations.title


def _lint_model() -> Any:
    """The workflow_lint output schema, derived from the lint report records (plain `View`s, no pydantic)."""
    from akm.format.lint import LintReport

    return _schema_model(LintReport)


def protocol_error_for(exc: Exception) -> Any:
    """The JSON-RPC error answering a line the SDK could not read, or None (nothing to answer).

    The SDK's stdio transport drops such a line silently, so a client waiting on its id would wait forever:
    * not JSON at all -> -32700 with id null (JSON-RPC 2.0: the id cannot be known);
    * JSON that is not Unicode text (a lone surrogate escape such as \\ud800, which JavaScript's
      JSON.stringify emits for a broken string) -> -32700 with the request's own id;
    * JSON that is not a valid message but carries an id and a method -> -32600 with that id.
    Notifications (no id) get no answer, as JSON-RPC wants.
    """
    import json

    import mcp_types as types
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError) or not exc.errors():
        return None
    first = exc.errors()[0]
    raw = first.get("input")
    if first.get("type") == "json_invalid" and isinstance(raw, (str, bytes)):
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):
            return types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
                code=types.PARSE_ERROR, message=f"Parse error: {first.get('msg')}"))
        rid = message.get("id") if isinstance(message, dict) else None
        if isinstance(rid, bool) or not isinstance(rid, (int, str)):
            return None
        return types.JSONRPCError(jsonrpc="2.0", id=rid, error=types.ErrorData(
            code=types.PARSE_ERROR, message=f"Parse error: the request is not Unicode text ({first.get('msg')}); "
                                            "send every string as valid UTF-8 (no lone surrogates)."))
    raw = next((e["input"] for e in exc.errors() if isinstance(e.get("input"), dict) and "id" in e["input"]), None)
    rid = raw.get("id") if raw is not None else None
    if isinstance(rid, bool) or not isinstance(rid, (int, str)) or "method" not in raw:
        return None
    as_request = [e for e in exc.errors() if e["loc"][:1] == ("JSONRPCRequest",)] or exc.errors()
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'message'}: {e['msg']}" for e in as_request[:5])
    return types.JSONRPCError(jsonrpc="2.0", id=rid, error=types.ErrorData(
        code=types.INVALID_REQUEST, message=f"Invalid request: {problems}"))


async def _serve_stdio(server: MCPServer) -> None:
    """`server.run_stdio_async`, but a line the transport cannot read is answered, not dropped."""
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    try:  # SDK internals (mcp 2.x): an SDK that moved them still serves, as the SDK itself does
        from mcp.shared._context_streams import create_context_streams
        low = server._lowlevel_server
    except (ImportError, AttributeError):
        await server.run_stdio_async()  # unreadable lines are then dropped by the SDK, not answered
        return

    async with stdio_server() as (read_stream, write_stream):
        relay_send, relay_receive = create_context_streams(0)

        async def relay() -> None:
            async with relay_send:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        answer = protocol_error_for(item)
                        if answer is not None:
                            await write_stream.send(SessionMessage(answer))
                            continue
                    await relay_send.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            await low.run(relay_receive, write_stream, low.create_initialization_options())
            tg.cancel_scope.cancel()


def serve() -> int:
    """`akm mcp`: speak MCP on stdin/stdout until the client goes away."""
    sys.stdout.flush()
    server = build_server()
    try:
        anyio.run(_serve_stdio, server)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0
