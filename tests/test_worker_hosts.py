"""One fan-out across hosts (issue 19): `workflow run --workers` coordinates, `akm worker` processes on three
"hosts" (own HOME, data dir and `AKM_HOST_ID`) share one PostgreSQL journal and run the units.

Real processes, a real server (tests/pgcluster.py): units run on several hosts and none is claimed twice; a
worker killed with SIGKILL loses only its in-flight units, which others run again once its claims lapse; a
worker frozen with SIGSTOP past its claims' expiry has its late finishes rejected after SIGCONT.
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

from tests.helpers import ROOT, open_at

pytestmark = pytest.mark.slow

FAN = """---
description: a fan-out for workers
params:
  n: {{ type: integer, default: 30 }}
steps:
  - id: items
    unit:
      exec:
        command: [python3, -c, "import json,os; print(json.dumps(list(range(json.loads(os.environ['AKM_PARAMS'])['n']))))"]
    output: {{ type: array, items: {{ type: integer }} }}
  - id: work
    map:
      over: steps.items.output
      concurrency: {width}
      unit:
        exec:
          command: [python3, -c, "import os,time; time.sleep({sleep}); print(os.environ['AKM_ITEM'])"]
    output: {{ type: array }}
---
## items
List the items.
## work
Work on one item.
"""


def _env(tmp_path: Path, name: str, url: str, **extra: str) -> dict[str, str]:
    home = tmp_path / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
    env.update(
        HOME=str(home / "home"),
        XDG_CONFIG_HOME=str(home / "config"),
        AKM_DATA_DIR=str(home / "data"),
        AKM_HOST_ID=f"test-{name}",
        AKM_JOURNAL_URL=url,
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def _worker(env: dict[str, str], project: Path, concurrency: int = 4) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "akm",
            "worker",
            "--concurrency",
            str(concurrency),
            "--poll",
            "200ms",
            "--format",
            "json",
        ],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _coordinate(env: dict[str, str], project: Path, *params: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "akm", "workflow", "run", "fan.md", "--workers", *params, "--format", "json"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen) -> dict:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return json.loads(out) if out.strip() else {"stderr": err}


def _rows(url: str) -> list:
    db = open_at(url)
    try:
        return db.query("SELECT unit_id, step_id, status, attempts, host FROM units ORDER BY unit_id")
    finally:
        db.close()


def _wait_for(predicate, what: str, deadline_s: float = 180.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def server_url(pg_cluster):
    from tests import pgcluster

    with pgcluster.fresh_schema(pg_cluster) as url:
        yield url


def _project(tmp_path: Path, *, width: int, sleep: float) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "fan.md").write_text(FAN.format(width=width, sleep=sleep))
    return project


def test_three_workers_share_a_300_unit_fan_out_and_claim_nothing_twice(tmp_path, server_url):
    project = _project(tmp_path, width=64, sleep=0)
    workers = [_worker(_env(tmp_path, name, server_url), project) for name in ("a", "b", "c")]
    try:
        coord = _coordinate(_env(tmp_path, "coord", server_url), project, "--n", "300")
        out, err = coord.communicate(timeout=600)
        assert coord.returncode == 0, err
        assert json.loads(out)["run"]["status"] == "completed"
    finally:
        summaries = [_stop(w) for w in workers]
    rows = _rows(server_url)
    work = [r for r in rows if r["step_id"] == "work"]
    assert len(work) == 300 and all(r["status"] == "completed" for r in work)
    # a unit is claimed once, or again after a worker gave its claim back unrun (claimed ahead of a slot whose unit
    # ran long on a loaded machine: akm.worker.loop.AHEAD_HOLD_S); each claim bumps the row's fencing token
    released = sum(s["released"] for s in summaries)
    assert all(r["attempts"] >= 1 for r in rows) and sum(r["attempts"] - 1 for r in rows) == released, released
    hosts = {r["host"] for r in rows}
    assert len(hosts) >= 2 and hosts <= {"test-a", "test-b", "test-c"}
    assert sum(s["finished"] for s in summaries) == 301 and sum(s["rejected"] for s in summaries) == 0


def test_a_killed_worker_loses_only_its_in_flight_units(tmp_path, server_url):
    project = _project(tmp_path, width=12, sleep=1.5)
    # A TTL far above a renewal's delay on a busy 2-core machine: a live worker whose renewals run late stops its
    # own units near the TTL (self-fencing), which would re-run more than the victim's units.
    ttl = {"AKM_WORKER_CLAIM_TTL_S": "10"}
    victim = _worker(_env(tmp_path, "a", server_url, **ttl), project, concurrency=3)
    others = [_worker(_env(tmp_path, name, server_url, **ttl), project, concurrency=3) for name in ("b", "c")]
    try:
        coord = _coordinate(_env(tmp_path, "coord", server_url), project, "--n", "24")

        def victim_busy():
            running = [r for r in _rows(server_url) if r["host"] == "test-a" and r["status"] == "running"]
            return running if any(r["step_id"] == "work" for r in running) else None

        _wait_for(victim_busy, "the victim worker to run work units")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        in_flight = {r["unit_id"] for r in _rows(server_url) if r["host"] == "test-a" and r["status"] == "running"}
        assert in_flight
        out, err = coord.communicate(timeout=600)
        assert coord.returncode == 0, err
    finally:
        for w in others:
            _stop(w)
    rows = _rows(server_url)
    assert all(r["status"] == "completed" for r in rows)
    again = {r["unit_id"] for r in rows if r["attempts"] > 1}
    assert again == in_flight  # only what the dead worker had in flight ran again
    assert all(r["host"] != "test-a" for r in rows if r["unit_id"] in in_flight)


def test_a_frozen_worker_has_its_late_finishes_rejected(tmp_path, server_url):
    project = _project(tmp_path, width=6, sleep=2)
    ttl = {"AKM_WORKER_CLAIM_TTL_S": "8"}  # the other worker's claims must not lapse on a busy machine
    frozen = _worker(_env(tmp_path, "a", server_url, **ttl), project, concurrency=3)
    other = _worker(_env(tmp_path, "b", server_url, **ttl), project, concurrency=3)
    try:
        coord = _coordinate(_env(tmp_path, "coord", server_url), project, "--n", "12")

        def frozen_busy():
            return [
                r
                for r in _rows(server_url)
                if r["host"] == "test-a" and r["status"] == "running" and r["step_id"] == "work"
            ] or None

        _wait_for(frozen_busy, "the worker to run work units")
        frozen.send_signal(signal.SIGSTOP)
        held = {r["unit_id"] for r in _rows(server_url) if r["host"] == "test-a" and r["status"] == "running"}
        out, err = coord.communicate(timeout=600)  # the other worker takes the lapsed claims over
        assert coord.returncode == 0, err
        frozen.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        late = _stop(frozen)
    finally:
        if frozen.poll() is None:
            frozen.send_signal(signal.SIGCONT)
            frozen.kill()
        _stop(other)
    assert late["rejected"] >= len(held) > 0
    rows = {r["unit_id"]: r for r in _rows(server_url)}
    assert all(r["status"] == "completed" for r in rows.values())
    for unit_id in held:  # the newer claim's result stands, from the other host
        assert rows[unit_id]["host"] == "test-b" and rows[unit_id]["attempts"] == 2
