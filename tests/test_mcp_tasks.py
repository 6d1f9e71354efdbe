"""Durable MCP tasks (issue 37 item 3): the `io.modelcontextprotocol/tasks` extension (SEP-2663) spoken in raw
2026-07-28 lines to the built `dist/akm mcp`. A `workflow_run` whose request declares the extension is answered
at once with a task; the server is killed mid-unit and a new `akm mcp` process answers `tasks/get` for it from
the journal, taking the run up, until `completed` with the answer a plain call gives (the brief of the session
step). The shapes asserted are the extension's (specification/draft/tasks.md of modelcontextprotocol/ext-tasks).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.helpers import py, write_wf
from tests.mcp_wire import McpWire, meta_2026, server_env

EXTENSION = "io.modelcontextprotocol/tasks"
UNIT_S = 22
TASK_KEYS = {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"}  # Task's fields


def meta(tasks: bool) -> dict[str, Any]:
    return meta_2026("tasks-test", {"extensions": {EXTENSION: {}}} if tasks else {})


class Server(McpWire):
    """One `dist/akm mcp` process spoken to in raw 2026-07-28 lines, declaring the tasks extension or not."""

    def request(self, method: str, *, tasks: bool = True, **params: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().request(method, params, meta=meta(tasks))


def workflow(project: Path) -> None:
    write_wf(
        project,
        "slow.md",
        f"""
        steps:
          - id: build
            unit: {{ exec: {{ command: {py(f"import time; time.sleep({UNIT_S}); print('built')")} }} }}
          - id: review
            inputs: [steps.build.output]
        """,
        "## build\n\nBuild.\n\n## review\n\nReview the build.",
    )


def until_settled(server: Server, task_id: str, deadline_s: float = 600) -> tuple[dict[str, Any], list[str]]:
    """Poll tasks/get as a client does (at the task's poll interval, here faster) until a terminal status."""
    seen: list[str] = []
    deadline = time.monotonic() + deadline_s
    while True:
        got = server.request("tasks/get", taskId=task_id)
        result = got["result"]
        assert result["resultType"] == "complete" and TASK_KEYS <= set(result), result
        seen.append(result["status"])
        if result["status"] in ("completed", "failed", "cancelled"):
            return result, seen
        assert result["status"] == "working" and task_id.split(".")[0] in result["statusMessage"], result
        assert time.monotonic() < deadline, seen
        time.sleep(0.5)


def test_a_workflow_run_task_survives_a_restarted_server(akm_bin, shiv_root, tmp_path, project):
    workflow(project)
    env = server_env(tmp_path, shiv_root)
    first = Server.built(akm_bin, env, project, timeout=300)
    try:
        discover = first.request("server/discover")["result"]
        assert discover["capabilities"]["extensions"] == {EXTENSION: {}}

        started = time.monotonic()
        created = first.request("tools/call", name="workflow_run", arguments={"target": "slow.md"})["result"]
        assert time.monotonic() - started < UNIT_S  # at once, not after the unit
        assert created["resultType"] == "task" and created["status"] == "working", created
        assert TASK_KEYS <= set(created) and created["pollIntervalMs"] > 0 and created["ttlMs"] is None
        task_id = created["taskId"]
        run_id = task_id.split(".")[0]
        assert run_id in created["statusMessage"]

        working = first.request("tasks/get", taskId=task_id)["result"]
        assert working["status"] == "working" and working["taskId"] == task_id
        refused = first.request("tasks/get", tasks=False, taskId=task_id)["error"]
        assert refused["code"] == -32021 and refused["data"] == {
            "requiredCapabilities": {"extensions": {EXTENSION: {}}}
        }
        unknown = first.request("tasks/get", taskId=run_id + ".not-a-task")["error"]
        assert unknown["code"] == -32602 and "Task not found" in unknown["message"]
    finally:
        first.kill()  # mid-unit: its driver dies with it, the task is in the journal

    second = Server.built(akm_bin, env, project, timeout=300)
    try:
        done, seen = until_settled(second, task_id)
        assert done["status"] == "completed" and done["taskId"] == task_id and "working" in seen
        result = done["result"]  # the CallToolResult a plain workflow_run call gives now
        assert result["isError"] is False, result
        run = result["structuredContent"]["run"]
        assert run["runId"] == run_id and run["status"] == "awaiting_session"
        assert run["awaiting"]["kind"] == "units" and run["awaiting"]["stepId"] == "review" and run["awaiting"]["units"]
        assert "unit_report" in result["structuredContent"]["next"]
        again = second.request("tasks/get", taskId=task_id)["result"]
        assert again["status"] == "completed" and again["result"]["structuredContent"]["run"]["runId"] == run_id

        # A client that does not declare the extension gets today's answer, never a task.
        plain = second.request("tools/call", tasks=False, name="workflow_run", arguments={"target": run_id})["result"]
        assert "taskId" not in plain and plain["structuredContent"]["run"]["status"] == "awaiting_session"

        # tasks/cancel stops the task, not the run.
        other = second.request("tools/call", name="workflow_run", arguments={"target": "slow.md", "new": True})
        other_id = other["result"]["taskId"]
        assert second.request("tasks/cancel", taskId=other_id)["result"] == {"resultType": "complete", **_stamp(second)}
        cancelled = second.request("tasks/get", taskId=other_id)["result"]
        assert cancelled["status"] == "cancelled"
        status = second.request(
            "tools/call", tasks=False, name="workflow_status", arguments={"run_id": other_id.split(".")[0]}
        )
        assert status["result"]["structuredContent"]["status"] == "active"  # the run goes on
    finally:
        second.close(gracefully=True)


def _stamp(server: Server) -> dict[str, Any]:
    """The `_meta` serverInfo stamp every 2026-07-28 result carries (taken from a frame already seen)."""
    for frame in server.frames:
        stamp = (frame.get("result") or {}).get("_meta")
        if stamp is not None:
            return {"_meta": stamp}
    return {}
