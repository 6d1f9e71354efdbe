"""The PostgreSQL journal's groundwork (akm/store/postgres/) against a real throwaway server (tests/pgcluster.py).

Includes the four races of postgres.md as tests on the real server: identical starts, insert versus abandon,
the event cursor, and expiry on the database clock (a skewed host clock cannot steal a live lease).
"""

from __future__ import annotations

import multiprocessing
import threading
import uuid

import pytest

from akm.errors import AkmError, JournalError
from akm.store.migrations import MIGRATIONS
from akm.store.postgres import ops, schema
from akm.store.postgres.connect import connect, parse_url


@pytest.fixture
def pg(pg_cluster, request):
    """(url, schema name) of a fresh, migrated schema for this test, dropped afterwards."""
    name = "t_" + uuid.uuid4().hex[:12]
    url = pg_cluster.url(schema=name)
    con = connect(parse_url(url))
    schema.apply_migrations(con, name)
    yield url, name
    con.run(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    con.close()


def _con(url):
    return connect(parse_url(url))


def _run(con, s, **kw):
    args = dict(
        run_id=str(uuid.uuid4()),
        workflow_ref="/w.md",
        scope_key="dir:v1:x",
        params_json='{"a": 1}',
        plan_json="{}",
        plan_hash="h",
        hash_version=1,
    )
    args.update(kw)
    return ops.create_run(con, s, **args)


# ------------------------------------------------------------------ connection


def test_url_password_from_env_and_errors(pg_cluster):
    t = parse_url("postgresql://u:${PGPW}@db.example:6543/j?sslmode=verify-full&schema=akm2", {"PGPW": "s3"})
    assert (t.host, t.port, t.database, t.user, t.password, t.sslmode, t.schema) == (
        "db.example",
        6543,
        "j",
        "u",
        "s3",
        "verify-full",
        "akm2",
    )
    assert "s3" not in t.shown
    for bad in ("mysql://x/y", "postgresql://u:${NOPE}@h/d", "postgresql://h/d?sslmode=maybe"):
        with pytest.raises(JournalError) as e:
            parse_url(bad, {})
        assert e.value.code == "JOURNAL_URL_INVALID"
    wrong = pg_cluster.url().replace(pg_cluster.password, "wrong")
    with pytest.raises(JournalError) as e:
        connect(parse_url(wrong))
    assert e.value.code == "JOURNAL_AUTH_FAILED"
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(JournalError) as e:
        connect(parse_url(f"postgresql://u:p@127.0.0.1:{port}/d"), timeout=10)
    assert e.value.code == "JOURNAL_UNREACHABLE"


def test_sslmode_require_against_a_server_without_tls_is_a_coded_error(pg_cluster):
    with pytest.raises(JournalError) as e:
        connect(parse_url(pg_cluster.url(sslmode="require")))
    assert e.value.code in ("JOURNAL_TLS_FAILED", "JOURNAL_ERROR"), e.value


# ------------------------------------------------------------------ schema


def test_same_migration_ids_as_sqlite():
    assert [m for m, _ in schema.PG_MIGRATIONS] == [m for m, _ in MIGRATIONS]


def _migrate(url, name, q):
    con = _con(url)
    q.put(schema.apply_migrations(con, name))
    con.close()


def test_five_processes_migrate_a_fresh_schema_once(pg_cluster):
    name = "t_" + uuid.uuid4().hex[:12]
    url = pg_cluster.url()
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_migrate, args=(url, name, q)) for _ in range(5)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(300)
    applied = [r for r in results if r]
    assert len(applied) == 1 and applied[0] == [m for m, _ in MIGRATIONS], results
    con = _con(url)
    assert schema.applied_ids(con, name) == [m for m, _ in MIGRATIONS]
    con.run(f"DROP SCHEMA {name} CASCADE")


def test_foreign_and_newer_schemas_are_refused(pg):
    url, name = pg
    con = _con(url)
    con.run(f"INSERT INTO {name}.schema_migrations (seq, id) VALUES (99, '0099-from-the-future')")
    with pytest.raises(JournalError) as e:
        schema.apply_migrations(con, name)
    assert e.value.code == "JOURNAL_TOO_NEW"
    con.run("CREATE SCHEMA other_app")
    con.run("CREATE TABLE other_app.things (x int)")
    try:
        with pytest.raises(JournalError) as e:
            schema.apply_migrations(con, "other_app")
        assert e.value.code == "JOURNAL_FOREIGN"
        assert con.run("SELECT count(*) FROM information_schema.tables WHERE table_schema='other_app'") == [[1]]
    finally:
        con.run("DROP SCHEMA other_app CASCADE")


# ------------------------------------------------------------------ race 1: identical starts


def _start(url, name, barrier, out):
    con = _con(url)
    barrier.wait(timeout=120)
    out.append(_run(con, name))
    con.close()


