"""Many hosts, one run history (issue 18): the journal on a PostgreSQL server, selected by URL or config.

Two "hosts" are two sets of processes with their own HOME, config and data dirs and their own host id
(`AKM_HOST_ID`), pointed at one throwaway server (tests/pgcluster.py). They see one history, and a live
driver on one keeps the other out of its run (LEASE_HELD) until it finishes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import PY, ROOT, write_wf


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
