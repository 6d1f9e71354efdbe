"""End to end: the built `dist/akm mcp` over stdio, with the official client and with raw JSON-RPC."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters  # noqa: E402

from akm import paths
from tests.helpers import py, write_wf
from tests.mcp_wire import McpWire, server_env, source_env


def flow(project: Path) -> Path:
    return write_wf(
        project,
        "flow.md",
        f"""
        steps:
          - id: prep
            unit: {{ exec: {{ command: {py('print("to stdout, never to the protocol")')} }} }}
          - id: write
            output: {{ type: object, required: [text], properties: {{ text: {{ type: string }} }} }}
          - id: show
            unit: {{ exec: {{ command: {py('import os; print(os.environ["AKM_INPUTS"])')} }} }}
            inputs: [steps.write.output]
        """,
        "## prep\n\nPrep.\n\n## write\n\nWrite a sentence.\n\n## show\n\nShow.",
    )


def test_official_client_drives_a_session_run_over_stdio(akm_bin, shiv_root, tmp_path, project):
    flow(project)
    params = StdioServerParameters(
        command=str(akm_bin), args=["mcp"], env=server_env(tmp_path, shiv_root), cwd=str(project)
    )

    async def main():
        async with Client(params) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert {"workflow_run", "workflow_next", "unit_report"} <= names
            r = await c.call_tool("workflow_run", {"target": "flow.md"})
            assert r.structured_content["run"]["status"] == "awaiting_session"
            rid = r.structured_content["run"]["runId"]
            b = (await c.call_tool("workflow_next", {"run_id": rid})).structured_content
            unit = b["units"][0]
            assert unit["unitId"] == "write:solo" and unit["outputSchema"]["required"] == ["text"]
            rep = await c.call_tool(
                "unit_report",
                {"run_id": rid, "unit_id": "write:solo", "status": "completed", "result": {"text": "hello"}},
            )
            assert rep.structured_content["stepOutcome"]["kind"] == "completed"
            done = await c.call_tool("workflow_run", {"target": rid})
            return done.structured_content

    result = anyio.run(main)
    assert result["run"]["status"] == "completed"
    show = json.loads(result["run"]["steps"][2]["output"])
    assert show == {"steps.write.output": {"text": "hello"}}


def test_only_protocol_on_stdout_and_malformed_requests_survive(akm_bin, shiv_root, tmp_path, project):
    flow(project)
    srv = McpWire.built(akm_bin, server_env(tmp_path, shiv_root), project)
    try:
        init = srv.initialize()
        assert init["result"]["serverInfo"]["name"] == "akm" and "workflow_next" in init["result"]["instructions"]
        srv.send("this is not json")
        srv.send({"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": {"name": "no_such_tool"}})
        srv.send(
            {
                "jsonrpc": "2.0",
                "id": "y",
                "method": "tools/call",
                "params": {"name": "workflow_run", "arguments": {"max_steps": "many"}},
            }
        )
        run = srv.request("tools/call", {"name": "workflow_run", "arguments": {"target": "flow.md"}})
        content = run["result"]["structuredContent"]
        assert content["run"]["status"] == "awaiting_session"
        assert content["run"]["steps"][0]["output"] == "to stdout, never to the protocol"
        listed = srv.request("tools/list")
        assert len(listed["result"]["tools"]) == 13  # workflow_catalog (16), workflow_rewind (33), workflow_wait (37)
        answered = {f.get("id") for f in srv.frames}
        assert {"x", "y"} <= answered  # bad calls got answers (errors), and the server kept going
        bad_call = next(f for f in srv.frames if f.get("id") == "y")
        assert bad_call.get("error") or bad_call["result"]["isError"]
        parse_error = next(f for f in srv.frames if f.get("id") is None and "error" in f)
        assert parse_error["error"]["code"] == -32700  # "this is not json" is answered (JSON-RPC: id null)
    finally:
        srv.close()


def test_requests_the_sdk_cannot_read_are_answered_not_dropped(akm_bin, shiv_root, tmp_path, project):
    """A lone surrogate escape (what JavaScript's JSON.stringify writes for a broken string) or a malformed
    request with an id used to vanish without an answer: the client waited on that id forever."""
    srv = McpWire.built(akm_bin, server_env(tmp_path, shiv_root), project)
    try:
        srv.initialize()
        srv.send(
            '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "unit_report", '
            '"arguments": {"run_id": "r", "unit_id": "u", "status": "completed", "result": "bad \\ud800"}}}'
        )
        lone = srv.wait_for(lambda f: f.get("id") == 7)
        assert lone["error"]["code"] == -32700 and "UTF-8" in lone["error"]["message"]
        srv.send({"jsonrpc": "2.0", "id": "m", "method": 5})
        bad = srv.wait_for(lambda f: f.get("id") == "m")
        assert bad["error"]["code"] == -32600 and "method" in bad["error"]["message"]
        srv.send('{"jsonrpc": "2.0", "method": "notifications/x", "params": {"a": "\\udc80"}}')  # no id: no answer
        alive = srv.request("tools/list")
        assert len(alive["result"]["tools"]) == 13
        assert all(f.get("id") in (None, 7, "m", alive["id"], 1) or "method" in f for f in srv.frames)
    finally:
        srv.close()


def test_an_sdk_without_the_internals_we_use_still_serves(tmp_path, project):
    """Answering unreadable lines uses mcp 2.x internals; with an SDK that moved them (a newer mcp from pip),
    `akm mcp` must still start and serve, as the SDK's own stdio loop does."""
    code = (
        "import sys, mcp.server.mcpserver, mcp.shared._context_streams as internals\n"
        "del internals.create_context_streams  # the SDK's own modules hold their references already\n"
        "from akm.cli import main\nsys.exit(main(['mcp']))"
    )
    srv = McpWire([sys.executable, "-c", code], source_env(tmp_path), project)
    try:
        assert srv.initialize()["result"]["serverInfo"]["name"] == "akm"
        assert len(srv.request("tools/list")["result"]["tools"]) == 13
    finally:
        srv.close()


def test_kill_9_of_the_server_mid_run_loses_nothing(akm_bin, shiv_root, tmp_path, project):
    marker = tmp_path / "started"
    slow = (
        f"import pathlib,sys,time; m=pathlib.Path({str(marker)!r})\n"
        "if m.exists(): print('resumed'); sys.exit(0)\n"
        "m.write_text('x'); time.sleep(600)"
    )
    write_wf(
        project,
        "long.md",
        f"""
        steps:
          - id: quick
            unit: {{ exec: {{ command: {py('print("quick")')} }} }}
          - id: slow
            unit: {{ exec: {{ command: {py(slow)} }} }}
        """,
        "## quick\n\nQ.\n\n## slow\n\nS.",
    )
    env = server_env(tmp_path, shiv_root)
    srv = McpWire.built(akm_bin, env, project)
    try:
        srv.initialize()
        srv.send(
            {
                "jsonrpc": "2.0",
                "id": 99,
                "method": "tools/call",
                "params": {"name": "workflow_run", "arguments": {"target": "long.md", "timeout": "10m"}},
            }
        )
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists()
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(timeout=30)
    finally:
        srv.close()
    db = sqlite3.connect(paths.journal_path())
    try:
        run_id, status = db.execute("SELECT id, status FROM runs").fetchone()
        quick_before = db.execute("SELECT attempts, started_at FROM units WHERE unit_id = 'quick:solo'").fetchone()
    finally:
        db.close()
    assert status == "active"
    # the run is picked up at once (its dead holder is on this host); only the in-flight unit runs again
    proc = subprocess.run(
        [str(akm_bin), "workflow", "run", run_id, "--format", "json"],
        env=env,
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout)["run"]
    assert [s["output"] for s in view["steps"]] == ["quick", "resumed"]
    db = sqlite3.connect(paths.journal_path())
    try:
        assert (
            db.execute("SELECT attempts, started_at FROM units WHERE unit_id = 'quick:solo'").fetchone() == quick_before
        )
        assert db.execute("SELECT attempts FROM units WHERE unit_id = 'slow:solo'").fetchone() == (2,)
    finally:
        db.close()
