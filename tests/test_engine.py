"""The durable engine against a real SQLite journal and real subprocesses."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from akm import api, paths
from akm.errors import UsageError
from tests.helpers import (
    PY,
    db_rows,
    journal_backend,
    journal_bytes,
    journal_sql,
    open_test_journal,
    py,
    run,
    sqlite_only,
    steps_of,
    write_wf,
)

# ------------------------------------------------------------------ basics


def test_linear_run_completes_and_rerun_dispatches_nothing(project):
    wf = write_wf(
        project,
        "lin.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py('print("one")')} }} }}
          - id: b
            unit: {{ exec: {{ command: {py('print("two")')} }} }}
        """,
        "## a\n\nfirst\n\n## b\n\nsecond",
    )
    res = run(wf, project)
    assert res.run.status == "completed" and res.done and res.started
    assert steps_of(res)["a"]["output"] == "one"
    assert [s.status for s in res.run.steps] == ["completed", "completed"]
    units_before = db_rows("SELECT unit_id, attempts, started_at FROM units ORDER BY unit_id")
    events_before = db_rows("SELECT count(*) FROM events")
    again = run(res.run.run_id, project)
    assert again.done and again.executed == []
    assert db_rows("SELECT unit_id, attempts, started_at FROM units ORDER BY unit_id") == units_before
    assert db_rows("SELECT count(*) FROM events") == events_before
    # lease released after success
    assert db_rows("SELECT lease_holder, lease_until FROM runs") == [(None, None)]
    # D17: one task_history row per invocation
    assert db_rows("SELECT count(*) FROM task_history") == [(2,)]


def test_map_of_30_items_then_route(project):
    wf = write_wf(
        project,
        "fan.md",
        f"""
        params:
          n: {{ type: integer }}
        steps:
          - id: items
            unit: {{ exec: {{ command: {py('import json,os; n=json.loads(os.environ["AKM_PARAMS"])["n"]; print(json.dumps(list(range(n))))')} }} }}
            output: {{ type: array }}
          - id: square
            map:
              over: steps.items.output
              concurrency: 8
              unit:
                exec: {{ command: {py('import json,os; i=json.loads(os.environ["AKM_ITEM"]); print(json.dumps(i*i))')} }}
                output: {{ type: integer }}
            output: {{ type: array, items: {{ type: integer }} }}
          - id: verdict
            inputs: [steps.square.output]
            unit: {{ exec: {{ command: {py('import json,os; v=json.loads(os.environ["AKM_INPUTS"])["steps.square.output"]; print(json.dumps("big" if sum(v) > 1000 else "small"))')} }} }}
            output: {{ type: string }}
          - id: go
            route:
              input: steps.verdict.output
              when:
                - {{ match: big, step: big }}
                - {{ match: small, step: small }}
          - id: big
            unit: {{ exec: {{ command: {py('print("B")')} }} }}
          - id: small
            unit: {{ exec: {{ command: {py('print("S")')} }} }}
        """,
        "## items\n\nx\n\n## square\n\nx\n\n## verdict\n\nx\n\n## go\n\nroute\n\n## big\n\nx\n\n## small\n\nx",
    )
    res = run(wf, project, param_pairs=[("n", "30")])
    st = steps_of(res)
    assert res.run.status == "completed"
    assert st["square"]["output"] == [i * i for i in range(30)]
    assert st["big"]["status"] == "completed" and st["small"]["status"] == "skipped"
    assert db_rows("SELECT count(*) FROM units WHERE step_id='square'") == [(30,)]
    ev = json.loads(db_rows("SELECT evidence_json FROM steps WHERE step_id='go'")[0][0])
    assert ev["route"] == {"input": "steps.verdict.output", "value": "big", "selected": "big"}


def test_retry_succeeds_on_third_attempt(project):
    counter = project / "count.txt"
    wf = write_wf(
        project,
        "retry.md",
        f"""
        steps:
          - id: flaky
            unit:
              exec: {{ command: {
            py(f'''
                  import pathlib, sys
                  p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) + 1 if p.exists() else 1
                  p.write_text(str(n)); print("attempt", n); sys.exit(0 if n >= 3 else 1)''')
        } }}
              retry: {{ max: 3, on: [non_zero_exit] }}
        """,
        "## flaky\n\nflaky thing",
    )
    res = run(wf, project)
    assert res.run.status == "completed"
    assert counter.read_text() == "3"
    rows = db_rows("SELECT unit_id, status, failure_reason FROM units ORDER BY started_at")
    assert rows == [
        ("flaky:solo", "failed", "non_zero_exit"),
        ("flaky:solo~r1", "failed", "non_zero_exit"),
        ("flaky:solo~r2", "completed", None),
    ]
    ev = json.loads(db_rows("SELECT evidence_json FROM steps")[0][0])
    assert ev["units"][0]["unitId"] == "flaky:solo" and ev["output"] == "attempt 3"


