"""The unit queue of phase 2 (akm.store.queue) on both journals: queue, claim, fence, renew, sweep, release."""

from __future__ import annotations

import threading
import time

import pytest

from akm.engine.attempt import from_payload
from akm.errors import UsageError
from akm.store import queue, runs, units
from tests.helpers import bare_run, put


@pytest.fixture()
def db(journal):
    bare_run(journal)
    return journal


@pytest.fixture()
def fence(db):
    assert runs.acquire_lease(db, "r1", "coord") is None
    return runs.lease_fence(db, "r1", "coord")


def claim(db, holder="w1", host="host-a", limit=10, pid=None):
    return queue.claim_units(
        db, run_id="r1", step_id="build", kinds=("exec",), holder=holder, host=host, pid=pid, limit=limit
    )


def test_a_queued_unit_is_claimed_once_and_finished_by_its_claimant(db, fence):
    assert put(db, fence).outcome == "queued"
    row = units.get_unit(db, "r1", "build.unit:1")
    assert row.status == "queued" and row.attempts == 0 and row.queued_at is not None
    assert [e.queued for e in queue.eligible_work(db, ["exec"])] == [1]
    assert queue.eligible_work(db, ["llm"]) == []
    got = claim(db)
    assert [(c.unit_id, c.token) for c in got] == [("build.unit:1", 1)]
    assert claim(db, holder="w2") == []  # nothing left to claim
    row = units.get_unit(db, "r1", "build.unit:1")
    assert (row.status, row.claim_holder, row.host, row.attempts) == ("running", "w1", "host-a", 1)
    # another worker's finish of the same row is no finish at all
    other = got[0]._replace(token=1)
    assert (
        queue.finish_claimed(db, other, "w2", status="completed", result_json='"x"', tokens=None, failure_reason=None)
        == "superseded"
    )
    assert (
        queue.finish_claimed(db, got[0], "w1", status="completed", result_json='"ok"', tokens=7, failure_reason=None)
        == "finished"
    )
    row = units.get_unit(db, "r1", "build.unit:1")
    assert (row.status, row.result_json, row.tokens, row.claim_holder, row.host) == (
        "completed",
        '"ok"',
        7,
        None,
        "host-a",
    )
    assert queue.finished_rows(db, "r1", ["build.unit:1", "nope"])["build.unit:1"]["status"] == "completed"


def test_queueing_is_fenced_and_adopts_what_is_in_flight(db, fence):
    put(db, fence)
    assert put(db, fence).outcome == "adopted"  # still queued: left as it is
    (c,) = claim(db)
    assert put(db, fence).outcome == "adopted"  # running under a live claim
    queue.finish_claimed(
        db, c, "w1", status="failed", result_json='"boom"', tokens=None, failure_reason="non_zero_exit"
    )
    assert put(db, fence).outcome == "queued"  # a failed row goes back, as a driver re-dispatches it
    assert units.get_unit(db, "r1", "build.unit:1").attempts == 1  # the next claim counts the next run
    (c,) = claim(db)
    queue.finish_claimed(db, c, "w1", status="completed", result_json='"ok"', tokens=None, failure_reason=None)
    assert put(db, fence).outcome == "finished"  # a completed row is never overwritten
    runs.release_lease(db, "r1", "coord")
    assert runs.acquire_lease(db, "r1", "coord2") is None
    with pytest.raises(UsageError) as info:
        put(db, fence, unit_id="build.unit:2")
    assert info.value.code == "LEASE_LOST"
    assert units.get_unit(db, "r1", "build.unit:2") is None


