"""The session protocol (D11-D13): a calling agent does units and judges gates, then reports them."""

from __future__ import annotations

import json

import pytest

from akm import api
from akm.errors import AkmError
from tests.helpers import db_rows, journal_backend, journal_sql, open_test_journal, py, run, write_wf

REVIEW = """
    params:
      files: { type: array, items: { type: string } }
    steps:
      - id: review
        map:
          over: params.files
          unit:
            output: { type: object, required: [verdict], properties: { verdict: { type: string } } }
      - id: tally
        unit: { exec: { command: %s } }
        inputs: [steps.review.output]
    """ % py("import os,json; v=json.loads(os.environ['AKM_INPUTS'])['steps.review.output']; print(len(v))")


def _insertion_order(table: str) -> str:
    """SQLite's rowid; on PostgreSQL the identity column (steps have none: their key orders them)."""
    if journal_backend() != "postgres":
        return "rowid"
    return {"events": "id", "steps": "run_id, sequence_index"}.get(table, "seq")


def journal() -> dict[str, list[tuple]]:
    """Everything a refused report must leave untouched."""
    con = journal_sql()
    try:
        return {
            t: con.execute(f"SELECT * FROM {t} ORDER BY {_insertion_order(t)}").fetchall()
            for t in ("runs", "steps", "units", "events")
        }
    finally:
        con.close()


def start(project, frontmatter, body, **params):
    wf = write_wf(project, "wf.md", frontmatter, body)
    res = run(wf, project, params=params or None)
    assert res.run.status == "awaiting_session", res.run
    return res.run.run_id


def report(run_id, unit_id, project, **kw):
    kw.setdefault("status", "completed")
    return api.report_unit(run_id, unit_id, cwd=str(project), **kw).to_json()


def refused(code, fn, *a, **kw):
    before = journal()
    with pytest.raises(AkmError) as exc:
        fn(*a, **kw)
    assert exc.value.code == code, exc.value.message
    assert journal() == before, "a refused report changed the journal"
    return exc.value


# ------------------------------------------------------------------ the loop


def test_fan_out_session_step_reported_then_the_next_exec_step_sees_it(project):
    rid = start(project, REVIEW, "## review\n\nReview the file.\n\n## tally\n\nCount.", files=["a.py", "b.py"])
    brief = api.next_brief(rid).to_json()
    assert brief["kind"] == "units" and brief["stepId"] == "review" and len(brief["units"]) == 2
    u0 = brief["units"][0]
    assert u0["context"]["item"] == "a.py" and u0["context"]["itemIndex"] == 0
    assert u0["outputSchema"]["required"] == ["verdict"] and "Review the file." in u0["prompt"]
    assert u0["report"] == {
        "runId": rid,
        "unitId": u0["unitId"],
        "attemptId": u0["attemptId"],
        "gateLoop": 1,
        "expectStep": "review",
        "status": "completed",
        "rerun": False,
    }
    assert u0["resultKind"] == "json"
    assert brief["instructions"].strip() == "Review the file."
    first = report(rid, u0["unitId"], project, result={"verdict": "ok"}, expect_step="review")
    assert first["recorded"] == "written" and first["remainingUnits"] == 1 and first["stepOutcome"] is None
    assert first["runStatus"] == "awaiting_session"
    second = report(rid, brief["units"][1]["unitId"], project, result='{"verdict": "fine"}')
    assert second["stepOutcome"]["kind"] == "completed" and second["runStatus"] == "active"
    res = run(rid, project)
    assert res.run.status == "completed"
    outputs = {s.id: s.output for s in res.run.steps}
    assert outputs == {"review": [{"verdict": "ok"}, {"verdict": "fine"}], "tally": "2"}


def test_text_session_unit_and_empty_text_is_null(project):
    rid = start(project, "steps:\n  - id: write\n  - id: after", "## write\n\nWrite.\n\n## after\n\nMore.")
    report(rid, "write:solo", project, result="a haiku")
    out = report(rid, "after:solo", project, result="")
    assert out["stepOutcome"]["kind"] == "completed"
    view = api.run_status(rid)
    assert view.status == "completed"
    assert [s.output for s in view.steps] == ["a haiku", None]


