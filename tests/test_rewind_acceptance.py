"""Issue 33's acceptance, end to end: the corpus's github-issues-parallel-implementer over MCP (the official
Python client, `from mcp import Client`) against the built `dist/akm`.

`plan-and-order` reports `{"order": [1, 2]}` — valid against its `{type: object}` schema, approved by its gate —
and `implement` then fails: its fan-out reads `ordered_issues`. Before issue 33 nothing could fix that run. Now
the failed run's `next` names the rewind; one rewind and one corrected report recover it, the run completes, and
the step before (`intake`) ran once.
"""

from __future__ import annotations

import json
import shutil
import sqlite3

import anyio
from mcp import Client, StdioServerParameters

from tests.helpers import CORPUS, needs_shared
from tests.mcp_wire import server_env
from tests.schema_examples import example
from tests.test_no_dead_ends import proposed_calls

pytestmark = needs_shared()

WORKFLOW = "github-issues-parallel-implementer.md"


def test_the_issue_scenario_is_recovered_with_one_rewind_and_one_report(akm_bin, shiv_root, tmp_path, project):
    shutil.copy(CORPUS / "current" / WORKFLOW, project / WORKFLOW)
    params = {
        "repo": "acme/widgets",
        "issues": [1, 2],
        "reviewers": ["senior-engineer"],
        "required_checks": ["unit"],
    }
    server = StdioServerParameters(
        command=str(akm_bin), args=["mcp"], env=server_env(tmp_path, shiv_root), cwd=str(project)
    )
    tally = {"rewinds": 0, "corrections": 0}

    async def main() -> dict:
        async with Client(server) as c:

            async def call(name: str, args: dict) -> dict:
                r = await c.call_tool(name, args)
                assert not r.is_error, f"{name}: {r.content[0].text}"
                return r.structured_content

            async def work(brief: dict, answers: dict) -> dict | None:
                """Do what a brief asks: each unit with its answer, then the verdict; the last answer."""
                out = None
                if brief["kind"] == "units":
                    for u in brief["units"]:
                        value = answers.get(brief["stepId"]) or example(u["outputSchema"], 0)
                        if callable(value):
                            value = value(u)
                        out = await call("unit_report", {**u["report"], "result": value})
                    nxt = out.get("brief") if out else None
                    if nxt and nxt["kind"] == "judge":
                        out = await call("unit_report", {**nxt["judge"]["report"], "verdict": {"complete": True}})
                elif brief["kind"] == "judge":
                    out = await call("unit_report", {**brief["judge"]["report"], "verdict": {"complete": True}})
                return out

            answers: dict = {"plan-and-order": {"order": [1, 2]}}  # the wrong but schema-valid result
            run = await call("workflow_run", {"target": WORKFLOW, "params": params})
            rid = run["run"]["runId"]
            for _ in range(10):
                if run["run"]["status"] != "awaiting_session":
                    break
                await work(run["run"]["awaiting"], answers)
                run = await call("workflow_run", {"target": rid})
            assert run["run"]["status"] == "failed" and run["run"]["currentStepId"] == "implement", run["run"]
            assert run["run"]["recovery"]["stepId"] == "plan-and-order", run["run"]["recovery"]
            # The remedy proposed is the one that works: a rewind to plan-and-order, then run.
            calls = proposed_calls(run["next"])
            assert [name for name, _ in calls] == ["workflow_rewind", "workflow_run"], run["next"]
            rewound = await call(*calls[0])
            tally["rewinds"] += 1
            assert rewound["steps"][:3] == ["plan-and-order", "prepare-worktrees", "implement"]
            run = await call(*calls[1])
            brief = run["run"]["awaiting"]
            assert brief["stepId"] == "plan-and-order" and brief["units"][0]["action"] == "rerun"
            answers["plan-and-order"] = {"ordered_issues": [1, 2], "briefs": {}, "soft_conflicts": []}
            await work(brief, answers)
            tally["corrections"] += 1
            answers["implement"] = lambda u: {"status": "clean", "issue": u["context"]["item"]}
            for _ in range(20):
                run = await call("workflow_run", {"target": rid})
                if run["run"]["status"] != "awaiting_session":
                    break
                await work(run["run"]["awaiting"], answers)
            return run

    run = anyio.run(main)
    assert run["run"]["status"] == "completed", (run["run"], run.get("next"))
    assert tally == {"rewinds": 1, "corrections": 1}
    con = sqlite3.connect(tmp_path / "akm-data" / "akm-journal.sqlite3")
    try:
        rid = run["run"]["runId"]
        intake = con.execute("SELECT attempts FROM units WHERE run_id = ? AND step_id = 'intake'", (rid,)).fetchall()
        assert intake == [(1,), (1,)]  # its unit and its gate verdict, each once
        assert con.execute("SELECT COUNT(*) FROM superseded_units WHERE step_id = 'intake'").fetchone() == (0,)
        (old,) = con.execute(
            "SELECT result_json FROM superseded_units WHERE run_id = ? AND unit_id = 'plan-and-order:solo'", (rid,)
        ).fetchall()
        assert json.loads(old[0]) == {"order": [1, 2]}  # the wrong result is kept, marked superseded
        implemented = con.execute(
            "SELECT COUNT(*) FROM units WHERE run_id = ? AND step_id = 'implement' AND phase IS NULL", (rid,)
        ).fetchone()
        assert implemented == (2,)
    finally:
        con.close()
