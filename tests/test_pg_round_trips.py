"""Few round trips per unit across a network (issue 40), on a real throwaway PostgreSQL server.

A unit's journal writes are each one statement on PostgreSQL (`akm/store/postgres/hotpath.py`): a driver's finish
with its next insert, a worker's claim over every step it may run, a worker's finish; a coordinator's queue writes
from many threads go out together (`akm/store/batch.py`); and a process's threads each get a connection of the
journal's pool, so one thread's open transaction does not hold up another's statement. Counted in the
connection's statement trace (`Connection.trace`); the behaviour itself is the shared tests' (both journals).
"""

from __future__ import annotations

import threading

import pytest

from akm.store import queue, runs, units
from akm.store.batch import Coalescer
from tests.helpers import bare_run, put, wait_until

RUN = "r1"


@pytest.fixture
def pg(pg_db):
    """A journal on a fresh schema holding one run whose lease `coord` holds, and that lease's fence."""
    db, _ = pg_db
    bare_run(db, RUN)
    assert runs.acquire_lease(db, RUN, "coord") is None
    return db, runs.lease_fence(db, RUN, "coord")


def _attempt(unit_id: str) -> units.NewAttempt:
    return units.NewAttempt(RUN, unit_id, "build", "build.unit", runner="exec", input_hash="h")


def test_a_drivers_finish_and_next_insert_are_one_statement(pg):
    db, fence = pg
    _, (started,) = units.write_attempts(db, [], [_attempt("build.unit:1")], fence=fence)
    db.conn.trace = trace = []
    finish = units.UnitFinish(RUN, "build.unit:1", started, "completed", result_json='"ok"', step_id="build")
    done, (again,) = units.write_attempts(db, [finish], [_attempt("build.unit:2")], fence=fence)
    assert done == ["finished"] and len(trace) == 1, trace  # no BEGIN, clock read, lock or COMMIT of its own
    assert [u.status for u in units.get_units(db, RUN)] == ["completed", "running"]
    kinds = [e["event_type"] for e in db.query("SELECT event_type FROM events ORDER BY id")]
    assert kinds[-3:] == ["workflow_unit_started", "workflow_unit_finished", "workflow_unit_started"]
    # a guard the statement leaves to the portable transaction: the lease is lost, nothing is written
    runs.release_lease(db, RUN, "coord")
    assert runs.acquire_lease(db, RUN, "other") is None
    trace.clear()
    late = units.UnitFinish(RUN, "build.unit:2", again, "completed", result_json='"late"', step_id="build")
    with pytest.raises(Exception) as info:
        units.write_attempts(db, [late], [_attempt("build.unit:3")], fence=fence)
    assert getattr(info.value, "code", None) == "LEASE_LOST"
    assert "BEGIN" in trace  # it fell back to the portable form, which names the refusal
    assert (
        units.get_unit(db, RUN, "build.unit:2").status == "running" and units.get_unit(db, RUN, "build.unit:3") is None
    )


def test_a_worker_claims_its_free_slots_and_finishes_each_in_one_statement(pg):
    db, fence = pg
    for i in range(5):
        put(db, fence, f"build.unit:{i}", run_id=RUN, input_hash="h")
    db.conn.trace = trace = []
    got = queue.claim_work(
        db, targets=[(RUN, "build"), (RUN, "other")], kinds=("exec",), holder="w1", host="h", pid=None, limit=3
    )
    assert len(got) == 3 and len(trace) == 1
    trace.clear()
    assert (
        queue.finish_claimed(
            db, got[0], "w1", status="completed", result_json='"ok"', tokens=1, failure_reason=None, cost=0.125
        )
        == "finished"
    )
    assert len(trace) == 1
    assert units.get_unit(db, RUN, got[0].unit_id).cost == 0.125  # the cost is kept, as the portable form keeps it
    # a late finish (the claim was given up and claimed again meanwhile) is still rejected, in one statement too
    assert queue.release_claim(db, got[1], "w1")
    again = queue.claim_work(db, targets=[(RUN, "build")], kinds=("exec",), holder="w2", host="h", pid=None, limit=5)
    assert got[1].unit_id in {c.unit_id for c in again}
    trace.clear()
    late = queue.finish_claimed(
        db, got[1], "w1", status="completed", result_json='"x"', tokens=None, failure_reason=None
    )
    assert late == "superseded" and len(trace) == 1
    assert units.get_unit(db, RUN, got[1].unit_id).result_json is None