def test_an_unclaimed_report_is_journaled_at_one_instant_and_a_claimed_one_from_its_claim(project):
    # An unclaimed report is written whole in one transaction: its row starts and finishes at one stamp (the
    # report says "not timed"), never the milliseconds between two reads of the clock. A claim times the unit.
    rid = start(project, "steps:\n  - id: write\n  - id: after", "## write\n\nWrite.\n\n## after\n\nMore.")
    report(rid, "write:solo", project, result="a haiku")
    report(rid, "after:solo", project, status="running", holder="me")
    import time

    time.sleep(0.01)  # the claim and the result are two calls: at least this far apart
    report(rid, "after:solo", project, result="more", holder="me")
    stamps = dict(
        (u, (s, f)) for u, s, f in db_rows("SELECT unit_id, started_at, finished_at FROM units WHERE run_id = ?", rid)
    )
    assert stamps["write:solo"][0] == stamps["write:solo"][1], stamps
    assert stamps["after:solo"][0] < stamps["after:solo"][1], stamps


def test_gate_judged_by_a_reported_verdict_reject_loop_accept(project):
    rid = start(
        project,
        "steps:\n  - id: draft\n    gate: { max_loops: 2 }",
        "## draft\n\nDraft it.\n\n### gate\n\n- Mentions cats.",
    )
    report(rid, "draft:solo", project, result="about dogs")
    brief = api.next_brief(rid).to_json()
    assert brief["kind"] == "judge" and brief["judge"]["unitId"] == "draft.gate:l1"
    assert brief["judge"]["artifact"] == "about dogs" and "- Mentions cats." in brief["judge"]["prompt"]
    out = report(
        rid, "draft.gate:l1", project, verdict={"complete": False, "missing": ["cats"], "feedback": "Add cats."}
    )
    assert out["stepOutcome"]["kind"] == "next_loop" and out["stepOutcome"]["feedback"] == "Add cats."
    brief = api.next_brief(rid).to_json()
    assert brief["gateLoop"] == 2 and brief["units"][0]["attemptId"] == "draft:solo~l2"
    assert brief["units"][0]["context"]["gateFeedback"] == {"feedback": "Add cats.", "missing": ["cats"]}
    assert "Add cats." in brief["units"][0]["prompt"]
    report(rid, "draft:solo", project, result="about cats")
    out = report(rid, "draft.gate:l2", project, verdict='{"complete": true}')
    assert out["stepOutcome"]["kind"] == "completed" and out["runStatus"] == "completed"
    gates = db_rows("SELECT unit_id, status, result_json FROM units WHERE phase = 'gate' ORDER BY unit_id")
    assert [(g[0], json.loads(g[2])["complete"]) for g in gates] == [("draft.gate:l1", False), ("draft.gate:l2", True)]


def test_exhausted_gate_blocks_and_resume_gives_a_fresh_budget(project):
    rid = start(project, "steps:\n  - id: draft", "## draft\n\nDraft.\n\n### gate\n\n- Perfect.")
    report(rid, "draft:solo", project, result="meh")
    out = report(
        rid, "draft.gate:l1", project, verdict={"complete": False, "missing": ["perfection"], "feedback": "Try harder."}
    )
    assert out["stepOutcome"]["kind"] == "blocked" and out["runStatus"] == "blocked"
    assert out["stepOutcome"]["missing"] == ["perfection"] and out["stepOutcome"]["feedback"] == "Try harder."
    view = api.run_status(rid)
    assert view.steps[0].status == "blocked" and "Try harder." in view.steps[0].notes
    api.resume(rid)
    res = run(rid, project)  # loop 2 carries the rejection's feedback
    assert res.run.status == "awaiting_session"
    brief = api.next_brief(rid).to_json()
    assert brief["gateLoop"] == 2 and brief["units"][0]["attemptId"] == "draft:solo~l2"
    report(rid, "draft:solo", project, result="perfect")
    out = report(rid, "draft.gate:l2", project, verdict={"complete": True})
    assert out["runStatus"] == "completed"


def test_next_never_writes(project):
    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["x"])
    before = journal()
    api.next_brief(rid).to_json()
    api.next_brief(rid).to_json()
    assert journal() == before


# ------------------------------------------------------------------ hostile reports, one per guard


def test_unknown_unit_is_refused_naming_the_valid_ones(project):
    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["a"])
    err = refused("UNKNOWN_UNIT", report, rid, "review.unit:notreal", project, result={"verdict": "x"})
    assert "review.unit:" in err.message and err.details["units"]


def test_wrong_step_is_refused(project):
    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["a"])
    unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
    err = refused("STEP_MISMATCH", report, rid, unit, project, result={"verdict": "x"}, expect_step="tally")
    assert "is now on step review" in err.message


