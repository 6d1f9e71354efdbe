"""Many hosts, one run history (issue 18): the journal on a PostgreSQL server, selected by URL or config.

Two "hosts" are two sets of processes with their own HOME, config and data dirs and their own host id
(`AKM_HOST_ID`), pointed at one throwaway server (tests/pgcluster.py). They see one history, and a live
driver on one keeps the other out of its run (LEASE_HELD) until it finishes; a driver killed with SIGKILL is
taken over by the other after the takeover grace (its liveness session is gone; spec/journal.md), not at
the lease's expiry, with only its in-flight units redone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import PY, ROOT, open_at, write_wf


def _host(tmp_path: Path, name: str, url: str) -> dict[str, str]:
    home = tmp_path / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
    env.update(
        HOME=str(home / "home"),
        XDG_CONFIG_HOME=str(home / "config"),
        AKM_DATA_DIR=str(home / "data"),
        AKM_HOST_ID=f"test-{name}",
        AKM_JOURNAL_URL=url,
        PYTHONPATH=str(ROOT),
    )
    return env


def _akm(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "akm", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _json(env: dict[str, str], cwd: Path, *args: str) -> dict:
    proc = _akm(env, cwd, *args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def server_url(pg_cluster):
    from tests import pgcluster

    with pgcluster.fresh_schema(pg_cluster) as url:
        yield url


def test_two_hosts_share_one_history_and_a_live_driver_keeps_the_other_out(tmp_path, server_url):
    project = tmp_path / "project"
    project.mkdir()
    go = tmp_path / "go"
    started = tmp_path / "started"
    waits = (
        "import pathlib,time\n"
        f"pathlib.Path({str(started)!r}).write_text('x')\n"
        "end = time.time() + 120\n"
        f"while time.time() < end and not pathlib.Path({str(go)!r}).exists():\n"
        "    time.sleep(0.05)\n"
        "print('done')"
    )
    write_wf(
        project,
        "wait.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {json.dumps([PY, "-c", waits])} }} }}
        """,
        "## a\n\nwait for the go file",
    )
    a, b = _host(tmp_path, "a", server_url), _host(tmp_path, "b", server_url)
    driver = subprocess.Popen(
        [sys.executable, "-m", "akm", "workflow", "run", "wait.md", "--format", "json"],
        cwd=project,
        env=a,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), driver.communicate(timeout=30)
        # host B sees host A's run ...
        listed_b = _json(b, project, "workflow", "list")
        listed_a = _json(a, project, "workflow", "list")
        ids_b = [r["runId"] for r in listed_b["runs"]]
        assert ids_b == [r["runId"] for r in listed_a["runs"]] and len(ids_b) == 1
        run_id = ids_b[0]
        # ... and cannot drive it while A's driver lives
        refused = _akm(b, project, "workflow", "run", run_id, "--format", "json")
        assert refused.returncode != 0
        assert "LEASE_HELD" in refused.stdout + refused.stderr
        status = _json(b, project, "workflow", "status", run_id)
        assert status["status"] == "active" and status["engineLease"]["host"] == "test-a"
    finally:
        go.write_text("go")
        out, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    assert json.loads(out)["run"]["status"] == "completed"
    done = _json(b, project, "workflow", "status", run_id)
    assert done["status"] == "completed" and done["engineLease"] is None
    # no journal file on either host: the history is the server's
    assert not (tmp_path / "a" / "data" / "akm-journal.sqlite3").exists()
    assert not (tmp_path / "b" / "data" / "akm-journal.sqlite3").exists()


def test_config_journal_url_selects_the_server_and_refuses_a_stored_password(tmp_path, server_url):
    project = tmp_path / "project"
    project.mkdir()
    env = _host(tmp_path, "c", "")
    del env["AKM_JOURNAL_URL"]
    password = server_url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    literal = _akm(env, project, "config", "set", "journal.url", server_url)
    assert literal.returncode == 2 and "INVALID_ARGUMENT" in literal.stderr
    assert password not in literal.stdout + literal.stderr
    by_ref = server_url.replace(f":{password}@", ":${AKM_TEST_PGPW}@")
    assert _akm(env, project, "config", "set", "journal.url", by_ref).returncode == 0
    write_wf(
        project,
        "hi.md",
        f"steps:\n  - id: a\n    unit: {{ exec: {{ command: {json.dumps([PY, '-c', 'print(1)'])} }} }}",
        "## a\n\nx",
    )
    unset = _akm(env, project, "workflow", "list")
    assert unset.returncode == 78 and "JOURNAL_URL_INVALID" in unset.stderr and password not in unset.stderr
    env["AKM_TEST_PGPW"] = password
    res = _json(env, project, "workflow", "run", "hi.md")
    assert res["run"]["status"] == "completed"
    assert [r["runId"] for r in _json(env, project, "workflow", "list")["runs"]] == [res["run"]["runId"]]
    assert not (tmp_path / "c" / "data" / "akm-journal.sqlite3").exists()