def test_the_coordinators_read_of_finished_rows_is_one_statement_whatever_the_number_of_ids(pg):
    """The ids travel as one JSON array: one statement text, so one prepared statement per connection (a text per
    number of ids was parsed and planned anew for each, and took a slot of the connection's 256)."""
    db, fence = pg
    ids = [f"build.unit:{i}" for i in range(4)] + ["build.unit:nul\x00\uffff"]
    for unit_id in ids:
        put(db, fence, unit_id, run_id=RUN)
    got = queue.claim_work(db, targets=[(RUN, "build")], kinds=("exec",), holder="w1", host="h", pid=None, limit=5)
    for c in got:
        if c.unit_id != "build.unit:0":
            queue.finish_claimed(db, c, "w1", status="completed", result_json='"ok"', tokens=None, failure_reason=None)
    db.conn.trace = trace = []
    answers = [queue.finished_rows(db, RUN, ids[:n] + ["nope"]) for n in range(1, 6)]
    assert [sorted(a) for a in answers] == [[], ids[1:2], ids[1:3], ids[1:4], ids[1:5]]
    assert answers[-1]["build.unit:nul\x00\uffff"]["status"] == "completed"  # NUL and the escape mark, as stored
    assert len(trace) == 5 and len(set(trace)) == 1