@pytest.mark.parametrize(
    "result,code", [({"wrong": "shape"}, "RESULT_INVALID"), ("not json", "RESULT_INVALID"), (None, "RESULT_REQUIRED")]
)
def test_result_missing_its_schema_is_refused_with_the_errors(project, result, code):
    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["a"])
    unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
    kw = {"result": result} if result is not None else {}
    err = refused(code, report, rid, unit, project, **kw)
    if code == "RESULT_INVALID" and isinstance(result, dict):
        assert 'missing required property "verdict"' in err.message and err.details["errors"]


def test_a_result_too_large_for_the_journal_is_refused_before_it_is_parsed(project):
    from akm.engine.session import MAX_RESULT_BYTES

    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["a"])
    unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
    big = "x" * MAX_RESULT_BYTES
    refused("RESULT_TOO_LARGE", report, rid, unit, project, result='{"verdict": "%s"}' % big)  # CLI: text
    err = refused("RESULT_TOO_LARGE", report, rid, unit, project, result={"verdict": big})  # MCP: a JSON value
    assert err.details["maxBytes"] == 1024 * 1024 and "file" in err.message  # more than the journal's 1 MiB
    refused("RESULT_TOO_LARGE", report, rid, unit, project, status="failed", result=big + "x")
    # issue 23 item 2: the journal holds at most 1 MiB of a unit's result (spec/engine.md); a 10 MB report
    # was stored whole. Just over is refused (nothing written), just under is recorded.
    over = refused("RESULT_TOO_LARGE", report, rid, unit, project, result={"verdict": "x" * (1024 * 1024 - 13)})
    assert over.details == {"bytes": 1024 * 1024 + 1, "maxBytes": 1024 * 1024} and "1 MiB" in over.message
    assert db_rows("SELECT count(*) FROM units WHERE status = 'completed'") == [(0,)]
    fits = report(rid, unit, project, result={"verdict": "x" * (1024 * 1024 - 14)})  # exactly 1 MiB is fine
    assert fits["recorded"] == "written"


def test_a_string_schema_takes_the_text_itself(project):
    """Over MCP `result: "Ada"` is already a JSON string: it must not need quoting twice (nor "42" become 42)."""
    rid = start(
        project,
        "steps:\n  - id: name\n    output: { type: string }\n  - id: age\n"
        "    output: { type: object, required: [n], properties: { n: { type: integer } } }",
        "## name\n\nA name.\n\n## age\n\nAn age.",
    )
    assert report(rid, "name:solo", project, result="42", status="running")["recorded"] == "heartbeat"
    assert report(rid, "name:solo", project, result="42")["stepOutcome"]["kind"] == "completed"
    assert db_rows("SELECT result_json FROM units WHERE unit_id = 'name:solo'") == [('"42"',)]
    refused("RESULT_INVALID", report, rid, "age:solo", project, result="Ada")  # an object schema still wants JSON


def test_different_content_for_a_completed_unit_diverges_unless_rerun(project):
    rid = start(project, "steps:\n  - id: w\n  - id: v", "## w\n\nW.\n\n## v\n\nV.")
    assert report(rid, "w:solo", project, result="one")["recorded"] == "written"
    # the step completed: the unit is no longer in the current work; report the next step's unit twice
    report(rid, "v:solo", project, status="running", holder="me")
    first = report(rid, "v:solo", project, result="first", holder="me")
    assert first["runStatus"] == "completed"
    refused("RUN_NOT_ACTIVE", report, rid, "v:solo", project, result="second", holder="me")


def test_conflicting_and_idempotent_reports_on_an_open_step(project):
    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["a", "b"])
    unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
    assert report(rid, unit, project, result={"verdict": "ok"})["recorded"] == "written"
    assert report(rid, unit, project, result={"verdict": "ok"})["recorded"] == "idempotent"
    refused("REPORT_CONFLICT", report, rid, unit, project, result={"verdict": "changed"})
    out = report(rid, unit, project, result={"verdict": "changed"}, rerun=True)
    assert out["recorded"] == "written"
    assert db_rows("SELECT attempts, result_json FROM units WHERE unit_id = ?", unit) == [(2, '{"verdict":"changed"}')]


