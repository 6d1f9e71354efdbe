"""Upstream's driver-protocol tests, where akm disagreed (issue 39): each case on both fronts (the CLI and the
MCP tools), or on both drivers (a run driven by reports and the native drive loop).

1. A failure `retry.on` lets be re-run keeps the step open, but it is reported: `remainingUnits` counts
   only the units with no result yet (upstream report.test.ts, "RETRY-ELIGIBLE failure": 1 of a, b).
2. A running (or failed) row journaled with another input hash than the plan's is a replay divergence for
   a result, a heartbeat and a re-run alike, and nothing is written.
3. The brief names a unit's env bindings: its refs (`env`) and the variables they bind (`envBindings`),
   never a value.
4. A gate rejected once then passed finishes through reports and verdicts as natively, even when the
   loop-2 answer is the loop-1 answer again (tests/test_parity.py also runs it as a scenario).
5. A budget ceiling fails the step with one sentence on both drivers (also a parity scenario).
"""

from __future__ import annotations

import json

from tests.helpers import journal_sql, run, write_wf
from tests.test_mcp import call, err
from tests.test_session import journal

RETRY = """
    params:
      files: { type: array, items: { type: string } }
    steps:
      - id: review
        map: { over: params.files, unit: { retry: { max: 1, on: [timeout] } } }
    """
SOLO = "steps:\n  - id: build\n  - id: wrap"
SOLO_BODY = "## build\n\nBuild it.\n\n## wrap\n\nWrap it."


def _start(cli, project, name: str, frontmatter: str, body: str, *flags: str) -> str:
    write_wf(project, name, frontmatter, body)
    return cli.json("workflow", "run", name, *flags, check=3)["run"]["runId"]


def _tool(c, name: str, args: dict):
    """A tool's structured answer (anyio coroutine)."""
    return c.call_tool(name, args)


# ------------------------------------------------------------------ 1. remainingUnits


def test_a_retry_eligible_failure_is_not_remaining_at_the_cli(cli, project):
    rid = _start(cli, project, "retry.md", RETRY, "## review\n\nReview.", "--files", '["a.ts", "b.ts"]')
    ua, ub = [u["unitId"] for u in cli.json("workflow", "next", rid)["units"]]
    out = cli.json("workflow", "report", rid, ub, "--status", "failed", "--failure-reason", "timeout")
    assert out["recorded"] == "written" and out["stepOutcome"] is None
    assert out["remainingUnits"] == 1, out  # a, never reported; b is reported (and may be re-run)
    assert "may be re-run" in out["message"] and "1 unit(s) of step review still need a report" in out["message"]
    brief = cli.json("workflow", "next", rid)
    assert {u["unitId"]: u["action"] for u in brief["units"]} == {ua: "do", ub: "rerun"}
    status = cli.json("workflow", "status", rid)
    assert status["status"] == "awaiting_session" and status["steps"][0]["status"] == "pending"
    # the other unit's result leaves only the re-run: nothing remains unreported, the step still waits
    out = cli.json("workflow", "report", rid, ua, "--status", "completed", "--result", "fine")
    assert out["remainingUnits"] == 0 and out["stepOutcome"] is None
    out = cli.json("workflow", "report", rid, ub, "--status", "completed", "--result", "fine too", "--rerun")
    assert out["stepOutcome"]["kind"] == "completed"


def test_a_retry_eligible_failure_is_not_remaining_over_mcp(project):
    write_wf(project, "retry.md", RETRY, "## review\n\nReview.")

    async def script(c):
        r = (
            await _tool(c, "workflow_run", {"target": "retry.md", "params": {"files": ["a.ts", "b.ts"]}})
        ).structured_content
        rid = r["run"]["runId"]
        ua, ub = r["run"]["awaiting"]["units"]
        failed = await _tool(
            c, "unit_report", {"run_id": rid, "unit_id": ub["unitId"], "status": "failed", "failure_reason": "timeout"}
        )
        done = await _tool(c, "unit_report", {**ua["report"], "result": "fine"})
        return failed.structured_content, done.structured_content

    failed, done = call(project, script)
    assert failed["remainingUnits"] == 1 and failed["stepOutcome"] is None
    assert "1 unit(s) of the step still need a report" in failed["next"]
    assert done["remainingUnits"] == 0 and done["stepOutcome"] is None
    assert "re-run" in done["next"] and "workflow_next" in done["next"]  # the agent is told what remains


# ------------------------------------------------------------------ 2. replay divergence on a running row


def _tamper(unit_id: str, status: str | None = None) -> None:
    con = journal_sql()
    if status is None:
        con.execute("UPDATE units SET input_hash = 'deadbeef' WHERE unit_id = ?", (unit_id,))
    else:
        con.execute("UPDATE units SET input_hash = 'deadbeef', status = ? WHERE unit_id = ?", (status, unit_id))
    con.commit()
    con.close()


