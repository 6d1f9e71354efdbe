"""`workflow run FILE --from RUN` (issue 33): a new run of the edited workflow reuses what did not change."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from akm import api
from akm.errors import AkmError
from tests.helpers import db_rows, run, write_wf

TOOL = """
import json, os, sys
mode = sys.argv[1]
params = json.loads(os.environ["AKM_PARAMS"])
with open(params["log"], "a") as log:
    log.write((mode if mode != "fan" else "fan " + os.environ["AKM_ITEM"]) + "\\n")
inputs = json.loads(os.environ.get("AKM_INPUTS", "{}"))
if mode == "make":
    print(json.dumps(list(range(params["n"]))))
elif mode == "fan":
    print(json.loads(os.environ["AKM_ITEM"]) * 2)
elif mode == "total":
    print(sum(inputs["steps.fan.output"]))
else:
    print(json.dumps({"says": mode, "total": inputs["steps.total.output"]}))
"""


def _wf(project: Path, last: str) -> Path:
    """make -> fan (a 100-unit exec fan-out) -> total -> last; every execution appends a line to params.log
    (a file outside the journal), so what really ran is counted there."""
    tool = project.parent / "tool.py"
    tool.write_text(TOOL)

    def cmd(mode: str) -> str:
        return json.dumps([sys.executable, str(tool), mode])

    return write_wf(
        project,
        "edit.md",
        f"""
        params:
          n: {{ type: integer }}
          log: {{ type: string }}
        steps:
          - id: make
            unit: {{ exec: {{ command: {cmd("make")} }} }}
            output: {{ type: array }}
          - id: fan
            map:
              over: steps.make.output
              concurrency: 8
              unit: {{ exec: {{ command: {cmd("fan")} }}, output: {{ type: integer }} }}
          - id: total
            inputs: [steps.fan.output]
            unit: {{ exec: {{ command: {cmd("total")} }} }}
            output: {{ type: integer }}
          - id: last
            inputs: [steps.total.output]
            unit: {{ exec: {{ command: {cmd(last)} }} }}
            output: {{ type: object }}
        """,
        "## make\nList.\n\n## fan\nDouble.\n\n## total\nAdd.\n\n## last\nSay.",
    )


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_an_edited_last_step_reruns_alone(project):
    log = project.parent / "runs.log"
    wf = _wf(project, "first")
    first = run(wf, project, params={"n": 100, "log": str(log)})
    assert first.run.status == "completed", first.run
    assert len(_lines(log)) == 103  # make, 100 fan units, total, last
    rid = first.run.run_id

    _wf(project, "second")  # the user edits the last step
    before = len(_lines(log))
    second = run(wf, project, params={"n": 100, "log": str(log)}, from_run=rid)
    assert second.run.status == "completed" and second.started and second.run.run_id != rid
    assert _lines(log)[before:] == ["second"]  # the fan-out executed 0 times, total 0 times
    steps = {s.id: s for s in second.run.steps}
    assert (steps["fan"].unit_count, steps["fan"].reused_units, steps["fan"].attempts) == (100, 100, 0)
    assert steps["make"].reused_units == 1 and steps["total"].reused_units == 1 and steps["last"].reused_units == 0
    assert steps["last"].output == {"says": "second", "total": 9900}
    assert {e["stepId"]: (e["unitCount"], e["reusedUnits"]) for e in second.executed} == {
        "make": (1, 1),
        "fan": (100, 100),
        "total": (1, 1),
        "last": (1, 0),
    }
    # no tokens, no attempts for what was reused; each row names its source
    rows = db_rows(
        "SELECT unit_id, attempts, tokens, reused_from FROM units WHERE run_id = ? AND step_id = 'fan'",
        second.run.run_id,
    )
    assert len(rows) == 100 and all(a == 0 and t is None for _, a, t, _ in rows)
    assert all(json.loads(src) == {"runId": rid, "unitId": uid} for uid, _, _, src in rows)
    # the first run is untouched
    assert api.run_status(rid).status == "completed"


def test_changed_params_change_every_unit_they_reach(project):
    """Params are an input of every unit (its prompt and AKM_PARAMS carry them all): a unit reuses only when
    its inputs are the same, so other params rerun what they reach — here everything."""
    log = project.parent / "runs.log"
    wf = _wf(project, "first")
    rid = run(wf, project, params={"n": 3, "log": str(log)}).run.run_id
    other = run(wf, project, params={"n": 4, "log": str(log)}, from_run=rid)
    assert other.run.status == "completed"
    assert sum(s.reused_units for s in other.run.steps) == 0
    assert len(_lines(log)) == 6 + 7


def test_from_is_refused_where_it_cannot_work(project):
    log = project.parent / "runs.log"
    wf = _wf(project, "first")
    rid = run(wf, project, params={"n": 2, "log": str(log)}).run.run_id
    with pytest.raises(AkmError) as e:
        run(rid, project, from_run=rid)
    assert e.value.code == "NEW_RUN_NEEDS_WORKFLOW"
    with pytest.raises(AkmError) as e:
        run(wf, project, params={"n": 2, "log": str(log)}, from_run="0" * 8 + "-0000-4000-8000-" + "0" * 12)
    assert e.value.code == "RUN_NOT_FOUND"


def test_from_on_an_active_identical_run_starts_a_new_one(project):
    """`--from` always starts a new run, even when an identical one is drivable (no join)."""
    wf = write_wf(
        project,
        "s.md",
        """
        steps:
          - id: ask
            output: { type: object }
          - id: use
            inputs: [steps.ask.output]
        """,
        "## ask\nAsk.\n\n## use\nUse.",
    )
    first = run(wf, project)
    rid = first.run.run_id
    api.report_unit(rid, "ask:solo", status="completed", result={"a": 1}, cwd=str(project))
    assert run(rid, project).run.status == "awaiting_session"
    second = run(wf, project, from_run=rid)
    assert second.run.run_id != rid and second.started
    # the session unit the agent did is reused: the new run goes straight to `use`
    assert second.run.status == "awaiting_session" and second.run.awaiting["stepId"] == "use"
    assert second.run.steps[0].reused_units == 1


def test_cli_from(akm, project):
    log = project.parent / "runs.log"
    _wf(project, "first")
    started = akm.json("workflow", "run", "edit.md", "--n", "3", "--log", str(log), "--max-steps", "1", check=4)
    rid = started["run"]["runId"]
    _wf(project, "second")  # edited while the run is still going: that run keeps its plan, the warning says how
    changed = akm("workflow", "run", "edit.md", "--n", "3", "--log", str(log), check=0)
    assert f"akm workflow run edit.md --from {rid}" in changed.stderr, changed.stderr
    out = akm("workflow", "run", "edit.md", "--n", "3", "--log", str(log), "--from", rid, check=0)
    assert "fan     — 3 units (3 reused)" in out.stdout or "3 units (3 reused)" in out.stdout, out.stdout
    assert _lines(log).count("second") == 1 and _lines(log).count("first") == 1


def _journal_state() -> tuple[bytes, int]:
    """The journal file's bytes and its WAL's size: what a preview must leave exactly as it was."""
    from akm import paths

    path = paths.journal_path()
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes(), wal.stat().st_size if wal.exists() else 0


def test_acceptance_plan_then_from_a_100_unit_fan_out(akm, project, monkeypatch):
    """Issue 33's acceptance: a 3-step workflow (after `make`) with a 100-unit exec fan-out; the last step is
    edited; `--plan --from` writes 0 bytes to the journal and says 100 reused; `--from` executes the fan-out
    0 times (executions are counted in a file outside the journal)."""
    log = project.parent / "runs.log"
    monkeypatch.setenv("AKM_DATA_DIR", str(akm.data_dir))  # read the journal the CLI writes
    _wf(project, "first")
    rid = akm.json("workflow", "run", "edit.md", "--n", "100", "--log", str(log))["run"]["runId"]
    assert len(_lines(log)) == 103
    _wf(project, "second")

    before = _journal_state()
    preview = akm.json("workflow", "run", "edit.md", "--n", "100", "--log", str(log), "--from", rid, "--plan")
    assert _journal_state() == before  # 0 bytes written
    steps = {s["id"]: s for s in preview["steps"]}
    assert (steps["fan"]["units"], steps["fan"]["reused"], steps["fan"]["toRun"]) == (100, 100, 0)
    assert steps["make"]["reused"] == 1 and steps["total"]["reused"] == 1
    assert (steps["last"]["reused"], steps["last"]["toRun"], steps["last"]["runner"]) == (0, 1, "exec")
    assert steps["last"]["runsOn"] == "akm runs its command (exec)"  # where each step goes, as the plan froze it
    assert preview["reused"] == 102 and preview["toRun"] == 1 and preview["runId"] is None
    assert preview["fromRun"] == rid and preview["first"] == "run 1 unit(s) of step last as exec commands"
    text = akm("workflow", "run", "edit.md", "--n", "100", "--log", str(log), "--from", rid, "--plan", check=0)
    assert "nothing was written" in text.stdout and "reused 102, to run 1" in text.stdout
    assert "last → akm runs its command (exec)" in text.stdout
    assert _journal_state() == before
    assert len(_lines(log)) == 103  # the preview ran nothing

    done = akm.json("workflow", "run", "edit.md", "--n", "100", "--log", str(log), "--from", rid)
    assert done["run"]["status"] == "completed"
    assert _lines(log)[103:] == ["second"]  # the fan-out executed 0 times
    fan = next(s for s in done["run"]["steps"] if s["id"] == "fan")
    assert (fan["unitCount"], fan["reusedUnits"]) == (100, 100)


def test_plan_of_a_new_run_creates_no_journal(akm, project):
    _wf(project, "first")
    out = akm.json("workflow", "run", "edit.md", "--n", "2", "--log", "x", "--plan")
    assert out["runId"] is None and out["steps"][0]["status"] == "to_do"
    assert [s["status"] for s in out["steps"][1:]] == ["unknown", "unknown", "unknown"]
    assert not akm.data_dir.exists() or not any(akm.data_dir.iterdir())


def test_plan_of_a_continued_run_and_over_mcp(project):
    import anyio
    from mcp import Client

    from akm.mcp import build_server

    wf = write_wf(
        project,
        "route.md",
        """
        params:
          kind: { type: string }
        budget: { max_units: 2 }
        steps:
          - id: ask
            output: { type: object }
          - id: pick
            route:
              input: params.kind
              when: [{ match: a, step: left }, { match: b, step: right }]
          - id: left
            inputs: [steps.ask.output]
          - id: right
            inputs: [steps.ask.output]
        """,
        "## ask\nAsk.\n\n## pick\nPick.\n\n## left\nL.\n\n## right\nR.",
    )
    rid = run(wf, project, params={"kind": "a"}).run.run_id
    p = api.plan_run(str(wf), params={"kind": "a"}, cwd=str(project))
    assert p.run_id == rid and p.status == "awaiting_session"
    assert [(s.id, s.status, s.for_agent) for s in p.steps] == [
        ("ask", "to_do", 1),
        ("pick", "completes", 0),  # it routes on a param: known now
        ("left", "unknown", 0),  # it reads ask's output, not produced yet
        ("right", "skipped", 0),
    ]
    assert p.steps[1].note == "routes to left"
    assert p.budget.max_units == 2 and p.first == "ask you for 1 unit(s) of step ask"
    api.report_unit(rid, "ask:solo", status="completed", result={"x": 1}, cwd=str(project))
    p = api.plan_run(rid)
    assert [(s.id, s.status) for s in p.steps] == [
        ("ask", "completed"),
        ("pick", "completes"),
        ("left", "to_do"),
        ("right", "skipped"),
    ]
    server = build_server(cwd=str(project))

    async def script():
        async with Client(server) as c:
            r = await c.call_tool("workflow_run", {"target": rid, "plan": True})
            assert not r.is_error, r.content[0].text
            body = r.structured_content
            assert body["run"] is None and body["plan"]["runId"] == rid and body["executed"] == []
            assert "Nothing was run or written" in body["next"]
            r = await c.call_tool("workflow_run", {"target": "route.md", "params": {"kind": "b"}, "plan": True})
            assert r.structured_content["plan"]["runId"] is None

    before = db_rows("SELECT COUNT(*) FROM events")
    try:
        anyio.run(script)
    finally:
        server.drives.shutdown()
    assert db_rows("SELECT COUNT(*) FROM events") == before  # nothing written


def test_a_verdict_on_the_same_artifact_is_reused_not_asked_again(project, fake_openai, capsys):
    """The judge engine is a model call: a `--from` run whose gated step restores every unit restores the
    verdict on that same artifact too (no request reaches the judge), and a changed artifact is judged."""
    from akm import cli

    judge = {"kind": "llm", "endpoint": fake_openai.url, "model": "verdict-pass"}
    assert cli.main(["config", "set", "engines.judge", json.dumps(judge)]) == 0
    assert cli.main(["config", "set", "workflow.judgeEngine", "judge"]) == 0
    capsys.readouterr()
    body = "## ask\nAsk.\n\n### gate\n- Good.\n\n## tell\nTell."
    front = "steps:\n  - id: ask\n    output: { type: object }\n  - id: tell\n    inputs: [steps.ask.output]\n"
    wf = write_wf(project, "g.md", front, body)
    rid = run(wf, project).run.run_id
    api.report_unit(rid, "ask:solo", status="completed", result={"a": 1}, cwd=str(project))
    assert len(fake_openai.bodies("verdict-pass")) == 1
    run(rid, project)
    api.report_unit(rid, "tell:solo", status="completed", result="told", cwd=str(project))
    assert api.run_status(rid).status == "completed"

    wf.write_text(wf.read_text().replace("## tell\nTell.", "## tell\nTell it again."))
    preview = api.plan_run(str(wf), from_run=rid, cwd=str(project))
    assert [(s.id, s.status) for s in preview.steps] == [("ask", "reused"), ("tell", "to_do")]
    again = run(wf, project, from_run=rid)
    assert again.run.status == "awaiting_session" and again.run.awaiting["stepId"] == "tell"
    assert len(fake_openai.bodies("verdict-pass")) == 1  # the judge was not asked again
    gate = [u for u in api.run_status(again.run.run_id, units=True).units if u.phase == "gate"]
    assert len(gate) == 1 and gate[0].reused_from == {"runId": rid, "unitId": "ask.gate:l1"}

    # the same run rewound to `ask`: its own gate is asked again (that is what going back to it means)
    api.rewind(rid, "ask")
    api.report_unit(rid, "ask:solo", status="completed", result={"a": 1}, rerun=True, cwd=str(project))
    assert len(fake_openai.bodies("verdict-pass")) == 2
