"""`akm mcp` driven by Claude Code itself (issue 37 item 7): the real `claude` CLI (tests/agent_clis, pinned) in
`--print` mode, with akm registered as its only MCP server, against a loopback fake of the Anthropic Messages API
that plays a scripted model (tests/fake_model_apis.py `scripts`). The model calls akm's tools as an agent would —
catalog, run, the reports and verdicts each brief asks for, run again — until `triage-bug-report` completes.

Asserted: the run completes; every tool result the model received is at most 64 KiB. Recorded (printed): how
many tool calls the workflow took through Claude Code, and whether Claude Code used MCP tasks with akm (it
declares the extension per request when it does; akm journals every task it makes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from akm import api
from tests import real_clis
from tests.fake_model_apis import FakeModelApis
from tests.helpers import CORPUS, needs_shared
from tests.mcp_wire import server_env

pytestmark = [real_clis.skip_or_fail(), needs_shared()]

LIMIT = 64 * 1024
EXTENSION = "io.modelcontextprotocol/tasks"
WORKFLOW = "triage-bug-report"
PARAMS = {
    "bug_ref": "gh:example/app#142",
    "repro_env": "local-docker",
    "severity_hint": "medium",
    "workspace_dir": ".akm-run/triage",
    "knowledge_wiki": "engineering",
}


class ScriptedAgent:
    """The model: reads the last tool result in the conversation Claude Code sends and makes the next call."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []  # every tool result the model received: tool, bytes, text
        self.calls: list[str] = []
        self.run_id: str | None = None
        self.finished: str | None = None
        self.answered: str | None = None  # the tool_use_id of the last result acted on
        self.skipped: list[Any] = []  # requests with no new tool result (what the CLI sent instead)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if not any(str(t).startswith("mcp__akm__") or t == "ToolSearch" for t in tools):
            return {"type": "text", "text": "ok"}  # a side request of the CLI's, not the agent's turn
        messages = body.get("messages") or []
        # The latest tool result, wherever it is: the CLI may add turns of its own after it (reminders).
        answers = [
            b
            for m in messages
            if m.get("role") == "user" and isinstance(m.get("content"), list)
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if not answers:
            return self.call("workflow_catalog", {})
        if answers[-1].get("tool_use_id") == self.answered:
            self.skipped.append(messages[-1])
            return {"type": "text", "text": "ok"}  # a turn of the CLI's own with no new result: nothing to do
        self.answered = answers[-1].get("tool_use_id")
        answer = answers[-1]
        text = _text(answer.get("content"))
        tool = self.calls[-1] if self.calls else "?"
        self.results.append({"tool": tool, "bytes": len(text.encode()), "error": bool(answer.get("is_error"))})
        data = _json_in(text)
        if answer.get("is_error") or not isinstance(data, dict):
            return self.stop(f"{tool} answered: {text[:2000]}")
        try:
            return self.next_call(tool, data)
        except Exception as exc:  # a broken script ends the turn saying why (an HTTP error makes the CLI retry)
            return self.stop(f"the script failed on {tool}'s answer: {exc!r}: {text[:2000]}")

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(name)
        n = len(self.calls)
        return {"type": "tool_use", "id": f"toolu_{n:04d}", "name": f"mcp__akm__{name}", "input": arguments}

    def stop(self, why: str) -> dict[str, Any]:
        self.finished = why
        return {"type": "text", "text": why}

    def next_call(self, tool: str, data: dict[str, Any]) -> dict[str, Any]:
        if tool == "workflow_catalog":
            refs = [w.get("ref") or w.get("name") for w in data.get("workflows") or []]
            ref = next(r for r in refs if WORKFLOW in str(r))
            return self.call("workflow_run", {"target": ref, "params": PARAMS})
        brief = None
        if tool == "workflow_run":
            run = data.get("run") or {}
            self.run_id = run.get("runId") or self.run_id
            if run.get("status") == "completed":
                return self.stop("completed")
            if run.get("status") != "awaiting_session":
                if data.get("driving"):
                    return self.call("workflow_run", {"target": self.run_id})
                return self.stop(f"the run is {run.get('status')}: {json.dumps(data)[:2000]}")
            brief = run.get("awaiting")
        elif tool == "unit_report":
            brief = data.get("brief")
            if brief is None:  # the step is done: continue the run, its answer has the next brief
                return self.call("workflow_run", {"target": self.run_id})
        elif tool == "workflow_next":
            brief = data
        if not isinstance(brief, dict):
            return self.call("workflow_next", {"run_id": self.run_id})
        if brief.get("kind") == "judge":
            report = brief["judge"]["report"]
            return self.call("unit_report", {**report, "verdict": {"complete": True}})
        unit = brief["units"][0]
        return self.call("unit_report", {**unit["report"], "result": f"done: {unit['unitId']}"})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))