def test_foreign_and_expired_claims(project):
    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["a", "b"])
    unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
    claimed = report(rid, unit, project, status="running", holder="agent-1")
    assert claimed["claim"]["holder"] == "agent-1" and claimed["recorded"] == "heartbeat"  # as upstream
    assert report(rid, unit, project, status="running", holder="agent-1")["recorded"] == "heartbeat"
    brief_unit = api.next_brief(rid).to_json()["units"][0]
    assert brief_unit["action"] == "claimed" and brief_unit["claim"]["holder"] == "agent-1"
    err = refused("CLAIM_HELD", report, rid, unit, project, result={"verdict": "x"}, holder="agent-2")
    assert "agent-1" in err.message
    # the claim expires: its own holder must claim again before reporting
    con = journal_sql()
    con.execute("UPDATE units SET claim_expires_at = '2000-01-01T00:00:00.000Z' WHERE unit_id = ?", (unit,))
    con.commit()
    con.close()
    refused("CLAIM_EXPIRED", report, rid, unit, project, result={"verdict": "x"}, holder="agent-1")
    # ... while anyone may take over the expired claim
    assert report(rid, unit, project, result={"verdict": "x"}, holder="agent-2")["recorded"] == "written"
    assert db_rows("SELECT attempts FROM units WHERE unit_id = ?", unit) == [(2,)]


def test_live_engine_lease_refuses_reports(project):
    rid = start(project, REVIEW, "## review\n\nR.\n\n## tally\n\nT.", files=["a"])
    unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
    from akm.store import runs as runs_store

    with open_test_journal() as db:
        assert runs_store.acquire_lease(db, rid, "engine-x", host="elsewhere", pid=1) is None
    err = refused("LEASE_HELD", report, rid, unit, project, result={"verdict": "x"})
    assert "engine-x" in err.message
    assert any("driving this run" in w for w in api.next_brief(rid).to_json()["warnings"])


