"""More engine semantics: vote, empty output, skip cascade, budget seeding, width, progress."""

from __future__ import annotations

import json

from akm import api
from tests.helpers import db_rows, journal_sql, py, run, steps_of, write_wf


def test_vote_majority_and_tie(project):
    wf = write_wf(
        project,
        "vote.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: poll
            map:
              over: params.xs
              reducer: vote
              unit: {{ exec: {{ command: {py('import json,os; print(json.loads(os.environ["AKM_ITEM"])["v"])')} }} }}
        """,
        "## poll\n\nvote",
    )
    res = run(wf, project, params={"xs": [{"i": 1, "v": "a"}, {"i": 2, "v": "b"}, {"i": 3, "v": "a"}]})
    assert res.run.status == "completed" and steps_of(res)["poll"]["output"] == "a"
    (project / ".akm").mkdir()
    res = run(wf, project, params={"xs": [{"i": 1, "v": "a"}, {"i": 2, "v": "b"}]})
    assert res.run.status == "failed" and "tied" in steps_of(res)["poll"]["notes"]


def test_empty_output_is_null_and_fails_a_dependent_input(project):
    wf = write_wf(
        project,
        "empty.md",
        f"""
        steps:
          - id: quiet
            unit: {{ exec: {{ command: {py("pass")} }} }}
          - id: reader
            inputs: [steps.quiet.output]
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
        """,
        "## quiet\n\nsay nothing\n\n## reader\n\nread it",
    )
    res = run(wf, project)
    st = steps_of(res)
    assert st["quiet"]["status"] == "completed" and st["quiet"]["output"] is None
    assert db_rows("SELECT result_json FROM units WHERE unit_id='quiet:solo'") == [(None,)]
    assert res.run.status == "failed" and "resolved to null" in st["reader"]["notes"]


def test_skipped_router_cascades_to_its_targets(project):
    wf = write_wf(
        project,
        "cascade.md",
        f"""
        params:
          first: {{ type: string }}
        steps:
          - id: r1
            route:
              input: params.first
              when: [{{ match: a, step: x }}, {{ match: b, step: r2 }}]
          - id: x
            unit: {{ exec: {{ command: {py('print("x")')} }} }}
          - id: r2
            route:
              input: params.first
              when: [{{ match: b, step: y }}]
              default: z
          - id: y
            unit: {{ exec: {{ command: {py('print("y")')} }} }}
          - id: z
            unit: {{ exec: {{ command: {py('print("z")')} }} }}
        """,
        "## r1\n\n## x\n\nx\n\n## r2\n\n## y\n\ny\n\n## z\n\nz",
    )
    res = run(wf, project, params={"first": "a"})
    st = steps_of(res)
    assert res.run.status == "completed"
    assert {k: v["status"] for k, v in st.items()} == {
        "r1": "completed",
        "x": "completed",
        "r2": "skipped",
        "y": "skipped",
        "z": "skipped",
    }
    assert "r2" in st["y"]["notes"]


def test_budget_is_seeded_from_the_journal_across_invocations(project):
    flag = project / "fixed"
    wf = write_wf(
        project,
        "seed.md",
        f"""
        budget: {{ max_units: 2 }}
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              concurrency: 1
              unit: {{ exec: {{ command: {py(f'import json,os,sys,pathlib; sys.exit(1) if json.loads(os.environ["AKM_ITEM"]) == "b" and not pathlib.Path({str(flag)!r}).exists() else print(1)')} }} }}
        """,
        "## each\n\nx",
    )
    res = run(wf, project, params={"xs": ["a", "b"]})
    assert res.run.status == "failed"
    flag.write_text("1")
    api.resume(res.run.run_id)
    res2 = run(res.run.run_id, project)
    assert res2.run.status == "failed"
    assert "max_units" in steps_of(res2)["each"]["notes"]
    assert db_rows("SELECT sum(attempts) FROM units") == [(2,)]


def test_map_width_bounds_concurrent_children(project):
    log = project / "spans.jsonl"
    started = project / "started"
    started.mkdir()
    # Each unit marks its start, then stays until two units have started (at most 60 s): the first
    # two always overlap however slowly processes start, and the width caps the overlap at two.
    code = py(
        f"import json,os,pathlib,time; a=time.time(); d=pathlib.Path({str(started)!r}); "
        f'(d / os.environ["AKM_ITEM"]).touch(); end=a+60\n'
        f"while len(list(d.iterdir())) < 2 and time.time() < end: time.sleep(0.02)\n"
        f'open({str(log)!r},"a").write(json.dumps([a,time.time()])+chr(10))'
    )
    wf = write_wf(
        project,
        "width.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              concurrency: 2
              unit: {{ exec: {{ command: {code} }} }}
        """,
        "## each\n\nx",
    )
    res = run(wf, project, params={"xs": [1, 2, 3, 4]})
    assert res.run.status == "completed"
    spans = [json.loads(line) for line in log.read_text().splitlines()]
    points = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    live = peak = 0
    for _, d in points:
        live += d
        peak = max(peak, live)
    assert peak == 2