def _json_in(text: str) -> Any:
    """The JSON object a tool result starts with (Claude Code may append a system reminder after it)."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    return value


def test_claude_code_drives_a_workflow_to_completion_through_akm_mcp(akm_bin, shiv_root, tmp_path, project):
    real_clis.require()
    (project / ".akm" / "workflows").mkdir(parents=True)
    shutil.copy(CORPUS / "current" / f"{WORKFLOW}.md", project / ".akm" / "workflows" / f"{WORKFLOW}.md")
    apis = FakeModelApis()
    agent = ScriptedAgent()
    apis.scripts["mcp"] = agent
    home = tmp_path / "home"
    try:
        setup = real_clis.setup("claude", home, project, apis.base("mcp"))
        config = tmp_path / "mcp.json"
        wire = tmp_path / "client-lines.jsonl"  # every line Claude Code writes to akm, to read what it declared
        server = {"command": "/bin/bash", "args": ["-c", f'tee -a "{wire}" | exec "{akm_bin}" mcp']}
        config.write_text(
            json.dumps({"mcpServers": {"akm": {**server, "env": server_env(tmp_path, shiv_root)}}}), encoding="utf-8"
        )
        env = {**os.environ, **setup["env"], "CLAUDE_CODE_ENABLE_TASKS": "1", "DISABLE_AUTOUPDATER": "1"}
        proc = subprocess.run(
            [
                str(real_clis.BIN / "claude"),
                "--print",
                "--output-format",
                "stream-json",
                "--verbose",
                "--mcp-config",
                str(config),
                "--strict-mcp-config",
                "--allowedTools",
                "mcp__akm__*",
                "--max-turns",
                "200",
                f"Triage the bug with the akm workflow {WORKFLOW}.",
            ],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        apis.close()
    (tmp_path / "claude-stream.jsonl").write_text(proc.stdout, encoding="utf-8")  # kept for a failure's reader
    stream = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert agent.finished == "completed", (agent.finished, agent.calls, agent.skipped[-2:], proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stream and stream[-1].get("type") == "result" and not stream[-1].get("is_error"), stream[-1:]
    assert agent.run_id is not None and api.run_status(agent.run_id).status == "completed"
    assert agent.results and all(not r["error"] for r in agent.results), agent.results
    biggest = max(r["bytes"] for r in agent.results)
    assert biggest <= LIMIT, agent.results
    tasks = api.events(run_id=agent.run_id, limit=10_000).events
    used_tasks = any(e.event_type == api.TASK_OPENED for e in tasks)
    lines = [json.loads(line) for line in wire.read_text(encoding="utf-8").splitlines() if line.startswith("{")]
    calls = [m for m in lines if m.get("method") == "tools/call"]
    declared = [
        ((m.get("params") or {}).get("_meta") or {}).get("io.modelcontextprotocol/clientCapabilities") for m in calls
    ]
    declares_tasks = any(EXTENSION in ((caps or {}).get("extensions") or {}) for caps in declared)
    assert len(calls) == len(agent.calls) and used_tasks == declares_tasks  # a declaring client gets tasks
    print(
        f"\nClaude Code {real_clis.version('claude')}: {WORKFLOW} completed in {len(agent.calls)} tool calls "
        f"({', '.join(f'{n} {agent.calls.count(n)}' for n in sorted(set(agent.calls)))}); largest tool result "
        f"{biggest} bytes; MCP tasks used: {used_tasks}; it declared {declared[0] if declared else None}; methods "
        f"{sorted({str(m.get('method')) for m in lines})}; turns without a new result: {len(agent.skipped)}"
    )