def test_queue_writes_of_many_threads_go_out_together(pg):
    db, fence = pg
    n = 24
    gate = threading.Barrier(n)
    answers: dict[int, str] = {}

    def queue_one(i: int) -> None:
        gate.wait()
        answers[i] = put(db, fence, f"build.unit:{i}", run_id=RUN, input_hash="h").outcome

    threads = [threading.Thread(target=queue_one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {i: "queued" for i in range(n)}
    assert queue.eligible_work(db, ("exec",))[0].queued == n
    assert queue._queue_batches(db).batches < n  # some went out together (how many is the scheduler's call)


def test_a_threads_open_transaction_does_not_hold_up_another_threads_statement(pg):
    db, _ = pg
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with db.tx() as conn:
            conn.execute("SELECT 1 FROM runs WHERE id = ? FOR UPDATE", (RUN,))
            inside.set()
            leave.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(60)
        assert db.query("SELECT count(*) AS n FROM units")[0]["n"] == 0  # answered while the other waits
        assert db.connections == 2
    finally:
        leave.set()
        t.join()
    wait_until(lambda: not db.held(), what="the transaction's end")
    db.query("SELECT 1")
    assert db.connections == 2  # reused, not opened again


def test_coalescer_answers_each_caller_and_shares_a_failure():
    """The batching of `akm.store.batch` itself: each item its own answer (or its own error); an exception of a
    whole batch is every caller's; calls made while a batch is written go in the next one."""
    release = threading.Event()
    first_in = threading.Event()
    batches: list[list[int]] = []

    def write(items: list[int]) -> list[int | BaseException]:
        batches.append(items)
        if items == [0]:
            first_in.set()
            release.wait(60)  # the others queue meanwhile
        if 99 in items:
            raise RuntimeError("journal down")
        return [ValueError(f"bad {i}") if i == 7 else i * 10 for i in items]

    c: Coalescer[int, int] = Coalescer(write)
    out: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            out[i] = c.submit(i)
        except Exception as exc:  # noqa: BLE001 - asserted below
            out[i] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert first_in.wait(60)
    rest = [threading.Thread(target=call, args=(i,)) for i in range(1, 9)]
    for t in rest:
        t.start()
    wait_until(lambda: len(c._pending) == 8, what="the others to queue")
    release.set()
    for t in [first, *rest]:
        t.join()
    assert len(batches) == 2 and batches[0] == [0] and sorted(batches[1]) == list(range(1, 9))
    assert {i: v for i, v in out.items() if i != 7} == {i: i * 10 for i in range(9) if i != 7}
    assert isinstance(out[7], ValueError)
    with pytest.raises(RuntimeError, match="journal down"):
        c.submit(99)
    assert c.submit(3) == 30  # the coalescer goes on after a failed batch


def test_a_workers_finish_and_its_slots_next_claim_are_one_statement(pg):
    db, fence = pg
    for i in range(3):
        put(db, fence, f"build.unit:{i}", run_id=RUN, input_hash="h", dispatch_json="{}")
    (first,) = queue.claim_work(db, targets=[(RUN, "build")], kinds=("exec",), holder="w1", host="h", pid=None, limit=1)
    db.conn.trace = trace = []
    written, nxt = queue.finish_and_claim(
        db,
        first,
        "w1",
        status="completed",
        result_json='"ok"',
        tokens=3,
        failure_reason=None,
        cost=0.5,
        targets=[(RUN, "build"), ("no-such-run", None)],
        kinds=("exec",),
        host="h",
        pid=None,
        limit=1,
    )
    assert written == "finished" and [c.unit_id for c in nxt] == ["build.unit:1"] and len(trace) == 1, trace
    events = db.query("SELECT event_type, metadata_json FROM events ORDER BY id")[-2:]
    assert [e["event_type"] for e in events] == ["workflow_unit_finished", "workflow_unit_started"]
    assert '"cost":0.5' in events[0]["metadata_json"] and '"worker":"w1"' in events[1]["metadata_json"]
    assert units.get_unit(db, RUN, first.unit_id).cost == 0.5


def test_a_listener_reads_what_arrived_without_a_round_trip_of_its_own(pg, monkeypatch):
    """The LISTEN connection reads the notifications the server pushed, several in one packet included (the second
    waits in the driver's buffer, where a `select` does not see it), without sending a statement per wake-up."""
    from akm.store.postgres import wakeups

    db, _ = pg
    monkeypatch.setattr(wakeups, "KEEPALIVE_S", 3600.0)  # no keep-alive statement during the test
    mine = threading.Event()
    listener = db.listener("akm_test_wake", mine, "mine")
    try:

        def listening() -> list[dict]:
            return db.query(
                "SELECT pid, query FROM pg_stat_activity WHERE application_name = 'akm-listen' "
                "AND query LIKE 'LISTEN akm_test_wake%'"
            )

        wait_until(lambda: listening(), what="the listener's LISTEN")
        db.query("SELECT pg_notify('akm_test_wake', 'other'), pg_notify('akm_test_wake', 'mine')")
        wait_until(mine.is_set, what="the wake-up")
        mine.clear()
        db.query("SELECT pg_notify('akm_test_wake', 'other')")  # not its payload: no wake-up
        db.query("SELECT pg_notify('akm_test_wake', 'mine')")
        wait_until(mine.is_set, what="the second wake-up")
        assert listening(), "the listener sent a statement after LISTEN"
    finally:
        listener.close()


def test_a_lease_renewal_is_one_statement_on_the_journal_clock(pg):
    db, fence = pg
    before = runs.get_run(db, RUN).lease_until
    db.conn.trace = trace = []
    assert runs.renew_lease(db, RUN, "coord", 600.0, epoch=fence.epoch)
    assert len(trace) == 1, trace  # no BEGIN, clock read or COMMIT of its own
    (row,) = db.query("SELECT lease_until > clock_timestamp() + interval '590 seconds' AS ahead FROM runs")
    assert row["ahead"] and runs.get_run(db, RUN).lease_until != before
    assert not runs.renew_lease(db, RUN, "coord", epoch=fence.epoch + 1)  # another epoch's: refused
    assert not runs.renew_lease(db, RUN, "someone-else")


def test_a_pool_warmed_ahead_opens_its_connections_in_the_background_and_uses_them(pg):
    db, _ = pg
    db.warm(3)
    wait_until(lambda: db.connections == 3, what="three connections")
    db.warm(99)  # never past the pool's bound
    wait_until(lambda: db.connections == db.pool_max, what="the pool's bound")
    assert db.query("SELECT count(*) AS n FROM runs")[0]["n"] == 1
    assert db.connections == db.pool_max


def test_the_hot_statements_primed_on_each_pooled_connection_change_nothing(pg):
    """A worker's and a coordinator's hot statements run ahead on each pooled connection (`Journal.warm`): prepared
    there, so a run's first claims and finishes are not each connection's first parse and plan; run against nothing,
    so they claim, write, lock and notify nothing."""
    from akm.store.postgres.db import pg_statement

    db, fence = pg
    put(db, fence, "build.unit:1", run_id=RUN)
    put(db, fence, "build.unit:2", run_id=RUN)
    (running,) = queue.claim_work(
        db, targets=[(RUN, "build")], kinds=("exec",), holder="w1", host="h", pid=None, limit=1
    )

    def state() -> list:
        return [
            [
                tuple(r)
                for r in db.query(
                    "SELECT unit_id, status, attempts, claim_holder, result_json FROM units ORDER BY unit_id"
                )
            ],
            db.query("SELECT count(*) AS n FROM events")[0]["n"],
            [tuple(r) for r in db.query("SELECT status, lease_holder, lease_epoch, lease_until FROM runs")],
        ]

    before = state()
    woken = threading.Event()
    listeners = [db.listener(channel, woken) for channel in (queue.WORK_CHANNEL, queue.RUN_CHANNEL)]
    try:
        wait_until(
            lambda: len(db.query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'akm-listen'")) == 2,
            what="the listeners",
        )
        primers = queue.worker_primers(db) + queue.coordinator_primers(db)
        texts = {pg_statement(sql) for sql, _ in primers}
        assert len(texts) == 6
        db.warm(3, primers)
        wait_until(
            lambda: db.connections == 3 and all(texts <= set(c.prepared) for c in list(db._all)),
            what="every pooled connection primed",
        )
        assert state() == before
        assert not woken.wait(0.5)  # no NOTIFY either
        assert db.query("SHOW plan_cache_mode")[0][0] == "force_generic_plan"  # a worker's sessions: generic plans
    finally:
        for listener in listeners:
            listener.close()
    db.conn.trace = trace = []
    got = queue.claim_work(db, targets=[(RUN, "build")], kinds=("exec",), holder="w2", host="h", pid=None, limit=1)
    assert [c.unit_id for c in got] == ["build.unit:2"] and len(trace) == 1  # the primed statement, as it runs
    assert (
        queue.finish_claimed(
            db, running, "w1", status="completed", result_json='"ok"', tokens=None, failure_reason=None
        )
        == "finished"
    )


def test_the_read_of_finished_rows_parses_its_ids_once(pg):
    """The ids' JSON becomes an array once (an init plan), not once per row of the run: written as
    `IN (SELECT json_array_elements_text(…))`, the planner joined the function to each row and a read took ~4 ms at
    200 units, ten times the IN list it replaced."""
    import json

    from akm.store.postgres.hotpath import FINISHED_ROWS

    db, fence = pg
    for i in range(40):
        put(db, fence, f"build.unit:{i}", run_id=RUN)
    got = queue.claim_work(db, targets=[(RUN, "build")], kinds=("exec",), holder="w1", host="h", pid=None, limit=30)
    for c in got:
        queue.finish_claimed(db, c, "w1", status="completed", result_json='"ok"', tokens=None, failure_reason=None)
    ids = json.dumps([f"build.unit:{i}" for i in range(0, 40, 2)])
    (plan,) = db.query("EXPLAIN (ANALYZE, FORMAT JSON) " + FINISHED_ROWS, (RUN, ids))[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def nodes(node: dict):
        yield node
        for child in node.get("Plans", ()):
            yield from nodes(child)

    calls = [n for n in nodes(plan[0]["Plan"]) if n["Node Type"] == "ProjectSet"]
    assert calls and all(n["Actual Loops"] <= 1 for n in calls), plan
    assert len(queue.finished_rows(db, RUN, json.loads(ids))) == 15
