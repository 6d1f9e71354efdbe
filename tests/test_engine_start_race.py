"""losing the start race silently drives the OTHER invocation's run with ITS params."""

from __future__ import annotations

import sqlite3
import threading
import time


from akm import paths
from akm.errors import UsageError
from tests.test_engine import py, run, write_wf


def test_lost_start_race_does_not_adopt_a_run_with_other_params(project):
    wf = write_wf(project, "race.md", f"""
        params:
          who: {{ type: string }}
        steps:
          - id: hello
            unit: {{ exec: {{ command: {py('import json,os; print("hi", json.loads(os.environ["AKM_PARAMS"])["who"])')} }} }}
        """, "## hello\n\nx")
    # Invocation A's run exists but is not yet visible to B's `find_active_run` ...
    a = run(wf, project, param_pairs=[("who", "alice")], max_steps=0)
    con = sqlite3.connect(paths.state_db_path(), isolation_level=None, timeout=30)
    con.execute("UPDATE runs SET status='failed' WHERE id=?", (a.run.run_id,))
    # ... and becomes visible (commits) while B is between its lookup and its INSERT.
    con.execute("BEGIN IMMEDIATE")
    con.execute("UPDATE runs SET status='active' WHERE id=?", (a.run.run_id,))
    out: dict = {}

    def b() -> None:
        try:
            out["res"] = run(wf, project, param_pairs=[("who", "bob")])
        except BaseException as exc:  # noqa: BLE001
            out["err"] = exc

    t = threading.Thread(target=b)
    t.start()
    time.sleep(1.0)  # B has looked up (nothing active) and now waits on the write lock in create_run
    con.execute("COMMIT")
    con.close()
    t.join(timeout=30)
    assert not t.is_alive()
    if "err" in out:
        assert isinstance(out["err"], UsageError) and out["err"].code in ("RUN_ALREADY_ACTIVE", "LEASE_HELD")
        return
    res = out["res"]
    # B asked for who=bob; it must not report alice's run as its own.
    assert res.run.params == {"who": "bob"}, f"B drove run {res.run.run_id} with params {res.run.params}"