def test_a_lapsed_claim_is_swept_back_and_the_late_finish_is_rejected(db, fence, monkeypatch):
    put(db, fence)
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "0.001")
    (frozen,) = claim(db, holder="w1")
    import time

    time.sleep(0.05)
    assert queue.sweep(db, host="someone-else") == [("r1", "build.unit:1")]
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "60")
    (fresh,) = claim(db, holder="w2", host="host-b")
    assert fresh.token == 2
    assert queue.renew_claims(db, "w1", [frozen]).gone == [frozen]  # the frozen worker learns it lost the claim
    assert queue.renew_claims(db, "w2", [fresh]) == queue.Renewal([], [])
    assert (
        queue.finish_claimed(
            db, frozen, "w1", status="completed", result_json='"late"', tokens=None, failure_reason=None
        )
        == "superseded"
    )
    assert (
        queue.finish_claimed(db, fresh, "w2", status="completed", result_json='"new"', tokens=None, failure_reason=None)
        == "finished"
    )
    row = units.get_unit(db, "r1", "build.unit:1")
    assert (row.result_json, row.attempts, row.host) == ('"new"', 2, "host-b")


def test_a_claim_of_a_dead_process_on_this_host_is_swept_at_once(db, fence):
    import subprocess
    import sys

    put(db, fence)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    claim(db, holder="w1", host="host-a", pid=dead.pid)
    assert queue.sweep(db, host="host-b") == []  # another host cannot judge that pid
    assert queue.sweep(db, host="host-a") == [("r1", "build.unit:1")]
    assert units.get_unit(db, "r1", "build.unit:1").status == "queued"


def test_release_gives_a_claim_back_and_abandon_fails_what_is_queued(db, fence):
    put(db, fence)
    put(db, fence, unit_id="build.unit:2")
    c1, c2 = claim(db, limit=2)
    assert queue.release_claim(db, c1, "w1") is True
    assert queue.release_claim(db, c1, "w1") is False  # not ours any more
    assert units.get_unit(db, "r1", c1.unit_id).status == "queued"
    runs.release_lease(db, "r1", "coord")
    runs.abandon_run(db, "r1")
    row = units.get_unit(db, "r1", c1.unit_id)
    assert (row.status, row.failure_reason) == ("failed", "abandoned")
    assert claim(db) == []  # an abandoned run gives out nothing
    # the worker still running c2 learns the run ended, and its finish records the unit abandoned
    assert queue.renew_claims(db, "w1", [c2]) == queue.Renewal([], [c2])
    assert units.get_unit(db, "r1", c2.unit_id).status == "running"
    assert (
        queue.finish_claimed(db, c2, "w1", status="completed", result_json='"x"', tokens=None, failure_reason=None)
        == "finished"
    )
    row = units.get_unit(db, "r1", c2.unit_id)
    assert (row.status, row.failure_reason, row.result_json) == ("failed", "abandoned", None)


def test_a_claim_given_up_in_a_run_that_ended_is_failed_not_queued(db, fence, monkeypatch):
    put(db, fence)
    put(db, fence, unit_id="build.unit:2")
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "0.001")
    lapsing, released = claim(db, limit=2)
    runs.abandon_run(db, "r1")  # the coordinator still holds the lease: worker rows are left to the workers
    assert [units.get_unit(db, "r1", c.unit_id).status for c in (lapsing, released)] == ["running", "running"]
    assert queue.release_claim(db, released, "w1") is True
    import time

    time.sleep(0.05)
    assert queue.sweep(db, host="elsewhere") == [("r1", lapsing.unit_id)]
    for c in (lapsing, released):
        row = units.get_unit(db, "r1", c.unit_id)
        assert (row.status, row.failure_reason) == ("failed", "abandoned")


def test_queueing_over_a_lapsed_claim_requeues_it_and_a_live_local_claim_is_not_swept(db, fence, monkeypatch):
    import os

    put(db, fence)
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "0.001")
    (old,) = claim(db, holder="w1", host="host-a", pid=os.getpid())
    import time

    time.sleep(0.05)
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "60")
    assert put(db, fence).outcome == "queued"  # a takeover re-queues a row whose claim lapsed
    (new,) = claim(db, holder="w2", host="host-a", pid=os.getpid())
    assert new.token == old.token + 1
    assert queue.sweep(db, host="host-a") == []  # live pid on this host, claim not expired: left alone


