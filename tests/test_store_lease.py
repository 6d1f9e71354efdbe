"""The run lease (spec-engine §4, D16) with real processes, threads and files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from akm.errors import NotFoundError, UsageError
from akm.store import runs
from akm.store.clock import now_iso
from tests.helpers import bare_run, open_at, wait_until

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def make_run(db, run_id="r1"):
    return bare_run(db, run_id, step_ids=["a", "b"], workflow_ref=f"workflows/{run_id}")


@pytest.fixture()
def db_path(journal_at):
    return journal_at  # both journals (conftest): an SQLite file or a PostgreSQL URL


@pytest.fixture()
def db(db_path):
    database = open_at(db_path)
    make_run(database)
    yield database
    database.close()


def test_acquire_renew_release_cycle(db):
    assert runs.read_lease(db, "r1") is None
    assert runs.acquire_lease(db, "r1", "h1") is None
    lease = runs.read_lease(db, "r1")
    assert lease.holder == "h1" and lease.host == runs.host_id() and lease.pid == os.getpid()
    assert lease.host.startswith(socket.gethostname())
    # not re-acquirable, not even by the same holder id
    assert runs.acquire_lease(db, "r1", "h1") == lease
    assert runs.acquire_lease(db, "r1", "h2") == lease
    time.sleep(0.005)
    assert runs.renew_lease(db, "r1", "h1") is True
    assert runs.read_lease(db, "r1").until > lease.until
    assert runs.renew_lease(db, "r1", "h2") is False
    assert runs.release_lease(db, "r1", "h2") is False  # not ours: no-op
    assert runs.read_lease(db, "r1").holder == "h1"
    assert runs.release_lease(db, "r1", "h1") is True
    assert runs.read_lease(db, "r1") is None
    assert runs.acquire_lease(db, "r1", "h2") is None


def test_expired_lease_is_taken_over_and_old_holder_loses_renewal(db):
    assert runs.acquire_lease(db, "r1", "old") is None
    assert runs.acquire_lease(db, "r1", "new").holder == "old"
    # expire it by the clock the journal uses (a short TTL would be a time window on a loaded machine)
    db.execute("UPDATE runs SET lease_until = ? WHERE id = 'r1'", (now_iso(-1),))
    assert runs.read_lease(db, "r1") is None  # expired
    assert runs.acquire_lease(db, "r1", "new") is None
    assert runs.renew_lease(db, "r1", "old") is False
    assert runs.release_lease(db, "r1", "old") is False
    assert runs.read_lease(db, "r1").holder == "new"


def test_lease_requires_a_drivable_run(db):
    with pytest.raises(NotFoundError):
        runs.acquire_lease(db, "ghost", "h")
    with pytest.raises(NotFoundError):
        runs.read_lease(db, "ghost")
    runs.set_run_status(db, "r1", "awaiting_session")
    assert runs.acquire_lease(db, "r1", "h") is None  # awaiting_session is drivable
    assert runs.renew_lease(db, "r1", "h") is True
    runs.abandon_run(db, "r1")
    assert runs.release_lease(db, "r1", "h") is True  # released on every exit path, failed runs included
    assert runs.read_lease(db, "r1") is None
    with pytest.raises(UsageError) as info:
        runs.acquire_lease(db, "r1", "h2")
    assert info.value.code == "RUN_ABANDONED"


def test_half_set_lease_is_not_live(db):
    db.execute("UPDATE runs SET lease_holder = 'half', lease_until = NULL WHERE id = 'r1'")
    assert runs.read_lease(db, "r1") is None
    assert runs.acquire_lease(db, "r1", "h") is None


def _acquire_in_child(db_path: Path, holder: str, host_expr: str = "None", wait_stdin: bool = False):
    script = textwrap.dedent(
        f"""
        import sys
        from akm.store import open_db, open_journal
        from akm.store import runs
        at = sys.argv[1]
        db = open_journal(at) if at.startswith('postgresql://') else open_db(at)
        res = runs.acquire_lease(db, "r1", {holder!r}, host={host_expr})
        print("won" if res is None else "lost", flush=True)
        if {wait_stdin!r}:
            sys.stdin.read()
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", script, str(db_path)],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_dead_local_holder_is_expired_at_once(db, db_path):
    child = _acquire_in_child(db_path, "crashed-engine")
    assert child.stdout.readline().strip() == "won"
    child.communicate(timeout=20)
    raw = runs.require_run(db, "r1")
    assert raw.lease_holder == "crashed-engine" and raw.lease_pid == child.pid
    assert raw.lease_until > now_iso()  # still far from expiry ...
    assert runs.read_lease(db, "r1") is None  # ... but its process is gone
    assert runs.acquire_lease(db, "r1", "me") is None
    assert runs.read_lease(db, "r1").holder == "me"