def test_reason_not_in_retry_on_is_not_retried(project):
    wf = write_wf(
        project,
        "noretry.md",
        f"""
        steps:
          - id: x
            unit:
              exec: {{ command: {py("import sys; sys.exit(3)")} }}
              retry: {{ max: 2, on: [timeout] }}
        """,
        "## x\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    assert db_rows("SELECT count(*) FROM units") == [(1,)]
    assert "exited 3" in steps_of(res)["x"]["notes"]


def test_on_error_continue_gives_null_slots(project):
    wf = write_wf(
        project,
        "cont.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              unit:
                exec: {{ command: {py('import json,os,sys; i=json.loads(os.environ["AKM_ITEM"]); sys.exit(1) if i % 2 else print(i)')} }}
                on_error: continue
            output: {{ type: array }}
        """,
        "## each\n\nx",
    )
    res = run(wf, project, params={"xs": [0, 1, 2, 3]})
    st = steps_of(res)["each"]
    assert res.run.status == "completed"
    assert st["output"] == ["0", None, "2", None]
    assert "on_error: continue" in st["summary"]


@pytest.mark.parametrize("shape", ["solo", "map"])
def test_on_error_continue_with_a_schema_keeps_the_parse_error_as_the_reason(project, shape):
    """The unit's parse error is the cause; the schema rejecting the null it leaves is the consequence."""
    unit = f"""on_error: continue
                output: {{ type: object }}
                exec: {{ command: {py('print("log line"); print("{}")')} }}"""
    if shape == "solo":
        body = f"""
          - id: each
            unit:
                {unit}
            output: {{ type: object }}"""
    else:
        body = f"""
          - id: each
            map:
              over: params.xs
              unit:
                {unit}
            output: {{ type: array, items: {{ type: object }} }}"""
    wf = write_wf(
        project, f"cont-{shape}.md", "params:\n  xs: { type: array, default: [1] }\nsteps:" + body, "## each\n\nx"
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    notes = steps_of(res)["each"]["notes"]
    assert "(parse_error) (recorded, on_error: continue)" in notes
    assert 'the output does not start with a JSON value: line 1 column 1 reads "log line"' in notes
    assert notes.index("parse_error") < notes.index("expected type object, got null")


def test_budget_ceiling_fails_the_step(project):
    wf = write_wf(
        project,
        "budget.md",
        f"""
        budget: {{ max_units: 2 }}
        steps:
          - id: each
            map:
              over: params.xs
              concurrency: 1
              unit: {{ exec: {{ command: {py('print("ok")')} }} }}
        params:
          xs: {{ type: array }}
        """,
        "## each\n\nx",
    )
    res = run(wf, project, params={"xs": ["a", "b", "c"]})
    assert res.run.status == "failed"
    assert "budget exceeded (max_units ceiling)" in steps_of(res)["each"]["notes"]
    assert db_rows("SELECT count(*) FROM units") == [(2,)]


def test_failed_item_is_the_only_one_redispatched_after_resume(project):
    flag = project / "fixed"
    wf = write_wf(
        project,
        "resume.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              concurrency: 1  # fail fast would otherwise race the siblings of the failing item
              unit:
                exec: {{ command: {py(f'import json,os,sys,pathlib; i=json.loads(os.environ["AKM_ITEM"]); sys.exit(1) if i == "c" and not pathlib.Path({str(flag)!r}).exists() else print(i)')} }}
        """,
        "## each\n\nx",
    )
    res = run(wf, project, params={"xs": ["a", "b", "c"]})
    assert res.run.status == "failed"
    # b fails; on_error: fail stops dispatching, so whether c was dispatched before that depends
    # on scheduling: what matters is that nothing that completed is ever dispatched again.
    before = {u: (status, started) for u, status, started in db_rows("SELECT unit_id, status, started_at FROM units")}
    assert sorted(status for status, _ in before.values()).count("failed") == 1
    flag.write_text("yes")
    with pytest.raises(UsageError) as exc:
        run(res.run.run_id, project)
    assert exc.value.code == "RUN_NOT_ACTIVE"
    api.resume(res.run.run_id)
    res2 = run(res.run.run_id, project)
    assert res2.run.status == "completed"
    after = db_rows("SELECT unit_id, attempts, started_at FROM units")
    assert len(after) == 3
    for unit_id, attempts, started in after:
        if unit_id not in before:  # never dispatched before the resume: dispatched once now
            assert attempts == 1
        elif before[unit_id][0] == "completed":  # reused, never redone
            assert (attempts, started) == (1, before[unit_id][1])
        else:  # the failed one: dispatched again
            assert attempts == 2 and started != before[unit_id][1]
    assert steps_of(res2)["each"]["output"] == ["a", "b", "c"]


def test_replay_divergence_is_detected(project):
    wf = write_wf(
        project,
        "div.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
          - id: b
            unit: {{ exec: {{ command: {py("import sys; sys.exit(1)")} }} }}
        """,
        "## a\n\nx\n\n## b\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    # Tamper the completed row's hash and reopen step a: the journal no longer matches the plan.
    con = journal_sql()
    con.execute("UPDATE units SET input_hash = ? WHERE unit_id = 'a:solo'", ("0" * 64,))
    con.execute("UPDATE steps SET status='pending', evidence_json=NULL, completed_at=NULL WHERE step_id='a'")
    con.execute("UPDATE steps SET status='pending' WHERE step_id='b'")
    con.execute("UPDATE runs SET status='active', current_step_id='a', lease_holder=NULL, lease_until=NULL")
    con.commit()
    con.close()
    res2 = run(res.run.run_id, project)
    assert res2.run.status == "failed"
    assert "replay divergence" in steps_of(res2)["a"]["notes"]
    assert db_rows("SELECT attempts FROM units WHERE unit_id='a:solo'") == [(1,)]


def test_step_output_schema_mismatch_fails_the_step(project):
    wf = write_wf(
        project,
        "typed.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("print(5)")} }} }}
            output: {{ type: string }}
        """,
        "## a\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    assert "validation" in steps_of(res)["a"]["notes"] or "expected" in steps_of(res)["a"]["notes"]
    assert db_rows("SELECT failure_reason FROM units") == [("validation_error",)]


def test_empty_and_duplicate_fan_out(project):
    wf = write_wf(
        project,
        "fan2.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              unit: {{ exec: {{ command: {py("print(1)")} }} }}
            output: {{ type: array }}
        """,
        "## each\n\nx",
    )
    res = run(wf, project, params={"xs": []})
    assert res.run.status == "completed" and steps_of(res)["each"]["output"] == []
    (project / ".akm").mkdir()  # a new scope, so a second run of the same file starts fresh
    res = run(wf, project, params={"xs": ["x", "x"]})
    assert res.run.status == "failed"
    assert "duplicate items (indices 0 and 1" in steps_of(res)["each"]["notes"]


def test_route_without_match_and_default_fails(project):
    wf = write_wf(
        project,
        "route.md",
        f"""
        params:
          mode: {{ type: string }}
        steps:
          - id: r
            route:
              input: params.mode
              when: [{{ match: a, step: x }}]
          - id: x
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
        """,
        "## r\n\nroute\n\n## x\n\nx",
    )
    res = run(wf, project, params={"mode": "zzz"})
    assert res.run.status == "failed"
    assert "route failed" in steps_of(res)["r"]["notes"]


def test_session_unit_parks_the_run(project):
    wf = write_wf(
        project,
        "sess.md",
        f"""
        steps:
          - id: prep
            unit: {{ exec: {{ command: {py('print("ready")')} }} }}
          - id: think
        """,
        "## prep\n\nx\n\n## think\n\nWrite a haiku about the prep output.",
    )
    res = run(wf, project)
    assert res.run.status == "awaiting_session"
    assert api.exit_status_for(res) == 3
    brief = res.run.awaiting
    assert brief["stepId"] == "think" and brief["units"][0]["unitId"] == "think:solo"
    assert "Write a haiku" in brief["units"][0]["prompt"]
    # driving again does not redo the exec step, and parks again
    res2 = run(res.run.run_id, project)
    assert res2.run.status == "awaiting_session"
    assert db_rows("SELECT unit_id, attempts FROM units") == [("prep:solo", 1)]


# ------------------------------------------------------------------ integrity


def test_secret_from_env_binding_never_stored_or_printed(project, capfd):
    secret = "s3cr3t-VALUE-7781"
    env_dir = project / ".akm" / "env"
    env_dir.mkdir(parents=True)
    (env_dir / "ci.env").write_text(f"API_TOKEN={secret}\n")
    wf = write_wf(
        project,
        "secret.md",
        f"""
        steps:
          - id: leak
            unit:
              env: [env/ci]
              exec: {{ command: {py('import os,sys; t=os.environ["API_TOKEN"]; print("token", t); print("err", t, file=sys.stderr); sys.exit(1)')} }}
          """,
        "## leak\n\ntry to leak it",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    out = json.dumps(res.to_json())
    assert secret not in out and "[REDACTED]" in out
    data = Path(paths.journal_path()).parent
    for f in data.iterdir() if journal_backend() == "sqlite" else ():
        assert secret.encode() not in f.read_bytes(), f"secret leaked into {f.name}"
    assert secret.encode() not in journal_bytes()  # the same on either journal
    captured = capfd.readouterr()
    assert secret not in captured.out and secret not in captured.err


def test_journal_write_failure_is_surfaced(project):
    wf = write_wf(
        project,
        "jw.md",
        f"""
        steps:
          - id: a
            unit:
              exec: {{ command: {py("print(1)")} }}
              on_error: continue
        """,
        "## a\n\nx",
    )

    db = open_test_journal()
    sqlite_only(db, "the failure is staged with an SQLite trigger")
    db.execute(
        "CREATE TRIGGER fail_finish BEFORE UPDATE OF finished_at ON units "
        "WHEN NEW.finished_at IS NOT NULL BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"
    )
    db.close()
    res = run(wf, project)
    assert res.run.status == "failed"
    notes = steps_of(res)["a"]["notes"]
    assert "could not be journaled" in notes and "disk on fire" in notes


def test_tampered_plan_is_refused(project):
    wf = write_wf(
        project,
        "t.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("import time; print(1)")} }} }}
        """,
        "## a\n\nx",
    )
    res = run(wf, project, max_steps=None)
    con = journal_sql()
    con.execute("UPDATE runs SET status='active', plan_json = replace(plan_json, 'print(1)', 'print(2)')")
    con.commit()
    con.close()
    with pytest.raises(UsageError) as exc:
        run(res.run.run_id, project)
    assert exc.value.code == "CORRUPT_RUN"


def test_timeout_aborts_and_rerun_continues(project):
    wf = write_wf(
        project,
        "slow.md",
        f"""
        steps:
          - id: slow
            unit: {{ exec: {{ command: {py("import time; time.sleep(30)")} }} }}
        """,
        "## slow\n\nx",
    )
    res = run(wf, project, timeout_ms=300)
    assert res.aborted and res.timed_out and res.run.status == "active"
    assert api.exit_status_for(res) == 1
    assert db_rows("SELECT status, failure_reason FROM units") == [("failed", "aborted")]
    assert db_rows("SELECT lease_holder FROM runs") == [(None,)]


def test_max_steps_stops_with_run_active(project):
    wf = write_wf(
        project,
        "ms.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("print(1)")} }} }}
          - id: b
            unit: {{ exec: {{ command: {py("print(2)")} }} }}
        """,
        "## a\n\nx\n\n## b\n\nx",
    )
    res = run(wf, project, max_steps=1)
    assert res.run.status == "active" and res.steps_processed == 1
    assert api.exit_status_for(res) == 4
    res2 = run(res.run.run_id, project)
    assert res2.run.status == "completed"


def test_worktree_isolation_clean_removed_dirty_retained(project):
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(project),
            "-c",
            "user.email=a@b",
            "-c",
            "user.name=a",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "init",
        ],
        check=True,
    )
    wf = write_wf(
        project,
        "wt.md",
        f"""
        params:
          xs: {{ type: array }}
        steps:
          - id: each
            map:
              over: params.xs
              unit:
                isolation: worktree
                exec: {{ command: {py('import json,os,pathlib; i=json.loads(os.environ["AKM_ITEM"]); print(os.getcwd()); (pathlib.Path("dirt.txt").write_text("x") if i == "dirty" else None)')} }}
            output: {{ type: array }}
        """,
        "## each\n\nx",
    )
    res = run(wf, project, params={"xs": ["clean", "dirty"]})
    assert res.run.status == "completed"
    clean_dir, dirty_dir = steps_of(res)["each"]["output"]
    assert "akm-worktrees" in clean_dir and clean_dir != str(project)
    assert not Path(clean_dir).exists()
    assert (Path(dirty_dir) / "dirt.txt").exists()
    assert any("retained" in w for w in res.warnings)
    assert not (project / "dirt.txt").exists()


def test_worktree_isolation_outside_git_fails_before_dispatch(project):
    wf = write_wf(
        project,
        "wt2.md",
        f"""
        steps:
          - id: a
            unit:
              isolation: worktree
              exec: {{ command: {py("print(1)")} }}
        """,
        "## a\n\nx",
    )
    res = run(wf, project)
    assert res.run.status == "failed"
    assert "isolation: worktree" in steps_of(res)["a"]["notes"]
    assert db_rows("SELECT count(*) FROM units") == [(0,)]


def test_heartbeat_marks_running_units(project, tmp_path):
    from akm.engine.drive import DriveOptions, drive_run

    if journal_backend() != "sqlite":
        pytest.skip("the unit watches the SQLite file for its heartbeat")

    # The unit runs until the journal shows a heartbeat on its row (or 60 s pass): no time window.
    wait_for_heartbeat = (
        f"import sqlite3,time\nend = time.time() + 60\n"
        f"while time.time() < end:\n"
        f"    con = sqlite3.connect({str(paths.journal_path())!r}, timeout=30)\n"
        f"    seen = con.execute(\"SELECT 1 FROM units WHERE status='running' AND last_checkin_at IS NOT NULL "
        f'AND last_checkin_at > started_at").fetchone()\n'
        f"    con.close()\n"
        f"    if seen: break\n"
        f"    time.sleep(0.05)\n"
        f"print(1)"
    )
    wf = write_wf(
        project,
        "hb.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {json.dumps([PY, "-c", wait_for_heartbeat])} }} }}
        """,
        "## a\n\nx",
    )
    first = run(wf, project, max_steps=None, timeout_ms=50)  # creates the run, aborts at once
    db = open_test_journal()
    try:
        res = drive_run(
            db, first.run.run_id, DriveOptions(work_dir=project, project_root=project, heartbeat_interval=0.2)
        )
    finally:
        db.close()
    assert res.done
    checkin, started = db_rows("SELECT last_checkin_at, started_at FROM units WHERE status='completed'")[0]
    assert checkin is not None and checkin > started


def test_lost_lease_stops_the_driver(project):
    """Another holder takes the lease mid-dispatch: the unit is stopped and the driver refuses to go on."""
    import threading

    from akm.engine.drive import DriveOptions, drive_run

    wf = write_wf(
        project,
        "steal.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {py("import time; time.sleep(20)")} }} }}
        """,
        "## a\n\nx",
    )
    first = run(wf, project, timeout_ms=50)  # creates the run; aborts at once
    db = open_test_journal()
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            drive_run(
                db, first.run.run_id, DriveOptions(work_dir=project, project_root=project, heartbeat_interval=0.2)
            )
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    # The first run may or may not have dispatched the unit before its 50 ms ran out (a busy machine): the drive
    # below dispatches it once more than it was.
    before = max((r[0] for r in db_rows("SELECT attempts FROM units")), default=0)
    t = threading.Thread(target=drive)
    t.start()
    deadline = time.time() + 60
    while time.time() < deadline and not db_rows(
        "SELECT 1 FROM units WHERE status='running' AND attempts=?", before + 1
    ):
        time.sleep(0.05)
    con = journal_sql()
    con.execute(
        "UPDATE runs SET lease_holder='thief', lease_host='elsewhere', lease_pid=1, "
        "lease_until='2999-01-01T00:00:00.000Z'"
    )
    con.commit()
    con.close()
    t.join(timeout=60)
    db.close()
    assert not t.is_alive()
    assert errors and isinstance(errors[0], UsageError) and errors[0].code == "LEASE_LOST"
    assert "thief" in errors[0].message
    # fenced: the stopped unit's row is the new holder's now (it dispatches it again); nothing is written over it
    # (one attempt more than the first run made: it may not have dispatched within its 50 ms on a busy box)
    assert db_rows("SELECT status, failure_reason, attempts FROM units") == [("running", None, before + 1)]
    assert db_rows("SELECT status, lease_holder FROM runs") == [("active", "thief")]
