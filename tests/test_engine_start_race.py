"""losing the start race silently drives the OTHER invocation's run with ITS params."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from akm import paths
from akm.store import runs as runs_store
from tests.helpers import journal_backend, journal_sql, py, run, write_wf


def test_lost_start_race_does_not_adopt_a_run_with_other_params(project, monkeypatch):
    wf = write_wf(
        project,
        "race.md",
        f"""
        params:
          who: {{ type: string }}
        steps:
          - id: hello
            unit: {{ exec: {{ command: {py('import json,os; print("hi", json.loads(os.environ["AKM_PARAMS"])["who"])')} }} }}
        """,
        "## hello\n\nx",
    )
    # Invocation A's run exists but is not yet visible to B's `find_active_run` ...
    a = run(wf, project, param_pairs=[("who", "alice")], max_steps=0)
    if journal_backend() != "sqlite":
        pytest.skip("stages the race with SQLite's write lock; on PostgreSQL see test_pg_journal's identical starts")
    con = sqlite3.connect(paths.journal_path(), isolation_level=None, timeout=30)
    con.execute("UPDATE runs SET status='failed' WHERE id=?", (a.run.run_id,))
    # ... and becomes visible (commits) while B is between its lookup and its INSERT.
    con.execute("BEGIN IMMEDIATE")
    con.execute("UPDATE runs SET status='active' WHERE id=?", (a.run.run_id,))
    out: dict = {}
    # B signals once it has looked up (nothing active) and is about to insert: the insert then
    # waits on our write lock. The real create_run runs; this only tells the test where B is.
    at_insert = threading.Event()
    real_create_run = runs_store.create_run

    def create_run_after_signal(*args, **kwargs):
        at_insert.set()
        return real_create_run(*args, **kwargs)

    monkeypatch.setattr(runs_store, "create_run", create_run_after_signal)

    def b() -> None:
        try:
            out["res"] = run(wf, project, param_pairs=[("who", "bob")])
        except BaseException as exc:  # noqa: BLE001
            out["err"] = exc

    t = threading.Thread(target=b)
    t.start()
    assert at_insert.wait(60), "B never reached create_run"
    con.execute("COMMIT")
    con.close()
    t.join(timeout=60)
    assert not t.is_alive()
    # B lost the race to a run with other params: it never adopts alice's run. Runs with other params
    # live side by side (issue 6 item 4), so B starts and drives its own run with its own params.
    assert "err" not in out, out.get("err")
    res = out["res"]
    assert res.started and res.run.run_id != a.run.run_id, f"B drove run {res.run.run_id} with params {res.run.params}"
    assert res.run.params == {"who": "bob"} and res.run.status == "completed"
    con = journal_sql()
    try:
        assert con.execute("SELECT params_json, status FROM runs WHERE id = ?", (a.run.run_id,)).fetchone() == (
            '{"who":"alice"}',
            "active",
        )
    finally:
        con.close()
