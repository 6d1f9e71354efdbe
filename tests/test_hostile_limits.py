"""Hostile sizes: every read is bounded, every bound is named (issue 23 items 2 and 5).

`--result @/dev/zero` used to grow without end; a report's text is read to at most 16 MiB + 1 byte and
refused with RESULT_TOO_LARGE, and what a report records is held to the journal's 1 MiB per unit row.
"""

from __future__ import annotations

import json
import resource
import subprocess
import threading

SESSION_WF = "---\nsteps:\n  - id: s\n---\n\n## s\n\nDo s.\n"
MiB = 1024 * 1024


def _awaiting(akm) -> str:
    (akm.cwd / "s.md").write_text(SESSION_WF, encoding="utf-8")
    out = akm.json("workflow", "run", "s.md", check=3)
    return out["run"]["runId"]


def _limit_memory() -> None:
    """The child may not grow past 1 GiB: an unbounded read fails instead of eating the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (1024 * MiB, 1024 * MiB))


def test_result_from_dev_zero_is_refused_reading_at_most_16_mib(akm):
    run_id = _awaiting(akm)
    proc = akm(
        "workflow",
        "report",
        run_id,
        "s:solo",
        "--status",
        "completed",
        "--result",
        "@/dev/zero",
        preexec_fn=_limit_memory,
    )
    assert proc.returncode == 2, proc.stderr
    assert "error[RESULT_TOO_LARGE]: --result '@/dev/zero': /dev/zero holds more than 16777216 bytes" in proc.stderr
    assert akm.json("workflow", "status", run_id)["status"] == "awaiting_session"  # nothing recorded


def test_result_from_endless_stdin_reads_at_most_16_mib_and_is_refused(akm):
    run_id = _awaiting(akm)
    proc = subprocess.Popen(
        [*akm.argv0, "workflow", "report", run_id, "s:solo", "--status", "completed", "--result", "-"],
        cwd=akm.cwd,
        env=akm.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    written = 0
    chunk = b"x" * (256 * 1024)

    def feed() -> None:
        nonlocal written
        try:
            while written < 64 * MiB:  # four times the bound: a bounded reader stops long before
                proc.stdin.write(chunk)
                written += len(chunk)
        except (BrokenPipeError, OSError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    err = proc.stderr.read()  # until the process exits: the feeder thread keeps writing meanwhile
    proc.wait(timeout=120)
    feeder.join(timeout=120)
    assert proc.returncode == 2, err
    assert b"error[RESULT_TOO_LARGE]: --result '-': standard input holds more than 16777216 bytes" in err
    assert written <= 17 * MiB + len(chunk)  # it stopped reading at the bound (plus what a pipe buffers)


def test_a_result_of_exactly_16_mib_is_read_and_judged_by_the_journal_bound(akm):
    """At the read bound the text is read whole; then the journal's 1 MiB per unit row refuses it, coded."""
    run_id = _awaiting(akm)
    (akm.cwd / "big.txt").write_bytes(b"y" * (16 * MiB))
    proc = akm(
        "workflow", "report", run_id, "s:solo", "--status", "completed", "--result", "@big.txt", "--format", "json"
    )
    assert proc.returncode == 2, proc.stderr
    body = json.loads(proc.stderr)
    assert body["code"] == "RESULT_TOO_LARGE" and body["details"]["maxBytes"] == MiB
    assert "the journal holds at most 1048576 bytes (1 MiB) of a unit's result" in body["error"]
    (akm.cwd / "ok.txt").write_bytes(b"z" * (MiB - 2))  # recorded as a JSON string: two quotes
    proc = akm("workflow", "report", run_id, "s:solo", "--status", "completed", "--result", "@ok.txt")
    assert proc.returncode == 0, proc.stderr


def test_an_unreadable_result_file_is_still_unreadable_file(akm):
    run_id = _awaiting(akm)
    (akm.cwd / "bad.txt").write_bytes(b"\xff\xfe")
    for arg in ("@bad.txt", "@missing.txt", "@."):
        proc = akm("workflow", "report", run_id, "s:solo", "--status", "completed", "--result", arg)
        assert proc.returncode == 2 and "error[UNREADABLE_FILE]" in proc.stderr, (arg, proc.stderr)


def test_workflows_refs_are_one_normalized_ref(akm):
    """`workflows/./s` and `workflows/s` made two runs of one workflow (issue 23 item 5)."""
    (akm.cwd / ".akm" / "workflows").mkdir(parents=True)
    (akm.cwd / ".akm" / "workflows" / "s.md").write_text(SESSION_WF, encoding="utf-8")
    first = akm.json("workflow", "run", "workflows/./s", check=3)
    assert first["run"]["workflow"] == "workflows/s"
    for spelling in ("workflows/s", "workflows//s.md", "workflows/s.md"):
        again = akm.json("workflow", "run", spelling, check=3)
        assert again["run"]["runId"] == first["run"]["runId"] and not again["started"], spelling
    listed = akm.json("workflow", "list", "--ref", "workflows/./s")["runs"]
    assert [r["runId"] for r in listed] == [first["run"]["runId"]]


CAP_WF = """\
---
params:
  items: { type: array }
  two: { type: array, default: [1, 2] }
steps:
  - id: warm
    map:
      over: params.two
      unit:
        exec:
          command: ["true"]
  - id: wide
    map:
      over: params.items
      unit:
        exec:
          command: ["true"]
---

## warm

w

## wide

x
"""


def test_a_step_that_would_pass_the_lifetime_cap_fails_before_dispatching(tmp_path, project):
    """10,000 units after 2 others passed the 10,000-dispatch lifetime cap only after running 9,998 of them
    (and the run could never succeed): the step is refused at its start, with the bound named."""
    import sqlite3

    from akm import api, paths

    (project / "cap.md").write_text(CAP_WF, encoding="utf-8")
    res = api.run_workflow("cap.md", params={"items": list(range(9_999))}, cwd=str(project))
    assert res.run.status == "failed"
    wide = res.run.steps[1]
    assert wide.status == "failed" and "lifetime cap of 10000 units" in (wide.notes or "")
    assert "has 9999 units to dispatch, but the run has already dispatched 2" in wide.notes
    con = sqlite3.connect(paths.journal_path())
    assert con.execute("SELECT count(*) FROM units WHERE step_id = 'wide'").fetchone() == (0,)
    con.close()


def test_a_report_holder_is_bounded_like_every_other_string(tmp_path, project):
    """issue 35 item 5: `unit_report` stored a 100,000-character holder on the unit row."""
    import pytest

    from akm import api
    from akm.errors import UsageError

    (project / "s.md").write_text(SESSION_WF, encoding="utf-8")
    run_id = api.run_workflow("s.md", cwd=str(project)).run.run_id
    for holder in ("h" * 100_000, "agent\nsecond line", "  "):
        with pytest.raises(UsageError) as exc:
            api.report_unit(run_id, "s:solo", status="running", holder=holder, cwd=str(project))
        assert exc.value.code == "INVALID_ARGUMENT" and (exc.value.details or {}).get("argument") == "holder"
        assert len(exc.value.message) < 500
    claimed = api.report_unit(run_id, "s:solo", status="running", holder="sub-agent-1", cwd=str(project))
    assert claimed.to_json()["claim"]["holder"] == "sub-agent-1"
