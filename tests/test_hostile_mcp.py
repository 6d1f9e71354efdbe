"""Hostile JSON-RPC over `akm mcp`'s stdio (issue 23 items 2 and 3): every request gets an answer.

A real server process (`python -m akm mcp`, the same code the zipapp runs) spoken to with raw lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mcp_wire import McpWire, source_env

INIT = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _mcp_process(env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """`python -m akm mcp` on pipes (its stderr dropped), for a case that plays the client byte by byte."""
    return subprocess.Popen(
        [sys.executable, "-m", "akm", "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
    )


@pytest.fixture
def server(tmp_path, project):
    srv = McpWire.from_source(source_env(tmp_path), project)
    srv.send(INIT, INITIALIZED)
    srv.answer("init")
    yield srv
    srv.close()


@pytest.mark.parametrize(
    "line,why",
    [
        ("{}", "jsonrpc: Field required; id: Field required; method: Field required"),
        ('[{"jsonrpc": "2.0", "id": 4, "method": "ping"}]', "a batch (a JSON array) is not supported"),
        ("[]", "a batch (a JSON array) is not supported"),
        (
            '{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}',
            "the id must be a string or an integer, not an object",
        ),
        ('{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', "not a number with a fraction or an exponent"),
        ('{"jsonrpc": "2.0", "id": 1.0, "method": "ping"}', "not a number with a fraction or an exponent"),
        ('{"jsonrpc": "2.0", "id": true, "method": "ping"}', "the id must be a string or an integer, not a boolean"),
        ('{"jsonrpc": "2.0", "id": null, "method": "ping"}', "the id must be a string or an integer, not null"),
        ("5", "a JSON-RPC message is an object, not an integer"),
    ],
)
def test_an_invalid_request_is_answered_minus_32600_with_id_null(server, line, why):
    server.send(line)
    (err,) = server.wait_until(
        lambda: [f for f in server.frames if "id" in f and f["id"] is None], what="an answer with id null"
    )
    assert err["error"]["code"] == -32600 and why in err["error"]["message"], err
    server.send({"jsonrpc": "2.0", "id": "after", "method": "ping"})
    assert server.answer("after")["result"] == {}  # and it keeps serving


def test_a_request_without_a_method_is_answered_with_its_id(server):
    server.send({"jsonrpc": "2.0", "id": 12})
    assert server.answer(12)["error"] == {"code": -32600, "message": "Invalid request: method: Field required"}


def test_malformed_notifications_and_responses_get_no_answer(server):
    server.send(
        {"jsonrpc": "2.0", "method": "notifications/x", "params": 5},
        {"jsonrpc": "2.0", "id": 99, "result": 5},
        {"jsonrpc": "2.0", "id": "p", "method": "ping"},
    )
    server.answer("p")
    assert [f for f in server.frames if f.get("id") in (99, None)] == []


def test_pipelined_requests_then_end_of_input_are_each_answered(tmp_path, project):
    """`init`, `tools/call`, `ping` in one write and stdin closed: the SDK's loop cancelled the call at EOF."""
    srv = McpWire.from_source(source_env(tmp_path), project)
    try:
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "workflow_list", "arguments": {}}}
        srv.send(INIT, INITIALIZED, call, {"jsonrpc": "2.0", "id": 3, "method": "ping"})
        srv.proc.stdin.close()
        assert srv.answer("init")["result"]["serverInfo"]["name"] == "akm"
        assert srv.answer(2)["result"]["structuredContent"] == {"runs": []}
        assert srv.answer(3)["result"] == {}
        assert srv.proc.wait(timeout=120) == 0
    finally:
        srv.close()


def test_a_line_over_16_mib_is_refused_unread_with_its_id(server):
    big = "x" * (16 * 1024 * 1024)
    server.write(
        b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "workflow_list", '
        b'"arguments": {"ref": "' + big.encode() + b'"}}}\n'
    )
    err = server.answer(5)["error"]
    assert err["code"] == -32600 and "more than the 16777216 bytes (16 MiB) a line may hold" in err["message"]
    assert err["data"]["maxBytes"] == 16 * 1024 * 1024 and err["data"]["bytes"] > 16 * 1024 * 1024
    server.send({"jsonrpc": "2.0", "id": 6, "method": "ping"})
    assert server.answer(6)["result"] == {}  # the rest of the long line was skipped, not read as messages


ARRAY_WF = "---\nsteps:\n  - id: s\n    output: { type: array }\n---\n\n## s\n\nDo s.\n"


def _report(server, rid, run_id, result) -> dict:
    server.send(
        {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {
                "name": "unit_report",
                "arguments": {"run_id": run_id, "unit_id": "s:solo", "status": "completed", "result": result},
            },
        }
    )
    return server.answer(rid)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_one_nesting_limit_for_a_result_over_mcp_and_at_the_cli(server, project, akm):
    """200 levels are accepted at the CLI and over MCP alike; 201 are RESULT_INVALID in both, with the same
    reason. Over MCP 200 levels used to be -32700 "not Unicode text" (pydantic's JSON reader stops at 200,
    the envelope included)."""
    (project / "a.md").write_text(ARRAY_WF, encoding="utf-8")
    cli_run = akm.json("workflow", "run", "a.md", check=3)["run"]["runId"]
    deep = akm("workflow", "report", cli_run, "s:solo", "--status", "completed", "--result", _nested(201))
    assert deep.returncode == 2 and "error[RESULT_INVALID]" in deep.stderr and "200 levels" in deep.stderr
    akm("workflow", "report", cli_run, "s:solo", "--status", "completed", "--result", _nested(200), check=0)

    server.send(
        {
            "jsonrpc": "2.0",
            "id": "run",
            "method": "tools/call",
            "params": {"name": "workflow_run", "arguments": {"target": "a.md", "new": True}},
        }
    )
    run_id = server.answer("run")["result"]["structuredContent"]["run"]["runId"]
    too_deep = _report(server, "deep", run_id, json.loads(_nested(201)))["result"]
    assert too_deep["isError"] and "error[RESULT_INVALID]" in too_deep["content"][0]["text"]
    assert "200 levels" in too_deep["content"][0]["text"]
    assert json.loads(too_deep["content"][1]["text"])["code"] == "RESULT_INVALID"
    ok = _report(server, "ok", run_id, json.loads(_nested(200)))["result"]
    assert not ok["isError"] and ok["structuredContent"]["recorded"] == "written"


