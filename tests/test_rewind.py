"""Rewind (issue 33): take a run back to a step; what did not change is reused, nothing is deleted."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from akm import api
from akm.errors import AkmError
from akm.store import rewinds as rewinds_store
from akm.store import runs as runs_store
from tests.helpers import db_rows, open_test_journal, py, run, write_wf

# Every unit of `fan` and `sum` appends a line to a file outside the journal: executions are counted there.
THREE = """
    params:
      items: { type: array }
      log: { type: string }
    steps:
      - id: fan
        map:
          over: params.items
          unit:
            exec:
              command: %s
            output: { type: integer }
      - id: sum
        inputs: [steps.fan.output]
        unit:
          exec:
            command: %s
          output: { type: integer }
      - id: name
        inputs: [steps.sum.output]
        output: { type: object, required: [name], properties: { name: { type: string } } }
    """ % (
    py(
        """
        import json, os
        p = json.loads(os.environ["AKM_PARAMS"]); item = json.loads(os.environ["AKM_ITEM"])
        open(p["log"], "a").write("fan %s\\n" % item)
        print(item * 2)
        """
    ),
    py(
        """
        import json, os
        p = json.loads(os.environ["AKM_PARAMS"]); v = json.loads(os.environ["AKM_INPUTS"])["steps.fan.output"]
        open(p["log"], "a").write("sum\\n")
        print(sum(v))
        """
    ),
)


def executions(log: Path) -> list[str]:
    """What ran, sorted (a fan-out's units run concurrently)."""
    return sorted(log.read_text().splitlines()) if log.exists() else []


def report(run_id: str, unit_id: str, project: Path, **kw) -> dict:
    kw.setdefault("status", "completed")
    return api.report_unit(run_id, unit_id, cwd=str(project), **kw).to_json()


def finished_three(project: Path, n: int = 3) -> tuple[str, Path, Path]:
    log = project.parent / "executions.log"
    wf = write_wf(project, "three.md", THREE, "## fan\nDouble.\n\n## sum\nAdd.\n\n## name\nName the sum.")
    res = run(wf, project, params={"items": list(range(1, n + 1)), "log": str(log)})
    assert res.run.status == "awaiting_session", res.run
    rid = res.run.run_id
    report(rid, "name:solo", project, result={"name": "first"})
    assert run(rid, project).run.status == "completed"
    return rid, wf, log


def test_rewind_reopens_the_step_and_later_ones_and_reuses_what_did_not_change(project):
    rid, _, log = finished_three(project)
    assert executions(log) == ["fan 1", "fan 2", "fan 3", "sum"]
    fan_before = db_rows("SELECT unit_id, started_at FROM units WHERE run_id = ? AND step_id = 'fan'", rid)

    out = api.rewind(rid, "sum")
    assert out.steps == ["sum", "name"]
    assert out.run.status == "active" and out.run.current_step_id == "sum"
    assert [s.status for s in out.run.steps] == ["completed", "pending", "pending"]
    assert out.superseded_units == 2 and out.reusable_units == 2  # sum's exec unit, name's session unit
    assert out.rewind.seq == 1 and out.rewind.to_step == "sum" and out.rewind.from_status == "completed"
    assert {s.id: s.status for s in out.rewind.steps} == {"sum": "completed", "name": "completed"}
    # the step before is untouched: same rows, same stamps
    assert db_rows("SELECT unit_id, started_at FROM units WHERE run_id = ? AND step_id = 'fan'", rid) == fan_before

    again = run(rid, project)
    assert again.run.status == "completed", again.run
    assert executions(log) == ["fan 1", "fan 2", "fan 3", "sum"]  # nothing ran again: every unit was restored
    steps = {s.id: s for s in again.run.steps}
    assert steps["sum"].output == 12 and steps["name"].output == {"name": "first"}
    assert steps["sum"].reused_units == 1 and steps["name"].reused_units == 1 and steps["fan"].reused_units == 0
    assert [e["reusedUnits"] for e in again.executed] == [1, 1]


def test_a_run_id_prefix_names_the_run_to_rewind(project):
    """A rewind takes a run id as every command does: whole, or its first 6+ characters (`@last` alike)."""
    rid, _, _ = finished_three(project)
    out = api.rewind(rid[:8], "sum")
    assert out.run.run_id == rid and out.run.current_step_id == "sum" and out.steps == ["sum", "name"]


def test_redo_runs_the_units_again_and_history_stays_visible(project):
    rid, _, log = finished_three(project)
    out = api.rewind(rid, "fan", redo=["fan.unit:" + _item_hash(2)])
    assert out.rewind.redo == ["fan.unit:" + _item_hash(2)]
    assert run(rid, project).run.status == "completed"
    assert executions(log) == ["fan 1", "fan 2", "fan 2", "fan 3", "sum"]  # only the unit redone ran

    api.rewind(rid, "sum", redo=True)
    assert run(rid, project).run.status == "awaiting_session"  # name's input is the same, but redo=all
    assert executions(log).count("sum") == 2
    view = api.run_status(rid, units=True)
    assert [r.seq for r in view.rewinds] == [1, 2]
    superseded = [u for u in view.units if u.superseded_by]
    in_force = [u for u in view.units if not u.superseded_by]
    # first rewind: 3 fan + sum + name rows; second: the restored sum (reused) and name
    assert len(superseded) == 7, [(u.unit_id, u.superseded_by) for u in superseded]
    assert {u.superseded_by for u in superseded} == {view.rewinds[0].rewind_id, view.rewinds[1].rewind_id}
    assert sorted(u.unit_id for u in in_force if u.step_id == "fan") == sorted(
        "fan.unit:" + _item_hash(i) for i in (1, 2, 3)
    )
    reused = [u for u in in_force if u.reused_from]
    assert {u.unit_id for u in reused} == {"fan.unit:" + _item_hash(1), "fan.unit:" + _item_hash(3)}
    assert all(u.attempts == 0 and u.tokens is None for u in reused)
    assert reused[0].reused_from["rewindId"] == view.rewinds[0].rewind_id
    # the event log says so
    kinds = [e.event_type for e in api.events(run_id=rid, limit=1000).events]
    assert kinds.count("workflow_rewound") == 2 and kinds.count("workflow_unit_reused") == 4  # fan 1, fan 3, sum, name


def _item_hash(item) -> str:
    from akm.canonical import canonical_json, sha256_hex

    return sha256_hex(canonical_json(item))[:12]


def test_session_units_of_the_step_are_offered_again(project):
    rid, _, _ = finished_three(project)
    api.rewind(rid, "name")
    brief = api.next_brief(rid).to_json()
    assert brief["kind"] == "units" and brief["stepId"] == "name"
    (unit,) = brief["units"]
    assert unit["action"] == "rerun" and unit["report"]["rerun"] is True
    res = report(rid, "name:solo", project, result={"name": "second"}, rerun=True)
    assert res["stepOutcome"]["kind"] == "completed" and res["runStatus"] == "completed"
    view = api.run_status(rid, units=True)
    assert view.output == {"name": "second"}
    old = [u for u in view.units if u.superseded_by]
    assert [u.result for u in old] == [{"name": "first"}]
    assert view.rewinds[0].steps[0].output == {"name": "first"}


def test_the_issue_scenario_a_wrong_but_valid_result_is_corrected(project):
    """plan returns `{"order": [...]}`; `work` fans out over `steps.plan.output.ordered` and fails. Before:
    nothing could fix it. Now: one rewind, one corrected report, and the run completes; intake ran once."""
    wf = write_wf(
        project,
        "issues.md",
        """
        steps:
          - id: intake
            output: { type: object }
          - id: plan
            inputs: [steps.intake.output]
            output: { type: object }
          - id: work
            map: { over: steps.plan.output.ordered }
        """,
        "## intake\nRead.\n\n## plan\nOrder.\n\n## work\nDo one.",
    )
    rid = run(wf, project).run.run_id
    report(rid, "intake:solo", project, result={"issues": [1, 2]})
    run(rid, project)
    report(rid, "plan:solo", project, result={"order": [1, 2]})
    failed = run(rid, project)
    assert failed.run.status == "failed" and failed.run.current_step_id == "work"
    with pytest.raises(AkmError) as refused:
        report(rid, "plan:solo", project, result={"ordered": [1, 2]}, rerun=True)
    assert refused.value.code == "RUN_NOT_ACTIVE"

    api.rewind(rid, "plan")
    report(rid, "plan:solo", project, result={"ordered": [1, 2]}, rerun=True)
    brief = run(rid, project).run.awaiting
    assert brief["stepId"] == "work" and len(brief["units"]) == 2
    for u in brief["units"]:
        report(rid, u["unitId"], project, result=f"did {u['context']['item']}")
    done = run(rid, project)
    assert done.run.status == "completed", done.run
    assert db_rows("SELECT attempts FROM units WHERE run_id = ? AND step_id = 'intake'", rid) == [(1,)]


def test_refusals_write_nothing(project):
    rid, wf, _ = finished_three(project)

    def snapshot():
        return [db_rows("SELECT * FROM runs WHERE id = ?", rid)] + [
            db_rows(f"SELECT * FROM {t} WHERE run_id = ? ORDER BY 1, 2", rid)
            for t in ("steps", "units", "rewinds", "superseded_units", "events")
        ]

    before = snapshot()
    for kwargs, code in (
        (dict(to_step="nope"), "STEP_NOT_FOUND"),
        (dict(to_step="sum", redo=["sum:nope"]), "UNKNOWN_UNIT"),
        (dict(to_step="sum", redo=["fan.unit:" + _item_hash(1)]), "UNKNOWN_UNIT"),  # not in the reopened steps
    ):
        with pytest.raises(AkmError) as e:
            api.rewind(rid, **kwargs)
        assert e.value.code == code, e.value
    with pytest.raises(AkmError) as e:
        api.rewind("0" * 8 + "-0000-4000-8000-" + "0" * 12, "sum")
    assert e.value.code == "RUN_NOT_FOUND"
    assert snapshot() == before

    # a step the run has not reached
    other = run(wf, project, params={"items": [5], "log": str(project.parent / "other.log")}, max_steps=1)
    with pytest.raises(AkmError) as e:
        api.rewind(other.run.run_id, "name")
    assert e.value.code == "STEP_NOT_REACHED"
    # a live driver holds it
    db = open_test_journal()
    try:
        assert runs_store.acquire_lease(db, other.run.run_id, "someone") is None
        with pytest.raises(AkmError) as e:
            api.rewind(other.run.run_id, "fan")
        assert e.value.code == "LEASE_HELD"
        runs_store.release_lease(db, other.run.run_id, "someone")
    finally:
        db.close()
    api.abandon(other.run.run_id)
    with pytest.raises(AkmError) as e:
        api.rewind(other.run.run_id, "fan")
    assert e.value.code == "RUN_ABANDONED"


def test_a_driver_fenced_before_the_rewind_writes_nothing_after_it(project):
    rid, _, _ = finished_three(project)
    api.rewind(rid, "sum")
    db = open_test_journal()
    try:
        assert runs_store.acquire_lease(db, rid, "old-driver") is None
        fence = runs_store.lease_fence(db, rid, "old-driver")
        runs_store.release_lease(db, rid, "old-driver")  # ... as if stopped past its lease, then taken over:
        api.rewind(rid, "sum")  # the rewind bumps the epoch
        with pytest.raises(AkmError) as e:
            runs_store.complete_step(db, rid, "sum", "completed", fence=fence)
        assert e.value.code in ("LEASE_LOST", "LEASE_HELD")
        with pytest.raises(AkmError) as e:
            rewinds_store.adopt_units(db, rid, "sum", [_adoption()], fence=fence)
        assert e.value.code == "LEASE_LOST"
    finally:
        db.close()


def _adoption() -> rewinds_store.Adoption:
    c = rewinds_store.Candidate("sum:solo", "h", "1", 0, "exec", None, None, {"runId": "x", "unitId": "sum:solo"})
    return rewinds_store.Adoption("sum:solo", "sum.unit", None, "h", c)


def test_a_failed_run_and_a_blocked_gate_can_be_rewound(project):
    wf = write_wf(
        project,
        "gated.md",
        """
        steps:
          - id: draft
            output: { type: object, required: [text], properties: { text: { type: string } } }
            gate: { max_loops: 1 }
        """,
        "## draft\nWrite.\n\n### gate\n- it is good",
    )
    rid = run(wf, project).run.run_id
    report(rid, "draft:solo", project, result={"text": "bad"})
    res = report(rid, "draft.gate:l1", project, verdict={"complete": False, "missing": ["good"], "feedback": "no"})
    assert res["runStatus"] == "blocked"
    api.rewind(rid, "draft")
    brief = api.next_brief(rid).to_json()
    assert brief["units"][0]["action"] == "rerun" and brief["gateLoop"] == 1
    report(rid, "draft:solo", project, result={"text": "good"}, rerun=True)
    res = report(rid, "draft.gate:l1", project, verdict={"complete": True})
    assert res["runStatus"] == "completed"
    view = api.run_status(rid, units=True)
    gates = [(u.unit_id, u.result, u.superseded_by is not None) for u in view.units if u.phase == "gate"]
    assert sorted(gates, key=lambda g: g[2]) == [
        ("draft.gate:l1", {"complete": True, "missing": []}, False),
        ("draft.gate:l1", {"complete": False, "missing": ["good"], "feedback": "no"}, True),
    ]


def test_budgets_count_superseded_attempts(project):
    """A rewind gives no budget back: the superseded dispatches still count (max_units 4: 3 fans + sum ran)."""
    log = project.parent / "executions.log"
    body = "## fan\nDouble.\n\n## sum\nAdd.\n\n## name\nN."
    wf = write_wf(project, "b.md", "budget: { max_units: 4 }\n" + textwrap.dedent(THREE), body)
    rid = run(wf, project, params={"items": [1, 2, 3], "log": str(log)}).run.run_id
    api.rewind(rid, "fan", redo=True)
    res = run(rid, project)
    assert res.run.status == "failed" and "budget" in (res.run.steps[0].notes or ""), res.run.steps[0]
    assert executions(log) == ["fan 1", "fan 2", "fan 3", "sum"]


def test_the_history_table_keeps_every_unit_column(journal):
    names = {
        "units": _columns(journal, "units") - {"seq", "claim_session"},  # PostgreSQL's own extras
        "superseded_units": _columns(journal, "superseded_units") - {"rewind_id", "reusable"},
    }
    assert names["units"] == names["superseded_units"]
    assert names["units"] >= set(rewinds_store.HISTORY_UNIT_COLUMNS)


def _columns(db, table: str) -> set[str]:
    if getattr(db, "backend", "sqlite") == "sqlite":
        return {r["name"] for r in db.query(f"PRAGMA table_info({table})")}
    return {
        r[0]
        for r in db.query(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ?",
            (db.schema, table),
        )
    }


def test_rewind_events_reopen_the_steps_for_event_readers(project):
    rid, _, _ = finished_three(project)
    out = api.rewind(rid, "sum")
    evs = [e for e in api.events(run_id=rid, limit=1000).events]
    tail = [(e.event_type, e.metadata.get("stepId"), e.metadata.get("status")) for e in evs[-3:]]
    assert tail == [
        ("workflow_step_updated", "sum", "pending"),
        ("workflow_step_updated", "name", "pending"),
        ("workflow_rewound", None, None),
    ]
    assert evs[-1].metadata["rewindId"] == out.rewind.rewind_id
    assert json.dumps(evs[-1].metadata)  # ids, statuses and counts only


def test_cli_rewind(akm, project):
    log = project.parent / "executions.log"
    write_wf(project, "three.md", THREE, "## fan\nDouble.\n\n## sum\nAdd.\n\n## name\nName the sum.")
    res = akm.json("workflow", "run", "three.md", "--items", "[1, 2]", "--log", str(log), check=3)
    rid = res["run"]["runId"]
    akm("workflow", "report", rid, "name:solo", "--status", "completed", "--result", '{"name": "x"}', check=0)
    akm("workflow", "run", rid, check=0)
    out = akm("workflow", "rewind", rid, "--to", "sum", check=0)
    assert f"rewound run {rid} to step sum (rewind 1): reopened sum, name" in out.stdout
    assert f"continue with: akm workflow run {rid}" in out.stdout
    data = akm.json("workflow", "rewind", rid, "--to", "fan", "--redo")
    assert data["rewind"]["redo"] is True and data["steps"] == ["fan", "sum", "name"]
    assert data["run"]["status"] == "active" and [r["seq"] for r in data["run"]["rewinds"]] == [1, 2]
    bad = akm("workflow", "rewind", rid, "--to", "nope")
    assert bad.returncode == 1 and "error[STEP_NOT_FOUND]" in bad.stderr  # not found: exit 1 (EXIT_BY_CODE)
    missing = akm("workflow", "rewind", rid)
    assert missing.returncode == 2 and "--to" in missing.stderr
    akm("workflow", "run", rid, check=3)  # fan and sum ran again; name's session unit is asked for again
    assert executions(log) == ["fan 1", "fan 1", "fan 2", "fan 2", "sum", "sum"]
    text = akm("workflow", "status", rid, "--units", check=0).stdout
    assert "(superseded by rewind " in text and "rewind 2 (" in text and "back to step fan" in text
    assert "    superseded completed  sum → 6" in text, text  # the output the first rewind superseded


def test_mcp_rewind(project):
    import anyio
    from mcp import Client

    from akm.mcp import build_server

    rid, _, _ = finished_three(project)
    server = build_server(cwd=str(project))

    async def script():
        async with Client(server) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert tools["workflow_rewind"].annotations.destructive_hint is False
            bad = await c.call_tool("workflow_rewind", {"run_id": rid, "to_step": "sum", "redo": "yes"})
            assert bad.is_error and "INVALID_ARGUMENT" in bad.content[0].text
            r = await c.call_tool("workflow_rewind", {"run_id": rid, "toStep": "name"})
            assert not r.is_error, r.content[0].text
            body = r.structured_content
            assert body["steps"] == ["name"] and body["run"]["status"] == "active"
            assert f'workflow_run(target="{rid}")' in body["next"]
            run = (await c.call_tool("workflow_run", {"target": rid})).structured_content
            assert run["run"]["status"] == "awaiting_session"
            unit = run["run"]["awaiting"]["units"][0]
            assert unit["action"] == "rerun"
            rep = await c.call_tool("unit_report", {**unit["report"], "result": {"name": "again"}})
            assert rep.structured_content["runStatus"] == "completed"

    try:
        anyio.run(script)
    finally:
        server.drives.shutdown()


def test_the_html_report_shows_what_a_rewind_superseded(project):
    rid, _, _ = finished_three(project)
    api.rewind(rid, "name")
    report(rid, "name:solo", project, result={"name": "second-name"}, rerun=True)
    page = api.run_report_html(rid)
    assert '<section id="rewinds">' in page and "rewind 1: back to" in page
    assert page.count('class="superseded"') == 1 and "superseded output" in page
    assert "first" in page and "second-name" in page  # the superseded output and the one in force
    failures = page[page.index('<section id="failures">') : page.index('<section id="steps">')]
    assert "None." in failures  # superseded rows are history, not failures
