"""The MCP tools and resources: each one `akm.api` call, run off the event loop in a worker thread.

No workflow logic lives here: a tool translates its arguments, calls the api, and adds what this front
knows — the `next` an agent should call (a tool name, never a shell command) and progress notifications.
The tools are registered on one server by `register`; their names, docstrings and signatures are what a
client sees (the input schemas are then regenerated from the api request models, `akm.mcp.errors`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from akm import api, views
from akm.api import MAX_UNIT_TOKENS as MAX_REPORT_TOKENS
from akm.errors import AkmError
from akm.mcp import drives as drives_mod
from akm.mcp.errors import _error_result, _ok
from akm.mcp.schemas import (
    CatalogModel,
    EventPageModel,
    McpReportResult,
    McpRewindResult,
    McpRunResult,
    McpStatusResult,
    RunListModel,
    RunViewModel,
    _lint_model,
)
from akm.report.live import activity_text
from akm.report.timeline_svg import duration_text

DEFAULT_CALL_BOUND_S = 45.0


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


# Every run id argument takes what `akm.api._run_ids` resolves (the same forms as the CLI's RUN).
RUN_ID_HELP = "The run id: whole, its first 6 or more characters, or @last (this project's newest run)"


def _with_next_after_report(res: Any) -> dict[str, Any]:
    data = res.to_json()
    data["next"] = _next_after_report(data)
    return data


def _status_with_next(view: views.RunView) -> dict[str, Any]:
    data = view.to_json()
    data["next"] = remedy_text(view.recovery, view.run_id) if view.recovery else None
    return data


def _plan_answer(preview: views.RunPreview) -> dict[str, Any]:
    """`workflow_run(plan=true)`: the run answer's keys with nothing driven (`run` null: the preview names the
    run it would continue), the preview in `plan`."""
    body: dict[str, Any] = {key: None for key, _ in _RUN_RESULT_KEYS}
    body.update(executed=[], stepsProcessed=0, done=False, aborted=False, timedOut=False, started=False)
    body.update(driving=False, warnings=list(preview.warnings), plan=preview.to_json())
    how = f'workflow_run(target="{preview.run_id}")' if preview.run_id else "workflow_run with the same arguments"
    body["next"] = f"Nothing was run or written. To do it, call {how} without plan. First it would: {preview.first}."
    return body


_RUN_RESULT_KEYS = [(views.to_camel(name), default) for name, default in views.fields_of(views.RunResult)]


def _with_next_after_rewind(res: Any) -> dict[str, Any]:
    data = res.to_json()
    rid, step = data["run"]["runId"], data["rewind"]["toStep"]
    data["next"] = (
        f'Call workflow_run(target="{rid}") to go on from step {step}: units whose inputs did not change are '
        "reused, not run; when the step needs you, the answer carries the brief in run.awaiting (units you did "
        "before are offered with action rerun: report them with unit_report(**unit.report, result=...))."
    )
    return data


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
    if status in ("failed", "blocked", "abandoned") and result.run.recovery:
        return remedy_text(result.run.recovery, rid)
    return None


def remedy_text(rec: dict[str, Any], rid: str) -> str:
    """A run's `recovery` (akm/engine/recovery.py) as the tool calls that carry it out."""
    import json

    why = str(rec.get("why") or "")
    why = why[:1].upper() + why[1:]
    action = rec.get("action")
    if action == "resume":
        if rec.get("then") == "judge":
            return (
                f'{why}. Call workflow_resume(run_id="{rid}"), then workflow_next(run_id="{rid}"): its judge brief '
                "is the verdict to give; report it with unit_report(**judge.report, verdict={...}). Alternatively "
                "workflow_run asks the judge engine again."
            )
        return f'{why}. Call workflow_resume(run_id="{rid}"), then workflow_run(target="{rid}").'
    if action == "rewind":
        redo = ", redo=true" if rec.get("redo") else ""
        return (
            f'{why}. Call workflow_rewind(run_id="{rid}", to_step="{rec.get("stepId")}"{redo}), then '
            f'workflow_run(target="{rid}"): its answer carries what you must do again.'
        )
    params = json.dumps(rec.get("params") or {}, ensure_ascii=False)
    return (
        f"{why}. Change the workflow file if that is the cause, then call workflow_run("
        f'target={json.dumps(rec.get("workflow"))}, params={params}, from_run="{rec.get("fromRun") or rid}").'
    )


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
        self.between = 0  # activity reports since the last unit tick
        self.between_at = -1  # the units done when they started

    async def send(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            if self.gone:
                return
            if item["kind"] == "step_started":
                self._open(item["stepId"])
                self.step_total = item["total"]
                continue  # nothing finished yet: no tick
            if item["kind"] == "unit_activity":
                # between two unit ticks: a fraction that grows with each report, so progress still increases
                if item["stepId"] != self.step:
                    self._open(item["stepId"])
                self.between = self.between + 1 if self.between_at == self.step_done else 1
                self.between_at = self.step_done
                value = self.offset + self.step_done + 1 - 1 / (self.between + 1)
                total = self.offset + max(self.step_total, self.step_done + 1) + 1
                a = item["activity"]
                message = (
                    f"step {item['stepId']}: {item['attemptId']} {activity_text(a)} "
                    f"({duration_text(a.get('elapsedS') or 0)})"
                )
                await self._report(value, total, message)
                continue
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
            await self._report(value, total, message)

    async def _report(self, value: float, total: float, message: str) -> None:
        if value <= self.sent:
            return  # progress must increase; a repeat carries nothing new
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
        if res.get("recovery"):
            return f"The run is {status}. " + remedy_text(res["recovery"], rid)
        return f'The run is {status}: workflow_status(run_id="{rid}") says what moves it on (its recovery).'
    if outcome.get("kind") == "completed" or status == "active":
        return f'Call workflow_run(target="{rid}") to go on: its answer carries the next brief in run.awaiting.'
    if res.get("recorded") == "heartbeat" or res.get("status") == "running":
        return "Report the unit's result with unit_report (status completed) before its claim expires."
    if res.get("remainingUnits"):
        return f"{res['remainingUnits']} unit(s) of the step still need a report."
    if not outcome and status == "awaiting_session":  # nothing unreported, yet the step waits: a re-run
        return (
            f'The step waits for a failed unit to be re-run (its retry.on lists the reason): call workflow_next(run_id="{rid}") '
            "and report it with unit_report(**unit.report, result=...) (its report says rerun)."
        )
    return None


def _bound_s() -> float:
    raw = os.environ.get("AKM_MCP_CALL_BOUND", "").strip()
    if not raw:
        return DEFAULT_CALL_BOUND_S
    try:
        return max(0.1, float(raw.rstrip("s")))
    except ValueError:
        return DEFAULT_CALL_BOUND_S


def register(server: MCPServer, drives: drives_mod.Drives, *, holder: str, base_cwd: str) -> None:
    """Register every tool and resource on `server`; they drive runs through `drives`, claim units as
    `holder` by default, and resolve relative paths against `base_cwd`."""

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
        from_run: Annotated[
            str | None,
            Field(
                description="Start a new run of the (edited) workflow that reuses every completed unit of this "
                "run whose identity (step definition and inputs) is unchanged: nothing runs again for them"
            ),
        ] = None,
        workers: Annotated[
            bool,
            Field(
                description="Coordinate only: queue exec, LLM and agent units for `akm worker` processes "
                "sharing the journal (any host) and wait for their results; only when this call starts the "
                "run's driver"
            ),
        ] = False,
        stop: Annotated[
            bool,
            Field(
                description="Stop this server's background driver of the run (target: its run "
                "id); running units are stopped, the run stays resumable"
            ),
        ] = False,
        plan: Annotated[
            bool,
            Field(
                description="Preview only, writing nothing: per step the units reused, to run and for you, "
                "engines and models, budgets, and what the run would do first (in the answer's plan)"
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
        if plan:
            return await _call_then(
                _plan_answer,
                api.plan_run,
                target,
                params=params or None,
                new=new,
                from_run=from_run,
                cwd=cwd or base_cwd,
            )
        try:
            drive, opened = await anyio.to_thread.run_sync(
                lambda: drives.start_or_attach(
                    target,
                    params=params or None,
                    new=new,
                    from_run=from_run,
                    max_steps=max_steps,
                    cwd=cwd or base_cwd,
                    workers=workers,
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
        run_id: Annotated[str, Field(description=RUN_ID_HELP)],
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
        run_id: Annotated[str, Field(description=RUN_ID_HELP)],
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
            verdict=verdict,
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
        run_id: Annotated[str, Field(description=RUN_ID_HELP)],
        units: Annotated[bool, Field(description="Include every journaled unit attempt")] = False,
        step: Annotated[str | None, Field(description="Only this step, its output whole")] = None,
        format: Annotated[
            Literal["json", "html"],
            Field(  # noqa: A002 (the CLI's flag name)
                description="html: also a self-contained HTML report of the run (a text/html resource)"
            ),
        ] = "json",
    ) -> Annotated[CallToolResult, McpStatusResult]:
        """Where a run stands: steps, their outputs (large ones clipped: pass step for one whole), and (with
        units) every unit attempt, the superseded ones of its rewinds too; format html adds a self-contained HTML
        report. For a failed, blocked or abandoned run, next (and recovery) say what moves it on."""
        result = await _call_then(_status_with_next, api.run_status, run_id, units=units, step=step)
        if format == "html" and not result.is_error:
            rid = (result.structured_content or {}).get("runId", run_id)  # a prefix or @last, resolved
            try:
                page = await anyio.to_thread.run_sync(lambda: api.run_report_html(rid))
            except AkmError as exc:
                return _error_result(exc)
            result.content.append(_html_resource(f"akm://runs/{rid}/report.html", page))
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
        run_id: Annotated[str, Field(description=RUN_ID_HELP)],
    ) -> Annotated[CallToolResult, RunViewModel]:
        """Reopen a failed or blocked run (its current step is retried on the next workflow_run)."""
        return await _call(api.resume, run_id)

    @server.tool(
        annotations=ToolAnnotations(
            title="Rewind a run",
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        )
    )
    async def workflow_rewind(
        run_id: Annotated[str, Field(description="The run id")],
        to_step: Annotated[str, Field(description="The step to go back to: it and every later step are reopened")],
        redo: Annotated[
            bool | list[str],
            Field(
                description="false (default): units whose identity is unchanged are reused; true: redo every "
                "unit of the reopened steps; a list of unit ids: redo those"
            ),
        ] = False,
    ) -> Annotated[CallToolResult, McpRewindResult]:
        """Take a run back to a step (completed, failed, blocked or active run): the step and every later one are
        reopened, in one transaction. Nothing is lost: the superseded results stay in the run's history. The
        step's units you did are offered again (action rerun) so you can report a corrected result; other units
        whose inputs did not change are reused instead of run. Then call workflow_run."""
        return await _call_then(_with_next_after_rewind, api.rewind, run_id, to_step, redo=redo)

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
        run_id: Annotated[str, Field(description=RUN_ID_HELP)],
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
        run_id: Annotated[
            str | None, Field(description="Only this run's events (whole id, its first 6+ characters, or @last)")
        ] = None,
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

        from akm.mcp import compact

        return json.dumps(compact.compact_run(api.run_status(run_id).to_json()), ensure_ascii=False)
