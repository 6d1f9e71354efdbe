"""How the MCP front answers: results, akm errors as `isError` results, and answers kept compact.

Every error a call can meet — an argument, an unknown tool, a domain error, a bug — is a tool result with the
same code and message the CLI prints; `_HINTS` gives the hints in MCP terms where the CLI's hint names a
shell command.
"""

from __future__ import annotations

from typing import Any

from mcp_types import CallToolResult, TextContent

from akm.errors import AkmError

# Hints in MCP terms for error codes whose CLI hint names shell commands.
_HINTS = {
    "RUN_NOT_FOUND": "List runs with workflow_list.",
    "RUN_ID_AMBIGUOUS": "Pass more of the run id; workflow_list shows them whole.",
    "RUN_NOT_ACTIVE": "Call workflow_status on the run: its recovery says what moves it on — workflow_resume (its "
    "current step is retried as it is) or workflow_rewind (back to an earlier step, e.g. to correct a result "
    "the step was built on) — then workflow_run.",
    "LEASE_HELD": "Another process is driving this run (another session, a detached driver): "
    "workflow_wait(run_id=<run id>) waits until it is done or needs you; then go on with workflow_run.",
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


def error_result(exc: AkmError) -> CallToolResult:
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


def ok_result(model: Any) -> CallToolResult:
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