# A unit of the fan-out: items 1 and 2 finish at once; every other item sleeps until the test has killed
# host A (the `killed` file), so when A dies exactly the units it had in flight are unfinished.
SLEEPER = """\
import json, os, pathlib, time
item = json.loads(os.environ["AKM_ITEM"])
end = time.time() + 300
while item > 2 and time.time() < end and not pathlib.Path({killed!r}).exists():
    time.sleep(0.05)
print(item)
"""


def _wait_for(what: str, probe, deadline_s: float = 120.0):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_killed_driver_is_taken_over_at_once_and_only_its_in_flight_units_are_redone(tmp_path, server_url):
    from akm.store.postgres.liveness import NAMESPACE, session_key

    project = tmp_path / "project"
    project.mkdir()
    killed = tmp_path / "killed"
    script = project / "unit.py"
    script.write_text(SLEEPER.format(killed=str(killed)))
    write_wf(
        project,
        "fan.md",
        f"""
        params:
          items: {{ type: array, items: {{ type: integer }}, default: [1, 2, 3, 4, 5, 6] }}
        steps:
          - id: fan
            map:
              over: params.items
              concurrency: 2
              unit:
                exec:
                  command: {json.dumps([PY, str(script)])}
        """,
        "## fan\n\nsix units, two at a time",
    )
    a, b = _host(tmp_path, "a", server_url), _host(tmp_path, "b", server_url)
    # A lease TTL far beyond the test's deadlines: a takeover that waited for expiry could not pass.
    a["AKM_LEASE_TTL_S"] = b["AKM_LEASE_TTL_S"] = "600"
    db = open_at(server_url)
    driver = subprocess.Popen(
        [sys.executable, "-m", "akm", "workflow", "run", "fan.md", "--format", "json"],
        cwd=project,
        env=a,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def two_done_two_in_flight():
            if driver.poll() is not None:
                raise AssertionError(driver.communicate())
            rows = db.query("SELECT unit_id, status FROM units ORDER BY unit_id")
            done = [r[0] for r in rows if r[1] == "completed"]
            running = [r[0] for r in rows if r[1] == "running"]
            return (done, running) if len(done) == 2 and len(running) == 2 else None

        done_before, in_flight = _wait_for("two units finished and two in flight on host A", two_done_two_in_flight)
        # A's liveness connection opens beside its lease; its heartbeat records the marker once the lock is held
        _wait_for("host A's liveness marker", lambda: db.query_one("SELECT lease_liveness FROM runs")[0])
        run_id, holder, host = db.query_one("SELECT id, lease_holder, lease_host FROM runs")
        assert host == "test-a"
        assert db.query_one("SELECT lease_session, lease_liveness FROM runs")[0] == session_key(holder)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
        # The server notices the closed socket and ends A's session; its liveness lock goes with it.
        _wait_for(
            "host A's liveness session to end",
            lambda: (
                not db.query(
                    "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = ? AND objid::bigint = ?",
                    (NAMESPACE, session_key(holder)),
                )
            ),
        )
        killed.write_text("x")
        # The lease row still names A, unexpired for ~10 minutes; B takes the run over at once all the same.
        assert db.query_one("SELECT lease_until > now() + interval '300 s' FROM runs")[0]
        began = time.monotonic()
        took = _akm(b, project, "workflow", "run", run_id, "--format", "json", timeout=300)
        assert took.returncode == 0, took.stdout + took.stderr
        assert "LEASE_HELD" not in took.stdout + took.stderr
        assert time.monotonic() - began < 300, "host B waited for the lease to expire"
        assert json.loads(took.stdout)["run"]["status"] == "completed"
    finally:
        killed.write_text("x")
        if driver.poll() is None:
            driver.kill()
            driver.communicate(timeout=60)
    attempts = {r[0]: (r[1], int(r[2])) for r in db.query("SELECT unit_id, status, attempts FROM units")}
    assert len(attempts) == 6 and {s for s, _ in attempts.values()} == {"completed"}
    # what A finished is never redone; what it had in flight is redone once; the rest ran once, on B
    assert {u for u, (_, n) in attempts.items() if n > 1} == set(in_flight)
    assert all(attempts[u][1] == 2 for u in in_flight)
    started = [
        json.loads(r[0])["unitId"]
        for r in db.query("SELECT metadata_json FROM events WHERE event_type = 'workflow_unit_started'")
    ]
    assert sorted(started) == sorted([*attempts, *in_flight]) and not set(done_before) & set(in_flight)
    status = _json(a, project, "workflow", "status", run_id)
    assert status["status"] == "completed" and status["engineLease"] is None
    db.close()