def test_command_units_and_finished_runs_are_not_reportable(project):
    wf = write_wf(
        project,
        "x.md",
        f"""
        steps:
          - id: cmd
            unit: {{ exec: {{ command: {py("import sys; sys.exit(3)")} }} }}
        """,
        "## cmd\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    refused("RUN_NOT_ACTIVE", report, res.run.run_id, "cmd:solo", project, result="faked")


def test_verdicts_only_when_a_verdict_is_awaited(project):
    rid = start(project, "steps:\n  - id: d", "## d\n\nD.\n\n### gate\n\n- Good.")
    refused("NOT_AWAITING_VERDICT", report, rid, "d.gate:l1", project, verdict={"complete": True})
    report(rid, "d:solo", project, result="x")
    refused("UNKNOWN_UNIT", report, rid, "d.gate:l7", project, verdict={"complete": True})
    refused("VERDICT_INVALID", report, rid, "d.gate:l1", project, verdict={"complete": "yes"})
    refused("VERDICT_INVALID", report, rid, "d.gate:l1", project, verdict="not json")


def test_budget_ceiling_refuses_the_report_and_fails_the_step_and_run(project):
    rid = start(
        project,
        """
        params:
          xs: { type: array }
        budget: { max_units: 2 }
        steps:
          - id: m
            map: { over: params.xs }
        """,
        "## m\n\nM.",
        xs=["a", "b", "c"],
    )
    units = [u["unitId"] for u in api.next_brief(rid).to_json()["units"]]
    report(rid, units[0], project, result="1")
    report(rid, units[1], project, result="2")
    with pytest.raises(AkmError) as exc:
        report(rid, units[2], project, result="3")
    assert exc.value.code == "BUDGET_EXCEEDED" and "max_units ceiling" in exc.value.message
    # as natively: the report is not recorded, the step and the run fail (issue 16; before, the run stayed
    # awaiting_session and offered the unit forever)
    assert db_rows("SELECT count(*) FROM units WHERE unit_id = ?", units[2]) == [(0,)]
    view = api.run_status(rid)
    assert view.status == "failed" and view.steps[0].status == "failed"
    assert exc.value.details["runStatus"] == "failed"


def test_failed_reports_fail_fast_and_normalize_their_reason(project):
    rid = start(
        project,
        """
        params:
          xs: { type: array }
        steps:
          - id: m
            map: { over: params.xs }
        """,
        "## m\n\nM.",
        xs=["a", "b"],
    )
    units = [u["unitId"] for u in api.next_brief(rid).to_json()["units"]]
    out = report(rid, units[0], project, status="failed", failure_reason="Copilot: PR Closed!!", result="it broke")
    assert out["stepOutcome"]["kind"] == "failed" and out["runStatus"] == "failed"
    assert db_rows("SELECT failure_reason FROM units WHERE unit_id = ?", units[0]) == [("external:copilot-pr-closed",)]


def test_retry_eligible_failure_keeps_the_unit_open(project):
    rid = start(
        project,
        """
        steps:
          - id: w
            unit: { retry: { max: 1, on: [timeout] } }
        """,
        "## w\n\nW.",
    )
    out = report(rid, "w:solo", project, status="failed", failure_reason="timeout")
    # reported, so not remaining (as upstream), but the step waits for its re-run and says so
    assert out["stepOutcome"] is None and out["remainingUnits"] == 0 and "may be re-run" in out["message"]
    unit = api.next_brief(rid).to_json()["units"][0]
    assert unit["action"] == "rerun" and unit["report"]["rerun"] and unit["lastFailure"] == "timeout"
    out = report(rid, "w:solo", project, result="done", rerun=True)
    assert out["runStatus"] == "completed"


def test_native_engine_never_dispatches_a_claimed_unit(project):
    """D13 both ways: a unit an agent claimed is not dispatched by an engine that could run it."""
    from akm.dispatch.base import DispatcherRegistry
    from akm.dispatch.types import DispatchResult
    from akm.engine.drive import DriveOptions, drive_run

    calls = []

    class Fake:
        kind = "session"

        def dispatch(self, request, cancel, feedback=None):
            calls.append(request.unit_id)
            return DispatchResult(ok=True, text=f"native {request.unit_id}")

    rid = start(
        project,
        """
        params:
          xs: { type: array }
        steps:
          - id: m
            map: { over: params.xs }
        """,
        "## m\n\nM.",
        xs=["a", "b"],
    )
    units = [u["unitId"] for u in api.next_brief(rid).to_json()["units"]]
    report(rid, units[0], project, status="running", holder="agent")
    with open_test_journal() as db:
        opts = DriveOptions(work_dir=project, project_root=project, registry=DispatcherRegistry({"session": Fake()}))
        res = drive_run(db, rid, opts)
    assert calls == [units[1]]
    assert res.awaiting is not None  # still waiting for the claimed unit
    brief = api.next_brief(rid).to_json()
    assert [u["unitId"] for u in brief["units"]] == [units[0]] and brief["units"][0]["action"] == "claimed"


def test_workflow_run_keeps_a_retryable_session_failure_open(project):
    """The engine treats a session unit's retryable failure as the report path does: outstanding, not final."""
    rid = start(
        project,
        """
        steps:
          - id: w
            unit: { retry: { max: 2, on: [timeout] } }
        """,
        "## w\n\nW.",
    )
    report(rid, "w:solo", project, status="failed", failure_reason="timeout")
    res = run(rid, project)
    assert res.run.status == "awaiting_session"
    assert api.next_brief(rid).to_json()["units"][0]["action"] == "rerun"


@pytest.mark.parametrize("reporter_dir", ["project", "elsewhere"])
def test_a_reported_secret_is_redacted_wherever_the_report_comes_from(project, tmp_path, reporter_dir):
    """A report stores nothing of the unit's `env:` secrets — also when the reporter stands outside the project
    (an MCP server whose client ran the workflow with another `cwd`): the run's own env files are used."""
    secret = "s3cr3t-Tok-8812"
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "ci.env").write_text(f"TOKEN={secret}\n", encoding="utf-8")
    rid = start(
        project,
        """
        steps:
          - id: w
            unit: { env: [env/ci] }
          - id: v
            unit: { env: [env/ci], output: { type: object, properties: { note: { type: string } } } }
        """,
        "## w\n\nW.\n\n## v\n\nV.",
    )
    where = project if reporter_dir == "project" else tmp_path / "elsewhere"
    where.mkdir(exist_ok=True)
    api.report_unit(
        rid,
        "w:solo",
        status="completed",
        result=f"the token is {secret}",
        holder=f"agent {secret}",
        cwd=str(where),
    )
    api.report_unit(rid, "v:solo", status="completed", result={"note": f"again {secret}"}, cwd=str(where))
    dump = json.dumps(journal(), default=str)
    assert secret not in dump, "a reported secret reached the journal"
    assert db_rows("SELECT result_json FROM units WHERE unit_id = 'w:solo'") == [('"the token is [REDACTED]"',)]
