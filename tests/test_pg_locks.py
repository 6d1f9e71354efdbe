"""The PostgreSQL dialect takes each lock once per transaction (akm/store/postgres/db.py, PgDialect).

Store calls nest in one transaction (`write_report` runs `insert_unit` and `finish_unit` inside its own; a group
commit runs many units' writes in one), and each asks for the run-row lock and the event lock again; every lock
is a server round trip. The connection remembers what its transaction holds and the dialect skips a repeat.
Counted here in the connection's statement trace (`Connection.trace`), on a real throwaway server, with a
second connection proving that the locks are really held (or really gone) on the server.
"""

from __future__ import annotations

import pytest

from akm.store import events, units
from akm.store.journal import RUN_UNIT_WRITE, RUN_UPDATE, RUN_WRITE
from akm.store.postgres.connect import connect, parse_url, sqlstate
from tests.helpers import bare_run

RUN = "r1"


@pytest.fixture
def pg(pg_db):
    """(journal, url) on a fresh schema holding one run."""
    bare_run(pg_db[0], RUN)
    return pg_db


@pytest.fixture
def other(pg):
    """A second session on the same schema: it asks for locks with NOWAIT to see what the first one holds."""
    db, url = pg
    con = connect(parse_url(url))
    con.run(f"SET search_path TO {db.schema}")
    yield con
    con.close()


def _can_lock(con, mode: str) -> bool:
    """Can another session lock the run's row in `mode` right now (NOWAIT: no waiting, a refusal is 55P03)?"""
    try:
        con.run("BEGIN")
        con.run(f"SELECT 1 FROM runs WHERE id = :id FOR {mode} NOWAIT", id=RUN)
        return True
    except Exception as exc:
        assert sqlstate(exc) == "55P03", exc
        return False
    finally:
        con.run("ROLLBACK")


def _locks(trace: list[str]) -> tuple[int, int]:
    """(run-row lock statements, advisory lock statements) in a statement trace."""
    row = sum(1 for sql in trace if sql.startswith("SELECT 1 FROM runs WHERE id = ? FOR "))
    advisory = sum(1 for sql in trace if "pg_advisory_xact_lock" in sql)
    return row, advisory


def test_a_repeated_lock_is_one_statement_per_transaction(pg):
    db, _ = pg
    db.conn.trace = trace = []
    with db.tx() as conn:
        for _ in range(3):
            db.dialect.lock_run(conn, RUN, RUN_UNIT_WRITE)
            db.dialect.event_lock(conn)
            db.dialect.identity_lock(conn, "ref\x1fscope")
        db.dialect.lock_run(conn, "another-run", RUN_UNIT_WRITE)  # another row: its own lock
        held = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
        ).fetchone()[0]
    assert _locks(trace) == (2, 2)
    assert held == 2  # the event lock and the identity lock, each held once


def test_a_stronger_mode_is_still_asked_for(pg, other):
    db, _ = pg
    db.conn.trace = trace = []
    with db.tx() as conn:
        db.dialect.lock_run(conn, RUN, RUN_UNIT_WRITE)
        assert _can_lock(other, "SHARE")  # KEY SHARE leaves SHARE to others
        db.dialect.lock_run(conn, RUN, RUN_WRITE)  # stronger: locked again
        assert not _can_lock(other, "SHARE") and _can_lock(other, "KEY SHARE")
        db.dialect.lock_run(conn, RUN, RUN_UNIT_WRITE)  # weaker than what is held: skipped
        db.dialect.lock_run(conn, RUN, RUN_WRITE)  # the same: skipped
        db.dialect.lock_run(conn, RUN, RUN_UPDATE)  # stronger again: locked
        assert not _can_lock(other, "KEY SHARE")
        db.dialect.lock_run(conn, RUN, RUN_WRITE)
        db.dialect.lock_run(conn, RUN, RUN_UNIT_WRITE)
    assert _locks(trace)[0] == 3
    assert _can_lock(other, "UPDATE")  # committed: the row is free


def test_locks_are_forgotten_at_commit_and_at_rollback(pg, other):
    db, _ = pg
    db.conn.trace = trace = []
    with db.tx() as conn:
        db.dialect.lock_run(conn, RUN, RUN_UPDATE)
        db.dialect.event_lock(conn)
    assert _can_lock(other, "UPDATE")
    with pytest.raises(RuntimeError), db.tx() as conn:
        db.dialect.lock_run(conn, RUN, RUN_UPDATE)  # a new transaction: locked again
        db.dialect.event_lock(conn)
        assert not _can_lock(other, "KEY SHARE")
        raise RuntimeError("roll back")
    assert _can_lock(other, "UPDATE")
    with db.tx() as conn:
        db.dialect.lock_run(conn, RUN, RUN_UPDATE)  # after the rollback: locked again
        db.dialect.event_lock(conn)
        assert not _can_lock(other, "KEY SHARE")
    assert _locks(trace) == (3, 3)
    assert db.conn.locks == {}


def test_a_lock_outside_a_transaction_is_not_remembered(pg):
    """Outside `tx()` each statement commits on its own, so its lock is gone at once."""
    db, _ = pg
    db.dialect.lock_run(db.conn, RUN, RUN_UPDATE)
    db.dialect.event_lock(db.conn)
    assert db.conn.locks == {}


def test_write_report_locks_the_run_and_the_events_once(pg):
    """A finishing report inserts and finishes the attempt inside its own transaction: one lock of each."""
    db, _ = pg
    db.conn.trace = trace = []
    attempt = units.NewAttempt(RUN, "build:solo", "build", "build", runner="session", input_hash="h1")
    write = units.write_report(
        db,
        units.ReportedAttempt(
            attempt,
            status="completed",
            result_json='"done"',
            tokens=3,
            failure_reason=None,
            holder="agent-1",
            rerun=False,
        ),
    )
    assert write.recorded == "written"
    assert _locks(trace) == (1, 1)
    assert [u.status for u in units.get_units(db, RUN)] == ["completed"]
    unit_events = [e.event_type for e in events.list_events(db, RUN)[0] if e.event_type.startswith("workflow_unit_")]
    assert unit_events == ["workflow_unit_started", "workflow_unit_finished"]


def test_a_group_of_unit_writes_locks_once(pg):
    """What a group commit does (engine/groupcommit.py): many units' finish-and-insert in one transaction."""
    db, _ = pg
    started = {
        f"u{i}": units.insert_unit(db, run_id=RUN, unit_id=f"u{i}", step_id="build", node_id="build") for i in range(5)
    }
    db.conn.trace = trace = []
    with db.tx():
        for i in range(5):
            finish = units.UnitFinish(run_id=RUN, unit_id=f"u{i}", started_at=started[f"u{i}"], status="completed")
            units.finish_and_insert(db, finish, run_id=RUN, unit_id=f"v{i}", step_id="build", node_id="build")
    assert _locks(trace) == (1, 1)
    assert trace.count("BEGIN") == 1 and trace.count("COMMIT") == 1
    assert sorted(u.unit_id for u in units.get_units(db, RUN) if u.status == "running") == [f"v{i}" for i in range(5)]