def test_a_running_row_with_another_input_hash_is_a_replay_divergence_at_the_cli(cli, project):
    rid = _start(cli, project, "solo.md", SOLO, SOLO_BODY)
    claim = cli.json("workflow", "report", rid, "build:solo", "--status", "running")
    assert claim["recorded"] == "heartbeat"
    _tamper("build:solo")
    for args in (
        ("--status", "completed", "--result", "built"),  # finishing the claim
        ("--status", "running"),  # heartbeating it
        ("--status", "failed", "--failure-reason", "timeout"),
        ("--status", "completed", "--result", "built", "--rerun"),
    ):
        before = journal()
        out = cli("workflow", "report", rid, "build:solo", *args)
        assert out.returncode == 2 and "error[REPLAY_DIVERGED]" in out.stderr, (args, out.stderr)
        assert "journaled as running" in out.stderr and "Traceback" not in out.stderr
        assert journal() == before, f"a refused report changed the journal: {args}"
    # a failed row is held to the same rule, a re-run included (upstream: "even with rerun")
    _tamper("build:solo", "failed")
    before = journal()
    out = cli("workflow", "report", rid, "build:solo", "--status", "completed", "--result", "built", "--rerun")
    assert out.returncode == 2 and "error[REPLAY_DIVERGED]" in out.stderr
    assert journal() == before


def test_a_running_row_with_another_input_hash_is_a_replay_divergence_over_mcp(project):
    write_wf(project, "solo.md", SOLO, SOLO_BODY)

    async def script(c):
        r = (await _tool(c, "workflow_run", {"target": "solo.md"})).structured_content
        hint = r["run"]["awaiting"]["units"][0]["report"]
        claim = (await _tool(c, "unit_report", {**hint, "status": "running"})).structured_content
        _tamper("build:solo")
        before = journal()
        finish = await _tool(c, "unit_report", {**hint, "result": "built"})
        beat = await _tool(c, "unit_report", {**hint, "status": "running"})
        return claim, finish, beat, journal() == before

    claim, finish, beat, unchanged = call(project, script)
    assert claim["recorded"] == "heartbeat"
    for refusal in (finish, beat):
        e = err(refusal)
        assert e["code"] == "REPLAY_DIVERGED" and e["exitCode"] == 2 and "journaled as running" in e["error"]
    assert unchanged, "a refused report changed the journal"


# ------------------------------------------------------------------ 3. env bindings by name

SECRET = "s3cr3t-value-never-shown"
ENVED = 'steps:\n  - id: build\n    unit:\n      env: ["env/ci-secrets", "env:absent"]'


def _env_project(project) -> None:
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "ci-secrets.env").write_text(f"CI_TOKEN={SECRET}\nexport DEPLOY_KEY=x{SECRET}\n")


def test_the_brief_names_env_bindings_at_the_cli(cli, project):
    _env_project(project)
    rid = _start(cli, project, "env.md", ENVED, "## build\n\nBuild.")
    out = cli("workflow", "next", rid, "--format", "json", check=0)
    unit = json.loads(out.stdout)["units"][0]
    assert unit["env"] == ["env/ci-secrets", "env/absent"]  # the refs, the colon form read as env/<name>
    assert unit["envBindings"] == ["CI_TOKEN", "DEPLOY_KEY"]  # what they bind here; the absent one binds none
    assert SECRET not in out.stdout and SECRET not in out.stderr
    text = cli("workflow", "next", rid, check=0).stdout
    assert SECRET not in text


def test_the_brief_names_env_bindings_over_mcp(project):
    _env_project(project)
    write_wf(project, "env.md", ENVED, "## build\n\nBuild.")

    async def script(c):
        r = await _tool(c, "workflow_run", {"target": "env.md"})
        rid = r.structured_content["run"]["runId"]
        return r, await _tool(c, "workflow_next", {"run_id": rid})

    run, brief = call(project, script)
    for answer, unit in (
        (run, run.structured_content["run"]["awaiting"]["units"][0]),
        (brief, brief.structured_content["units"][0]),
    ):
        assert unit["env"] == ["env/ci-secrets", "env/absent"] and unit["envBindings"] == ["CI_TOKEN", "DEPLOY_KEY"]
        assert SECRET not in json.dumps(answer.structured_content) + "".join(
            getattr(b, "text", "") for b in answer.content
        )


# ------------------------------------------------------------------ 4. a gate loop through reports

LOOP = "steps:\n  - id: work\n    gate: { max_loops: 3 }"
LOOP_BODY = "## work\n\nDo the work.\n\n### gate\n\n- The work is thorough."
REJECT = {"complete": False, "missing": ["thoroughness"], "feedback": "Go deeper."}


def _loop_graph(rid: str) -> list[tuple]:
    con = journal_sql()
    try:
        rows = con.execute(
            "SELECT unit_id, status, result_json FROM units WHERE run_id = ? ORDER BY unit_id", (rid,)
        ).fetchall()
    finally:
        con.close()
    return [(u, s, json.loads(r)) for u, s, r in rows]