def test_live_holder_in_another_process_keeps_lease_until_it_exits(db, db_path):
    child = _acquire_in_child(db_path, "busy-engine", wait_stdin=True)
    try:
        assert child.stdout.readline().strip() == "won"
        held = runs.acquire_lease(db, "r1", "me")
        assert held is not None and held.holder == "busy-engine" and held.pid == child.pid
    finally:
        child.communicate(input="", timeout=20)
    assert runs.acquire_lease(db, "r1", "me") is None


def test_dead_holder_on_another_host_waits_for_expiry(db, db_path):
    child = _acquire_in_child(db_path, "remote-engine", host_expr="'some-other-host'")
    assert child.stdout.readline().strip() == "won"
    child.communicate(timeout=20)
    lease = runs.read_lease(db, "r1")
    assert lease is not None and lease.host == "some-other-host"
    assert runs.acquire_lease(db, "r1", "me").holder == "remote-engine"


def test_two_threads_with_separate_connections_exactly_one_wins(db_path, db):
    for round_no in range(8):
        run_id = f"race{round_no}"
        make_run(db, run_id)
        conns = [open_at(db_path) for _ in range(4)]
        barrier = threading.Barrier(len(conns))
        results: dict[int, object] = {}

        def go(i: int) -> None:
            barrier.wait()
            results[i] = runs.acquire_lease(conns[i], run_id, f"t{i}")

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(conns))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in conns:
            c.close()
        winners = [i for i, r in results.items() if r is None]
        assert len(winners) == 1, results
        assert all(r.holder == f"t{winners[0]}" for r in results.values() if r is not None)
        assert runs.read_lease(db, run_id).holder == f"t{winners[0]}"


def test_threads_sharing_one_database_exactly_one_wins(db):
    barrier = threading.Barrier(6)
    results: list[object] = []

    def go(i: int) -> None:
        barrier.wait()
        results.append(runs.acquire_lease(db, "r1", f"t{i}"))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is None for r in results) == 1


