"""A PostgreSQL journal whose connection fails answers with a coded error and carries on (issue 35 items 2–3).

Against the throwaway server (tests/pgcluster.py), through a TCP proxy (tests/faultproxy.py) where a fault must
come from the network: a stalled or reset connection is JOURNAL_CONNECTION_LOST with a hint (never INTERNAL),
a lock the server gave up waiting for is JOURNAL_BUSY, the next use reconnects, every session carries akm's
limits, and a session of akm's that went silent mid-transaction is ended by the server so waiters get through.
The end-to-end cases (drivers and workers under faults, units logging their intervals) are
tests/test_journal_faults.py.
"""

from __future__ import annotations

import time

import pytest

from akm.errors import JournalError
from akm.store import runs
from akm.store.postgres import connect as pgconnect
from akm.store.postgres.db import open_pg
from tests.faultproxy import FaultProxy
from tests.helpers import bare_run, wait_until


@pytest.fixture
def schema_url(pg_cluster):
    from tests import pgcluster

    with pgcluster.fresh_schema(pg_cluster) as url:
        open_pg(url).close()  # migrated before any fault
        yield url


@pytest.fixture
def proxy(pg_cluster):
    p = FaultProxy(pg_cluster.host, pg_cluster.port)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def admin(pg_cluster):
    con = pgconnect.connect(pgconnect.parse_url(pg_cluster.url()))
    try:
        yield con
    finally:
        con.close()


def _run(db, run_id: str = "r1") -> None:
    bare_run(db, run_id, step_ids=["a", "b"], workflow_ref="/w.md", plan_hash="h")


def test_every_session_carries_akms_limits_and_names_its_role(schema_url, admin):
    db = open_pg(schema_url)
    try:
        got = dict(
            db.query(
                "SELECT name, setting FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout', "
                "'idle_in_transaction_session_timeout', 'tcp_keepalives_idle', 'tcp_keepalives_interval', "
                "'tcp_keepalives_count', 'tcp_user_timeout', 'TimeZone')"
            )
        )
        assert got == {
            "lock_timeout": str(pgconnect.LOCK_TIMEOUT_S * 1000),
            "statement_timeout": str(pgconnect.STATEMENT_TIMEOUT_S * 1000),
            "idle_in_transaction_session_timeout": str(pgconnect.IDLE_IN_TRANSACTION_S * 1000),
            "tcp_keepalives_idle": str(pgconnect.KEEPALIVE_IDLE_S),
            "tcp_keepalives_interval": str(pgconnect.KEEPALIVE_INTERVAL_S),
            "tcp_keepalives_count": str(pgconnect.KEEPALIVE_COUNT),
            "tcp_user_timeout": str(pgconnect.TCP_USER_TIMEOUT_S * 1000),
            "TimeZone": "UTC",
        }
        import socket

        sock = db.conn.raw._usock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == pgconnect.KEEPALIVE_IDLE_S
        assert sock.gettimeout() == pgconnect.SOCKET_TIMEOUT_S
        lock = db.holder_liveness("h")
        assert lock is not None and lock.refresh()
        try:
            roles = {r[0] for r in admin.run("SELECT application_name FROM pg_stat_activity")}
            assert {"akm", "akm-liveness"} <= roles
        finally:
            lock.release()
    finally:
        db.close()


def test_a_stalled_connection_is_a_coded_error_and_the_next_use_reconnects(schema_url, proxy):
    db = open_pg(proxy.url(schema_url))
    try:
        _run(db)
        assert runs.acquire_lease(db, "r1", "me") is None
        (link,) = proxy.links()
        link.stall()
        db.conn.raw._usock.settimeout(0.5)  # what SOCKET_TIMEOUT_S does, sooner
        with pytest.raises(JournalError) as exc:
            runs.release_lease(db, "r1", "me")  # the INTERNAL: "cannot read from timed out object"
        assert exc.value.code == "JOURNAL_CONNECTION_LOST" and exc.value.exit_status == 78
        assert exc.value.hint and "run the command again" in exc.value.hint
        assert "Traceback" not in exc.value.message
        # the timed-out socket is never read again: the next call opens a new connection
        assert runs.get_run(db, "r1").lease_holder == "me"
        assert runs.release_lease(db, "r1", "me")
        assert db.reconnects == 1
        link.close()
    finally:
        db.close()


def test_a_reset_connection_is_a_coded_error_in_a_transaction_and_retried_outside_one(schema_url, proxy):
    db = open_pg(proxy.url(schema_url))
    try:
        _run(db)
        proxy.links()[0].drop()
        assert runs.get_run(db, "r1").status == "active"  # a read outside a transaction: retried once, anew
        assert db.reconnects == 1
        proxy.links()[0].drop()
        with pytest.raises(JournalError) as exc:
            runs.set_run_status(db, "r1", "awaiting_session", None)  # a write: never repeated (it may have committed)
        assert exc.value.code == "JOURNAL_CONNECTION_LOST"
        assert runs.get_run(db, "r1").status == "active"
        proxy.refusing = True  # the server is out of reach now
        proxy.links()[0].drop()
        with pytest.raises(JournalError) as exc:
            runs.get_run(db, "r1")
        assert exc.value.code == "JOURNAL_UNREACHABLE"
        proxy.refusing = False
        assert runs.get_run(db, "r1").status == "active"
    finally:
        db.close()


