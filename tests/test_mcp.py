"""The MCP front, in-process with the official client: tools, structured results, errors, progress, cancel."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import anyio
import mcp  # noqa: E402,F401  (a hard dependency: never skipped)
from mcp import Client  # noqa: E402

from akm import paths
from akm.mcp import build_server  # noqa: E402
from tests.helpers import py, write_wf

TOOLS = {
    "setup",
    "workflow_lint",
    "workflow_run",
    "workflow_list",
    "workflow_status",
    "workflow_next",
    "unit_report",
    "workflow_resume",
    "workflow_abandon",
    "workflow_rewind",
    "workflow_events",
    "workflow_catalog",
    "workflow_wait",
}


def session_wf(project: Path) -> Path:
    return write_wf(
        project,
        "flow.md",
        f"""
        params:
          topics: {{ type: array, items: {{ type: string }} }}
        steps:
          - id: prep
            unit: {{ exec: {{ command: {py('print("ready")')} }} }}
          - id: think
            gate: {{ max_loops: 2 }}
            map:
              over: params.topics
              unit:
                output: {{ type: object, required: [line], properties: {{ line: {{ type: string }} }} }}
          - id: show
            unit: {{ exec: {{ command: {py('import os; print(os.environ["AKM_INPUTS"])')} }} }}
            inputs: [steps.think.output]
        """,
        "## prep\n\nPrepare.\n\n## think\n\nWrite a line about the topic.\n\n### gate\n\n- Each line names "
        "its topic.\n\n## show\n\nShow.",
    )


def err(result) -> dict:
    """The error object of an isError result (its last text block is the CLI's JSON error)."""
    assert result.is_error and result.structured_content is None
    return json.loads(result.content[-1].text)


def call(project: Path, script, **server_kw):
    """Run `script(client)` against an in-process server rooted at `project`."""
    server = build_server(cwd=str(project), **server_kw)

    async def main():
        async with Client(server) as client:
            return await script(client)

    try:
        return anyio.run(main)
    finally:
        server.drives.shutdown()  # as `akm mcp` does when its session ends


def test_tools_are_listed_with_schemas_and_annotations(project):
    async def script(c):
        return (await c.list_tools()).tools

    tools = {t.name: t for t in call(project, script)}
    assert set(tools) == TOOLS
    for name, t in tools.items():
        assert t.input_schema["type"] == "object" and t.output_schema, name
        assert t.annotations is not None and t.description, name
    for ro in (
        "workflow_next",
        "workflow_status",
        "workflow_list",
        "workflow_lint",
        "workflow_events",
        "workflow_wait",
    ):
        assert tools[ro].annotations.read_only_hint is True
    assert tools["setup"].annotations.read_only_hint is False  # it writes the config (a preview without arguments)
    assert tools["workflow_abandon"].annotations.destructive_hint is True
    assert tools["workflow_run"].annotations.read_only_hint is False
    # status defaults to completed (a verdict is always completed), so only the ids are required
    assert set(tools["unit_report"].input_schema["required"]) == {"run_id", "unit_id"}
    for name, t in tools.items():  # generated from the api's request models: nothing outside them is taken
        assert t.input_schema["additionalProperties"] is False, name
        assert t.title and "\n    " not in t.description, name
    assert "runId" in json.dumps(tools["workflow_run"].output_schema)


def test_exec_workflow_completes_with_progress(project):
    wf = write_wf(
        project,
        "fan.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              unit: {{ exec: {{ command: {py('import os; print(os.environ["AKM_ITEM"])')} }} }}
        """,
        "## each\n\nEcho.",
    )
    progress = []

    async def script(c):
        async def cb(p, total, msg):
            progress.append((p, total, msg))

        return await c.call_tool("workflow_run", {"target": wf.name, "params": {"xs": [1, 2, 3]}}, progress_callback=cb)

    r = call(project, script)
    assert not r.is_error
    run = r.structured_content["run"]
    assert run["status"] == "completed" and run["steps"][0]["output"] == ["1", "2", "3"]
    assert r.structured_content["next"] is None
    # one notification per finished unit and one per finished step, numbered in increasing order
    assert [p for p, _, _ in progress] == [1, 2, 3, 4]
    assert {total for _, total, _ in progress} == {4}  # 3 units, then the step's own finish
    assert sorted(m for _, _, m in progress if "unit" in m)[0].startswith("step each: unit ")
    assert progress[-1][2] == "step each completed"
    assert json.loads(r.content[0].text) == r.structured_content


def test_session_loop_with_gate_reject_then_accept(project):
    session_wf(project)

    async def script(c):
        r = await c.call_tool("workflow_run", {"target": "flow.md", "params": {"topics": ["cats", "dogs"]}})
        rid = r.structured_content["run"]["runId"]
        assert r.structured_content["run"]["status"] == "awaiting_session"
        assert "run.awaiting" in r.structured_content["next"]  # the answer holds the brief already
        seen = []
        for loop in (1, 2):
            b = (await c.call_tool("workflow_next", {"run_id": rid})).structured_content
            assert b["kind"] == "units" and b["gateLoop"] == loop
            for u in b["units"]:
                topic = u["context"]["item"]
                line = f"about {topic}" if loop == 2 else "about nothing"
                rep = await c.call_tool(
                    "unit_report",
                    {
                        "run_id": rid,
                        "unit_id": u["unitId"],
                        "status": "completed",
                        "result": {"line": line},
                        "expect_step": "think",
                    },
                )
                assert not rep.is_error, rep.content[0].text
            b = (await c.call_tool("workflow_next", {"run_id": rid})).structured_content
            assert b["kind"] == "judge"
            seen.append(b["judge"]["artifact"])
            verdict = (
                {"complete": True}
                if loop == 2
                else {"complete": False, "missing": ["topic names"], "feedback": "Name the topic."}
            )
            rep = (
                await c.call_tool(
                    "unit_report",
                    {"run_id": rid, "unit_id": b["judge"]["unitId"], "status": "completed", "verdict": verdict},
                )
            ).structured_content
            assert rep["stepOutcome"]["kind"] == ("completed" if loop == 2 else "next_loop")
        r = await c.call_tool("workflow_run", {"target": rid})
        return r.structured_content, seen

    result, seen = call(project, script)
    assert result["run"]["status"] == "completed"
    steps = {s["id"]: s["output"] for s in result["run"]["steps"]}
    assert steps["think"] == [{"line": "about cats"}, {"line": "about dogs"}]
    assert json.loads(steps["show"]) == {"steps.think.output": steps["think"]}
    assert seen[0] == [{"line": "about nothing"}] * 2


def test_errors_are_tool_errors_with_code_and_exit_status(project):
    session_wf(project)

    async def script(c):
        r = await c.call_tool("workflow_run", {"target": "flow.md", "params": {"topics": ["a"]}})
        rid = r.structured_content["run"]["runId"]
        con = sqlite3.connect(paths.journal_path())
        before = con.execute("SELECT * FROM units ORDER BY rowid").fetchall()
        bad = await c.call_tool(
            "unit_report", {"run_id": rid, "unit_id": "think.unit:nope", "status": "completed", "result": {"line": "x"}}
        )
        schema_miss = await c.call_tool(
            "unit_report",
            {
                "run_id": rid,
                "unit_id": (await c.call_tool("workflow_next", {"run_id": rid})).structured_content["units"][0][
                    "unitId"
                ],
                "status": "completed",
                "result": {"wrong": 1},
            },
        )
        after = con.execute("SELECT * FROM units ORDER BY rowid").fetchall()
        con.close()
        missing = await c.call_tool("workflow_status", {"run_id": "00000000-0000-4000-8000-000000000000"})
        not_a_file = await c.call_tool("workflow_run", {"target": "nope.md"})
        bad_args = await c.call_tool("workflow_run", {"target": "flow.md", "max_steps": -1})
        return bad, schema_miss, missing, not_a_file, bad_args, before == after

    bad, schema_miss, missing, not_a_file, bad_args, unchanged = call(project, script)
    assert unchanged
    assert err(bad)["code"] == "UNKNOWN_UNIT" and bad.content[0].text.startswith("error[UNKNOWN_UNIT]: ")
    assert err(bad)["exitCode"] == 2 and "think.unit:" in err(bad)["error"]
    assert err(schema_miss)["code"] == "RESULT_INVALID"
    assert 'missing required property "line"' in err(schema_miss)["error"]
    assert err(missing)["code"] == "RUN_NOT_FOUND"
    assert "akm " not in missing.content[0].text  # MCP users are never told to type shell commands
    assert err(not_a_file)["code"] == "WORKFLOW_NOT_FOUND"
    assert err(bad_args)["code"] == "INVALID_ARGUMENT" and "max_steps" in err(bad_args)["error"]


def test_a_call_returns_at_its_bound_and_the_run_goes_on_in_the_background(project, monkeypatch, tmp_path):
    monkeypatch.setenv("AKM_MCP_CALL_BOUND", "1")
    release = tmp_path / "release"  # unit a runs until two calls have returned at their bound
    starts = tmp_path / "starts"
    wait = (
        f"import pathlib, time; end = time.time() + 120\n"
        f"open({str(starts)!r}, 'a').write('a\\n')\n"
        f"while not pathlib.Path({str(release)!r}).exists() and time.time() < end: time.sleep(0.05)\n"
        f"print('a')"
    )
    wf = write_wf(
        project,
        "slow.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py(wait)} }} }}
          - id: b
            unit: {{ exec: {{ command: {py('print("b")')} }} }}
        """,
        "## a\n\nA.\n\n## b\n\nB.",
    )

    async def script(c):
        first = await c.call_tool("workflow_run", {"target": wf.name})
        rid = first.structured_content["run"]["runId"]
        second = await c.call_tool("workflow_run", {"target": rid})
        release.write_text("go")
        results = [first, second]
        for _ in range(10):
            if results[-1].structured_content["run"]["status"] == "completed":
                break
            results.append(await c.call_tool("workflow_run", {"target": rid, "timeout": "60s"}))
        return results

    results = call(project, script)
    for early in results[:2]:
        body = early.structured_content
        assert body["run"]["status"] == "active" and not body["timedOut"] and not body["aborted"]
        assert body["driving"] is True and "still going in the background" in body["next"]
    last = results[-1].structured_content
    assert last["run"]["status"] == "completed" and last["driving"] is False
    assert [s["output"] for s in last["run"]["steps"]] == ["a", "b"]
    assert starts.read_text() == "a\n"  # the unit longer than two calls ran once
    con = sqlite3.connect(paths.journal_path())
    assert con.execute("SELECT COUNT(*) FROM units WHERE step_id = 'a'").fetchone() == (1,)
    con.close()


def test_a_cancelled_call_stops_waiting_not_the_run_and_stop_stops_it(project, tmp_path):
    started = tmp_path / "started"
    release = tmp_path / "release"
    body = (
        f"import pathlib, time; pathlib.Path({str(started)!r}).write_text('x'); end = time.time() + 120\n"
        f"while not pathlib.Path({str(release)!r}).exists() and time.time() < end: time.sleep(0.05)\n"
        f"print('done')"
    )
    wf = write_wf(
        project,
        "long.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py(body)} }} }}
        """,
        "## a\n\nA.",
    )

    def journal():
        con = sqlite3.connect(paths.journal_path())
        try:
            return (
                con.execute("SELECT id, status, lease_holder FROM runs").fetchone(),
                con.execute("SELECT status, failure_reason FROM units").fetchall(),
            )
        finally:
            con.close()

    async def script(c):
        async with anyio.create_task_group() as tg:

            async def runner():
                await c.call_tool("workflow_run", {"target": wf.name, "timeout": "120s"})

            tg.start_soon(runner)
            deadline = time.monotonic() + 60
            while not started.exists() and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        (rid, status, holder), units = journal()
        assert status == "active" and holder is not None and units == [("running", None)]  # still driven
        stopped = await c.call_tool("workflow_run", {"target": rid, "stop": True})
        after = journal()
        nothing = await c.call_tool("workflow_run", {"target": rid, "stop": True})
        release.write_text("go")
        again = await c.call_tool("workflow_run", {"target": rid, "timeout": "60s"})
        return stopped, after, nothing, again

    stopped, after, nothing, again = call(project, script)
    assert stopped.structured_content["aborted"] is True and stopped.structured_content["abortReason"] == "stopped"
    assert after[0][1:] == ("active", None) and after[1] == [("failed", "aborted")]  # lease released, resumable
    assert (
        nothing.structured_content["aborted"] is False and "nothing was stopped" in nothing.structured_content["next"]
    )
    assert again.structured_content["run"]["status"] == "completed"


def test_arguments_of_the_wrong_type_or_range_are_coded_and_write_nothing(project):
    from tests.test_session import journal

    session_wf(project)

    async def script(c):
        tools = {t.name: t for t in (await c.list_tools()).tools}
        r = await c.call_tool("workflow_run", {"target": "flow.md", "params": {"topics": ["a"]}})
        rid = r.structured_content["run"]["runId"]
        unit = (await c.call_tool("workflow_next", {"run_id": rid})).structured_content["units"][0]["unitId"]
        ok = {"run_id": rid, "unit_id": unit, "status": "completed", "result": {"line": "a"}}
        before = journal()
        bad = {}
        for name, args in {
            "huge_tokens": {**ok, "tokens": 10**30},  # no SQLite integer holds it: was an uncoded crash
            "int64_tokens": {**ok, "tokens": 2**63},
            "string_tokens": {**ok, "tokens": "many"},
            "bad_status": {**ok, "status": "done"},
            "unit_not_a_string": {**ok, "unit_id": 7},
            "verdict_not_an_object": {**ok, "verdict": "yes"},
            "no_run_id": {k: v for k, v in ok.items() if k != "run_id"},
        }.items():
            bad[name] = await c.call_tool("unit_report", args)
        return tools["unit_report"].input_schema, bad, journal() == before

    schema, bad, unchanged = call(project, script)
    assert unchanged, "a refused report changed the journal"
    assert schema["properties"]["status"]["enum"] == ["completed", "failed", "running"]
    assert schema["properties"]["tokens"]["anyOf"][0]["maximum"] == 10**12
    for name, result in bad.items():
        assert err(result)["code"] == "INVALID_ARGUMENT", (name, result.content[0].text)
        assert err(result)["exitCode"] == 2
    assert "tokens" in err(bad["huge_tokens"])["error"] and "status" in err(bad["bad_status"])["error"]


def test_an_unexpected_failure_is_a_coded_internal_error_and_the_server_goes_on(project, monkeypatch):
    from akm import api

    session_wf(project)

    def broken(*a, **kw):
        raise ZeroDivisionError("the bug")

    monkeypatch.setattr(api, "run_status", broken)  # stands in for any bug below the front

    async def script(c):
        failed = await c.call_tool("workflow_status", {"run_id": "x"})
        listed = await c.call_tool("workflow_list", {})
        return failed, listed

    failed, listed = call(project, script)
    body = err(failed)
    assert body["code"] == "INTERNAL" and body["exitCode"] == 70
    assert failed.content[0].text.startswith("error[INTERNAL]: unexpected ZeroDivisionError: the bug")
    assert not listed.is_error


def test_a_report_to_a_finished_run_is_not_told_to_resume_it(project):
    session_wf(project)

    async def script(c):
        r = await c.call_tool("workflow_run", {"target": "flow.md", "params": {"topics": ["a"]}})
        rid = r.structured_content["run"]["runId"]
        unit = (await c.call_tool("workflow_next", {"run_id": rid})).structured_content["units"][0]["unitId"]
        await c.call_tool("workflow_abandon", {"run_id": rid})
        return await c.call_tool(
            "unit_report", {"run_id": rid, "unit_id": unit, "status": "completed", "result": {"line": "a"}}
        )

    body = err(call(project, script))
    assert body["code"] == "RUN_NOT_ACTIVE" and "abandoned" in body["error"]
    assert "workflow_resume" not in json.dumps(body)  # an abandoned (or completed) run cannot be resumed


def test_object_arguments_sent_as_json_text_are_read_for_every_tool_and_scalars_never(project):
    """The MCP Inspector sends every argument as a string: an object or array argument given as JSON text is
    read as that JSON (params, verdict, config, paths, redo alike); a scalar is still never read out of text."""
    session_wf(project)

    async def script(c):
        r = await c.call_tool("workflow_run", {"target": "flow.md", "params": json.dumps({"topics": ["a"]})})
        rid = r.structured_content["run"]["runId"]
        unit = (await c.call_tool("workflow_next", {"run_id": rid})).structured_content["units"][0]
        rep = await c.call_tool("unit_report", {**unit["report"], "result": json.dumps({"line": "about a"})})
        judge = rep.structured_content["brief"]["judge"]
        verdict = await c.call_tool("unit_report", {**judge["report"], "verdict": json.dumps({"complete": True})})
        lint = await c.call_tool("workflow_lint", {"paths": json.dumps(["flow.md"])})
        scalar = await c.call_tool("workflow_run", {"target": rid, "max_steps": "1"})
        flag = await c.call_tool("workflow_list", {"active": "true"})
        not_json = await c.call_tool("setup", {"config": "{not json"})
        return r, rep, verdict, lint, scalar, flag, not_json

    r, rep, verdict, lint, scalar, flag, not_json = call(project, script)
    assert not r.is_error and r.structured_content["run"]["params"] == {"topics": ["a"]}
    assert not rep.is_error, rep.content[0].text  # a text result: taken as the unit's answer, as before
    assert not verdict.is_error and verdict.structured_content["stepOutcome"]["kind"] == "completed"
    assert not lint.is_error and lint.structured_content["ok"] is True
    for refused, name in ((scalar, "max_steps"), (flag, "active"), (not_json, "config")):
        assert err(refused)["code"] == "INVALID_ARGUMENT" and name in err(refused)["error"]
