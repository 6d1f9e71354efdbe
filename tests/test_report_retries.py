"""Reports an agent cannot get wrong (issue 16): resends are idempotent, stale reports are refused.

An agent retries a call whose answer it lost, resends after a gate sent work back, resumes after a
failure: every such report either answers `idempotent` with the run's current state (it is what the
journal already holds) or is refused with a code — and a refusal leaves the journal unchanged.
"""

from __future__ import annotations

import json

from akm import api
from tests.helpers import py, run
from tests.test_session import journal, refused, report, start

GATED = (
    "steps:\n  - id: draft\n    gate: { max_loops: 3 }\n    output: { type: object, required: [text], "
    "properties: { text: { type: string } } }\n  - id: after\n    unit: { exec: { command: %s } }" % py("print('ok')")
)
BODY = "## draft\n\nDraft it.\n\n### gate\n\n- Mentions cats.\n\n## after\n\nAfter."


def test_a_unit_report_resent_after_its_step_finished_or_the_run_ended_is_idempotent(project):
    rid = start(project, GATED, BODY)
    first = report(rid, "draft:solo", project, result={"text": "dogs"}, expect_step="draft")
    assert first["recorded"] == "written" and first["stepOutcome"]["kind"] == "awaiting_verdict"
    ok = report(rid, "draft.gate:l1", project, verdict={"complete": True})
    assert ok["stepOutcome"]["kind"] == "completed"
    before = journal()
    again = report(rid, "draft:solo", project, result={"text": "dogs"}, expect_step="draft")
    assert again["recorded"] == "idempotent" and again["attemptId"] == "draft:solo"
    assert again["runStatus"] == ok["runStatus"]
    verdict_again = report(rid, "draft.gate:l1", project, verdict={"complete": True})
    assert verdict_again["recorded"] == "idempotent" and verdict_again["stepId"] == "draft"
    assert journal() == before
    done = run(rid, project)
    assert done.run.status == "completed"
    before = journal()
    late = report(rid, "draft:solo", project, result={"text": "dogs"})
    assert late["recorded"] == "idempotent" and late["runStatus"] == "completed"
    assert "completed" in late["message"]
    late_verdict = report(rid, "draft.gate:l1", project, verdict='{"complete": true}')
    assert late_verdict["recorded"] == "idempotent" and late_verdict["runStatus"] == "completed"
    assert journal() == before
    # other content for a finished step or run is still refused
    refused("RUN_NOT_ACTIVE", report, rid, "draft:solo", project, result={"text": "cats"})
    refused("STALE_REPORT", report, rid, "draft.gate:l1", project, verdict={"complete": False, "feedback": "x"})


def test_a_loop_one_report_resent_after_the_gate_rejected_it_is_never_the_loop_two_result(project):
    rid = start(project, GATED, BODY)
    brief = api.next_brief(rid).to_json()
    loop1 = brief["units"][0]
    assert loop1["attemptId"] == "draft:solo" and loop1["report"]["attemptId"] == "draft:solo"
    report(rid, "draft:solo", project, result={"text": "dogs"}, attempt_id=loop1["attemptId"])
    rejected = report(
        rid, "draft.gate:l1", project, verdict={"complete": False, "missing": ["cats"], "feedback": "Add cats."}
    )
    assert rejected["stepOutcome"]["kind"] == "next_loop"
    before = journal()
    # the lost answer's retry, as it was: the same content for loop 1 -> idempotent, not loop 2's result
    resent = report(rid, "draft:solo", project, result={"text": "dogs"}, attempt_id="draft:solo")
    assert resent["recorded"] == "idempotent" and resent["gateLoop"] == 1
    assert journal() == before
    # other content named as loop 1's answer is stale: refused, nothing written
    err = refused("STALE_REPORT", report, rid, "draft:solo", project, result={"text": "dogs!"}, attempt_id="draft:solo")
    assert err.details["currentAttemptId"] == "draft:solo~l2"
    refused("STALE_REPORT", report, rid, "draft:solo", project, result={"text": "cats"}, gate_loop=1)
    # a verdict resent for the rejected loop: the same is idempotent, a different one stale
    assert (
        report(
            rid, "draft.gate:l1", project, verdict={"complete": False, "missing": ["cats"], "feedback": "Add cats."}
        )["recorded"]
        == "idempotent"
    )
    refused("STALE_REPORT", report, rid, "draft.gate:l1", project, verdict={"complete": True})
    # the loop-2 judge sees loop 2's answer
    brief = api.next_brief(rid).to_json()
    assert brief["gateLoop"] == 2 and brief["units"][0]["attemptId"] == "draft:solo~l2"
    out = report(rid, "draft:solo", project, result={"text": "cats"}, attempt_id="draft:solo~l2")
    assert out["recorded"] == "written" and out["gateLoop"] == 2
    judge = api.next_brief(rid).to_json()["judge"]
    assert judge["unitId"] == "draft.gate:l2" and judge["artifact"] == {"text": "cats"}


