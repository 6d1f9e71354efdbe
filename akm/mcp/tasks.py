"""The MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663) for `workflow_run`.

The SDK has no support for it, so this module is the one place akm speaks protocol beyond the SDK — through
the SDK's public low-level `Server` only: the extension is advertised in `Server.extensions` (the discover
answer's `capabilities.extensions`), `tasks/get`, `tasks/update` and `tasks/cancel` are request handlers
added with `add_request_handler`, and a `tools/call` that becomes a task returns its `CreateTaskResult` as a
plain mapping (an extension's `resultType` the SDK passes through as it is).

What it does (shapes pinned by tests/test_mcp_tasks.py against the extension's spec text):

* a 2026-07-28 `tools/call` of `workflow_run` whose `_meta` client capabilities declare the extension is
  answered at once with a task (`resultType: "task"`, `status: "working"`, `pollIntervalMs`) once its run is
  open and the task is journaled; the run is driven in the background as for a plain call. A call that is
  refused (bad input) is answered as a plain call is: no task. `plan` and `stop` never make one.
* `tasks/get` answers from the journal (`akm.api.find_task`), so another `akm mcp` process — a restarted
  session — answers for a task this one made: `working` while the run is driven (here, or by another live
  driver; a run whose driver died is taken up here), with where it is in `statusMessage`; `completed` once
  the run stops (completed, failed, blocked, abandoned, or awaiting the session), its `result` the answer a
  plain `workflow_run` call gives then — with the brief when it awaits you; `failed` only for a JSON-RPC
  error; `cancelled` after `tasks/cancel`.
* `tasks/cancel` stops the task, not the run: the run keeps going (`workflow_run(stop=true)` stops it).
* a client that does not declare the extension on a request gets today's answers, and -32021 for `tasks/*`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from akm import api
from akm.errors import AkmError
from akm.mcp import guidance
from akm.mcp.errors import error_result, ok_result
from akm.mcp.fit import fitted

if TYPE_CHECKING:
    from mcp.server import Server

    from akm.mcp.drives import Drives
    from akm.mcp.tools import Call

EXTENSION = "io.modelcontextprotocol/tasks"
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
POLL_INTERVAL_MS = 5000  # a unit takes seconds to hours; polling faster only reads the journal more often
SETTLE_WAIT_MS = 10_000  # what a tasks/get waits for a stopped run's answer (a driver returning its result)
METHODS = ("tasks/get", "tasks/update", "tasks/cancel")


class TaskIdParams(types.RequestParams):
    """`tasks/get` and `tasks/cancel` params (`tasks/update` adds `inputResponses`, which akm never asks for)."""

    task_id: str
    input_responses: dict[str, Any] | None = None


def declared(ctx: Any) -> bool:
    """Whether this request's client declared the extension (2026-07-28: per request, in `_meta`)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    caps = (ctx.meta or {}).get(types.CLIENT_CAPABILITIES_META_KEY)
    extensions = caps.get("extensions") if isinstance(caps, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def _task_json(task: api.TaskRecord, status: str, message: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "taskId": task.task_id,
        "status": status,
        "createdAt": task.created_at,
        "lastUpdatedAt": task.last_updated_at,
        "ttlMs": task.ttl_ms,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if message is not None:
        body["statusMessage"] = message
    return body


def _wire(result: types.CallToolResult) -> dict[str, Any]:
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


class Tasks:
    """The extension's handlers, registered on `server`; `drives` (the server's background drivers) run the
    tasks' runs, as `holder` in `cwd`."""

    def __init__(self, server: Server[Any], drives: Drives, holder: str, cwd: str) -> None:
        self.drives, self.holder, self.cwd = drives, holder, cwd
        server.extensions[EXTENSION] = {}
        server.add_request_handler("tasks/get", TaskIdParams, self._get)
        server.add_request_handler("tasks/update", TaskIdParams, self._update)
        server.add_request_handler("tasks/cancel", TaskIdParams, self._cancel)

    async def create(self, call: Call, req: Any) -> dict[str, Any] | types.CallToolResult:
        """`workflow_run` as a task: the run opened and its driver started (a refusal is answered as a plain
        call's), the task journaled, then answered at once."""
        cwd = req.cwd or call.cwd
        try:
            drive, opened = await anyio.to_thread.run_sync(
                lambda: call.drives.start_requested(req, cwd=cwd, trace_parent=call.trace_parent)
            )
            task = await anyio.to_thread.run_sync(lambda: api.open_task(opened.run_id))
        except AkmError as exc:
            return error_result(exc)
        message = f"run {opened.run_id}: {'started' if opened.started else 'continued'}; {drive.now_text()}"
        return {"resultType": "task", **_task_json(task, "working", message)}

    # -- the extension's methods ---------------------------------------------------------------------------
    def _check(self, ctx: Any) -> None:
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(code=types.METHOD_NOT_FOUND, message="Method not found", data=ctx.method)
        if not declared(ctx):
            raise MCPError(
                code=MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="Missing required client capability",
                data={"requiredCapabilities": {"extensions": {EXTENSION: {}}}},
            )

    async def _find(self, ctx: Any, params: TaskIdParams) -> api.TaskRecord:
        self._check(ctx)
        task = await anyio.to_thread.run_sync(lambda: api.find_task(params.task_id))
        if task is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"Failed to retrieve task: Task not found ({params.task_id!r})",
                data={"taskId": params.task_id},
            )
        return task

    async def _update(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        await self._find(ctx, params)
        return {}  # akm never asks for input: there is nothing outstanding to answer

    async def _cancel(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        task = await self._find(ctx, params)
        if not task.settled:
            await anyio.to_thread.run_sync(lambda: api.mark_task(task, api.TASK_CANCELLED))
        return {}

    async def _get(self, ctx: Any, params: TaskIdParams) -> dict[str, Any]:
        task = await self._find(ctx, params)
        if task.cancelled:
            message = "Cancelled: the task stopped; its run goes on (workflow_status shows it)."
            return _task_json(task, "cancelled", message)
        try:
            return await self._state(task)
        except AkmError as exc:  # the run is gone (its journal moved?): the tool's own coded error as the result
            return _task_json(task, "completed", exc.message) | {"result": _wire(error_result(exc))}

    async def _state(self, task: api.TaskRecord) -> dict[str, Any]:
        """Where the task's run is, as the task's status."""
        from akm.mcp.tools import TOOLS, Call

        run_id = task.run_id
        drives = self.drives
        if task.settled:  # answered once: the run as it is now, and never driven from a get
            view = await anyio.to_thread.run_sync(lambda: api.run_status(run_id))
            result = ok_result({"run": view.to_json(), "next": guidance.after_run(api.RunResult(run=view))})
            return await self._completed(task, fitted("workflow_run", None, result))
        drive = drives.get(run_id)
        if drive is not None and drive.alive:
            return _task_json(task, "working", f"run {run_id}: {drive.now_text()}")
        view = await anyio.to_thread.run_sync(lambda: api.run_status(run_id))
        if view.status == "active":
            where = f"at step {view.current_step_id}" if view.current_step_id else "starting"
            lease = view.engine_lease
            if lease is not None:
                message = f"run {run_id}: {where}, driven elsewhere by {lease.holder} (pid {lease.pid})"
                return _task_json(task, "working", message)
            # Its driver is gone (the server that made the task stopped): this server takes the run up.
            await anyio.to_thread.run_sync(lambda: drives.start_or_attach(run_id))
            return _task_json(task, "working", f"run {run_id}: {where}, taken up by this server")
        # The run stopped (or awaits the session): the answer a plain call gives now, from the driver that saw
        # it stop when there is one here, else from a driver that finds it stopped at once.
        request = api.front_request(
            api.RunToolRequest, {"target": run_id, "timeout": 1 if drive is not None else SETTLE_WAIT_MS}
        )
        call = Call(drives, self.holder, self.cwd)
        result = fitted("workflow_run", request, await TOOLS["workflow_run"].handler(call, request))
        content = result.structured_content if isinstance(result.structured_content, dict) else {}
        if not result.is_error and content.get("driving"):
            return _task_json(task, "working", f"run {run_id}: {view.status}")
        return await self._completed(task, result)

    async def _completed(self, task: api.TaskRecord, result: types.CallToolResult) -> dict[str, Any]:
        if not task.settled:
            task = await anyio.to_thread.run_sync(lambda: api.mark_task(task, api.TASK_SETTLED))
        content = result.structured_content if isinstance(result.structured_content, dict) else {}
        run = content.get("run")
        status = run.get("status") if isinstance(run, dict) else None
        message = f"run {task.run_id}: {status or ('error' if result.is_error else 'stopped')}"
        return _task_json(task, "completed", message) | {"result": _wire(result)}
