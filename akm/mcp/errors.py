"""How the MCP front answers: akm errors as `isError` results, and the server class that makes every error one.

`_AkmServer` checks each call's arguments against the tool's api request model before the SDK sees them,
turns argument, unknown-tool and unexpected errors into coded results (the same codes the CLI prints), and
clips large answers. `_HINTS` gives the hints in MCP terms where the CLI's hint names a shell command.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent

from akm.codes import Code
from akm.errors import AkmError, InternalError
from akm.mcp import drives as drives_mod
from akm.mcp import stdio as sdk

# Hints in MCP terms for error codes whose CLI hint names shell commands.
_HINTS = {
    "RUN_NOT_FOUND": "List runs with workflow_list.",
    "RUN_ID_AMBIGUOUS": "Pass more of the run id; workflow_list shows them whole.",
    "RUN_NOT_ACTIVE": "Call workflow_status on the run: its recovery says what moves it on — workflow_resume (its "
    "current step is retried as it is) or workflow_rewind (back to an earlier step, e.g. to correct a result "
    "the step was built on) — then workflow_run.",
    "LEASE_HELD": "Another invocation is driving this run; wait for it (workflow_run(target=<run id>) waits for "
    "this server's own driver; stop=true stops it), then try again.",
    "LEASE_LOST": "Another driver took this run over (this one was too slow to renew its lease); call "
    "workflow_status to see who drives it now.",
    "WORKFLOW_INVALID": "Call workflow_lint on the file for every problem and its fix.",
    "UNKNOWN_UNIT": "Call workflow_next for the units of the current step; a unit of a finished step is done "
    "again by going back to it: workflow_rewind(run_id=<run id>, to_step=<its step>).",
    "STEP_MISMATCH": "The run moved on: call workflow_next and report against the new step.",
    "STEP_CLOSED": "Go back to that step with workflow_rewind(run_id=<run id>, to_step=<that step>), then report "
    "the unit again with rerun=true; later steps are redone only where their inputs change.",
    "STALE_REPORT": "Call workflow_next: report the current attempt (its attemptId) with the gate's feedback.",
    "REPLAY_DIVERGED": "The journal no longer matches the run's plan: go back to the unit's step with "
    "workflow_rewind(run_id=<run id>, to_step=<its step>, redo=true), then workflow_run.",
    "BUDGET_EXCEEDED": "The run's budget is spent (a rewind gives none back): raise it in the workflow file, then "
    "workflow_run(target=<the workflow file>, from_run=<run id>) starts a new run that reuses every completed "
    "unit.",
    "RESULT_INVALID": "Correct the result so it matches the unit's outputSchema and report again.",
    "RESULT_REQUIRED": "Report the unit's result (a JSON value matching its outputSchema).",
    "REPORT_CONFLICT": "Pass rerun=true to replace the recorded result.",
    "UNIT_TERMINAL": "Pass rerun=true to do the finished unit again.",
    "CLAIM_EXPIRED": 'Report status="running" to claim the unit again, then report its result.',
    "NOT_AWAITING_VERDICT": "Call workflow_next to see what the run needs now.",
    "RUN_ALREADY_ACTIVE": "Continue that run with workflow_run(target=<its run id>).",
    "RUN_ABANDONED": "The run was abandoned for good: workflow_run(target=<the workflow file>, from_run=<run id>) "
    "starts a new one that reuses its completed units.",
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
    details = exc.details or {}
    if exc.code == "RUN_NOT_ACTIVE" and details.get("status") not in (None, "failed", "blocked"):
        hint = None  # resuming is for failed or blocked runs; the message says what the run is
    elif exc.code in ("RUN_NOT_ACTIVE", "RUN_ABANDONED") and isinstance(details.get("runId"), str):
        hint = (
            f'Call workflow_status(run_id="{details["runId"]}"): its next says what moves the run on (a resume, a '
            "rewind to an earlier step, or a new run that reuses its completed units)."
        )
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


# Each tool's arguments are one api request model's fields (`akm.api._models`): the tool's input schema is
# generated from it and every call is checked by it before the SDK sees the arguments, so an unknown or
# misspelt argument is INVALID_ARGUMENT naming it, never dropped. (model, the fields taken, renames)
_TOOL_ARGS: dict[str, tuple[str, tuple[str, ...] | None, dict[str, str] | None]] = {
    "workflow_run": (
        "RunToolRequest",
        ("target", "params", "max_steps", "timeout", "cwd", "new", "from_run", "workers", "stop", "plan"),
        None,
    ),
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
    "workflow_rewind": ("RewindRequest", None, None),
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
    """A tool's answer within `akm.mcp.compact.ANSWER_LIMIT`: large outputs, inputs and prompts clipped, each
    with its size and the call that returns it whole (which itself answers unclipped)."""
    from akm.mcp import compact

    if not isinstance(result, CallToolResult) or result.is_error or not isinstance(result.structured_content, dict):
        return result
    data = result.structured_content
    if name == "workflow_run" and isinstance(data.get("run"), dict):
        compact.compact_run(data["run"])
    elif name in ("workflow_status", "workflow_resume", "workflow_abandon") and arguments.get("step") is None:
        compact.compact_run(data)
    elif name == "workflow_rewind" and isinstance(data.get("run"), dict):
        compact.compact_run(data["run"])
        compact.compact_run({"runId": data["run"].get("runId"), "rewinds": [data.get("rewind") or {}]})
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

        tools = sdk.tool_table_if_present(self)
        tool = tools.get(name) if isinstance(tools, dict) and isinstance(arguments, dict) else None
        problems = _uncoerced(arguments, getattr(tool, "parameters", None)) if tool is not None else []
        if problems:
            return _error_result(
                AkmError(f"Invalid arguments for {name}: {'; '.join(problems)}.", code=Code.INVALID_ARGUMENT)
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
                return _error_result(AkmError(f"Invalid arguments for {name}: {problems}.", code=Code.INVALID_ARGUMENT))
            if str(exc).startswith("Unknown tool"):
                return _error_result(
                    AkmError(
                        f"{exc}. Tools: {', '.join(sorted(sdk.tool_table(self)))}.",
                        code=Code.UNKNOWN_TOOL,
                    )
                )
            if cause is not None and not isinstance(cause, AkmError):
                # The last line of defence, as at the CLI: a coded INTERNAL error (the SDK logged the traceback
                # to stderr), never a bare "Error executing tool".
                return _error_result(
                    InternalError(
                        f"unexpected {type(cause).__name__}: {cause}",
                        code=Code.INTERNAL,
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