def test_concurrent_claimers_never_claim_one_row_twice(journal_at, db, fence):
    import time

    from tests.helpers import open_at

    for i in range(60):
        put(db, fence, unit_id=f"build.unit:{i:03d}")
    got: dict[str, list[str]] = {}

    def claimer(name: str) -> None:
        mine = got.setdefault(name, [])
        conn = open_at(journal_at)
        start.wait()  # every claimer connected: they race from here
        try:
            while True:
                batch = claim(conn, holder=name, limit=3)
                if not batch:
                    return
                mine.extend(c.unit_id for c in batch)
                time.sleep(0.001)  # as a worker does between claims (it runs what it took)
        finally:
            conn.close()

    start = threading.Barrier(4)
    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [u for ids in got.values() for u in ids]
    assert len(every) == 60 and len(set(every)) == 60
    assert sum(1 for ids in got.values() if ids) >= 2  # the claimers really raced
    assert {r["attempts"] for r in db.query("SELECT attempts FROM units")} == {1}


def test_a_bad_claim_ttl_is_refused(monkeypatch):
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "soon")
    with pytest.raises(UsageError) as info:
        queue.claim_ttl_s()
    assert info.value.code == "INVALID_ENV"


def test_a_listed_step_keeps_its_payload_when_another_worker_empties_it_first(db, fence):
    """Issue 40's race: a worker listed the queue, another claimed the step's last units, and the first then read
    "a queued unit's payload" in a second statement, found none, and refused the step as "started by another akm
    version" (remembering the refusal). The payload now comes with the listing, so what the listing saw can be
    judged whatever other claimers did since."""
    payload = '{"v":1,"unitId":"build.unit:1","kind":"exec","scope":"s","commit":null}'
    put(db, fence, dispatch_json=payload)
    [listed] = queue.eligible_work(db, ("exec",))
    assert [c.unit_id for c in claim(db, holder="w2")] == ["build.unit:1"]  # the step is empty now
    assert queue.eligible_work(db, ("exec",)) == []
    assert (listed.run_id, listed.step_id, listed.queued) == ("r1", "build", 1)
    read = from_payload(listed.payload)
    assert read is not None and (read.spec.unit_id, read.spec.kind, read.scope) == ("build.unit:1", "exec", "s")
    assert not hasattr(queue, "sample_dispatch")  # the second read, where the race lived, is gone


def test_the_listing_carries_the_frozen_plan_of_runs_the_worker_has_not_read(db, fence):
    """A worker's first claim of a run needs its plan (issue 40): the listing sends it, with its hash, for the runs
    the worker does not name as known, and nothing for those it does (the plan does not change)."""
    bare_run(db, "r2", plan_json='{"two":2}', plan_hash="2" * 64, params={"other": 1})
    assert runs.acquire_lease(db, "r2", "coord") is None
    put(db, fence)
    put(db, runs.lease_fence(db, "r2", "coord"), run_id="r2", unit_id="build.unit:9")
    listed = {e.run_id: e for e in queue.eligible_work(db, ("exec",))}
    assert {r: (e.plan_json, e.plan_hash) for r, e in listed.items()} == {
        "r1": ("{}", "0" * 64),
        "r2": ('{"two":2}', "2" * 64),
    }
    listed = {e.run_id: e for e in queue.eligible_work(db, ("exec",), known={"r1", "gone"})}
    assert (listed["r1"].plan_json, listed["r2"].plan_json) == (None, '{"two":2}')
    assert listed["r1"].queued == listed["r2"].queued == 1


def test_a_finish_on_postgresql_wakes_the_coordinator_in_its_own_statement(db, fence):
    """The worker's finish carries the coordinator's wake-up (a NOTIFY in the same statement, issue 40), so a
    worker on PostgreSQL sends none of its own; a superseded finish wakes nobody."""
    if db.backend != "postgres":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")

    assert queue.finish_notifies(db)
    put(db, fence)
    put(db, fence, unit_id="build.unit:2")
    got = claim(db)
    woken = threading.Event()
    listener = db.listener(queue.RUN_CHANNEL, woken, "r1")
    try:
        _listening(db, queue.RUN_CHANNEL)
        stale = got[0]._replace(token=9)
        assert (
            queue.finish_claimed(
                db, stale, "w1", status="completed", result_json='"x"', tokens=None, failure_reason=None
            )
            == "superseded"
        )
        assert not woken.wait(1.0)
        assert (
            queue.finish_claimed(
                db, got[1], "w1", status="completed", result_json='"ok"', tokens=None, failure_reason=None
            )
            == "finished"
        )
        assert woken.wait(60), "the finish did not wake the listener"
    finally:
        listener.close()