def test_ten_processes_race_exactly_one_wins(db, db_path, tmp_path):
    go_file = tmp_path / "go"
    script = textwrap.dedent(
        """
        import os, sys, time
        from akm.store import open_db, open_journal
        from akm.store import runs
        at = sys.argv[1]
        db = open_journal(at) if at.startswith('postgresql://') else open_db(at)
        print("ready", flush=True)
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.001)
        res = runs.acquire_lease(db, "r1", sys.argv[3])
        print("won" if res is None else "lost:" + res.holder, flush=True)
        sys.stdin.read()  # stay alive so the winner's pid stays live for everyone
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(db_path), str(go_file), f"p{i}"],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(10)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go_file.write_text("go")
        outcomes = [p.stdout.readline().strip() for p in procs]
    finally:
        for p in procs:
            p.communicate(input="", timeout=30)
    winners = [f"p{i}" for i, o in enumerate(outcomes) if o == "won"]
    assert len(winners) == 1, outcomes
    assert all(o == f"lost:{winners[0]}" for o in outcomes if o != "won")
    assert runs.require_run(db, "r1").lease_holder == winners[0]


def _pg_only(db):
    if db.backend != "postgres":
        assert db.holder_liveness("h") is None and not db.dialect.liveness  # SQLite: pids tell, nothing recorded
        pytest.skip("holder liveness by a session lock is PostgreSQL's")


def _liveness_columns(db):
    row = db.query_one("SELECT lease_session, lease_liveness FROM runs WHERE id = 'r1'")
    return row[0], row[1]


def test_a_holder_whose_liveness_session_ended_is_taken_over_only_through_its_kept_lock(db):
    """issue 35: a free liveness lock is no proof of death (a live driver may have lost only that connection).
    A peer keeps the holder's lock (`hold_dead_holder`) and takes the run over with it (`dead=`), never
    without; the engine waits the fencing grace in between (akm.engine.fencing)."""
    _pg_only(db)
    from akm.store.postgres.liveness import HolderLock

    lock = HolderLock.acquire(db.target, "remote-engine")  # not watched: nothing takes it back by itself
    try:
        assert runs.acquire_lease(db, "r1", "remote-engine", host="some-other-host", pid=1, liveness=lock) is None
        assert _liveness_columns(db) == (lock.key, lock.marker)
        # alive: its session holds the lock, so a peer is refused, sees it driving, and keeps nothing
        assert runs.acquire_lease(db, "r1", "me").holder == "remote-engine"
        assert runs.read_lease(db, "r1").holder == "remote-engine"
        assert runs.hold_dead_holder(db, "r1") is None
        # the liveness connection alone is dropped (the holder process lives on)
        pid = lock._con.run("SELECT pg_backend_pid()")[0][0]
        db.execute("SELECT pg_terminate_backend(?)", (pid,))
        runs.release_dead_holder(db, wait_until(lambda: runs.hold_dead_holder(db, "r1"), what="the lock to be free"))
        raw = runs.require_run(db, "r1")
        assert raw.lease_holder == "remote-engine" and raw.lease_until > db.now(runs.lease_ttl_s() / 2)
        # still the driver as far as anyone can tell, and no plain acquisition takes it over
        assert runs.read_lease(db, "r1").holder == "remote-engine"
        assert runs.acquire_lease(db, "r1", "me").holder == "remote-engine"
        dead = runs.hold_dead_holder(db, "r1")
        assert dead is not None and (dead.holder, dead.key) == ("remote-engine", lock.key)
        try:
            # the holder cannot take its lock back while the peer keeps it: it must stop its units
            assert lock.refresh() is None and lock.marker is None
            assert runs.acquire_lease(db, "r1", "me", host="third-host", pid=1, dead=dead) is None
        finally:
            runs.release_dead_holder(db, dead)
    finally:
        lock.release()
    # a holder without liveness records none: the previous key never speaks for it, it waits for expiry
    assert _liveness_columns(db) == (None, None)
    assert runs.acquire_lease(db, "r1", "peer").holder == "me"


def test_a_kept_lock_is_no_takeover_once_the_holder_changed_or_the_lock_was_lost(db):
    _pg_only(db)
    lock = db.holder_liveness("engine")
    assert lock.refresh()
    assert runs.acquire_lease(db, "r1", "engine", host="some-other-host", pid=1, liveness=lock) is None
    lock.release()
    dead = runs.hold_dead_holder(db, "r1")
    assert dead is not None
    # the peer's connection fails meanwhile: the kept lock went with it, so no takeover
    runs.release_dead_holder(db, dead)
    assert runs.acquire_lease(db, "r1", "me", dead=dead).holder == "engine"
    # a kept lock names one holder at one epoch: a later holder is not taken over with it
    dead = runs.hold_dead_holder(db, "r1")
    try:
        runs.release_lease(db, "r1", "engine")
        assert runs.acquire_lease(db, "r1", "other", host="h2", pid=1) is None
        assert runs.acquire_lease(db, "r1", "me", dead=dead).holder == "other"
    finally:
        runs.release_dead_holder(db, dead)


def test_renewal_records_the_refreshed_marker_and_release_clears_it(db):
    _pg_only(db)
    lock = db.holder_liveness("engine")
    try:
        assert runs.acquire_lease(db, "r1", "engine", liveness=lock) is None
        db.execute("UPDATE runs SET lease_liveness = 'an-old-incarnation' WHERE id = 'r1'")
        assert runs.renew_lease(db, "r1", "engine", liveness=lock)
        assert _liveness_columns(db) == (lock.key, lock.marker)
        assert runs.release_lease(db, "r1", "engine")
        assert _liveness_columns(db) == (None, None)
    finally:
        lock.release()


def test_a_free_lock_under_another_server_incarnation_is_not_trusted(db):
    _pg_only(db)
    lock = db.holder_liveness("engine")
    assert lock.refresh()
    assert runs.acquire_lease(db, "r1", "engine", host="some-other-host", pid=1, liveness=lock) is None
    db.execute("UPDATE runs SET lease_liveness = 'an-old-incarnation' WHERE id = 'r1'")
    lock.release()
    assert runs.acquire_lease(db, "r1", "me").holder == "engine"  # wait for expiry, as after a restart


def test_abandon_finishes_the_running_units_of_a_holder_whose_session_ended(db):
    from akm.store import units

    _pg_only(db)
    lock = db.holder_liveness("engine")
    assert lock.refresh()
    assert runs.acquire_lease(db, "r1", "engine", host="some-other-host", pid=1, liveness=lock) is None
    fence = runs.lease_fence(db, "r1", "engine")
    units.insert_unit(db, run_id="r1", unit_id="a#0", step_id="a", node_id="a", fence=fence)
    lock.release()  # the driver died with its unit in flight
    runs.abandon_run(db, "r1")
    row = db.query_one("SELECT status, failure_reason FROM units WHERE run_id = 'r1'")
    assert (row[0], row[1]) == ("failed", "abandoned")


def test_a_lease_taken_before_the_liveness_lock_is_held_records_no_marker(db):
    _pg_only(db)
    from akm.store.postgres.liveness import HolderLock, session_key

    lock = HolderLock(db.target, "engine", 2.0)  # as `start` returns it before its connection holds the lock
    assert runs.acquire_lease(db, "r1", "engine", host="some-other-host", pid=1, liveness=lock) is None
    assert _liveness_columns(db) == (session_key("engine"), None)
    assert runs.acquire_lease(db, "r1", "me").holder == "engine"  # no marker: no fast path, wait for expiry
    assert runs.renew_lease(db, "r1", "engine", liveness=lock)  # refresh opens the connection, takes the lock
    try:
        assert lock.marker and _liveness_columns(db) == (lock.key, lock.marker)
    finally:
        lock.release()
    assert runs.hold_dead_holder(db, "r1") is not None  # the marker recorded: a peer may keep the lock now


def test_a_free_lease_is_taken_in_one_write_with_its_fence(db):
    """`take_free_lease`: the start of most drives (a new run, one whose driver let go) — the fence and the run's
    status come back with it; a held lease (live or lapsed) or a run not drivable is left to `acquire_lease`."""
    taken = runs.take_free_lease(db, "r1", "h1")
    assert taken == (runs.Fence("h1", 1), "active")
    assert runs.lease_fence(db, "r1", "h1") == runs.Fence("h1", 1)
    lease = runs.read_lease(db, "r1")
    assert lease is not None and lease.holder == "h1" and lease.pid == os.getpid()
    assert runs.take_free_lease(db, "r1", "h2") is None  # held: nothing written
    assert runs.lease_fence(db, "r1", "h1") == runs.Fence("h1", 1)
    assert runs.acquire_lease(db, "r1", "h2").holder == "h1"  # which says who holds it
    assert runs.release_lease(db, "r1", "h1")
    assert runs.take_free_lease(db, "r1", "h2") == (runs.Fence("h2", 2), "active")  # the epoch moves on
    assert runs.release_lease(db, "r1", "h2")
    runs.abandon_run(db, "r1")
    assert runs.take_free_lease(db, "r1", "h3") is None  # not drivable: acquire_lease says why
    with pytest.raises(UsageError):
        runs.acquire_lease(db, "r1", "h3")
    assert runs.take_free_lease(db, "nope", "h3") is None
