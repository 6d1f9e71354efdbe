"""Each statement is one round trip on PostgreSQL — its first run on a connection and its transaction's BEGIN
included (akm/store/postgres/wire.py) — and what it answers is what pg8000's own paths answered.

Round trips are counted by the TCP proxy between akm and the throwaway server (tests/faultproxy.py: the client's
sends that follow an answer of the server), on a real server.
"""

from __future__ import annotations

import pytest

from akm.errors import JournalError
from akm.store.postgres.db import open_pg
from tests.faultproxy import FaultProxy


@pytest.fixture
def journal(pg_cluster):
    """(journal through a counting proxy, its link): one connection, migrated before counting starts."""
    from tests import pgcluster

    proxy = FaultProxy(pg_cluster.host, pg_cluster.port)
    try:
        with pgcluster.fresh_schema(pg_cluster) as url:
            open_pg(url).close()
            db = open_pg(proxy.url(url))
            try:
                (link,) = proxy.links()
                yield db, link
            finally:
                db.close()
    finally:
        proxy.close()


def _trips(link, act):
    before = link.exchanges
    out = act()
    return link.exchanges - before, out


def test_a_statements_first_run_is_one_round_trip_and_later_runs_too(journal):
    db, link = journal
    sql = "SELECT ? + 1 AS n, ? AS t, NULL AS z, TIMESTAMPTZ '2026-01-02T03:04:05.678Z' AS ts"
    first, rows1 = _trips(link, lambda: [dict(r) for r in db.execute(sql, (41, "é"))])
    again, rows2 = _trips(link, lambda: [dict(r) for r in db.execute(sql, (1, "x"))])
    assert (first, again) == (1, 1)
    assert rows1 == [{"n": 42, "t": "é", "z": None, "ts": "2026-01-02T03:04:05.678Z"}]
    assert rows2[0]["n"] == 2 and rows2[0]["t"] == "x"


def test_a_transaction_sends_its_begin_with_its_first_statement(journal):
    db, link = journal
    db.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")

    def write():
        with db.tx() as conn:
            conn.execute("INSERT INTO t (k, v) VALUES (?, ?)", (1, "a"))
            conn.execute("UPDATE t SET v = ? WHERE k = ?", ("b", 1))

    trips, _ = _trips(link, write)
    assert trips == 3  # BEGIN + INSERT, UPDATE, COMMIT
    assert [tuple(r) for r in db.execute("SELECT k, v FROM t")] == [(1, "b")]

    def nothing():
        with db.tx():
            pass

    assert _trips(link, nothing)[0] == 0  # a transaction that sent nothing ends without a word to the server


def test_a_failed_statement_rolls_its_transaction_back_and_leaves_the_connection_usable(journal):
    db, link = journal
    db.execute("CREATE TABLE u (k int PRIMARY KEY)")
    db.execute("INSERT INTO u (k) VALUES (?)", (1,))
    for _ in range(2):  # the failed first run was not kept as prepared: the second fails the same way
        with pytest.raises(JournalError) as info:
            with db.tx() as conn:
                conn.execute("INSERT INTO u (k) VALUES (?)", (2,))
                conn.execute("INSERT INTO u (k) VALUES (?)", (1,))  # a unique violation
        assert "23505" in info.value.message
    assert [r["k"] for r in db.execute("SELECT k FROM u ORDER BY k")] == [1]  # the 2 was rolled back
    with pytest.raises(JournalError):
        db.execute("SELECT no_such_column FROM u")  # an error in the parse
    assert [r["k"] for r in db.execute("SELECT k FROM u ORDER BY k")] == [1]
    assert db.conn.in_transaction is False


def test_past_the_prepared_limit_statements_still_run_in_one_round_trip(journal):
    db, link = journal
    conn = db.conn
    conn.PREPARED_MAX = conn.named  # nothing more is prepared on this connection
    trips, rows = _trips(link, lambda: [r["n"] for r in db.execute("SELECT ? * 2 AS n", (21,))])
    assert (trips, rows) == (1, [42])
    assert _trips(link, lambda: [r["n"] for r in db.execute("SELECT ? * 2 AS n", (4,))]) == (1, [8])
    assert "SELECT $1 * 2 AS n" not in conn.prepared


def test_connections_send_at_once_without_waiting_for_acks(pg_cluster):
    """TCP_NODELAY: pg8000 writes a large statement in several sends, and Nagle's algorithm held the last one
    until the server's delayed ACK (40 ms a statement)."""
    import socket

    from akm.store.postgres.connect import connect, parse_url

    con = connect(parse_url(pg_cluster.url()))
    try:
        assert con._usock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        con.close()


def test_a_raw_connections_query_with_parameters_is_one_round_trip(pg_cluster):
    """`wire.query`: the liveness probe's and the migration ledger's statements (pg8000's `run` took three)."""
    from akm.store.postgres import wire
    from akm.store.postgres.connect import connect, parse_url

    proxy = FaultProxy(pg_cluster.host, pg_cluster.port)
    try:
        con = connect(parse_url(proxy.url(pg_cluster.url())))
        try:
            (link,) = proxy.links()
            trips, rows = _trips(
                link, lambda: wire.query(con, "SELECT :a::int + :b::int AS n, :t AS t", a=40, b=2, t="x")
            )
            assert (trips, rows) == (1, [[42, "x"]])
            assert _trips(link, lambda: wire.query(con, "SELECT pg_advisory_unlock_all()"))[0] == 1
        finally:
            con.close()
    finally:
        proxy.close()


def test_stamps_are_read_straight_into_the_journals_format():
    """`stamp_in` (a timestamptz's text as the journal's stamp, no datetime in between) says what pg8000's parse
    and `format_iso` say, for any instant, fraction and offset."""
    import datetime
    import random

    from pg8000.converters import timestamptz_in

    from akm.store.clock import format_iso
    from akm.store.postgres.connect import stamp_in

    rng = random.Random(40)
    base = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    for _ in range(5000):
        t = base + datetime.timedelta(microseconds=rng.randrange(0, 4 * 10**16))
        fraction = f".{t.microsecond:06d}".rstrip("0") if t.microsecond else ""
        text = t.strftime("%Y-%m-%d %H:%M:%S") + fraction + rng.choice(["+00", "+00", "+05:30", "-08"])
        assert stamp_in(text) == format_iso(timestamptz_in(text)), text
    assert stamp_in("infinity") == "infinity"
