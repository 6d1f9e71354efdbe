"""The MCP front (`akm mcp`): each tool is one `akm.api` call over stdio.

Like the CLI this module holds no workflow logic. It translates arguments,
runs the (blocking) api call in a worker thread, turns `AkmError` into an
`isError` result carrying the same code and message the CLI prints, and adds
its own hints — an agent is told which tool to call next, never a shell
command. `mcp` is imported only here: the CLI never pays for it.

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
from akm.mcp import drives as drives_mod

DEFAULT_CALL_BOUND_S = 45.0

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

# Hints in MCP terms for error codes whose CLI hint names shell commands.
_HINTS = {
    "RUN_NOT_FOUND": "List runs with workflow_list.",
    "RUN_NOT_ACTIVE": "Reopen a failed or blocked run with workflow_resume, then workflow_run.",
    "LEASE_HELD": "Another invocation is driving this run; wait for it, then call workflow_next again.",
    "LEASE_LOST": "Another driver took this run over (this one was too slow to renew its lease); call "
    "workflow_status to see who drives it now.",
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
    "CLAIM_EXPIRED": 'Report status="running" to claim the unit again, then report its result.',
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
    return CallToolResult(
        content=[
            TextContent(type="text", text=text),
            TextContent(type="text", text=json.dumps(body, ensure_ascii=False)),
        ],
        is_error=True,
    )


def _ok(model: Any) -> CallToolResult:
    import json

    if isinstance(model, dict):
        data = model
    elif hasattr(model, "to_json"):
        data = model.to_json()
    else:
        data = model.model_dump(mode="json", by_alias=True)

    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))], structured_content=data
    )


def _html_resource(uri: str, text: str) -> Any:
    """An HTML page as an embedded `text/html` resource (the run report of `workflow_status(format="html")`)."""
    from mcp_types import EmbeddedResource, TextResourceContents

    return EmbeddedResource(type="resource", resource=TextResourceContents(uri=uri, mime_type="text/html", text=text))


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
    model = create_model(
        cls.__name__ + ("Result" if extra else ""),
        __doc__=cls.__doc__,
        __config__=ConfigDict(alias_generator=to_camel, populate_by_name=True),
        **fields_,
    )
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


def _next_step_for(result: views.RunResult) -> str | None:
    status = result.run.status
    rid = result.run.run_id
    if status == "awaiting_session":
        return _next_for_brief((result.run.awaiting or {}), rid)
    if status == "active" and result.driving:
        return (
            f"The run is still going in the background (units keep running after this call). Call "
            f'workflow_run(target="{rid}") to wait for it again: it attaches and reports what happened '
            f'meanwhile. Stop it with workflow_run(target="{rid}", stop=true).'
        )
    if status == "active":
        return f'Call workflow_run(target="{rid}") to continue.'
    if status in ("failed", "blocked"):
        return (
            f'Inspect with workflow_status(run_id="{rid}"); fix the cause, then workflow_resume and '
            "workflow_run to retry (completed units are reused)."
        )
    return None


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


class _ProgressReporter:
    """Sends a call's progress notifications without ever holding up the driver.

    The driver drops messages into the call's mailbox (`drives.Listener`); this reporter sends them from the
    call's own task, each with a short bound, so a client that stops reading stalls only its own call. MCP wants
    `progress` to increase with every notification: progress and total accumulate over the steps this call
    reports — a step of N units counts N + 1 (each unit, then the step's own finish), so for one step `progress`
    is units done and the step's finish is the last, highest tick.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.offset = 0  # ticks of the steps finished earlier in this call
        self.step: str | None = None
        self.step_total = 0
        self.step_done = 0
        self.sent = 0.0
        self.gone = False

    async def send(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            if self.gone:
                return
            if item["kind"] == "step_started":
                self._open(item["stepId"])
                self.step_total = item["total"]
                continue  # nothing finished yet: no tick
            if item["kind"] == "unit":
                if item["stepId"] != self.step or item["done"] <= self.step_done:
                    self._open(item["stepId"])  # another step, or another pass (gate loop) of this one
                self.step_done, self.step_total = item["done"], max(item["total"], self.step_total)
                value, total = self.offset + item["done"], self.offset + self.step_total + 1
                mark = "ok" if item["ok"] else f"failed ({item['failureReason']})"
                message = f"step {item['stepId']}: unit {item['done']}/{item['total']} {item['attemptId']} {mark}"
            else:
                if item["stepId"] != self.step:
                    self._open(item["stepId"])
                value = total = self.offset + self.step_total + 1
                message = f"step {item['stepId']} {item['status']}"
                self._close()
            if value <= self.sent:
                continue  # progress must increase; a repeat carries nothing new
            self.sent = value
            with anyio.move_on_after(2.0) as scope:
                try:
                    await self.ctx.report_progress(value, total, message)
                except Exception:
                    self.gone = True  # progress is advisory; a gone client must not fail the call
            if scope.cancelled_caught:
                self.gone = True  # the client is not reading: send nothing more on this call

    def _close(self) -> None:
        if self.step is not None:
            self.offset += self.step_total + 1
        self.step, self.step_total, self.step_done = None, 0, 0

    def _open(self, step: str) -> None:
        self._close()
        self.step = step


def _next_for_brief(brief: dict[str, Any], rid: str) -> str:
    """What to do with a brief the answer already holds (run.awaiting, or a report's brief)."""
    kind = brief.get("kind")
    if kind == "units":
        return (
            "Do each unit in run.awaiting.units (prompt, context, outputSchema) and report it with "
            "unit_report(**unit.report, result=...); the report that finishes the step's units answers with "
            f'the judge brief if a gate needs a verdict, else call workflow_run(target="{rid}").'
        )
    if kind == "judge":
        return (
            "Judge run.awaiting.judge.artifact against its criteria and report unit_report(**judge.report, "
            'verdict={"complete": bool, "missing": [...], "feedback": "..."}).'
        )
    return f'Call workflow_next(run_id="{rid}") for what the run needs now.'


def _next_after_report(res: dict[str, Any]) -> str | None:
    """A report answer's `next`: what its own fields already say the agent must do."""
    rid, outcome, status = res["runId"], res.get("stepOutcome") or {}, res.get("runStatus")
    brief = res.get("brief")
    if status == "completed":
        return None
    if brief and brief.get("kind") == "judge":
        return (
            "The step's units are done: judge brief.judge.artifact against its criteria and report "
            'unit_report(**brief.judge.report, verdict={"complete": bool, "missing": [...], '
            '"feedback": "..."}).'
        )
    if brief and brief.get("kind") == "units":
        return (
            "The gate sent the step back: redo each unit in brief.units with brief.gateFeedback and report it "
            "with unit_report(**unit.report, result=...) (it names the new attemptId)."
        )
    if status in ("failed", "blocked"):
        return (
            f'The run is {status}: inspect it with workflow_status(run_id="{rid}"), fix the cause, then '
            f'workflow_resume(run_id="{rid}") and workflow_run(target="{rid}").'
        )
    if outcome.get("kind") == "completed" or status == "active":
        return f'Call workflow_run(target="{rid}") to go on: its answer carries the next brief in run.awaiting.'
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


# Each tool's arguments are one api request model's fields (`akm.api._models`): the tool's input schema is
# generated from it and every call is checked by it before the SDK sees the arguments, so an unknown or
# misspelt argument is INVALID_ARGUMENT naming it, never dropped. (model, the fields taken, renames)
_TOOL_ARGS: dict[str, tuple[str, tuple[str, ...] | None, dict[str, str] | None]] = {
    "workflow_run": ("RunToolRequest", ("target", "params", "max_steps", "timeout", "cwd", "new", "stop"), None),
    "workflow_next": ("NextRequest", None, None),
    "unit_report": (
        "ReportRequest",
        (
            "run_id",
            "unit_id",
            "status",
            "result",
            "verdict",
            "tokens",
            "failure_reason",
            "rerun",
            "expect_step",
            "attempt_id",
            "gate_loop",
            "holder",
        ),
        None,
    ),
    "workflow_status": ("StatusToolRequest", None, None),
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
    from akm.api import _models as api_models

    spec = _TOOL_ARGS.get(name)
    if spec is None:
        return arguments or {}
    model, only, renames = spec
    given = api_models.front_arguments(
        getattr(api_models, model), dict(arguments or {}), only=only, renames=renames, call=name
    )
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
    compacted = _ok(data)
    compacted.content.extend(result.content[1:])  # blocks beyond the JSON text (the HTML report) stay as they are
    return compacted


class _AkmServer(MCPServer):
    """MCPServer whose argument errors carry a code like every other akm error, and which owns the
    background drivers of its runs (`drives`)."""

    drives: drives_mod.Drives

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError
        from pydantic import ValidationError

        tools = getattr(getattr(self, "_tool_manager", None), "_tools", None)  # SDK internals: checked if present
        tool = tools.get(name) if isinstance(tools, dict) and isinstance(arguments, dict) else None
        problems = _uncoerced(arguments, getattr(tool, "parameters", None)) if tool is not None else []
        if problems:
            return _error_result(
                AkmError(
                    f"Invalid arguments for {name}: {'; '.join(problems)}.", code="INVALID_ARGUMENT", exit_status=2
                )
            )
        try:
            arguments = _checked_arguments(name, arguments)
        except AkmError as exc:
            return _error_result(exc)
        try:
            return _compacted(name, arguments, await super().call_tool(name, arguments, context))
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in cause.errors()
                )
                return _error_result(
                    AkmError(f"Invalid arguments for {name}: {problems}.", code="INVALID_ARGUMENT", exit_status=2)
                )
            if str(exc).startswith("Unknown tool"):
                return _error_result(
                    AkmError(
                        f"{exc}. Tools: {', '.join(sorted(self._tool_manager._tools))}.",
                        code="UNKNOWN_TOOL",
                        exit_status=2,
                    )
                )
            if cause is not None and not isinstance(cause, AkmError):
                # The last line of defence, as at the CLI: a coded INTERNAL error (the SDK logged the traceback
                # to stderr), never a bare "Error executing tool".
                return _error_result(
                    AkmError(
                        f"unexpected {type(cause).__name__}: {cause}",
                        code="INTERNAL",
                        exit_status=EXIT_INTERNAL,
                        hint="this is a bug in akm; the server's stderr has the traceback.",
                    )
                )
            raise


_JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    dict: "object",
    list: "array",
    type(None): "null",
}


def _uncoerced(arguments: dict[str, Any], schema: Any) -> list[str]:
    """Arguments whose JSON type the tool's schema does not take, where pydantic would coerce them
    (`"tokens": "5"` read as 5, `"rerun": "yes"` or `1` as true, `true` as the integer 1): an agent that
    sends the wrong type should hear so, not have its value reinterpreted."""
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    problems = []
    for key, value in arguments.items():
        prop = props.get(key)
        if not isinstance(prop, dict):
            continue
        allowed = {
            t
            for t in ([prop.get("type")] + [a.get("type") for a in prop.get("anyOf", []) if isinstance(a, dict)])
            if isinstance(t, str)
        }
        if not allowed or not allowed <= {"integer", "number", "boolean", "null"}:
            continue  # strings, objects, arrays and untyped values are taken as they come
        got = _JSON_TYPES.get(type(value), "a value")
        fits = (
            got in allowed
            or (got == "integer" and "number" in allowed)
            or (got == "number" and "integer" in allowed and float(value).is_integer())
        )
        if not fits:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
            problems.append(
                f"{key}: expected {' or '.join(sorted(allowed))}, got {got} {shown} (no conversion from other types)"
            )
    return problems


def build_server(*, holder: str | None = None, cwd: str | None = None) -> MCPServer:
    """The akm MCP server (also used in-process by tests)."""
    holder = holder or f"mcp:{uuid.uuid4()}"
    base_cwd = cwd or os.getcwd()
    server = _AkmServer(name="akm", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    drives = server.drives = drives_mod.Drives(cwd=base_cwd)

    def _read_only(title: str) -> ToolAnnotations:
        return ToolAnnotations(
            title=title, read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        )

    @server.tool(
        annotations=ToolAnnotations(
            title="Run a workflow",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=True,
        )
    )
    async def workflow_run(
        target: Annotated[
            str, Field(description="A workflow file path, a workflows/<name> ref, or a run id to continue")
        ],
        ctx: Context,
        params: Annotated[dict[str, Any], Field(description="Run params (only when starting a run)")] = {},  # noqa: B006
        max_steps: Annotated[
            int | str | None,
            Field(
                description="Finish at most this many steps now (0: start "
                "the run, drive nothing); only when this call "
                "starts the run's driver"
            ),
        ] = None,
        timeout: Annotated[
            int | str | None,
            Field(
                description="How long this call waits for the run, like 30s or "
                "5m (or ms; default: the server's bound, 45 s); the "
                "run keeps going in the background either way"
            ),
        ] = None,
        cwd: Annotated[str | None, Field(description="Project directory (default: the server's)")] = None,
        new: Annotated[bool, Field(description="Start a new run even if one with the same params is active")] = False,
        stop: Annotated[
            bool,
            Field(
                description="Stop this server's background driver of the run (target: its run "
                "id); running units are stopped, the run stays resumable"
            ),
        ] = False,
    ) -> Annotated[CallToolResult, McpRunResult]:
        """Start or continue a workflow run. akm drives it in the background (command units run in this server's
        process); the call waits up to its bound and returns when the run completes, fails, or needs you (status
        awaiting_session: see workflow_next) — or with the run still going (driving: true) and per-step progress.
        Calling again attaches to the same driver; cancelling a call only stops waiting."""
        try:
            wait_ms = api.parse_duration_ms(timeout) if timeout is not None else int(_bound_s() * 1000)
        except AkmError as exc:
            return _error_result(exc)
        if stop:
            return await _call(_stop_run, drives, target)
        try:
            drive, opened = await anyio.to_thread.run_sync(
                lambda: drives.start_or_attach(
                    target, params=params or None, new=new, max_steps=max_steps, cwd=cwd or base_cwd
                )
            )
        except AkmError as exc:
            return _error_result(exc)
        listener = drive.listen()
        reporter = _ProgressReporter(ctx)
        try:
            with anyio.move_on_after(wait_ms / 1000.0):
                while True:
                    await reporter.send(listener.take())
                    if drive.finished.is_set():
                        break
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
            return _error_result(exc)
        return _ok({**result.to_json(), "next": _next_step_for(result)})

    @server.tool(annotations=_read_only("What to do now"))
    async def workflow_next(
        run_id: Annotated[str, Field(description="The run id")],
        unit_id: Annotated[str | None, Field(description="Only this unit, whole")] = None,
    ) -> Annotated[CallToolResult, api.Brief]:
        """What you should do now for a run: its session units (prompt, context, schema, how to report) or the
        gate verdict it awaits. Never changes the run. Each unit's `report` names the unit_report arguments in
        camelCase: runId -> run_id, unitId -> unit_id, expectStep -> expect_step, status, rerun."""
        return await _call(api.next_brief, run_id, unit_id=unit_id)

    @server.tool(
        annotations=ToolAnnotations(
            title="Report a unit",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        )
    )
    async def unit_report(
        run_id: Annotated[str, Field(description="The run id")],
        unit_id: Annotated[str, Field(description="The unitId from workflow_next (or STEP.gate:lN for a verdict)")],
        status: Annotated[
            Literal["completed", "failed", "running"],
            Field(description="completed | failed | running (claims the unit)"),
        ] = "completed",
        result: Annotated[
            Any, Field(description="The unit's result: a JSON value matching its outputSchema, or text")
        ] = None,
        verdict: Annotated[
            dict[str, Any] | None,
            Field(description='A gate verdict {"complete": bool, "missing": [str], "feedback": str}'),
        ] = None,
        tokens: Annotated[
            int | None, Field(ge=0, le=MAX_REPORT_TOKENS, description="Tokens spent (counted against the budget)")
        ] = None,
        failure_reason: Annotated[str | None, Field(description="Why the unit failed (e.g. timeout)")] = None,
        rerun: Annotated[bool, Field(description="Replace a result already recorded")] = False,
        expect_step: Annotated[str | None, Field(description="Refuse unless the run is still on this step")] = None,
        holder: Annotated[
            str | None, Field(description="Claim holder (default: this server); give parallel sub-agents their own")
        ] = None,
        attempt_id: Annotated[str | None, Field(description="The brief's attemptId")] = None,
        gate_loop: Annotated[int | None, Field(description="The brief's gateLoop")] = None,
    ) -> Annotated[CallToolResult, McpReportResult]:
        """Record a unit you did (or a gate verdict). When it completes the step's work the step finishes; then
        call workflow_run to continue the run. A refused report changes nothing."""
        return await _call_then(
            _with_next_after_report,
            api.report_unit,
            run_id,
            unit_id,
            status=status,
            result=result,
            has_result=result is not None,
            verdict=verdict,
            has_verdict=verdict is not None,
            tokens=tokens,
            failure_reason=failure_reason,
            expect_step=expect_step,
            rerun=rerun,
            attempt_id=attempt_id,
            gate_loop=gate_loop,
            holder=holder or holder_default,
            cwd=base_cwd,
        )

    holder_default = holder

    @server.tool(annotations=_read_only("Run status"))
    async def workflow_status(
        run_id: Annotated[str, Field(description="The run id")],
        units: Annotated[bool, Field(description="Include every journaled unit attempt")] = False,
        step: Annotated[str | None, Field(description="Only this step, its output whole")] = None,
        format: Annotated[
            Literal["json", "html"],
            Field(  # noqa: A002 (the CLI's flag name)
                description="html: also a self-contained HTML report of the run (a text/html resource)"
            ),
        ] = "json",
    ) -> Annotated[CallToolResult, RunViewModel]:
        """Where a run stands: steps, their outputs (large ones clipped: pass step for one whole), and (with
        units) every unit attempt; format html adds a self-contained HTML report."""
        result = await _call(api.run_status, run_id, units=units, step=step)
        if format == "html" and not result.is_error:
            try:
                page = await anyio.to_thread.run_sync(lambda: api.run_report_html(run_id))
            except AkmError as exc:
                return _error_result(exc)
            result.content.append(_html_resource(f"akm://runs/{run_id}/report.html", page))
        return result

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

    @server.tool(
        annotations=ToolAnnotations(
            title="Resume a run",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        )
    )
    async def workflow_resume(
        run_id: Annotated[str, Field(description="The run id")],
    ) -> Annotated[CallToolResult, RunViewModel]:
        """Reopen a failed or blocked run (its current step is retried on the next workflow_run)."""
        return await _call(api.resume, run_id)

    @server.tool(
        annotations=ToolAnnotations(
            title="Abandon a run",
            read_only_hint=False,
            destructive_hint=True,
            idempotent_hint=False,
            open_world_hint=False,
        )
    )
    async def workflow_abandon(
        run_id: Annotated[str, Field(description="The run id")],
    ) -> Annotated[CallToolResult, RunViewModel]:
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

    @server.tool(
        annotations=ToolAnnotations(
            title="Set up engines",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=True,
        )
    )
    async def setup(
        yes: Annotated[
            bool,
            Field(
                description="Detect local model servers and agent CLIs, verify them, and write "
                "an llm and an agent engine where no default is set"
            ),
        ] = False,
        config: Annotated[
            dict[str, Any] | None,
            Field(
                description="Config to deep-merge (engines, defaults, workflow, modelAliases); API keys only as "
                "${ENV_NAME} references, never values"
            ),
        ] = None,
        probe: Annotated[
            bool,
            Field(
                description="Also probe the default LLM engine for json_schema support and record supportsJsonSchema"
            ),
        ] = False,
        project: Annotated[
            bool, Field(description="Write the project file (.akm/config.json) instead of the user file")
        ] = False,
    ) -> Annotated[CallToolResult, api.SetupResult]:
        """Set up engines for akm on this machine: what was found, what was written, what can run now.
        Never asks anything. With no arguments it is a preview: it detects and verifies, writes nothing."""
        dry_run = not yes and config is None and not probe
        return await _call(
            api.setup, yes=yes, config=config, probe=probe, project=project, cwd=base_cwd, dry_run=dry_run
        )

    @server.resource(
        "akm://runs",
        name="runs",
        title="Runs of this project",
        description="This project's runs, newest first (as workflow_list).",
        mime_type="application/json",
    )
    def runs_resource() -> str:
        import json

        return json.dumps(api.list_runs(cwd=base_cwd).to_json(), ensure_ascii=False)

    @server.resource(
        "akm://runs/{run_id}",
        name="run",
        title="A run",
        description="Where a run stands (as workflow_status; large outputs clipped).",
        mime_type="application/json",
    )
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

    from akm.api import _models as api_models

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


async def _serve_stdio(server: MCPServer) -> None:
    """`server.run_stdio_async`, but with bounded lines and every request answered (`akm.mcp.stdio`)."""
    from akm.mcp import stdio as mcp_stdio

    low = getattr(server, "_lowlevel_server", None)
    drives = getattr(server, "drives", None)
    on_eof = (lambda: drives.shutdown(wait_s=0)) if drives is not None else None  # the session ended: stop runs
    if low is None or not await mcp_stdio.serve(low, low.create_initialization_options(), on_eof):
        await server.run_stdio_async()  # an SDK that moved its internals: its own loop (unreadable lines dropped)


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
        anyio.run(_serve_stdio, server)
    except BrokenPipeError:
        status = 0
    finally:
        server.drives.shutdown()
    return status
