"""`workflow run --workers` + `akm worker` on one machine (the SQLite journal), in process: the coordinator
keeps the step's limits and decisions, the worker runs the units; a worker that cannot run a step's units
here (another commit checked out, an env file missing) claims none of them and says why."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from akm import api
from akm.cli import main as cli_main
from tests.helpers import ROOT, open_test_journal, py, write_wf


def _fan(project: Path, *, n: int = 6, extra: str = "", unit_extra: str = "", code: str | None = None) -> Path:
    code = code or "import os; print(os.environ['AKM_ITEM'])"
    return write_wf(
        project,
        "fan.md",
        f"""
        description: fan-out for workers
        {extra}
        steps:
          - id: work
            map:
              over: params.items
              concurrency: 8
              unit:
                exec:
                  command: {py(code)}
                {unit_extra}
        params:
          items: {{ type: array, default: {json.dumps(list(range(n)))} }}
        """,
        "## work\nDo one item.",
    )


class _Coordinator:
    def __init__(self, wf: Path, project: Path) -> None:
        self.cancel = api.Cancellation()
        self.warnings: list[str] = []
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._go, args=(wf, project), daemon=True)
        self.thread.start()

    def _go(self, wf: Path, project: Path) -> None:
        try:
            self.result = api.run_workflow(
                str(wf),
                workers=True,
                cwd=str(project),
                cancel=self.cancel,
                on_warning=lambda w: self.warnings.append(w.message),
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            self.error = exc

    def join(self, timeout: float = 120):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the coordinator did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def _rows() -> list:
    db = open_test_journal()
    try:
        return db.query("SELECT unit_id, status, attempts, host, queued_at FROM units ORDER BY unit_id")
    finally:
        db.close()


def _wait_queued(n: int, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if sum(1 for r in _rows() if r["status"] == "queued") >= n:
            return
        time.sleep(0.05)
    raise AssertionError("the coordinator queued nothing")


def _work(project: Path, **kw) -> object:
    return api.run_worker(project=str(project), poll="50ms", **kw)


def test_the_worker_runs_what_the_coordinator_queues(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    coord = _Coordinator(_fan(project), project)
    _wait_queued(6)
    cancel = api.Cancellation()
    worker = threading.Thread(target=lambda: _work(project, concurrency=3, cancel=cancel), daemon=True)
    worker.start()
    result = coord.join()
    cancel.trip("sigterm")
    worker.join(30)
    assert result.done and result.run.status == "completed"
    rows = _rows()
    assert len(rows) == 6 and all(r["status"] == "completed" and r["attempts"] == 1 for r in rows)
    assert all(r["queued_at"] is not None and r["host"] for r in rows)
    status = api.run_status(result.run.run_id, units=True).to_json()
    assert {u["host"] for u in status["units"]} == {rows[0]["host"]}


def test_budget_and_fail_fast_hold_across_workers(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    wf = _fan(project, n=8, extra="budget: { max_units: 3 }")
    coord = _Coordinator(wf, project)
    summary = _work(project, concurrency=4, idle_exit="1s")
    result = coord.join()
    assert result.run.status == "failed"
    rows = _rows()
    assert len(rows) == 3  # the coordinator queued no unit past the ceiling
    # crossing it stops the siblings, as in a local pass: what no worker had claimed is taken back, never run
    assert all(r["status"] in ("completed", "failed") for r in rows) and summary.finished <= 3
    assert summary.finished + sum(1 for r in rows if r["status"] == "failed") >= 3

    other = tmp_path / "q"
    other.mkdir()
    code = "import os, sys; sys.exit(3 if os.environ['AKM_ITEM'] == '0' else 0)"
    wf = write_wf(
        other,
        "ff.md",
        f"""
        description: fail fast
        steps:
          - id: work
            map:
              over: params.items
              concurrency: 1
              unit:
                exec:
                  command: {py(code)}
        params:
          items: {{ type: array, default: [0, 1, 2, 3] }}
        """,
        "## work\nDo one item.",
    )
    coord = _Coordinator(wf, other)
    _work(other, concurrency=4, idle_exit="1s")
    result = coord.join()
    assert result.run.status == "failed"
    run_rows = [r for r in _rows() if r["unit_id"].startswith("work")]
    assert len(run_rows) == 3 + 1  # the first run's three, and only item 0 here: nothing after the failure


def test_a_worker_claims_nothing_it_cannot_run_here(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    _fan(project, n=2, unit_extra="env: [env/secrets]")
    (project / ".akm" / "env").mkdir(parents=True)
    (project / ".akm" / "env" / "secrets.env").write_text("TOKEN=abc\n")
    subprocess.run([*git, "add", "fan.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    coord = _Coordinator(project / "fan.md", project)
    try:
        _wait_queued(2)
        # another project: nothing of this run
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        summary = _work(elsewhere, idle_exit="300ms")
        assert summary.claimed == 0 and "another project" in summary.refused[0]
        # the env file the step binds is missing here
        (project / ".akm" / "env" / "secrets.env").rename(project / "secrets.bak")
        summary = _work(project, idle_exit="300ms")
        assert summary.claimed == 0 and "env binding" in summary.refused[0]
        (project / "secrets.bak").rename(project / ".akm" / "env" / "secrets.env")
        # another commit checked out than the run's
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "two"], check=True)
        summary = _work(project, idle_exit="300ms")
        assert summary.claimed == 0 and "needs commit" in summary.refused[0]
        assert all(r["status"] == "queued" for r in _rows())
        subprocess.run([*git, "reset", "-q", "--hard", "HEAD~1"], check=True)
        summary = _work(project, idle_exit="1s")
        assert summary.finished == 2 and summary.refused == []
    finally:
        coord.cancel.trip("sigint")
    assert coord.join().run.status == "completed"


def test_a_stopped_worker_gives_its_units_back(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    coord = _Coordinator(_fan(project, n=2, code="import time; time.sleep(60)"), project)
    try:
        _wait_queued(2)
        cancel = api.Cancellation()
        box: dict = {}
        worker = threading.Thread(target=lambda: box.update(s=_work(project, cancel=cancel)), daemon=True)
        worker.start()
        end = time.monotonic() + 60
        while sum(r["status"] == "running" for r in _rows()) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        cancel.trip("sigterm")
        worker.join(60)
        assert box["s"].released == 2 and box["s"].stop_reason == "sigterm"
        assert [r["status"] for r in _rows()] == ["queued", "queued"]
    finally:
        coord.cancel.trip("sigint")
    assert coord.join().aborted


@pytest.mark.parametrize(
    "argv, code",
    [
        (["worker", "--kinds", "exec,shell"], "INVALID_ARGUMENT"),
        (["worker", "--concurrency", "0"], "INVALID_ARGUMENT"),
        (["worker", "--idle-exit", "soon"], "INVALID_ARGUMENT"),
        (["worker", "--project", "/nonexistent/dir"], "INVALID_ARGUMENT"),
    ],
)
def test_worker_arguments_are_checked(argv, code, capsys):
    assert cli_main([*argv, "--format", "json"]) == 2
    err = json.loads(capsys.readouterr().err)
    assert err["code"] == code


def test_a_worker_with_nothing_to_do_leaves_when_idle(tmp_path, capsys):
    assert cli_main(["worker", "--idle-exit", "200ms", "--poll", "50ms", "--project", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0 claimed, 0 finished" in out and "(stopped: idle)" in out


def _children(pid: int) -> list[str]:
    """The command lines of `pid`'s child processes (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError):
            pass
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the guardian needs /proc")
def test_a_worker_starts_its_units_guardian_while_it_waits_for_work(tmp_path):
    """The guardian that takes units down with their worker (akm.dispatch.guard) is started before any claim: left to
    the first spawn, its interpreter's start-up fell on the run's first units."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKM_")}
    env.update(HOME=str(tmp_path / "home"), AKM_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "akm", "worker", "--idle-exit", "120s", "--project", str(tmp_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not any("AKM_GUARD" in c or "_signal" in c for c in _children(proc.pid)):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no guardian while the worker waits for work"
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_killed_coordinator_is_taken_over_and_the_workers_units_are_not_run_again(tmp_path):
    import os
    import signal
    import sys

    from tests.helpers import ROOT

    project = tmp_path / "p"
    project.mkdir()
    wf = _fan(project, n=4, code="import os, time; time.sleep(1.5); print(os.environ['AKM_ITEM'])")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    coord = subprocess.Popen(
        [sys.executable, "-m", "akm", "workflow", "run", str(wf), "--workers", "--quiet"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_queued(4)
        cancel = api.Cancellation()
        box: dict = {}
        worker = threading.Thread(
            target=lambda: box.update(s=_work(project, concurrency=2, cancel=cancel)), daemon=True
        )
        worker.start()
        end = time.monotonic() + 60
        while sum(r["status"] == "running" for r in _rows()) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        coord.send_signal(signal.SIGKILL)
        coord.wait(30)
        run_id = api.list_runs(cwd=str(project)).runs[0].run_id
        result = api.run_workflow(run_id, cwd=str(project))  # a plain driver: it waits for the workers
        cancel.trip("sigterm")
        worker.join(30)
    finally:
        if coord.poll() is None:
            coord.kill()
    assert result.done and any("queued for or running on workers" in w for w in result.warnings)
    rows = _rows()
    assert len(rows) == 4 and all(r["status"] == "completed" and r["attempts"] == 1 for r in rows)
    assert box["s"].finished == 4


def test_the_coordinator_says_when_no_worker_claims_its_units(tmp_path, monkeypatch):
    from akm.engine import remote

    monkeypatch.setattr(remote, "UNCLAIMED_WARN_S", 0.2)
    project = tmp_path / "p"
    project.mkdir()
    coord = _Coordinator(_fan(project, n=2), project)
    try:
        end = time.monotonic() + 60
        said = [w for w in coord.warnings if "no worker has claimed any" in w]
        while not said and time.monotonic() < end:
            time.sleep(0.05)
            said = [w for w in coord.warnings if "no worker has claimed any" in w]
        # It counts the units queued when the quiet time ran out: on a busy machine the second may come later.
        assert len(said) == 1 and "start a worker" in said[0], said
        assert re.search(r'\b[12] unit\(s\) of step "work"', said[0]), said
    finally:
        coord.cancel.trip("sigint")
    assert coord.join().aborted


def test_fail_fast_takes_back_what_no_worker_claimed(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    code = "import os, sys, time; sys.exit(3) if os.environ['AKM_ITEM'] == '0' else time.sleep(0.3)"
    wf = _fan(project, n=6, code=code)
    coord = _Coordinator(wf, project)
    _wait_queued(6)
    summary = _work(project, concurrency=1, idle_exit="1s")
    result = coord.join()
    assert result.run.status == "failed"
    rows = _rows()
    assert all(r["status"] in ("completed", "failed") for r in rows)
    never_run = [r for r in rows if r["attempts"] == 0]
    assert summary.finished + len(never_run) == 6  # each unit either ran once on the worker or never ran
    assert any(r["attempts"] == 1 and r["status"] == "failed" for r in rows)


def test_a_worker_stopping_as_its_slot_takes_the_next_unit_gives_that_unit_back_unrun(tmp_path):
    """The slot's next unit, and after a short unit one more claimed ahead, come with the previous one's finish
    (issue 40): when the worker is stopped right then, neither is started; both go back to the queue."""
    project = tmp_path / "p"
    project.mkdir()
    marks = tmp_path / "ran"
    marks.mkdir()
    code = f"import os, pathlib; pathlib.Path({str(marks)!r}, os.environ['AKM_ITEM']).touch()"
    coord = _Coordinator(_fan(project, n=4, code=code), project)
    try:
        _wait_queued(4)
        cancel = api.Cancellation()
        events: list = []

        def seen(e) -> None:
            events.append(e)
            if e.kind == "claimed" and sum(x.kind == "claimed" for x in events) == 2:
                cancel.trip("sigterm")  # as the first unit's finish took the second

        summary = _work(project, concurrency=1, cancel=cancel, on_event=seen)
        assert summary.claimed == 3 and summary.finished == 1 and summary.released == 2
        assert summary.stop_reason == "sigterm"
        assert len(list(marks.iterdir())) == 1  # the second unit never ran
        assert sorted(r["status"] for r in _rows()) == ["completed", "queued", "queued", "queued"]
    finally:
        coord.cancel.trip("sigint")
    assert coord.join().aborted


def _marking_code(marks: Path, go: Path) -> str:
    """A unit that notes when it started and its unit id (in `marks/<item>`), and whether another unit of this worker was running
    then (`marks/overlap`); each runs 0.5 s, the second to start once `go` exists (it waits at most a minute)."""
    return f"""
        import os, pathlib, time
        marks, go = pathlib.Path({str(marks)!r}), pathlib.Path({str(go)!r})
        order = len([p for p in marks.iterdir() if p.name.isdigit()])
        running = marks / "running"
        if running.exists():
            (marks / "overlap").touch()
        running.touch()
        (marks / os.environ["AKM_ITEM"]).write_text(f"{{time.time()!r}} {{os.environ['AKM_UNIT_ID']}}")
        if order == 1:
            end = time.time() + 60
            while not go.exists() and time.time() < end:
                time.sleep(0.02)
        time.sleep(0.5)
        running.unlink()
        """


def test_a_unit_claimed_ahead_goes_back_to_the_queue_when_the_slot_runs_a_long_one(tmp_path, monkeypatch):
    """After a short unit a slot claims its next unit ahead (issue 40); when the unit it runs then turns out long,
    the one waiting behind it is given back within AHEAD_HOLD_S, not kept from other workers, and `concurrency`
    still bounds the units running at once (the unit ahead is not run beside the slot's)."""
    from akm.worker import loop

    monkeypatch.setattr(loop, "AHEAD_AFTER_S", 60.0)  # every unit counts as short, however loaded the machine
    project = tmp_path / "p"
    project.mkdir()
    marks, go = tmp_path / "marks", tmp_path / "go"
    marks.mkdir()
    coord = _Coordinator(_fan(project, n=4, code=_marking_code(marks, go)), project)
    _wait_queued(4)

    def seen(e) -> None:
        if e.kind == "released":
            go.touch()  # the long unit ends only once the unit held behind it went back

    summary = _work(project, concurrency=1, idle_exit="1s", on_event=seen)
    result = coord.join()
    assert result.run.status == "completed" and go.exists()
    assert summary.finished == 4 and summary.released == 1 and summary.claimed == 5
    assert not (marks / "overlap").exists()  # one unit at a time
    rows = _rows()
    assert sorted(r["attempts"] for r in rows) == [1, 1, 1, 2]  # the one given back was claimed again, ran once
    assert len([p for p in marks.iterdir() if p.name.isdigit()]) == 4


def test_a_unit_claimed_ahead_is_stamped_from_when_it_started_not_from_its_claim(tmp_path, monkeypatch):
    """A unit claimed ahead waits in its slot while the slot's unit runs: its row's start stamp is moved on by that
    wait (its run time does not include it), and never past when it really started."""
    from akm.store.clock import parse_iso
    from akm.worker import loop

    monkeypatch.setattr(loop, "AHEAD_AFTER_S", 60.0)
    project = tmp_path / "p"
    project.mkdir()
    marks, go = tmp_path / "marks", tmp_path / "go"
    marks.mkdir()
    go.touch()  # no unit waits for it: each runs 0.5 s
    coord = _Coordinator(_fan(project, n=5, code=_marking_code(marks, go)), project)
    _wait_queued(5)
    summary = _work(project, concurrency=1, idle_exit="1s")
    result = coord.join()
    assert result.run.status == "completed" and summary.finished == 5 and summary.released == 0
    db = open_test_journal()
    try:
        rows = db.query("SELECT unit_id, started_at FROM units WHERE run_id = ?", (result.run.run_id,))
        events = db.query(
            "SELECT ts, metadata_json FROM events WHERE run_id = ? AND event_type = 'workflow_unit_started'",
            (result.run.run_id,),
        )
    finally:
        db.close()
    claimed_at = {json.loads(e["metadata_json"])["unitId"]: parse_iso(e["ts"]).timestamp() for e in events}
    stamped = {r["unit_id"]: parse_iso(r["started_at"]).timestamp() for r in rows}
    real = {
        uid: float(at) for at, uid in (p.read_text().split() for p in marks.iterdir() if p.name.isdigit())
    }  # when each unit really started
    assert set(real) == set(stamped)
    order = sorted(stamped, key=lambda uid: real[uid])
    for uid in order:
        assert stamped[uid] <= real[uid] + 0.001  # never later than it really started (stamps are in ms)
    ahead = [uid for uid in order if real[uid] - claimed_at[uid] > 0.4]  # claimed while another unit ran
    assert len(ahead) >= 2  # the 3rd and 4th were claimed ahead, as the 2nd and 3rd started (not the 5th: the last)
    for uid in ahead:
        before = order[order.index(uid) - 1]
        assert stamped[uid] >= real[before] + 0.25  # not its claim, made as the unit before it started


def test_the_coordinator_stops_asking_for_a_finished_row_once_it_handed_it_over(tmp_path):
    """A delivered attempt leaves the waiter's list at once, not when its thread wakes: with 64 units in flight and a
    read after each finish, a row was read again by every read until its thread picked it up (about four each)."""
    from akm.engine.remote import Waiter

    db = open_test_journal()
    waiter = Waiter(db, "r1", poll_s=3600)
    got: dict = {}
    hold = threading.Lock()
    hold.acquire()

    def wait_for(attempt: str) -> None:
        row = waiter.wait(attempt, threading.Event())
        with hold:  # picked up only once the test let go: the loop may read again meanwhile
            got[attempt] = row

    threads = [threading.Thread(target=wait_for, args=(a,)) for a in ("a", "b")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while sorted(waiter._waiting) != ["a", "b"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    waiter._deliver({"a": {"unit_id": "a", "status": "completed"}})
    assert sorted(waiter._waiting) == ["b"]  # the next read asks for b only
    waiter._deliver({"b": {"unit_id": "b", "status": "failed"}, "a": {"unit_id": "a", "status": "completed"}})
    hold.release()
    for t in threads:
        t.join(timeout=60)
    waiter.close()
    assert got == {"a": {"unit_id": "a", "status": "completed"}, "b": {"unit_id": "b", "status": "failed"}}


def test_a_slots_helper_runs_its_jobs_in_order_and_past_one_that_fails():
    """The slot's one helper thread writes the finishes behind it in the order asked, and one job's failure does not
    leave the next ones (and the slot waiting on them) behind."""
    from akm.worker.loop import _Slot

    slot = _Slot()
    done: list[int] = []

    def fails() -> None:
        raise RuntimeError("a finish that failed")

    slot.behind(lambda: done.append(1))
    slot.behind(fails)
    slot.behind(lambda: done.append(2))
    slot.close()  # waits for every job asked for
    assert done == [1, 2]
