"""The PostgreSQL journal's own parts (akm/store/postgres/: connect, schema, PgJournal) against a real
throwaway server (tests/pgcluster.py): URLs and coded connection errors, migrations and the refusal of a
foreign or newer schema, the epoch fence of the shared layer on the server, NUL-safe storage.

The four races of postgres.md run through the shared layer on both journals in tests/test_journal_races.py.
"""

from __future__ import annotations

import multiprocessing
import uuid

import pytest

from akm.errors import JournalError, UsageError
from akm.store import open_journal, runs, units
from akm.store.migrations import MIGRATIONS
from akm.store.postgres import schema
from akm.store.postgres.connect import connect, parse_url
from tests.helpers import bare_run, step_row


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


def _run(db, **kw) -> str:
    fields = {"workflow_ref": "/w.md", "title": "", "scope_key": "dir:v1:x", "params": {"a": 1}, "plan_hash": "h"}
    return bare_run(db, **{"run_id": str(uuid.uuid4()), "step_ids": ["s"], **fields, **kw}).id


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


@pytest.mark.parametrize("mode", ["disable", "prefer"])
def test_sslmode_disable_and_prefer_never_ask_the_server_for_tls(mode):
    """What the client sends first is its startup message (protocol 3.0), not an SSLRequest: no silent,
    unverified TLS, and no CA bundle loaded for it on each connection."""
    import socket
    import struct
    import threading

    first: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def accept_one() -> None:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(30)
                first.append(conn.recv(8))  # then closed: the client's connect fails, as it should here

        t = threading.Thread(target=accept_one)
        t.start()
        with pytest.raises(JournalError):
            connect(parse_url(f"postgresql://u:p@127.0.0.1:{port}/d?sslmode={mode}"), timeout=30)
        t.join(30)
    (length, code) = struct.unpack("!ii", first[0])
    assert code == 196608, code  # 3.0; an SSLRequest would be 80877103


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
    with pytest.raises(JournalError) as e:  # as every command opens it
        open_journal(url).close()
    assert e.value.code == "JOURNAL_TOO_NEW" and e.value.exit_status == 78
    con.run("CREATE SCHEMA other_app")
    con.run("CREATE TABLE other_app.things (x int)")
    try:
        with pytest.raises(JournalError) as e:
            schema.apply_migrations(con, "other_app")
        assert e.value.code == "JOURNAL_FOREIGN"
        with pytest.raises(JournalError) as e:
            open_journal(url.replace(f"schema={name}", "schema=other_app")).close()
        assert e.value.code == "JOURNAL_FOREIGN"
        assert con.run("SELECT count(*) FROM information_schema.tables WHERE table_schema='other_app'") == [[1]]
    finally:
        con.run("DROP SCHEMA other_app CASCADE")


# ------------------------------------------------------------------ the epoch fence on the server


def test_insert_is_fenced_by_the_epoch(pg):
    """The shared layer's fence on PgJournal: a lapsed holder's insert is LEASE_LOST once another took the run
    (a new epoch), and renewing at the old epoch fails. Expiry is set on the server's clock (`db.now`)."""
    url, _ = pg
    db = open_journal(url)
    try:
        rid = _run(db)
        assert runs.acquire_lease(db, rid, "h1", 90, host="elsewhere", pid=1) is None
        first = runs.lease_fence(db, rid, "h1")
        assert first == runs.Fence("h1", 1)
        assert runs.acquire_lease(db, rid, "h2", 90, host="other", pid=2) is not None  # held: LEASE_HELD
        db.execute("UPDATE runs SET lease_until = ? WHERE id = ?", (db.now(-1), rid))
        assert runs.acquire_lease(db, rid, "h2", 90, host="other", pid=2) is None
        second = runs.lease_fence(db, rid, "h2")
        assert second == runs.Fence("h2", 2)
        assert runs.renew_lease(db, rid, "h1", 90, epoch=1) is False
        with pytest.raises(UsageError) as e:
            units.insert_unit(db, run_id=rid, unit_id="u", step_id="s", node_id="n", fence=first)
        assert e.value.code == "LEASE_LOST"
        assert db.query_one("SELECT count(*) FROM units WHERE run_id = ?", (rid,))[0] == 0
        units.insert_unit(db, run_id=rid, unit_id="u", step_id="s", node_id="n", fence=second)
        assert runs.renew_lease(db, rid, "h2", 90, epoch=2) is True
        assert runs.release_lease(db, rid, "h2") is True
    finally:
        db.close()


# ------------------------------------------------------------------ NUL-safe text


def test_nul_in_captured_text_is_stored_escaped_on_the_server(pg):
    """PostgreSQL text cannot hold NUL: the journal stores it escaped (the column on the server has none)
    and reads it back unchanged (tests/test_journal_races.py checks the read-back on both journals)."""
    url, name = pg
    db = open_journal(url)
    try:
        rid = _run(db)
        runs.complete_step(db, rid, "s", "completed", notes="stderr:\nbefore\x00after")
        assert step_row(db, rid, "s").notes == "stderr:\nbefore\x00after"
    finally:
        db.close()
    con = _con(url)
    try:
        raw = con.run(f"SELECT notes FROM {name}.steps WHERE run_id = :id AND step_id = 's'", id=rid)
        assert raw and "\x00" not in raw[0][0] and "before" in raw[0][0] and "after" in raw[0][0]
    finally:
        con.close()


# ------------------------------------------------------------------ stamps the api writes


def test_invocation_history_is_stamped_on_the_server_clock(pg, tmp_path, monkeypatch):
    """`workflow run`'s task-history start and finish come from the journal clock: a host whose clock runs
    an hour ahead still records the server's time (the stored stamps are not in the server's future)."""
    import time
    from types import SimpleNamespace

    from akm import api
    from akm.store import clock, events
    from tests.helpers import write_wf

    url, _ = pg
    monkeypatch.setenv("AKM_JOURNAL_URL", url)
    project = tmp_path / "proj"
    project.mkdir()
    wf = write_wf(
        project,
        "one.md",
        """
        steps:
          - id: a
            unit: { exec: { command: [python3, -c, "print(1)"] } }
            output: { type: integer }
        """,
        "## a\na",
    )
    real = time.time
    monkeypatch.setattr(
        clock, "time", SimpleNamespace(time=lambda: real() + 3600, strftime=time.strftime, gmtime=time.gmtime)
    )
    result = api.run_workflow(str(wf), cwd=str(project))
    assert result.run.status == "completed"
    db = open_journal(url)
    try:
        (entry,) = events.list_task_history(db, result.run.run_id)
        server_now = db.now()
    finally:
        db.close()
    assert entry.started_at <= entry.finished_at <= server_now, (entry, server_now)
    assert clock.now_iso() > server_now  # the host clock really is ahead