def test_a_report_naming_no_attempt_answers_the_current_loop_even_with_the_rejected_content(project):
    """As the drive loop counts an answer (issue 39: such a loop-2 answer was taken for a resend of loop 1,
    and a driver answering alike never got the step to its verdict)."""
    rid = start(project, GATED, BODY)
    report(rid, "draft:solo", project, result={"text": "dogs"})
    report(rid, "draft.gate:l1", project, verdict={"complete": False, "missing": ["cats"], "feedback": "Add cats."})
    plain = report(rid, "draft:solo", project, result={"text": "dogs"})
    assert plain["recorded"] == "written" and plain["attemptId"] == "draft:solo~l2" and plain["gateLoop"] == 2
    assert plain["stepOutcome"]["kind"] == "awaiting_verdict"
    assert api.next_brief(rid).to_json()["judge"]["unitId"] == "draft.gate:l2"


def test_a_report_naming_a_later_attempt_than_the_current_is_stale(project):
    rid = start(project, GATED, BODY)
    refused("STALE_REPORT", report, rid, "draft:solo", project, result={"text": "x"}, attempt_id="draft:solo~l2")


def test_a_session_unit_reported_failed_is_offered_again_after_resume(project):
    rid = start(
        project,
        "steps:\n  - id: w\n  - id: after\n    unit: { exec: { command: %s } }" % py("print(1)"),
        "## w\n\nW.\n\n## after\n\nA.",
    )
    out = report(rid, "w:solo", project, status="failed", failure_reason="no idea")
    assert out["runStatus"] == "failed"
    assert "workflow_resume" not in out["message"]  # the core names no front's tools; the MCP `next` does
    api.resume(rid)
    again = run(rid, project)  # before issue 16 the step failed again here, on every resume
    assert again.run.status == "awaiting_session", again.run
    unit = again.run.awaiting["units"][0]
    assert unit["action"] == "rerun" and unit["report"]["rerun"] is True
    done = report(rid, "w:solo", project, result="fixed", rerun=True)
    assert done["stepOutcome"]["kind"] == "completed"
    assert run(rid, project).run.status == "completed"


def test_a_replay_divergence_is_refused_and_writes_nothing(project):
    import sqlite3

    from akm import paths

    rid = start(
        project,
        "params:\n  xs: { type: array }\nsteps:\n  - id: m\n    map: { over: params.xs }",
        "## m\n\nM.",
        xs=["a", "b"],
    )
    units = [u["unitId"] for u in api.next_brief(rid).to_json()["units"]]
    report(rid, units[0], project, result="1")
    con = sqlite3.connect(paths.journal_path())
    con.execute("UPDATE units SET input_hash = 'tampered' WHERE unit_id = ?", (units[0],))
    con.commit()
    con.close()
    err = refused("REPLAY_DIVERGED", report, rid, units[0], project, result="1", rerun=True)
    assert err.details["unitId"] == units[0]


def test_other_content_for_a_finished_step_names_the_way_out(project):
    rid = start(project, "steps:\n  - id: a\n  - id: b", "## a\n\nA.\n\n## b\n\nB.")
    report(rid, "a:solo", project, result="first")
    run(rid, project)
    assert report(rid, "a:solo", project, result="first")["recorded"] == "idempotent"
    err = refused("STEP_CLOSED", report, rid, "a:solo", project, result="corrected")
    assert "rewind the run to step a" in err.message  # the way out that works (issue 33), not a new run
    assert err.details == {"runId": rid, "stepId": "a", "currentStep": "b"}


def test_the_catalog_lists_project_and_user_workflows_with_their_params(project, tmp_path, monkeypatch):
    import platformdirs

    lib = project / ".akm" / "workflows"
    lib.mkdir(parents=True)
    (lib / "greet.md").write_text(
        "---\ndescription: Greets someone.\nparams:\n  who: { type: string, description: whom to greet }\n"
        "  times: { type: integer, default: 1 }\nsteps:\n  - id: hello\n    gate: { max_loops: 2 }\n---\n\n"
        "## hello\n\nSay hello to {{params.who}}.\n\n### gate\n\n- Polite.\n",
        encoding="utf-8",
    )
    (lib / "broken.md").write_text("---\nsteps: 7\n---\n", encoding="utf-8")
    user = tmp_path / "user-data"
    monkeypatch.setattr(platformdirs, "user_data_dir", lambda *a, **k: str(user))
    (user / "workflows").mkdir(parents=True)
    (user / "workflows" / "greet.md").write_text("shadowed by the project's", encoding="utf-8")
    (user / "workflows" / "mine.md").write_text("---\nsteps:\n  - id: a\n---\n\n## a\n\nA.\n", encoding="utf-8")
    res = api.workflow_catalog(cwd=str(project)).to_json()
    by_ref = {w["ref"]: w for w in res["workflows"]}
    assert list(by_ref) == ["workflows/broken", "workflows/greet", "workflows/mine"]
    greet = by_ref["workflows/greet"]
    assert greet["source"] == "project" and greet["description"] == "Greets someone." and greet["problems"] == []
    assert greet["steps"] == [{"id": "hello", "kind": "unit", "gated": True}]
    assert greet["params"] == [
        {"name": "who", "type": "string", "description": "whom to greet", "required": True, "default": None},
        {"name": "times", "type": "integer", "description": None, "required": False, "default": 1},
    ]
    assert by_ref["workflows/mine"]["source"] == "user"
    assert by_ref["workflows/broken"]["problems"]
    # what it lists runs by its ref
    started = api.run_workflow("workflows/greet", params={"who": "Ada"}, cwd=str(project))
    assert started.run.status == "awaiting_session"