def test_a_session_ended_by_the_server_is_a_coded_error(schema_url, admin):
    db = open_pg(schema_url)
    try:
        _run(db)
        pid = db.query_one("SELECT pg_backend_pid()")[0]
        admin.run("SELECT pg_terminate_backend(:p)", p=pid)
        with pytest.raises(JournalError) as exc:
            with db.tx() as conn:
                conn.execute("UPDATE runs SET title = 'x' WHERE id = 'r1'")
        assert exc.value.code == "JOURNAL_CONNECTION_LOST"
        assert runs.get_run(db, "r1").title == "t"
    finally:
        db.close()


def test_a_lock_the_server_gave_up_waiting_for_is_journal_busy(schema_url, admin):
    db = open_pg(schema_url)
    other = open_pg(schema_url)
    try:
        _run(db)
        db.execute("SET lock_timeout = '300ms'")  # what LOCK_TIMEOUT_S does, sooner
        with other.tx() as conn:
            conn.execute("SELECT 1 FROM runs WHERE id = 'r1' FOR UPDATE")
            with pytest.raises(JournalError) as exc:
                runs.acquire_lease(db, "r1", "me")
        assert exc.value.code == "JOURNAL_BUSY" and "nothing was written" in (exc.value.hint or "")
        assert runs.acquire_lease(db, "r1", "me") is None  # the same connection goes on
    finally:
        db.close()
        other.close()


def test_a_session_silent_mid_transaction_is_ended_so_waiters_get_through(schema_url, proxy, admin):
    """The issue's item 2: a partitioned session idle in a transaction held the run row for minutes, and every
    later command waited and died INTERNAL, leaving a waiting backend behind. Now the server ends the silent
    session after IDLE_IN_TRANSACTION_S and the waiter (lock_timeout is longer) gets the row."""
    db = open_pg(schema_url)
    stuck = open_pg(proxy.url(schema_url))
    try:
        _run(db)
        # the settings every akm session has (checked above), shortened so the test does not wait for them
        stuck.execute("SET idle_in_transaction_session_timeout = '1s'")
        db.execute("SET lock_timeout = '10s'")
        stuck.conn.begin()
        stuck.conn.execute("SELECT 1 FROM runs WHERE id = 'r1' FOR NO KEY UPDATE")
        (link,) = proxy.links()
        link.half_open_server()  # the client is gone; the server's session sits idle in its transaction
        began = time.monotonic()
        assert runs.acquire_lease(db, "r1", "me") is None
        print(f"\nwaited {time.monotonic() - began:.1f} s for the silent session to be ended")
        wait_until(
            lambda: (
                not admin.run(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'akm%' "
                    "AND (wait_event_type = 'Lock' OR state LIKE 'idle in transaction%')"
                )
            ),
            what="no akm session waiting or idle in a transaction",
        )
        link.close()
    finally:
        db.close()
        stuck.close()


@pytest.mark.slow
def test_a_holder_that_cannot_take_its_liveness_lock_back_becomes_overdue(schema_url, admin):
    """The holder's half of the takeover grace: its liveness session ended, a peer keeps its lock, so it cannot
    prove its liveness any more and is `overdue` (its driver's watchdog then stops the units) after FENCE_AFTER_S."""
    from akm.store.journal import FENCE_AFTER_S
    from akm.store.postgres.liveness import NAMESPACE

    db = open_pg(schema_url)
    lock = db.holder_liveness("holder")
    try:
        # Stamped before a proof of our own, so the proof is later than the stamp whatever the load: the
        # holder cannot be overdue before FENCE_AFTER_S from here (a stamp taken after the peer's lock was seen
        # moved with the load, and a slow wait ate into the margin).
        proved_after = time.monotonic()
        assert lock is not None and lock.refresh() and not lock.overdue()
        pid = admin.run(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = :ns AND objid::bigint = :k",
            ns=NAMESPACE,
            k=lock.key,
        )[0][0]
        admin.run("SELECT pg_terminate_backend(:p)", p=pid)
        wait_until(
            lambda: admin.run("SELECT pg_try_advisory_lock(:ns, :k)", ns=NAMESPACE, k=lock.key)[0][0],
            what="the peer to keep the holder's lock",
        )
        wait_until(lock.overdue, what="the holder to be overdue", timeout=FENCE_AFTER_S + 60)
        assert time.monotonic() - proved_after >= FENCE_AFTER_S  # it kept its proof until its session ended
        admin.run("SELECT pg_advisory_unlock(:ns, :k)", ns=NAMESPACE, k=lock.key)
        wait_until(lambda: not lock.overdue(), what="the holder to take its lock back", timeout=60)
    finally:
        lock.release()
        db.close()