def test_queueing_on_postgresql_wakes_idle_workers_with_each_write(db, fence):
    """The queue write tells idle workers itself (a NOTIFY in its statement, issue 40), also when units were waiting
    already: a worker whose claim lost the race for those is idle while they wait (it slept until its next poll)."""
    if db.backend != "postgres":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")

    woken = threading.Event()
    listener = db.listener(queue.WORK_CHANNEL, woken, "r1")
    try:
        _listening(db, queue.WORK_CHANNEL)
        first = put(db, fence)
        assert first.outcome == "queued" and not first.wake  # told already, by the statement
        assert woken.wait(60), "queueing into an empty queue did not wake the workers"
        woken.clear()
        second = put(db, fence, unit_id="build.unit:2")
        assert second.outcome == "queued" and not second.wake
        assert woken.wait(60), "queueing beside a waiting unit did not wake the workers"
        woken.clear()
        assert put(db, fence, unit_id="build.unit:2").outcome == "adopted"  # nothing queued: nobody to tell
        assert not woken.wait(0.5)
    finally:
        listener.close()


def test_a_notifier_connects_with_its_first_notification(db):
    """A notifier opens no connection until something is to be sent: akm's queue writes and finishes notify in their
    own statements, and a connection opened ahead was a backend (and a password exchange) in a run's first moments
    for nothing. Its first notification still arrives."""
    if db.backend != "postgres":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")

    def notifiers() -> int:
        return len(db.query("SELECT 1 FROM pg_stat_activity WHERE application_name = 'akm-notify'"))

    woken = threading.Event()
    listener = db.listener(queue.WORK_CHANNEL, woken, "r1")
    notifier = db.notifier(queue.WORK_CHANNEL)
    try:
        _listening(db, queue.WORK_CHANNEL)
        assert notifiers() == 0
        notifier.notify("r1")
        assert woken.wait(60), "the first notification did not arrive"
        assert notifiers() == 1
    finally:
        notifier.close()
        listener.close()


def finish_next(db, c, holder="w1", status="completed", result='"ok"', limit=1, host="host-a", **kw):
    return queue.finish_and_claim(
        db,
        c,
        holder,
        status=status,
        result_json=result,
        tokens=None,
        failure_reason=None if status == "completed" else "non_zero_exit",
        targets=[("r1", "build")],
        kinds=("exec",),
        host=host,
        pid=None,
        limit=limit,
        **kw,
    )


def test_a_finish_takes_the_slots_next_unit_with_both_rules_kept(db, fence, monkeypatch):
    """A worker's finish and its slot's next claim together (issue 40): the finish stays fenced by its token (a
    late one is rejected, the newer claim's result stands) and the claim stays a claim (oldest first, once)."""
    import time

    for i in range(1, 4):
        put(db, fence, unit_id=f"build.unit:{i}")
    (first,) = claim(db, limit=1)
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "0.001")  # the next claim lapses at once
    written, (second,) = finish_next(db, first, cost=0.25)
    monkeypatch.setenv("AKM_WORKER_CLAIM_TTL_S", "60")
    assert written == "finished" and second.unit_id == "build.unit:2" and second.token == 1
    row = units.get_unit(db, "r1", first.unit_id)
    assert (row.status, row.result_json, row.cost, row.claim_holder) == ("completed", '"ok"', 0.25, None)
    row = units.get_unit(db, "r1", second.unit_id)
    assert (row.status, row.claim_holder, row.host) == ("running", "w1", "host-a")
    kinds = [e["event_type"] for e in db.query("SELECT event_type FROM events ORDER BY id")][-2:]
    assert kinds == ["workflow_unit_finished", "workflow_unit_started"]  # the finish first, as its slot frees
    # the frozen worker's claim lapses and another worker takes the unit: the late finish is rejected, the newer
    # claim's row is untouched, and the slot still takes what is left
    time.sleep(0.05)
    assert queue.sweep(db, host="elsewhere") == [("r1", "build.unit:2")]
    taken = {c.unit_id: c for c in claim(db, holder="w2", host="host-b", limit=2)}  # (re-queued ones go last)
    again = taken["build.unit:2"]
    assert again.token == 2 and set(taken) == {"build.unit:2", "build.unit:3"}
    put(db, fence, unit_id="build.unit:4")
    written, nxt = finish_next(db, second, result='"late"')
    assert written == "superseded" and [(c.unit_id, c.token) for c in nxt] == [("build.unit:4", 1)]
    row = units.get_unit(db, "r1", "build.unit:2")
    assert (row.status, row.claim_holder, row.result_json) == ("running", "w2", None)
    # nothing left to claim: the finish alone
    assert finish_next(db, again, holder="w2", host="host-b", result='"new"') == ("finished", [])
    assert units.get_unit(db, "r1", "build.unit:2").result_json == '"new"'


