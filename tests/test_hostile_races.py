"""A refusal writes nothing; a write is answered as written (issue 23 item 1).

Races made deterministic with real parts: a held finalize lock parks a report between its write and its
step's finish, a real driver process runs a unit while the run is abandoned under it, and a read-only
mount holds the journal.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from akm import api, paths
from akm.store import open_db
from akm.store import runs as runs_store
from akm.store import units as units_store

SESSION_WF = "---\nsteps:\n  - id: s\n---\n\n## s\n\nDo s.\n"


def _rows(sql: str, *args) -> list[tuple]:
    con = sqlite3.connect(paths.journal_path())
    try:
        return [tuple(r) for r in con.execute(sql, args)]
    finally:
        con.close()


def _wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_report_written_before_an_abandon_is_answered_as_written(project):
    (project / "s.md").write_text(SESSION_WF, encoding="utf-8")
    run_id = api.run_workflow("s.md", cwd=str(project)).run.run_id
    # Another reporter holds the finalize lock: this report writes, then waits for the lock.
    db = open_db(paths.journal_path())
    assert runs_store.acquire_lease(db, run_id, units_store.REPORT_LOCK_PREFIX + "other") is None
    answer: dict = {}

    def report() -> None:
        try:
            answer["ok"] = api.report_unit(
                run_id, "s:solo", status="completed", result="done", cwd=str(project)
            ).to_json()
        except Exception as exc:  # noqa: BLE001 — the assertion below names it
            answer["error"] = exc

    worker = threading.Thread(target=report)
    worker.start()
    _wait_for(
        lambda: _rows("SELECT status FROM units WHERE unit_id = 's:solo'") == [("completed",)], "the report's write"
    )
    api.abandon(run_id)
    worker.join(timeout=120)
    db.close()
    assert "error" not in answer, f"a committed report was answered as a refusal: {answer.get('error')!r}"
    assert answer["ok"]["recorded"] == "written" and answer["ok"]["runStatus"] == "abandoned"
    assert "abandoned now" in answer["ok"]["message"]
    assert _rows("SELECT status, result_json FROM units WHERE unit_id = 's:solo'") == [("completed", '"done"')]


def test_abandon_keeps_another_drivers_in_flight_result_out_of_the_journal(akm, project, tmp_path):
    marker = tmp_path / "started"
    unit = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('a result after the abandon'), sys.exit(0)))\n"
        f"pathlib.Path({str(marker)!r}).write_text('x')\n"
        "time.sleep(120)\n"
    )
    (project / "w.md").write_text(
        "---\nsteps:\n  - id: a\n    unit:\n      exec:\n        command: "
        + json.dumps([sys.executable, "-c", unit])
        + "\n---\n\n## a\n\nx\n",
        encoding="utf-8",
    )
    driver = akm.popen("workflow", "run", "w.md")
    try:
        _wait_for(marker.exists, "the unit to start")
        (run,) = api.list_runs(cwd=str(project)).runs
        api.abandon(run.run_id)
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
    assert "error[RUN_ABANDONED]" in err or driver.returncode != 0, err
    rows = _rows("SELECT status, failure_reason, result_json FROM units WHERE run_id = ?", run.run_id)
    assert rows == [("failed", "abandoned", None)], rows
    finished = [
        json.loads(m)
        for (m,) in _rows(
            "SELECT metadata_json FROM events WHERE event_type = 'workflow_unit_finished' AND run_id = ?", run.run_id
        )
    ]
    assert [e.get("failureReason") for e in finished] == ["abandoned"]


def _read_only(akm, data_dir, *args: str) -> subprocess.CompletedProcess:
    """`akm ARGS` with the journal's directory read-only: a read-only bind mount in a user namespace (even
    root cannot write there), or, for a non-root user, a directory without write permission."""
    if os.geteuid() != 0:
        os.chmod(data_dir, 0o555)
        try:
            return akm(*args)
        finally:
            os.chmod(data_dir, 0o755)
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("running as root without unshare(1): no way to make a directory read-only for root")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    probe = subprocess.run([unshare, "-rm", "sh", "-c", script, str(data_dir), "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not available here: {probe.stderr.decode(errors='replace')}")
    return subprocess.run(
        [unshare, "-rm", "sh", "-c", script, str(data_dir), *akm.argv0, *args],
        cwd=akm.cwd,
        env=akm.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_read_only_journal_directory_still_answers_the_reads(akm, project):
    (project / "s.md").write_text(SESSION_WF, encoding="utf-8")
    run_id = akm.json("workflow", "run", "s.md", check=3)["run"]["runId"]
    data_dir = akm.data_dir
    listed = _read_only(akm, data_dir, "workflow", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert [r["runId"] for r in json.loads(listed.stdout)["runs"]] == [run_id]
    status = _read_only(akm, data_dir, "workflow", "status", run_id, "--units", "--format", "json")
    assert status.returncode == 0 and json.loads(status.stdout)["status"] == "awaiting_session", status.stderr
    log = _read_only(akm, data_dir, "log", "--run", run_id, "--format", "json")
    assert log.returncode == 0 and json.loads(log.stdout)["events"], log.stderr
    brief = _read_only(akm, data_dir, "workflow", "next", run_id, "--format", "json")
    assert brief.returncode == 0 and json.loads(brief.stdout)["kind"] == "units", brief.stderr
    # A write still fails, coded, and writes nothing.
    report = _read_only(akm, data_dir, "workflow", "report", run_id, "s:solo", "--status", "completed", "--result", "x")
    assert report.returncode == 78 and "error[JOURNAL_ERROR]" in report.stderr, report.stderr
    assert akm.json("workflow", "status", run_id)["status"] == "awaiting_session"