def test_race_identical_starts_make_one_run(pg):
    url, name = pg
    for _ in range(5):
        con = _con(url)
        con.run(f"UPDATE {name}.runs SET status = 'completed'")
        con.close()
        out: list = []
        barrier = threading.Barrier(6)
        threads = [threading.Thread(target=_start, args=(url, name, barrier, out)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(out) == 6 and sum(created for _, created in out) == 1, out
        assert len({rid for rid, _ in out}) == 1


# ------------------------------------------------------------------ race 2: insert versus abandon


def test_race_unit_insert_never_lands_in_an_abandoned_run(pg):
    url, name = pg
    a, b = _con(url), _con(url)
    for i in range(20):
        rid, _ = _run(a, name, params_json=f'{{"i": {i}}}')
        lease = ops.acquire_lease(a, name, rid, "h1", "host", 1, 90)
        barrier = threading.Barrier(2)
        outcome: list = []

        def insert(con=a, rid=rid, lease=lease, barrier=barrier, outcome=outcome) -> None:
            barrier.wait(timeout=120)
            try:
                ops.insert_unit(
                    con, name, run_id=rid, unit_id="u", step_id="s", node_id="n", holder="h1", epoch=lease.epoch
                )
                outcome.append("inserted")
            except AkmError as exc:
                outcome.append(exc.code)

        t = threading.Thread(target=insert)
        t.start()
        barrier.wait(timeout=120)
        ops.abandon_run(b, name, rid)
        t.join(120)
        units = ops.unit_count(b, name, rid)
        # Either the insert committed first (the unit exists, then the run was abandoned) or it was refused.
        assert (outcome, units) in ((["inserted"], 1), (["RUN_ABANDONED"], 0)), (outcome, units)
        with pytest.raises(AkmError) as e:
            ops.insert_unit(a, name, run_id=rid, unit_id="v", step_id="s", node_id="n", holder="h1", epoch=lease.epoch)
        assert e.value.code == "RUN_ABANDONED"


def test_insert_is_fenced_by_the_epoch(pg):
    url, name = pg
    con = _con(url)
    rid, _ = _run(con, name)
    first = ops.acquire_lease(con, name, rid, "h1", "host", 1, 90)
    assert first.acquired and first.epoch == 1
    assert not ops.acquire_lease(con, name, rid, "h2", "host", 2, 90).acquired  # held: LEASE_HELD for the caller
    con.run(f"UPDATE {name}.runs SET lease_until = now() - interval '1 s' WHERE id = :id", id=rid)
    second = ops.acquire_lease(con, name, rid, "h2", "host", 2, 90)
    assert second.acquired and second.epoch == 2
    assert not ops.renew_lease(con, name, rid, "h1", 1, 90)
    with pytest.raises(AkmError) as e:
        ops.insert_unit(con, name, run_id=rid, unit_id="u", step_id="s", node_id="n", holder="h1", epoch=1)
    assert e.value.code == "LEASE_LOST"
    ops.insert_unit(con, name, run_id=rid, unit_id="u", step_id="s", node_id="n", holder="h2", epoch=2)
    assert ops.renew_lease(con, name, rid, "h2", 2, 90)
    assert ops.release_lease(con, name, rid, "h2", 2)


# ------------------------------------------------------------------ race 3: the event cursor


def _writer(url, name, n, barrier_evt):
    con = _con(url)
    barrier_evt.wait(120)
    for _ in range(n):
        with ops.transaction(con):
            ops._insert_event(con, name, "e", None, "{}")
            con.run("SELECT pg_sleep(0.001)")  # hold the transaction open a moment after the insert
    con.close()


def test_race_event_cursor_sees_every_event_exactly_once(pg):
    url, name = pg
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    writers = [ctx.Process(target=_writer, args=(url, name, 60, go)) for _ in range(4)]
    for w in writers:
        w.start()
    con = _con(url)
    seen: list[int] = []
    cursor = 0
    go.set()
    while any(w.is_alive() for w in writers) or len(seen) < 240:
        batch = ops.read_events(con, name, cursor)
        seen += [e[0] for e in batch]
        if batch:
            cursor = batch[-1][0]
        if not any(w.is_alive() for w in writers) and not batch and len(seen) < 240:
            break
    for w in writers:
        w.join(120)
    seen += [e[0] for e in ops.read_events(con, name, cursor)]
    everything = [e[0] for e in ops.read_events(con, name, 0, 10_000)]
    assert len(everything) == 240
    assert seen == everything  # nothing skipped, nothing repeated


# ------------------------------------------------------------------ race 4: one clock


def test_race_expiry_uses_the_database_clock(pg):
    """A host whose clock runs ahead cannot take a live lease: expiry is compared with the server's now()."""
    url, name = pg
    con = _con(url)
    rid, _ = _run(con, name)
    assert ops.acquire_lease(con, name, rid, "h1", "host", 1, 3).acquired
    # Writers stamp and compare only in SQL; the stored expiry is in the server's future whatever this host says.
    assert con.run(f"SELECT lease_until > now() FROM {name}.runs WHERE id = :id", id=rid) == [[True]]
    results: list = []
    barrier = threading.Barrier(8)

    def steal(i: int) -> None:
        c = _con(url)
        barrier.wait(timeout=120)
        results.append(ops.acquire_lease(c, name, rid, f"thief{i}", "other", i, 3).acquired)
        c.close()

    threads = [threading.Thread(target=steal, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [False] * 8
    con.run(f"UPDATE {name}.runs SET lease_until = now() - interval '1 ms' WHERE id = :id", id=rid)
    results.clear()
    barrier = threading.Barrier(8)
    threads = [threading.Thread(target=steal, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [False] * 7 + [True]  # an expired lease goes to exactly one new holder
    assert ops.db_now(con).endswith("Z") and len(ops.db_now(con)) == 24


# ------------------------------------------------------------------ NUL-safe text


def test_nul_in_captured_text_is_stored_visibly_and_surrogates_refused(pg):
    url, name = pg
    con = _con(url)
    rid, _ = _run(con, name)
    ops.set_step_notes(con, name, rid, "s", 0, "stderr:\nbefore\x00after")
    assert ops.step_notes(con, name, rid, "s") == "stderr:\nbefore\\u0000after"
    with pytest.raises(AkmError) as e:
        ops.set_step_notes(con, name, rid, "s", 0, "bad \udc80")
    assert e.value.code == "NOT_UTF8"
