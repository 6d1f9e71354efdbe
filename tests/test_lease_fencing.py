"""Fencing the run lease (spec-engine §3): a driver that lost its lease starts and journals nothing, a
holder's liveness is judged within its own boot and PID namespace, and a driver waits for a report's short
finalize lock. Real journals, real `akm` processes, SIGSTOP/SIGCONT and `unshare`; every wait is for an
event in the journal or a file, never for a time window."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from akm import api, paths
from akm.errors import AkmError, UsageError
from akm.store import open_db, runs, units
from akm.store.clock import now_iso
from tests.helpers import bare_run, wait_until, write_wf

DEADLINE_S = 120.0


# ------------------------------------------------------------------ helpers


def _make_run(db, run_id="r1"):
    return bare_run(db, run_id, step_ids=["a"], workflow_ref=f"workflows/{run_id}")


def _rows(sql: str, args: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(paths.journal_path(), timeout=30)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def _lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def _overlaps(log: Path) -> list[str]:
    """Units that started while another start of the same unit had not ended (from the append-only log)."""
    running: set[str] = set()
    twice: list[str] = []
    for parts in _lines(log):
        if parts[0] == "start":
            if parts[1] in running:
                twice.append(parts[1])
            running.add(parts[1])
        elif parts[0] == "end":
            running.discard(parts[1])
    return twice


def _unit_script(log: Path, hold: str) -> str:
    """An exec unit that logs its start and end (with its parent pid, the driver) around `hold`."""
    code = (
        f"import os,json,time; log={str(log)!r}; u=os.environ['AKM_UNIT_ID']\n"
        "def w(s):\n"
        "    fd=os.open(log, os.O_WRONLY|os.O_APPEND|os.O_CREAT, 0o644); os.write(fd, s.encode()); os.close(fd)\n"
        "w(f'start {u} {os.getppid()}\\n')\n"
        f"{hold}\n"
        "w(f'end {u} {os.getppid()}\\n')\n"
        "print(json.dumps(1))"
    )
    return json.dumps([sys.executable, "-c", code])


def _akm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
    env.update(
        AKM_DATA_DIR=str(tmp_path / "akm-data"),
        XDG_CONFIG_HOME=str(tmp_path / "xdg-config"),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        **extra,
    )
    return env


def _popen(argv: list[str], project: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _akm(*args: str) -> list[str]:
    return [sys.executable, "-m", "akm", *args]


# ------------------------------------------------------------------ the store


def test_every_acquisition_bumps_the_epoch_and_a_lost_fence_writes_nothing(tmp_path):
    db = open_db(tmp_path / "j.sqlite3")
    _make_run(db)
    assert runs.acquire_lease(db, "r1", "old") is None
    old = runs.lease_fence(db, "r1", "old")
    assert old == runs.Fence("old", 1) and runs.lease_fence(db, "r1", "other") is None
    started = units.insert_unit(db, run_id="r1", unit_id="a:0", step_id="a", node_id="a", fence=old)
    # old lapses (stopped past its TTL) and a new driver takes the run: a new epoch
    db.execute("UPDATE runs SET lease_until = ? WHERE id = 'r1'", (now_iso(-1),))
    assert runs.acquire_lease(db, "r1", "new") is None
    assert runs.lease_fence(db, "r1", "new") == runs.Fence("new", 2)
    before = _dump(db)
    for write in (
        lambda: units.insert_unit(db, run_id="r1", unit_id="a:1", step_id="a", node_id="a", fence=old),
        lambda: units.finish_unit(
            db, run_id="r1", unit_id="a:0", started_at=started, status="completed", result_json="1", fence=old
        ),
        lambda: units.finish_and_insert(
            db,
            units.UnitFinish("r1", "a:0", started, "completed", "1"),
            run_id="r1",
            unit_id="a:1",
            step_id="a",
            node_id="a",
            fence=old,
        ),
        lambda: runs.complete_step(db, "r1", "a", "completed", lease_holder="old", fence=old),
        lambda: runs.set_run_status(db, "r1", "awaiting_session", {"kind": "units"}, fence=old),
    ):
        with pytest.raises(UsageError) as exc:
            write()
        assert exc.value.code == "LEASE_LOST" and "epoch 1" in exc.value.message, exc.value.message
    assert _dump(db) == before, "a fenced-out write changed the journal"
    assert runs.renew_lease(db, "r1", "old", epoch=1) is False
    assert runs.renew_lease(db, "r1", "new", epoch=1) is False  # the right holder at the wrong epoch
    assert runs.renew_lease(db, "r1", "new", epoch=2) is True
    db.close()


def test_a_lapsed_lease_nobody_took_is_still_its_holders_and_a_fenced_insert_renews_it(tmp_path):
    db = open_db(tmp_path / "j.sqlite3")
    _make_run(db)
    assert runs.acquire_lease(db, "r1", "h") is None
    fence = runs.lease_fence(db, "r1", "h")
    db.execute("UPDATE runs SET lease_until = ? WHERE id = 'r1'", (now_iso(-1),))
    units.insert_unit(db, run_id="r1", unit_id="a:0", step_id="a", node_id="a", fence=fence)
    until = db.query_one("SELECT lease_until FROM runs WHERE id = 'r1'")["lease_until"]
    assert until > now_iso(runs.LEASE_TTL_S / 2), "the insert must leave the lease good for half a TTL"
    db.close()


def test_lease_ttl_comes_from_the_environment(tmp_path, monkeypatch):
    db = open_db(tmp_path / "j.sqlite3")
    _make_run(db)
    monkeypatch.setenv("AKM_LEASE_TTL_S", "5")
    assert runs.lease_ttl_s() == 5.0
    assert runs.acquire_lease(db, "r1", "h") is None
    until = db.query_one("SELECT lease_until FROM runs WHERE id = 'r1'")["lease_until"]
    assert now_iso(3) < until <= now_iso(5)
    for bad in ("0", "-1", "soon", "nan", "inf"):
        monkeypatch.setenv("AKM_LEASE_TTL_S", bad)
        with pytest.raises(UsageError) as exc:
            runs.acquire_lease(db, "r1", "other")
        assert exc.value.code == "INVALID_ENV" and "AKM_LEASE_TTL_S" in exc.value.message
    db.close()


@pytest.mark.skipif(not Path("/proc/sys/kernel/random/boot_id").exists(), reason="Linux /proc only")
def test_host_id_names_the_boot_and_the_pid_namespace():
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    ns = os.readlink("/proc/self/ns/pid")
    assert runs.host_id() == f"{runs.hostname()}/{boot}/{ns[ns.index('[') + 1 : -1]}"


def _dump(db) -> dict[str, list[tuple]]:
    return {t: [tuple(r) for r in db.query(f"SELECT * FROM {t} ORDER BY rowid")] for t in ("runs", "units", "events")}


# ------------------------------------------------------------------ SIGSTOP / SIGCONT


FAN = """
    steps:
      - id: items
        unit: {{ exec: {{ command: {items} }} }}
        output: {{ type: array }}
      - id: each
        map:
          over: steps.items.output
          concurrency: 2
          unit:
            exec: {{ command: {unit} }}
            output: {{ type: integer }}
    """


def _stop_outside_a_write(proc: subprocess.Popen) -> None:
    """SIGSTOP `proc` at a moment it holds no journal write lock (else nobody could write until SIGCONT).

    Tries BEGIN IMMEDIATE on the journal while it is stopped; when that is locked, lets it go on and
    stops it again. Decided by the lock itself, not by timing."""
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        con = sqlite3.connect(paths.journal_path(), timeout=0.5, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(proc.pid, signal.SIGCONT)
        finally:
            con.close()


def test_a_driver_stopped_past_its_lease_starts_nothing_once_it_continues(tmp_path, project):
    """issue 15 item 6: SIGSTOP a fan-out's driver past its lease TTL, let a second driver take the run,
    SIGCONT the first: it stops at once (LEASE_LOST), starts no unit, journals no result; no unit ever
    runs twice at once; the second driver completes the run."""
    log = tmp_path / "units.log"
    items = json.dumps([sys.executable, "-c", "import json; print(json.dumps(list(range(12))))"])
    # each unit holds until the test lets it end, so the takeover happens with units still to do
    gate = tmp_path / "go"
    hold = f"import pathlib\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.01)"
    write_wf(project, "fan.md", FAN.format(items=items, unit=_unit_script(log, hold)), "## items\n\nx\n\n## each\n\ny")
    env = _akm_env(tmp_path, AKM_LEASE_TTL_S="3")
    first = _popen(_akm("workflow", "run", "fan.md"), project, env)
    second = None
    try:
        wait_until(
            what="two units of the first driver",
            predicate=lambda: len([p for p in _lines(log) if p[0] == "start"]) >= 2,
        )
        run_id = _rows("SELECT id FROM runs")[0][0]
        _stop_outside_a_write(first)
        gate.touch()  # the units it started finish while it is stopped (they are not its to stop)
        wait_until(what="its units to end", predicate=lambda: sum(p[0] == "end" for p in _lines(log)) == 2)
        wait_until(
            what="its lease to lapse", predicate=lambda: _rows("SELECT lease_until < ? FROM runs", (now_iso(),))[0][0]
        )
        gate.unlink()
        second = _popen(_akm("workflow", "run", run_id), project, env)
        wait_until(
            lambda: any(p[0] == "start" and p[2] == str(second.pid) for p in _lines(log)),
            what="the second driver to start a unit",
        )
        mark = len(_lines(log))
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=DEADLINE_S)
        assert first.returncode == 2 and "LEASE_LOST" in err, (first.returncode, out, err)
        after = _lines(log)[mark:]
        assert not [p for p in after if p[0] == "start" and p[2] == str(first.pid)], "the stale driver started units"
        gate.touch()
        out2, err2 = second.communicate(timeout=DEADLINE_S)
        assert second.returncode == 0, (out2, err2)
    finally:
        gate.touch()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert _overlaps(log) == [], _lines(log)
    assert _rows("SELECT status, lease_epoch FROM runs") == [("completed", 2)]  # two acquisitions
    assert _rows("SELECT count(*), min(status), max(status) FROM units WHERE step_id = 'each'") == [
        (12, "completed", "completed")
    ]
    assert len({p[1] for p in _lines(log) if p[0] == "end"}) == 12


# ------------------------------------------------------------------ PID namespaces


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return (
            subprocess.run(
                ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=30
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare --pid (root or user namespaces)")
def test_a_driver_in_another_pid_namespace_does_not_take_over_a_live_run(tmp_path, project):
    """issue 15 item 6: `unshare --pid --fork --mount-proc akm workflow run RUN` sees no process with the
    holder's pid in its namespace; it must not judge the holder dead by that and take over (LEASE_HELD)."""
    log = tmp_path / "units.log"
    gate = tmp_path / "go"
    hold = f"import pathlib\nwhile not pathlib.Path({str(gate)!r}).exists(): time.sleep(0.01)"
    write_wf(
        project,
        "one.md",
        f"""
        steps:
          - id: a
            unit: {{ exec: {{ command: {_unit_script(log, hold)} }} }}
            output: {{ type: integer }}
        """,
        "## a\n\nx",
    )
    env = _akm_env(tmp_path)
    first = _popen(_akm("workflow", "run", "one.md"), project, env)
    try:
        wait_until(what="the unit to start", predicate=lambda: any(p[0] == "start" for p in _lines(log)))
        run_id, holder = _rows("SELECT id, lease_holder FROM runs")[0]
        inside = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", *_akm("workflow", "run", run_id)],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
        assert inside.returncode == 2 and "LEASE_HELD" in inside.stderr, (inside.returncode, inside.stderr)
        assert _rows("SELECT lease_holder FROM runs") == [(holder,)]
        gate.touch()
        out, err = first.communicate(timeout=DEADLINE_S)
        assert first.returncode == 0, (out, err)
    finally:
        gate.touch()
        if first.poll() is None:
            first.kill()
            first.wait()
    assert [p[0] for p in _lines(log)] == ["start", "end"]
    assert _rows("SELECT status FROM runs") == [("completed",)]