def test_a_finish_in_an_abandoned_run_records_it_and_claims_nothing(db, fence):
    put(db, fence)
    put(db, fence, unit_id="build.unit:2")
    (c,) = claim(db, limit=1)
    runs.abandon_run(db, "r1")
    written, nxt = finish_next(db, c)
    assert (written, nxt) == ("finished", [])
    row = units.get_unit(db, "r1", c.unit_id)
    assert (row.status, row.failure_reason, row.result_json) == ("failed", "abandoned", None)
    assert units.get_unit(db, "r1", "build.unit:2").status != "running"


def test_a_finish_moves_the_start_stamp_of_a_unit_that_waited_in_its_slot(db, fence):
    """A unit claimed ahead (akm.worker.loop) starts later than its claim: its finish moves the row's start stamp to
    when it really started, both ways of finishing; a finish without one keeps the claim's."""
    for i in range(1, 4):
        put(db, fence, unit_id=f"build.unit:{i}")
    (first,) = claim(db, limit=1)
    later = queue.started_later(first, 0.25)
    assert later > first.started_at  # (fixed-width stamps order as text)
    written, (second,) = finish_next(db, first, started_at=later)
    assert written == "finished" and units.get_unit(db, "r1", first.unit_id).started_at == later
    later = queue.started_later(second, 1.5)
    done = queue.finish_claimed(
        db, second, "w1", status="completed", result_json='"ok"', tokens=None, failure_reason=None, started_at=later
    )
    assert done == "finished" and units.get_unit(db, "r1", second.unit_id).started_at == later
    (third,) = claim(db, limit=1)
    assert finish_next(db, third) == ("finished", [])
    assert units.get_unit(db, "r1", third.unit_id).started_at == third.started_at


def _worker_with_ahead(db, tmp_path, fence, n: int):
    """A worker (not running its loop) holding `n` claims as units claimed ahead of `n` slots of its own."""
    from akm.worker import loop

    for i in range(1, n + 1):
        put(db, fence, unit_id=f"build.unit:{i}")
    worker = loop.Worker(db, loop.WorkerOptions(project_root=tmp_path))
    got = queue.claim_work(
        db, targets=[("r1", "build")], kinds=("exec",), holder=worker.holder, host="h", pid=None, limit=n
    )
    worker._took(got, time.monotonic())
    slots = []
    for c in got:
        slot = loop._Slot()
        assert worker._hold(slot, c) is not None
        slots.append(slot)
    return worker, got, slots


