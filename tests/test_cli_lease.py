"""what the user is told about the run lease after a run ends or is abandoned mid-drive."""

from __future__ import annotations

import json
import time

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
      exec: { command: [python3, -c, "import time; time.sleep(2); print(1)"] }
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
    """`workflow abandon RUN` while another invocation drives RUN: the driver died with
    `error[RUN_NOT_ACTIVE]: ... is failed and cannot be updated` + hint "resume it" (exit 2), never saying
    the run was abandoned — and its in-flight unit was journaled `completed` after the abandon."""
    (project / "two.md").write_text(SLOW_THEN_MORE)
    driver = akm.popen("workflow", "run", "two.md")
    try:
        deadline = time.monotonic() + 10
        run_id = None
        while run_id is None and time.monotonic() < deadline:
            runs = json.loads(akm("workflow", "list", "--format", "json", check=0).stdout)["runs"]
            run_id = runs[0]["runId"] if runs else None
            time.sleep(0.1)
        assert run_id
        time.sleep(0.5)
        akm("workflow", "abandon", run_id, check=0)
        out, err = driver.communicate(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert "abandon" in (out + err).lower(), f"exit {driver.returncode}\n{out}\n{err}"
    assert "resume" not in err, err