# ------------------------------------------------------------------ a report's finalize lock (item 5)


ASK = """
    steps:
      - id: ask
        output: { type: string }
      - id: after
        unit: { exec: { command: %s } }
    """ % json.dumps([sys.executable, "-c", "print(2)"])
ASK_BODY = "## ask\n\nSay ok.\n\n### gate\n\nThe answer says ok.\n\n## after\n\nx"


def _in_frame(thread: threading.Thread, name: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == name:
            return True
        frame = frame.f_back
    return False


def _set_judge(capsys, fake_openai, model: str) -> None:
    from akm import cli

    for args in (
        ["config", "set", "engines.judge", json.dumps({"kind": "llm", "endpoint": fake_openai.url, "model": model})],
        ["config", "set", "workflow.judgeEngine", "judge"],
    ):
        assert cli.main(args) == 0, capsys.readouterr().err
    capsys.readouterr()


def test_workflow_run_waits_for_the_report_that_is_finishing_the_step(project, fake_openai, capsys):
    """issue 15 item 5: a report finishing a step holds the run lease while its engine judge answers;
    `workflow run` started meanwhile waits for that hold (on the journal's lease row) instead of
    answering LEASE_HELD "another invocation is driving", then drives the rest of the run."""
    _set_judge(capsys, fake_openai, "verdict-held")
    wf = write_wf(project, "ask.md", ASK, ASK_BODY)
    rid = api.run_workflow(str(wf), cwd=str(project)).run.run_id
    unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
    outcome: dict[str, object] = {}

    def call(key: str, fn) -> None:
        try:
            outcome[key] = fn()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome[key] = exc

    reporter = threading.Thread(
        target=call,
        args=(
            "report",
            lambda: api.report_unit(rid, unit, cwd=str(project), status="completed", result="ok").to_json(),
        ),
    )
    reporter.start()
    try:
        assert fake_openai.held.acquire(timeout=DEADLINE_S), "the report's judge was never asked"
        assert _rows("SELECT lease_holder LIKE 'report:%' FROM runs WHERE id = ?", (rid,)) == [(1,)]
        driver = threading.Thread(target=call, args=("run", lambda: api.run_workflow(rid, cwd=str(project))))
        driver.start()
        wait_until(
            lambda: not driver.is_alive() or _in_frame(driver, "wait_lease_change"),
            what="the driver to wait for the report's lock (or to give up)",
        )
    finally:
        fake_openai.release.set()
        reporter.join(DEADLINE_S)
    driver.join(DEADLINE_S)
    assert not isinstance(outcome.get("run"), BaseException), outcome.get("run")
    assert not isinstance(outcome.get("report"), BaseException), outcome.get("report")
    assert outcome["report"]["stepOutcome"]["kind"] == "completed"
    assert outcome["run"].run.status == "completed"
    assert _rows("SELECT step_id, status FROM steps WHERE run_id = ? ORDER BY sequence_index", (rid,)) == [
        ("ask", "completed"),
        ("after", "completed"),
    ]


def test_workflow_run_racing_the_finishing_report_never_answers_lease_held(project, fake_openai, capsys):
    """Many races of `workflow run` against the report that finishes a step: the driver never answers
    LEASE_HELD (a report refused because the driver got there first is retried, as an agent would)."""
    _set_judge(capsys, fake_openai, "verdict-pass")
    wf = write_wf(project, "ask.md", ASK, ASK_BODY)
    held: list[str] = []
    for i in range(20):
        rid = api.run_workflow(str(wf), cwd=str(project), new=True).run.run_id
        unit = api.next_brief(rid).to_json()["units"][0]["unitId"]
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def report() -> None:
            barrier.wait()
            db = open_db(paths.journal_path())
            try:
                while True:
                    try:
                        api.report_unit(rid, unit, cwd=str(project), status="completed", result="ok")
                        return
                    except AkmError as exc:
                        if exc.code != "LEASE_HELD":
                            errors.append(exc)
                            return
                    lease = runs.read_lease(db, rid)  # the driver got there first: report once it is done
                    if lease is not None:
                        runs.wait_lease_change(db, rid, lease, time.monotonic() + DEADLINE_S)
            finally:
                db.close()

        def drive() -> None:
            barrier.wait()
            try:
                api.run_workflow(rid, cwd=str(project))
            except AkmError as exc:
                (held if exc.code == "LEASE_HELD" else errors).append(exc)

        threads = [threading.Thread(target=report), threading.Thread(target=drive)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE_S)
        assert not errors, errors
        final = api.run_workflow(rid, cwd=str(project))  # drives what the race left (if anything)
        assert final.run.status == "completed", (i, final.run)
    assert held == [], [e.message for e in held]


def test_a_bad_lease_ttl_is_refused_before_a_run_is_created(akm, project):
    (project / "one.md").write_text(
        "---\nsteps:\n  - id: a\n    unit: { exec: { command: [python3, -c, 'print(1)'] } }\n---\n## a\nx\n"
    )
    akm.env["AKM_LEASE_TTL_S"] = "soon"
    res = akm("workflow", "run", "one.md", check=78)  # the environment, not the request (one rule, issue 39)
    assert "error[INVALID_ENV]" in res.stderr and "AKM_LEASE_TTL_S" in res.stderr and "Traceback" not in res.stderr
    assert not paths.journal_path().exists() or _rows("SELECT count(*) FROM runs") == [(0,)]