def test_a_message_too_deep_for_any_reader_is_a_parse_error_with_its_id(server):
    server.send(
        '{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "unit_report", '
        '"arguments": {"result": ' + _nested(100000) + "}}}"
    )
    err = server.answer(8)["error"]
    assert err["code"] == -32700 and "nests too deeply" in err["message"] and "200 levels" in err["message"]


def _call(server, rid, tool: str, arguments: dict) -> dict:
    server.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
    return server.answer(rid)["result"]


def _code(result: dict) -> str:
    assert result["isError"], result
    return json.loads(result["content"][1]["text"])["code"]


def test_paths_the_os_cannot_take_are_coded_errors_over_mcp(server, project):
    """`workflow_list {ref: <300 chars>}` was an OSError and `workflow_run {cwd: "/tmp\\u0000x"}` a ValueError,
    both INTERNAL."""
    assert _code(_call(server, 1, "workflow_list", {"ref": "a" * 300})) == "INVALID_PATH"
    assert _code(_call(server, 2, "workflow_list", {"ref": "x\u0000y"})) == "INVALID_PATH"
    nul = _call(server, 3, "workflow_run", {"target": "wf.md", "cwd": "/tmp\u0000x"})
    assert _code(nul) == "INVALID_PATH" and "NUL character" in nul["content"][0]["text"]
    assert _code(_call(server, 4, "workflow_run", {"target": "wf.md", "cwd": "/" + "d" * 5000})) == "INVALID_PATH"


def test_typed_arguments_are_not_coerced_from_other_types(server, project):
    (project / "s.md").write_text(SESSION_WF, encoding="utf-8")
    run_id = _call(server, "run", "workflow_run", {"target": "s.md"})["structuredContent"]["run"]["runId"]
    base = {"run_id": run_id, "unit_id": "s:solo", "status": "completed", "result": "done"}
    for rid, extra in enumerate(({"tokens": "5"}, {"tokens": True}, {"rerun": "yes"}, {"rerun": 1})):
        refused = _call(server, rid, "unit_report", {**base, **extra})
        assert _code(refused) == "INVALID_ARGUMENT", refused
        assert "no conversion from other types" in refused["content"][0]["text"]
    assert _code(_call(server, "steps", "workflow_run", {"target": run_id, "max_steps": "2"})) == "INVALID_ARGUMENT"
    status = _call(server, "status", "workflow_status", {"run_id": run_id})["structuredContent"]
    assert status["status"] == "awaiting_session"  # nothing was recorded
    ok = _call(server, "ok", "unit_report", {**base, "tokens": 5})
    assert not ok["isError"] and ok["structuredContent"]["recorded"] == "written"


SESSION_WF = "---\nsteps:\n  - id: s\n---\n\n## s\n\nDo s.\n"


def test_a_client_gone_at_end_of_input_still_cancels_the_call_at_once(tmp_path, project):
    """Waiting for answers at EOF must not keep a run going for a client that closed both pipes."""
    marker = tmp_path / "started"
    unit = f"import pathlib, time; pathlib.Path({str(marker)!r}).write_text('x'); time.sleep(300)"
    (project / "slow.md").write_text(
        "---\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: "
        + json.dumps([sys.executable, "-c", unit])
        + "\n---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    proc = _mcp_process({**source_env(tmp_path), "AKM_MCP_CALL_BOUND": "600"}, project)
    try:
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "workflow_run", "arguments": {"target": "slow.md"}},
        }
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in (INIT, INITIALIZED, call)))
        proc.stdin.flush()
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the unit never started"
            time.sleep(0.05)
        proc.stdout.close()  # the client is gone: its end of our stdout closed
        proc.stdin.close()
        assert proc.wait(timeout=120) is not None  # not the 600 s call bound
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    from akm import api

    (run,) = api.list_runs(cwd=str(project)).runs
    assert run.status == "active"  # cancelled, still resumable


def test_the_server_leaves_when_its_client_stops_reading_but_keeps_its_stdin_open(tmp_path, project):
    """The answer to `ping` meets a closed pipe: the server ends, and the process with it (the SDK's stdin
    reader, blocked in a read that the still-open stdin never ends, used to keep it alive until the next line)."""
    proc = _mcp_process(source_env(tmp_path), project)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(INIT).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == "init"
        proc.stdout.close()  # the client stops reading; its end of our stdin stays open
        proc.stdin.write(json.dumps(INITIALIZED).encode() + b'\n{"jsonrpc": "2.0", "id": 2, "method": "ping"}\n')
        proc.stdin.flush()
        assert proc.wait(timeout=120) == 0  # generous: the SDK loads first on a busy machine
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdin.close()