def test_a_unit_claimed_ahead_that_was_lost_or_fenced_is_not_started(db, fence, tmp_path):
    """A unit claimed ahead is a claim like any other (akm.worker.loop): lost (no longer this worker's), it is
    neither run nor written; fenced by the watchdog, or due to be (its renewal overdue: a worker that was frozen,
    whose slot looks before the watchdog), or of a worker stopping, it is given back unrun."""
    worker, (lost, fenced, overdue, stopping, fine), slots = _worker_with_ahead(db, tmp_path, fence, 5)
    worker._flying[("r1", lost.unit_id)].lost = True
    worker._flying[("r1", fenced.unit_id)].fenced = True
    worker._flying[("r1", overdue.unit_id)].renewed_at -= worker.ttl
    assert [worker._take_ahead(s) for s in slots[:3]] == [None, None, None]
    assert units.get_unit(db, "r1", lost.unit_id).status == "running"  # not ours: untouched (it lapses, or is taken)
    assert units.get_unit(db, "r1", fenced.unit_id).status == "queued"
    assert units.get_unit(db, "r1", overdue.unit_id).status == "queued"
    taken = worker._take_ahead(slots[4])
    assert taken is not None and taken.unit_id == fine.unit_id and taken.started_at >= fine.started_at
    worker.opts.cancel.trip("sigterm")
    assert worker._take_ahead(slots[3]) is None
    assert units.get_unit(db, "r1", stopping.unit_id).status == "queued"
    assert (worker.summary.released, worker.summary.rejected) == (3, 1)
    assert set(worker._flying) == {("r1", fine.unit_id)}


def test_the_slot_and_the_give_back_timer_never_both_take_a_unit_claimed_ahead(db, fence, tmp_path, monkeypatch):
    """Which of the two gets the unit claimed ahead is a race: exactly one does, each time — it is run, or given back
    to the queue, never both and never neither."""
    from akm.worker import loop

    monkeypatch.setattr(loop, "AHEAD_HOLD_S", 0.0)
    worker, got, slots = _worker_with_ahead(db, tmp_path, fence, 12)
    started: list = []
    timers = [threading.Thread(target=worker._hold_or_give_back, args=(s, s.ahead)) for s in slots]
    takers = [threading.Thread(target=lambda s=s: started.append(worker._take_ahead(s))) for s in slots]
    for timer, taker in zip(timers, takers, strict=True):
        timer.start()
        taker.start()
    for t in timers + takers:
        t.join(60)
    ran = {c.unit_id for c in started if c is not None}
    back = {u.unit_id for u in got if units.get_unit(db, "r1", u.unit_id).status == "queued"}
    assert ran.isdisjoint(back) and ran | back == {c.unit_id for c in got}
    assert worker.summary.released == len(back)


def test_a_claim_ahead_never_takes_the_last_queued_unit(db, fence):
    """A worker claims a unit ahead of its slot (issue 40) only while another unit stays queued behind it: in a step
    narrower than the workers' slots, a worker that is idle now gets the last one (both journals, both claims)."""
    for i in range(1, 4):
        put(db, fence, unit_id=f"build.unit:{i}")
    (first,) = claim(db, limit=1)
    written, got = finish_next(db, first, limit=1, ahead=1)
    assert written == "finished" and [c.unit_id for c in got] == ["build.unit:2"]  # unit 3 is the last queued
    put(db, fence, unit_id="build.unit:4")
    put(db, fence, unit_id="build.unit:5")

    def ahead(limit: int, n: int) -> list[str]:
        got = queue.claim_work(
            db, targets=[("r1", "build")], kinds=("exec",), holder="w1", host="h", pid=None, limit=limit, ahead=n
        )
        return [c.unit_id for c in got]

    assert ahead(0, 1) == ["build.unit:3"]
    assert ahead(0, 2) == ["build.unit:4"]  # 5 is the last
    assert ahead(0, 1) == []
    assert ahead(1, 1) == ["build.unit:5"]  # one to run now is taken, last or not
    assert [queue.take_ahead(found, 1, 1) for found in range(4)] == [0, 1, 1, 2]


def _listening(db, channel: str) -> None:
    """Wait until the listener's LISTEN on `channel` ran (a NOTIFY before it is not delivered)."""
    from tests.helpers import wait_until

    wait_until(
        lambda: db.query(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'akm-listen' AND query IN "
            f"('LISTEN {channel}', 'SELECT 1')"
        ),
        what="the listener's LISTEN",
    )
