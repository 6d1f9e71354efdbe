"""Reports agents cannot get wrong, over the official MCP client against the built `dist/akm` (issue 16).

Strict arguments (one rule book: the api's request models), idempotent resends, stale-loop refusals and the
answers that spare a round trip — each refusal leaves the journal unchanged.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters  # noqa: E402

from akm import paths
from tests.helpers import py, write_wf
from tests.mcp_wire import server_env


def gated(project: Path) -> Path:
    return write_wf(
        project,
        "flow.md",
        f"""
        params:
          topic: {{ type: string, default: cats }}
        steps:
          - id: write
            gate: {{ max_loops: 2 }}
            output: {{ type: object, required: [text], properties: {{ text: {{ type: string }} }} }}
          - id: show
            unit: {{ exec: {{ command: {py('print("shown")')} }} }}
        """,
        "## write\n\nWrite a sentence.\n\n### gate\n\n- Names the topic.\n\n## show\n\nShow.",
    )


def journal(data_dir: Path) -> list[tuple]:
    con = sqlite3.connect(data_dir / paths.JOURNAL_FILE_NAME)
    try:
        return [
            *con.execute("SELECT * FROM units ORDER BY rowid"),
            *con.execute("SELECT * FROM steps ORDER BY rowid"),
            *con.execute("SELECT id, status, current_step_id, params_json FROM runs"),
        ]
    finally:
        con.close()


def err(result) -> dict:
    assert result.is_error, result
    return json.loads(result.content[-1].text)


def serve(akm_bin, shiv_root, tmp_path, project, script):
    params = StdioServerParameters(
        command=str(akm_bin), args=["mcp"], env=server_env(tmp_path, shiv_root), cwd=str(project)
    )

    async def main():
        async with Client(params) as c:
            return await script(c)

    return anyio.run(main)


def test_unknown_misspelt_and_lax_arguments_are_refused_and_camel_case_is_taken(akm_bin, shiv_root, tmp_path, project):
    gated(project)
    data = tmp_path / "akm-data"

    async def script(c):
        tools = {t.name: t for t in (await c.list_tools()).tools}
        r = await c.call_tool("workflow_run", {"target": "flow.md", "max_steps": 0})
        assert r.structured_content["run"]["status"] == "active", r  # 0: started, nothing driven (as the CLI)
        rid = r.structured_content["run"]["runId"]
        before = journal(data)
        bad = {
            "misspelt result": await c.call_tool(
                "unit_report", {"run_id": rid, "unit_id": "write:solo", "reslt": {"text": "x"}}
            ),
            "parameters": await c.call_tool(
                "workflow_run", {"target": "flow.md", "parameters": {"topic": "x"}, "new": True}
            ),
            "lax boolean": await c.call_tool(
                "unit_report", {"run_id": rid, "unit_id": "write:solo", "result": {"text": "x"}, "rerun": "yes"}
            ),
            "twice": await c.call_tool("unit_report", {"run_id": rid, "runId": rid, "unit_id": "write:solo"}),
            # camelCase is read, so the step guard holds (before, `expectStep` was dropped and the guard skipped)
            "guarded": await c.call_tool(
                "unit_report", {"runId": rid, "unitId": "write:solo", "expectStep": "show", "result": {"text": "x"}}
            ),
        }
        after_refusals = journal(data)
        run = await c.call_tool("workflow_run", {"target": rid})
        brief = run.structured_content["run"]["awaiting"]
        unit = brief["units"][0]
        # the brief's own camelCase report hint, passed as it is, plus the result
        ok = await c.call_tool("unit_report", {**unit["report"], "result": {"text": "about cats"}})
        return tools, bad, before == after_refusals, ok

    tools, bad, unchanged, ok = serve(akm_bin, shiv_root, tmp_path, project, script)
    assert unchanged, "a refused call changed the journal"
    for name, t in tools.items():
        assert t.input_schema["additionalProperties"] is False and t.title, name
    assert set(tools["unit_report"].input_schema["properties"]) >= {"run_id", "unit_id", "attempt_id", "result"}
    e = err(bad["misspelt result"])
    assert e["code"] == "INVALID_ARGUMENT" and "'reslt'" in e["error"] and "did you mean result" in e["error"]
    assert e["details"]["argument"] == "reslt"
    assert err(bad["parameters"])["code"] == "INVALID_ARGUMENT" and "'parameters'" in err(bad["parameters"])["error"]
    assert err(bad["lax boolean"])["code"] == "INVALID_ARGUMENT" and "rerun" in err(bad["lax boolean"])["error"]
    assert err(bad["twice"])["code"] == "INVALID_ARGUMENT"
    assert err(bad["guarded"])["code"] == "STEP_MISMATCH"
    assert not ok.is_error, ok.content[0].text
    assert ok.structured_content["recorded"] == "written"
    assert ok.structured_content["brief"]["kind"] == "judge"  # no workflow_next needed for the verdict


def test_resends_are_idempotent_and_a_stale_loop_is_refused_over_stdio(akm_bin, shiv_root, tmp_path, project):
    gated(project)
    data = tmp_path / "akm-data"

    async def script(c):
        r = (await c.call_tool("workflow_run", {"target": "flow.md"})).structured_content
        rid = r["run"]["runId"]
        unit = r["run"]["awaiting"]["units"][0]
        first = {**unit["report"], "result": {"text": "about dogs"}}
        judge = (await c.call_tool("unit_report", first)).structured_content["brief"]["judge"]
        reject = {**judge["report"], "verdict": {"complete": False, "missing": ["the topic"], "feedback": "Cats!"}}
        rejected = (await c.call_tool("unit_report", reject)).structured_content
        before = journal(data)
        resent = await c.call_tool("unit_report", first)  # the loop-1 answer again, as lost
        resent_verdict = await c.call_tool("unit_report", reject)
        stale = await c.call_tool("unit_report", {**first, "result": {"text": "about dogs, again"}})
        unchanged = journal(data) == before
        loop2 = rejected["brief"]["units"][0]
        judge2 = (
            await c.call_tool("unit_report", {**loop2["report"], "result": {"text": "about cats"}})
        ).structured_content["brief"]["judge"]
        accept = {**judge2["report"], "verdict": {"complete": True}}
        accepted = (await c.call_tool("unit_report", accept)).structured_content
        accepted_again = (await c.call_tool("unit_report", accept)).structured_content
        done = (await c.call_tool("workflow_run", {"target": rid})).structured_content
        after_end = (await c.call_tool("unit_report", accept)).structured_content
        return (rejected, resent, resent_verdict, stale, unchanged, judge2, accepted, accepted_again, done, after_end)

    (rejected, resent, resent_verdict, stale, unchanged, judge2, accepted, accepted_again, done, after_end) = serve(
        akm_bin, shiv_root, tmp_path, project, script
    )
    assert rejected["stepOutcome"]["kind"] == "next_loop" and rejected["brief"]["gateLoop"] == 2
    assert "brief.units" in rejected["next"]
    assert unchanged, "a resend or a stale report changed the journal"
    assert resent.structured_content["recorded"] == "idempotent" and resent.structured_content["gateLoop"] == 1
    assert resent_verdict.structured_content["recorded"] == "idempotent"
    assert err(stale)["code"] == "STALE_REPORT"
    assert judge2["artifact"] == {"text": "about cats"}  # the loop-2 judge sees the loop-2 answer
    assert accepted["stepOutcome"]["kind"] == "completed" and "workflow_run" in accepted["next"]
    assert accepted_again["recorded"] == "idempotent"
    assert done["run"]["status"] == "completed"
    assert after_end["recorded"] == "idempotent" and after_end["runStatus"] == "completed"


def test_answers_stay_compact_whatever_the_artifacts(akm_bin, shiv_root, tmp_path, project):
    big = "import json; print(json.dumps({'rows': ['x' * 1000 for _ in range(400)]}))"  # a 400 KB artifact
    write_wf(
        project,
        "big.md",
        f"""
        steps:
          - id: big
            unit: {{ exec: {{ command: {py(big)} }} }}
          - id: read
            inputs: [steps.big.output]
            gate: {{ max_loops: 1 }}
        """,
        "## big\n\nBig.\n\n## read\n\nSummarise the rows.\n\n### gate\n\n- Short.",
    )

    async def script(c):
        run = await c.call_tool("workflow_run", {"target": "big.md"})
        rid = run.structured_content["run"]["runId"]
        status = await c.call_tool("workflow_status", {"run_id": rid})
        whole_step = [await c.call_tool("workflow_status", {"run_id": rid, "step": "big"})]
        while (page := whole_step[-1].structured_content["steps"][0].get("outputPage") or {}).get("nextOffset"):
            args = {"run_id": rid, "step": "big", "output_offset": page["nextOffset"]}
            whole_step.append(await c.call_tool("workflow_status", args))
        nxt = await c.call_tool("workflow_next", {"run_id": rid})
        unit = nxt.structured_content["units"][0]
        whole_unit = [await c.call_tool("workflow_next", {"run_id": rid, "unit_id": unit["unitId"]})]
        while (page := whole_unit[-1].structured_content["units"][0].get("promptPage") or {}).get("nextOffset"):
            args = {"run_id": rid, "unit_id": unit["unitId"], "prompt_offset": page["nextOffset"]}
            whole_unit.append(await c.call_tool("workflow_next", args))
        rep = await c.call_tool("unit_report", {**unit["report"], "result": "400 rows of x"})
        return run, status, whole_step, nxt, whole_unit, rep

    run, status, whole_step, nxt, whole_unit, rep = serve(akm_bin, shiv_root, tmp_path, project, script)
    limit = 64 * 1024
    for answer in (run, status, nxt, rep, *whole_step, *whole_unit):
        assert not answer.is_error, answer.content[0].text
        assert len(answer.content[0].text.encode()) <= limit, len(answer.content[0].text)
        assert len(json.dumps(answer.structured_content).encode()) <= limit
    step = run.structured_content["run"]["steps"][0]
    assert step["outputClipped"]["bytes"] > 400_000
    assert (
        step["outputClipped"]["fetch"].startswith("workflow_status(") and 'step="big"' in step["outputClipped"]["fetch"]
    )
    assert all(len(page.structured_content["steps"]) == 1 for page in whole_step)
    # fetched whole, in pages (a command's stdout text), each naming the next
    output = "".join(page.structured_content["steps"][0]["output"] for page in whole_step)
    assert all("outputClipped" not in page.structured_content["steps"][0] for page in whole_step)
    assert len(whole_step) > 1 and whole_step[-1].structured_content["steps"][0]["outputPage"]["nextOffset"] is None
    assert len(json.loads(output)["rows"]) == 400
    unit = nxt.structured_content["units"][0]
    assert "inputs.steps.big.output" in unit["context"]["clipped"]  # once, in the prompt — and that is clipped
    assert unit["promptClipped"]["bytes"] > 400_000
    prompt = "".join(page.structured_content["units"][0]["prompt"] for page in whole_unit)
    assert prompt.count("x" * 1000) == 400
    assert rep.structured_content["brief"]["kind"] == "judge"


def test_capabilities_are_real_and_runs_are_resources(akm_bin, shiv_root, tmp_path, project):
    gated(project)

    async def script(c):
        caps = c.server_capabilities
        r = await c.call_tool("workflow_run", {"target": "flow.md"})
        rid = r.structured_content["run"]["runId"]
        listed = await c.read_resource("akm://runs")
        one = await c.read_resource(f"akm://runs/{rid}")
        templates = await c.list_resource_templates()
        return caps, rid, listed, one, templates

    caps, rid, listed, one, templates = serve(akm_bin, shiv_root, tmp_path, project, script)
    assert caps.prompts is None and caps.resources is not None and caps.tools is not None
    assert rid in listed.contents[0].text
    assert json.loads(one.contents[0].text)["status"] == "awaiting_session"
    assert any(t.uri_template == "akm://runs/{run_id}" for t in templates.resource_templates)
