"""what the user is told about the run lease after a run ends or is abandoned mid-drive."""

from __future__ import annotations

import json
import sqlite3
import time

from akm import paths

FAIL = """\
---
steps:
  - id: a
    unit:
      exec: { command: [python3, -c, "import sys; sys.exit(3)"] }
    output: { type: integer }
---
## a
fail
"""

SLOW_THEN_MORE = """\
---
steps:
  - id: a
    unit:
      exec: { command: [python3, -c, "import time; time.sleep(120); print(1)"] }
    output: { type: integer }
  - id: b
    unit:
      exec: { command: [python3, -c, "print(2)"] }
    output: { type: integer }
---
## a
slow
## b
quick
"""


def _wait_for_event(event_type: str, unit_id: str | None = None, deadline_s: float = 60) -> str:
    """The run id of the first journaled `event_type` event (of `unit_id`), waiting for it to appear."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if paths.journal_path().exists():
            con = sqlite3.connect(paths.journal_path(), timeout=30)
            try:
                rows = con.execute(
                    "SELECT run_id, metadata_json FROM events WHERE event_type = ? ORDER BY id", (event_type,)
                ).fetchall()
            except sqlite3.OperationalError:
                rows = []  # the journal is still being created
            finally:
                con.close()
            for run_id, meta in rows:
                if unit_id is None or json.loads(meta).get("unitId") == unit_id:
                    return run_id
        time.sleep(0.05)
    raise AssertionError(f"no {event_type} event within {deadline_s} s")


def test_failed_run_does_not_report_a_lease_held_by_the_exited_process(akm, project):
    """engine.md §3: the lease is released on every exit path (success, failure, ...).

    After a failed `workflow run` exits, its result still shows `engineLease` (text: "driven by <uuid>
    (host, pid N) until ...") naming the process that has just exited.
    """
    (project / "fail.md").write_text(FAIL)
    res = akm.json("workflow", "run", "fail.md", check=1)
    assert res["run"]["status"] == "failed"
    assert not res["run"].get("engineLease"), res["run"]["engineLease"]
    text = akm("workflow", "run", "fail.md", check=1).stdout
    assert "driven by" not in text, text


def test_abandon_while_driving_tells_the_driver_it_was_abandoned(akm, project):
    """`workflow abandon RUN` while another invocation drives RUN: the driver stops its in-flight unit,
    starts nothing more, and says the run was abandoned (never "resume it"). Waits for journal events,
    never for time windows."""
    (project / "two.md").write_text(SLOW_THEN_MORE)
    driver = akm.popen("workflow", "run", "two.md")
    try:
        run_id = _wait_for_event("workflow_unit_started", "a:solo")
        akm("workflow", "abandon", run_id, check=0)
        out, err = driver.communicate(timeout=90)  # unit a would sleep 120 s if it were not stopped
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 2, f"exit {driver.returncode}\n{out}\n{err}"
    assert "RUN_ABANDONED" in err and "abandon" in (out + err).lower(), err
    assert "resume" not in err, err
    view = akm.json("workflow", "status", run_id, "--units")
    assert view["status"] == "abandoned" and view["engineLease"] is None
    assert [(s["id"], s["status"]) for s in view["steps"]] == [("a", "failed"), ("b", "skipped")]
    assert [(u["unitId"], u["status"]) for u in view["units"]] == [("a:solo", "failed")]
    text = akm("workflow", "status", run_id, check=0).stdout
    assert "abandoned" in text and "driven by" not in text and "pending" not in text, text
    refused = akm("workflow", "resume", run_id, check=2)
    assert "RUN_ABANDONED" in refused.stderr