EXPECTED_LOOP = [
    ("work.gate:l1", "completed", REJECT),
    ("work.gate:l2", "completed", {"complete": True, "missing": []}),
    ("work:solo", "completed", "the same work"),
    ("work:solo~l2", "completed", "the same work"),
]


def test_a_gate_rejected_once_finishes_through_reports_at_the_cli(cli, project):
    """The agent answers both loops alike and names no attempt, as a careless driver would."""
    rid = _start(cli, project, "loop.md", LOOP, LOOP_BODY)
    verdicts = [REJECT, {"complete": True}]
    briefs = 0
    while briefs < 60:
        brief, briefs = cli.json("workflow", "next", rid), briefs + 1
        if brief["kind"] == "done":
            break
        if brief["kind"] == "judge":
            cli.json("workflow", "report", rid, brief["judge"]["unitId"], "--verdict", json.dumps(verdicts.pop(0)))
        else:
            assert brief["kind"] == "units", brief
            for u in brief["units"]:
                cli.json("workflow", "report", rid, u["unitId"], "--status", "completed", "--result", "the same work")
    assert brief["kind"] == "done" and briefs == 5, (briefs, brief)
    assert _loop_graph(rid) == EXPECTED_LOOP


def test_a_gate_rejected_once_finishes_through_reports_over_mcp(project):
    write_wf(project, "loop.md", LOOP, LOOP_BODY)

    async def script(c):
        rid = (await _tool(c, "workflow_run", {"target": "loop.md"})).structured_content["run"]["runId"]
        verdicts = [REJECT, {"complete": True}]
        for briefs in range(1, 61):
            b = (await _tool(c, "workflow_next", {"run_id": rid})).structured_content
            if b["kind"] == "done":
                return rid, briefs
            if b["kind"] == "judge":
                await _tool(
                    c, "unit_report", {"run_id": rid, "unit_id": b["judge"]["unitId"], "verdict": verdicts.pop(0)}
                )
            for u in b["units"]:
                r = await _tool(c, "unit_report", {"run_id": rid, "unit_id": u["unitId"], "result": "the same work"})
                assert not r.is_error, r.content[0].text
        return rid, None

    rid, briefs = call(project, script)
    assert briefs == 5
    assert _loop_graph(rid) == EXPECTED_LOOP


def test_the_same_gate_loop_driven_natively(project, fake_openai):
    """The drive loop, on the same workflow (a loopback model answers alike in both loops, its judge rejects
    once): the rows the report path ends with above."""
    (project / ".akm").mkdir()
    (project / ".akm" / "config.json").write_text(
        json.dumps(
            {
                "engines": {
                    "m": {"kind": "llm", "endpoint": fake_openai.url, "model": "plain"},
                    "j": {"kind": "llm", "endpoint": fake_openai.url, "model": "verdict-reject-once"},
                },
                "defaults": {"llmEngine": "m"},
                "workflow": {"judgeEngine": "j"},
            }
        )
    )
    write_wf(project, "loop.md", LOOP, LOOP_BODY)
    res = run(project / "loop.md", project)
    assert res.run.status == "completed", res.run
    graph = _loop_graph(res.run.run_id)
    assert [(u, s) for u, s, _ in graph] == [(u, s) for u, s, _ in EXPECTED_LOOP]
    assert [r["complete"] for u, _, r in graph if ".gate:" in u] == [False, True]
    assert [r for u, _, r in graph if ".gate:" not in u] == ["hello", "hello"]


# ------------------------------------------------------------------ 5. one budget sentence

BUDGET = """
    params:
      xs: { type: array, items: { type: string } }
    budget: { max_units: 2 }
    steps:
      - id: m
        map: { over: params.xs, concurrency: 1%s }
    """
NOTE = "budget exceeded (max_units ceiling): 2 of 2 units already dispatched"


def test_a_unit_ceiling_fails_the_step_with_one_sentence_on_both_drivers(cli, project):
    write_wf(project, "n.md", BUDGET % ", unit: { exec: { command: [echo, hi] } }", "## m\n\nM.")
    out = cli.json("workflow", "run", "n.md", "--xs", '["a", "b", "c"]', check=1)
    assert out["run"]["status"] == "failed" and out["run"]["steps"][0]["notes"] == NOTE
    rid = _start(cli, project, "s.md", BUDGET % "", "## m\n\nM.", "--xs", '["a", "b", "c"]')
    units = [u["unitId"] for u in cli.json("workflow", "next", rid)["units"]]
    for u in units[:2]:
        cli.json("workflow", "report", rid, u, "--status", "completed", "--result", "ok")
    refusal = cli("workflow", "report", rid, units[2], "--status", "completed", "--result", "ok")
    assert refusal.returncode == 2 and "error[BUDGET_EXCEEDED]" in refusal.stderr
    assert NOTE + "." in refusal.stderr
    status = cli.json("workflow", "status", rid)
    assert status["status"] == "failed" and status["steps"][0]["notes"] == NOTE