def test_akm_workflow_catalog_at_the_cli(akm, project):
    import json

    lib = project / ".akm" / "workflows"
    lib.mkdir(parents=True)
    (lib / "greet.md").write_text(
        "---\nparams:\n  who: { type: string }\nsteps:\n  - id: hello\n---\n\n## hello\n\nHi {{params.who}}.\n",
        encoding="utf-8",
    )
    out = akm("workflow", "catalog", check=0)
    assert "workflows/greet  (project)" in out.stdout and "--who string" in out.stdout
    data = json.loads(akm("workflow", "catalog", "--format", "json", check=0).stdout)
    assert data["workflows"][0]["params"][0]["name"] == "who"


def test_the_brief_says_what_upstream_drivers_expect(project):
    """Under another holder's live lease units are do_not_run; env binding names; credential-looking params
    are warned about; a claim gone silent is named; the first claim answers heartbeat."""
    import sqlite3

    from akm import paths
    from akm.store import open_db
    from akm.store import runs as runs_store

    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "gh.env").write_text("GH_TOKEN=s3cret\nGH_HOST=github.com\n", encoding="utf-8")
    rid = start(
        project,
        "params:\n  apiToken: { type: string }\nsteps:\n  - id: w\n    unit: { env: [env/gh] }",
        "## w\n\nW.",
        apiToken="abc",
    )
    brief = api.next_brief(rid).to_json()
    unit = brief["units"][0]
    assert unit["envBindings"] == ["GH_HOST", "GH_TOKEN"] and unit["action"] == "do"
    assert "s3cret" not in json.dumps(brief)
    assert any("apiToken" in w and "not secret" in w for w in brief["warnings"])
    claim = report(rid, "w:solo", project, status="running", holder="agent-1")
    assert claim["recorded"] == "heartbeat"  # the first claim too (upstream's answer)
    con = sqlite3.connect(paths.journal_path())
    con.execute("UPDATE units SET claim_expires_at = '2000-01-01T00:00:00.000Z' WHERE unit_id = 'w:solo'")
    con.commit()
    con.close()
    warnings = api.next_brief(rid).to_json()["warnings"]
    assert any("agent-1" in w and "gone silent" in w for w in warnings)
    with open_db(paths.journal_path()) as db:
        assert runs_store.acquire_lease(db, rid, "engine-x", host="elsewhere", pid=1) is None
    assert api.next_brief(rid).to_json()["units"][0]["action"] == "do_not_run"


def test_cli_verdict_implies_completed_and_a_report_prints_the_next_brief(akm, project):
    (project / "g.md").write_text(
        "---\nsteps:\n  - id: d\n    gate: { max_loops: 2 }\n---\n\n## d\n\nDraft.\n\n### gate\n\n- Cats.\n",
        encoding="utf-8",
    )
    started = akm("workflow", "run", "g.md", "--format", "json")
    assert started.returncode == 3, started.stderr
    rid = json.loads(started.stdout)["run"]["runId"]
    rep = akm(
        "workflow", "report", rid, "d:solo", "--status", "completed", "--result", "dogs", "--attempt", "d:solo", check=0
    )
    assert "== verdict d.gate:l1" in rep.stdout  # the judge brief, without `workflow next`
    again = akm("workflow", "report", rid, "d:solo", "--result", "dogs")  # --result means completed (issue 39)
    assert again.returncode == 0 and again.stdout.startswith("idempotent: "), (again.stdout, again.stderr)
    no = akm("workflow", "report", rid, "d:solo")  # nothing says what happened
    assert no.returncode == 2 and "error[INVALID_ARGUMENT]" in no.stderr and "--status" in no.stderr
    ok = akm(
        "workflow",
        "report",
        rid,
        "d.gate:l1",
        "--verdict",
        '{"complete": false, "feedback": "cats"}',
        "--format",
        "json",
        check=0,
    )
    assert json.loads(ok.stdout)["stepOutcome"]["kind"] == "next_loop"
    stale = akm(
        "workflow", "report", rid, "d:solo", "--status", "completed", "--result", "cats!", "--attempt", "d:solo"
    )
    assert stale.returncode == 2 and "error[STALE_REPORT]" in stale.stderr