def test_progress_lines_on_stderr(akm, project):
    write_wf(
        project,
        "p.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              unit: {{ exec: {{ command: {py("print(1)")} }} }}
        """,
        "## each\n\nx",
    )
    akm.env["AKM_PROGRESS"] = "1"
    proc = akm("workflow", "run", "p.md", "--xs", "a", "--xs", "b", "--format", "json", check=0)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[each ")]
    assert len(lines) == 2 and all(line.endswith(" ok") for line in lines)
    assert json.loads(proc.stdout)["run"]["status"] == "completed"  # stdout is only JSON


def test_list_filters(akm, project):
    write_wf(project, "a.md", "steps:\n  - id: s\n    unit: { exec: { command: [echo, a] } }", "## s\n\nx")
    write_wf(project, "b.md", 'steps:\n  - id: s\n    unit: { exec: { command: ["false"] } }', "## s\n\nx")
    akm("workflow", "run", "a.md", check=0)
    akm("workflow", "run", "b.md", check=1)
    runs = akm.json("workflow", "list")["runs"]
    assert [r["status"] for r in runs] == ["failed", "completed"]  # newest first
    assert akm.json("workflow", "list", "--ref", "a.md")["runs"][0]["status"] == "completed"
    assert akm.json("workflow", "list", "--active")["runs"] == []


def test_status_flags_stale_running_units(project):
    """D8: a running row with no recent heartbeat is reported stale; finished rows never are."""

    wf = write_wf(
        project,
        "st.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
        """,
        "## a\n\nx",
    )
    res = run(wf, project)
    con = journal_sql()
    con.execute(
        "INSERT INTO units (run_id, unit_id, step_id, node_id, status, started_at, last_checkin_at) "
        "VALUES (?, 'ghost:solo', 'a', 'a', 'running', '2020-01-01T00:00:00.000Z', NULL)",
        (res.run.run_id,),
    )
    con.execute(
        "INSERT INTO units (run_id, unit_id, step_id, node_id, status, started_at, last_checkin_at) "
        "VALUES (?, 'alive:solo', 'a', 'a', 'running', '2020-01-01T00:00:00.000Z', '2999-01-01T00:00:00.000Z')",
        (res.run.run_id,),
    )
    con.commit()
    con.close()
    units = {u.unit_id: u for u in api.run_status(res.run.run_id, units=True).units}
    assert units["ghost:solo"].stale is True
    assert units["alive:solo"].stale is False
    assert units["a:solo"].stale is None


def test_workflows_ref_is_looked_up_in_the_project(akm, project):
    lib = project / ".akm" / "workflows"
    lib.mkdir(parents=True)
    write_wf(lib, "greet.md", "steps:\n  - id: s\n    unit: { exec: { command: [echo, hi] } }", "## s\n\nx")
    res = akm.json("workflow", "run", "workflows/greet")
    assert res["run"]["status"] == "completed" and res["run"]["workflow"] == "workflows/greet"
    sub = project / "deep" / "er"
    sub.mkdir(parents=True)
    akm.cwd = sub  # same project scope from a subdirectory
    assert akm.json("workflow", "list")["runs"][0]["runId"] == res["run"]["runId"]
    missing = akm("workflow", "run", "workflows/nope", check=1)
    assert "WORKFLOW_NOT_FOUND" in missing.stderr and ".akm/workflows" in missing.stderr


def test_schema_mismatch_reruns_the_step_in_a_second_gate_loop(project):
    """A step output that misses its schema with loops left runs again with the errors as feedback (~l2 rows)."""
    counter = project / "n"
    wf = write_wf(
        project,
        "loop.md",
        f"""
        steps:
          - id: make
            unit:
              exec: {{ command: {py(f'import json,pathlib; p=pathlib.Path({str(counter)!r}); n=int(p.read_text()) if p.exists() else 0; p.write_text(str(n+1)); print(json.dumps("x" if n else 5))')} }}
            output: {{ type: string }}
            gate: {{ max_loops: 2 }}
        """,
        "## make\n\nmake a string",
    )
    res = run(wf, project)
    assert res.run.status == "completed" and steps_of(res)["make"]["output"] == "x"
    rows = db_rows("SELECT unit_id, phase, status, failure_reason FROM units ORDER BY started_at")
    # the loop transition is journaled as a gate row (a rejection for the schema miss), so a crash
    # or a session in the middle of loop 2 resumes at loop 2 with the same feedback
    assert rows == [
        ("make:solo", None, "failed", "validation_error"),
        ("make.gate:l1", "gate", "completed", None),
        ("make:solo~l2", None, "completed", None),
    ]
    verdict = json.loads(db_rows("SELECT result_json FROM units WHERE unit_id = 'make.gate:l1'")[0][0])
    assert verdict["complete"] is False and verdict["reason"] == "output_schema" and "expected" in verdict["feedback"]
    assert [e.get("gateLoop") for e in res.executed] == [None, 2]
    # a re-run of the completed run reuses everything
    again = run(res.run.run_id, project)
    assert again.done and db_rows("SELECT count(*) FROM units") == [(3,)]


def test_gated_step_parks_for_a_judge(project):
    """Gates are fail-closed: with no judge engine the rubric goes to the calling agent (D12)."""
    wf = write_wf(
        project,
        "gate.md",
        f"""
        steps:
          - id: build
            unit: {{ exec: {{ command: {py('print("built")')} }} }}
        """,
        "## build\n\nBuild it.\n\n### gate\n\n- The build printed `built`.",
    )
    res = run(wf, project)
    assert res.run.status == "awaiting_session" and api.exit_status_for(res) == 3
    brief = res.run.awaiting
    assert brief["kind"] == "judge" and brief["stepId"] == "build"
    judge = brief["judge"]
    assert judge["artifact"] == "built" and "printed `built`" in judge["criteria"][0]
    assert judge["unitId"] == "build.gate:l1" and '"built"' in judge["prompt"]
    assert steps_of(res)["build"]["status"] == "pending"
    # driving again reuses the journaled unit and parks again without re-running it
    again = run(res.run.run_id, project)
    assert again.run.status == "awaiting_session"
    assert db_rows("SELECT unit_id, attempts FROM units") == [("build:solo", 1)]
