"""The four races of postgres.md and hostile text, through the shared domain layer, on both journals.

Each would fail a literal port of the SQLite code to PostgreSQL (postgres.md §2.3, §2.5, §2.9): SQLite's
single write lock made every "read, check, write" atomic; on PostgreSQL the shared layer gets the same
answer only through the dialect's row locks, advisory locks and the server clock. The same tests run on
SQLite (`journal_at`, conftest), where they pin today's behaviour.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from akm.errors import AkmError, UsageError
from akm.store import events, runs, units
from tests.helpers import bare_run, open_at, step_row

SAME_START = {"workflow_ref": "/w.md", "title": "", "scope_key": "dir:v1:x", "params": {"a": 1}, "plan_hash": "h"}


def _start(db, **kw) -> tuple[str, bool]:
    """create_run; (run id, created?) — a losing identical start learns the winner's id."""
    args = {"run_id": str(uuid.uuid4()), "step_ids": ["s", "t"], **SAME_START, **kw}
    try:
        return bare_run(db, **args).id, True
    except UsageError as exc:
        if exc.code != "RUN_ALREADY_ACTIVE":
            raise
        return exc.details["runId"], False


def test_race_identical_starts_make_one_run(journal_at):
    for round_ in range(3):
        dbs = [open_at(journal_at) for _ in range(6)]
        out: list = []
        barrier = threading.Barrier(6)

        def start(db, barrier=barrier, out=out, round_=round_) -> None:
            barrier.wait(timeout=120)
            out.append(_start(db, params={"round": round_}))

        threads = [threading.Thread(target=start, args=(db,)) for db in dbs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for db in dbs:
            db.close()
        assert len(out) == 6 and sum(created for _, created in out) == 1, out
        assert len({rid for rid, _ in out}) == 1


def test_race_unit_insert_never_lands_in_an_abandoned_run(journal_at):
    a, b = open_at(journal_at), open_at(journal_at)
    try:
        for i in range(10):
            rid, _ = _start(a, params={"i": i})
            assert runs.acquire_lease(a, rid, "h1", 90, host="elsewhere", pid=1) is None
            fence = runs.lease_fence(a, rid, "h1")
            barrier = threading.Barrier(2)
            outcome: list = []

            def insert(rid=rid, fence=fence, barrier=barrier, outcome=outcome) -> None:
                barrier.wait(timeout=120)
                try:
                    units.insert_unit(a, run_id=rid, unit_id="u", step_id="s", node_id="n", fence=fence)
                    outcome.append("inserted")
                except AkmError as exc:
                    outcome.append(exc.code)

            t = threading.Thread(target=insert)
            t.start()
            barrier.wait(timeout=120)
            runs.abandon_run(b, rid)
            t.join(120)
            rows = b.query_one("SELECT count(*) FROM units WHERE run_id = ?", (rid,))[0]
            # Either the insert committed first (then the run was abandoned) or it was refused.
            assert (outcome, rows) in ((["inserted"], 1), (["RUN_ABANDONED"], 0)), (outcome, rows)
            with pytest.raises(AkmError) as e:
                units.insert_unit(a, run_id=rid, unit_id="v", step_id="s", node_id="n", fence=fence)
            assert e.value.code == "RUN_ABANDONED"
    finally:
        a.close()
        b.close()


def _writer(where, n, go) -> None:
    db = open_at(where)
    go.wait(120)
    for _ in range(n):
        with db.tx() as conn:
            events.append_event(db, "e", None, {})
            conn.execute("SELECT 1")  # the transaction stays open a moment after its insert
            time.sleep(0.001)
    db.close()


def test_race_event_cursor_sees_every_event_exactly_once(journal_at):
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    writers = [ctx.Process(target=_writer, args=(journal_at, 40, go)) for _ in range(4)]
    db = open_at(journal_at)
    try:
        for w in writers:
            w.start()
        seen: list[int] = []
        cursor = 0
        go.set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            alive = any(w.is_alive() for w in writers)
            batch, cursor = events.list_events(db, since_offset=cursor)
            seen += [e.id for e in batch]
            if not alive and not batch:
                break
        for w in writers:
            w.join(120)
        everything = [e.id for e in events.list_events(db)[0]]
        assert len(everything) == 160
        assert seen == everything  # nothing skipped, nothing repeated
    finally:
        db.close()


def test_race_expiry_uses_the_journal_clock(journal_at, monkeypatch):
    """A host whose clock runs an hour ahead cannot take a live lease on PostgreSQL: every expiry is written
    and compared on the server's clock. (On SQLite the host clock is the journal's clock: one host.)"""
    db = open_at(journal_at)
    if db.backend == "sqlite":
        db.close()
        pytest.skip("one host: the SQLite journal's clock is the host's")
    try:
        rid, _ = _start(db)
        assert runs.acquire_lease(db, rid, "h1", 30, host="elsewhere", pid=1) is None
        from akm.store import clock

        real = time.time
        monkeypatch.setattr(
            clock, "time", SimpleNamespace(time=lambda: real() + 3600, strftime=time.strftime, gmtime=time.gmtime)
        )
        results: list = []
        barrier = threading.Barrier(4)

        def steal(i: int) -> None:
            c = open_at(journal_at)
            barrier.wait(timeout=120)
            results.append(runs.acquire_lease(c, rid, f"thief{i}", 30, host="other", pid=i) is None)
            c.close()

        threads = [threading.Thread(target=steal, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == [False] * 4
        db.execute("UPDATE runs SET lease_until = now() - interval '1 ms' WHERE id = ?", (rid,))
        results.clear()
        barrier = threading.Barrier(4)
        threads = [threading.Thread(target=steal, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(results) == [False] * 3 + [True]  # an expired lease goes to exactly one new holder
        stamp = db.now()
        assert stamp.endswith("Z") and len(stamp) == 24
    finally:
        db.close()


def test_nul_in_captured_text_reads_back_the_same_and_surrogates_are_refused(journal_at):
    db = open_at(journal_at)
    try:
        rid, _ = _start(db, title="a \x00 title \uffff0")
        assert runs.get_run(db, rid).title == "a \x00 title \uffff0"
        runs.complete_step(db, rid, "s", "completed", notes="stderr:\nbefore\x00after")
        assert step_row(db, rid, "s").notes == "stderr:\nbefore\x00after"  # as SQLite stores it
        with pytest.raises(AkmError) as e:
            _start(db, title="bad \udc80", params={"b": 1})
        assert e.value.code == "NOT_UTF8"
        assert [r.id for r in runs.list_runs(db)] == [rid]  # the refused start wrote nothing
    finally:
        db.close()


def test_step_tallies_read_gate_loops_and_retries(journal):
    rid, _ = _start(journal)
    for uid in ("s.unit:a", "s.unit:a~r1", "s.unit:b~l2", "s.unit:b~l2~r1", "s.unit:c~l3~r2"):
        started = units.insert_unit(journal, run_id=rid, unit_id=uid, step_id="s", node_id="n")
        units.finish_unit(journal, run_id=rid, unit_id=uid, started_at=started, status="completed")
    tally = units.step_tallies(journal, rid)["s"]
    assert (tally.units, tally.attempts, tally.gate_loops) == (3, 5, 3)
