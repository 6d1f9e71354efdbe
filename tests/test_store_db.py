"""Connection, pragmas, transactions and migrations of the SQLite journal (real files)."""

from __future__ import annotations

import re
import sqlite3
import threading

import pytest

from akm.errors import JournalError
from akm.store import events, open_db
from akm.store.clock import now_iso
from akm.store.migrations import MIGRATIONS, applied_ids, apply_migrations, split_statements

EXPECTED_COLUMNS = {
    "runs": [
        "id",
        "workflow_ref",
        "workflow_path",
        "title",
        "status",
        "params_json",
        "current_step_id",
        "created_at",
        "updated_at",
        "completed_at",
        "scope_key",
        "plan_json",
        "plan_hash",
        "hash_version",
        "lease_holder",
        "lease_host",
        "lease_pid",
        "lease_until",
        "status_detail_json",
        "lease_epoch",
        "reuse_from",
    ],
    "steps": [
        "run_id",
        "step_id",
        "sequence_index",
        "status",
        "notes",
        "evidence_json",
        "summary",
        "completed_at",
        "gate_loop_base",
    ],
    "units": [
        "run_id",
        "unit_id",
        "step_id",
        "node_id",
        "parent_unit_id",
        "phase",
        "runner",
        "engine",
        "model",
        "status",
        "input_hash",
        "result_json",
        "tokens",
        "failure_reason",
        "worktree_path",
        "started_at",
        "finished_at",
        "session_id",
        "last_checkin_at",
        "attempts",
        "claim_holder",
        "claim_host",
        "claim_pid",
        "claim_expires_at",
        "truncated",
        "reopened",
        "queued_at",
        "host",
        "dispatch_json",
        "reused_from",
        "cost",
    ],
    "rewinds": [
        "id",
        "run_id",
        "seq",
        "to_step",
        "redo_json",
        "from_status",
        "from_step",
        "created_at",
        "lease_epoch",
    ],
    "events": ["id", "event_type", "ts", "run_id", "metadata_json"],
    "task_history": ["id", "run_id", "started_at", "finished_at", "outcome", "metadata_json"],
    "schema_migrations": ["id", "applied_at"],
}


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def test_now_iso_is_fixed_width_utc_millis():
    stamp = now_iso()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
    later = now_iso(90)
    assert len(later) == len(stamp) and later > stamp


def test_now_iso_matches_the_datetime_rendering():
    from datetime import datetime, timedelta, timezone

    from akm.store.clock import format_iso, parse_iso

    for offset in (0.0, 90.0, -1.5, 86_400.0 * 400):
        before = datetime.now(timezone.utc) + timedelta(seconds=offset)
        stamp = now_iso(offset)
        after = datetime.now(timezone.utc) + timedelta(seconds=offset)
        assert format_iso(before)[:19] <= stamp <= format_iso(after)  # the same text, between the two readings
        assert format_iso(parse_iso(stamp)) == stamp


def test_fan_out_checkpoints_run_in_the_background_and_the_wal_starts_over(tmp_path, monkeypatch):
    import time

    from akm.store.sqlite import db as db_module

    monkeypatch.setattr(db_module._Checkpointer, "EVERY_COMMITS", 20)
    path = tmp_path / "j.sqlite3"
    db = open_db(path)
    db.execute("CREATE TABLE t (x TEXT)")

    def commit() -> None:
        with db.tx() as conn:
            conn.execute("INSERT INTO t VALUES (?)", ("x" * 10_000,))  # three pages or so

    def frames_in_wal() -> int:
        return db.query_one("PRAGMA wal_checkpoint(PASSIVE)")[1]

    with db.checkpoints_in_background():
        assert db.query_one("PRAGMA wal_autocheckpoint")[0] == 0  # no commit checkpoints (and syncs) inline
        checkpoints = db._checkpoints
        for _ in range(20):
            commit()
        deadline = time.monotonic() + 60
        while not checkpoints.caught_up and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpoints.caught_up  # the thread checkpointed the 20 commits
        commit()
        # The race the writer's catch-up exists for: frames written while a checkpoint by another
        # connection ran. Without the catch-up the WAL would never start over during a fan-out.
        other = sqlite3.connect(path)
        commit()
        other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        commit()
        commit()
        other.close()
        checkpoints.caught_up = True  # what the thread reports after such a checkpoint
        commit()  # copies the frames written meanwhile itself ...
        commit()  # ... so this one starts the WAL over instead of appending to it
        assert frames_in_wal() < 8  # else: every page written since the last restart
    assert db.query_one("PRAGMA wal_autocheckpoint")[0] == 1000
    commit()
    db.close()
    db = open_db(path)
    assert db.query_one("SELECT count(*) FROM t")[0] == 27
    db.close()


def test_open_creates_parent_dir_sets_pragmas_and_schema(tmp_path):
    path = tmp_path / "deep" / "er" / "akm-journal.sqlite3"
    db = open_db(path)
    try:
        assert path.exists()
        conn = db.conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
        for table, cols in EXPECTED_COLUMNS.items():
            assert _columns(conn, table) == cols, table
        assert applied_ids(db) == [mid for mid, _ in MIGRATIONS]
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {
            "idx_runs_scope_ref_status",
            "idx_steps_run_sequence",
            "idx_units_run_step",
            "idx_events_run",
        } <= indexes
        # CHECK constraints are real
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO runs (id, workflow_ref, status, created_at, updated_at, scope_key, plan_json, plan_hash,"
                " hash_version) VALUES ('x','w','paused','t','t','s','{}','h',1)"
            )
    finally:
        db.close()


def test_reopen_applies_nothing(tmp_path):
    path = tmp_path / "akm-journal.sqlite3"
    open_db(path).close()
    db = open_db(path)
    try:
        assert apply_migrations(db) == []
        assert db.query_one("SELECT COUNT(*) AS n FROM schema_migrations")["n"] == len(MIGRATIONS)
    finally:
        db.close()


def test_delete_journal_mode_uses_full_sync(tmp_path, monkeypatch):
    monkeypatch.setenv("AKM_SQLITE_JOURNAL_MODE", " delete ")
    db = open_db(tmp_path / "akm-journal.sqlite3")
    try:
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        db.close()


def test_newer_ledger_is_refused_with_upgrade_hint(tmp_path):
    path = tmp_path / "akm-journal.sqlite3"
    db = open_db(path)
    db.execute("INSERT INTO schema_migrations (id, applied_at) VALUES ('9999-from-the-future', 'x')")
    db.close()
    with pytest.raises(JournalError) as info:
        open_db(path)
    assert info.value.code == "JOURNAL_TOO_NEW"
    assert "newer version of akm" in info.value.message
    assert "Upgrade akm" in (info.value.hint or "")


def test_prefix_ledger_applies_only_pending_and_inconsistent_is_refused(tmp_path):
    m1 = ("a-1", "CREATE TABLE IF NOT EXISTS t1 (x INTEGER);")
    m2 = ("a-2", "CREATE TABLE IF NOT EXISTS t2 (y INTEGER);\nCREATE INDEX IF NOT EXISTS i2 ON t2 (y);")
    db = open_db(tmp_path / "akm-journal.sqlite3", migrate=False)
    try:
        assert apply_migrations(db, [m1]) == ["a-1"]
        assert apply_migrations(db, [m1, m2]) == ["a-2"]
        assert applied_ids(db) == ["a-1", "a-2"]
        assert apply_migrations(db, [m1, m2]) == []
        with pytest.raises(JournalError) as info:
            apply_migrations(db, [m2, m1])  # known ids, wrong order
        assert info.value.code == "JOURNAL_INCONSISTENT"
    finally:
        db.close()


def test_failed_migration_rolls_back_its_ddl_and_ledger_row(tmp_path):
    good = ("b-1", "CREATE TABLE IF NOT EXISTS ok_table (x INTEGER);")
    bad = ("b-2", "CREATE TABLE IF NOT EXISTS half_done (x INTEGER);\nINSERT INTO no_such_table VALUES (1);")
    db = open_db(tmp_path / "akm-journal.sqlite3", migrate=False)
    try:
        with pytest.raises(JournalError, match="no such table: no_such_table"):
            apply_migrations(db, [good, bad])
        assert applied_ids(db) == ["b-1"]
        tables = {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "ok_table" in tables and "half_done" not in tables
    finally:
        db.close()


def test_split_statements_keeps_multiline_statements_whole():
    parts = split_statements("CREATE TABLE a (\n x INTEGER CHECK (x IN (1,2))\n);\n\nCREATE INDEX i ON a (x);\n")
    assert len(parts) == 2 and parts[0].startswith("CREATE TABLE a") and parts[1].startswith("CREATE INDEX")
    with pytest.raises(ValueError):
        split_statements("CREATE TABLE b (x")


def test_not_a_database_becomes_journal_error(tmp_path):
    path = tmp_path / "akm-journal.sqlite3"
    path.write_bytes(b"this is definitely not sqlite" * 100)
    with pytest.raises(JournalError) as info:
        open_db(path)
    assert "akm-journal.sqlite3" in info.value.message


def test_tx_rolls_back_on_body_exception_and_reraises(tmp_path):
    db = open_db(tmp_path / "akm-journal.sqlite3")
    try:
        with pytest.raises(RuntimeError, match="boom"):
            with db.tx():
                events.append_event(db, "x", None, {})
                raise RuntimeError("boom")
        assert events.list_events(db)[0] == []
        assert not db.conn.in_transaction
    finally:
        db.close()


def test_tx_joins_outer_transaction(tmp_path):
    db = open_db(tmp_path / "akm-journal.sqlite3")
    try:
        with pytest.raises(RuntimeError):
            with db.tx():
                with db.tx():  # joins: no nested BEGIN error
                    events.append_event(db, "inner", None, {})
                events.append_event(db, "outer", None, {})
                raise RuntimeError("undo both")
        assert events.list_events(db)[0] == []
        with db.tx():
            with db.tx():
                events.append_event(db, "inner", None, {})
        assert [e.event_type for e in events.list_events(db)[0]] == ["inner"]
    finally:
        db.close()


def test_sqlite_error_in_tx_becomes_journal_error(tmp_path):
    db = open_db(tmp_path / "akm-journal.sqlite3")
    try:
        with pytest.raises(JournalError) as info:
            with db.tx() as conn:
                conn.execute("INSERT INTO nope VALUES (1)")
        assert "no such table" in info.value.message
        assert not db.conn.in_transaction
        with pytest.raises(JournalError):
            db.query("SELECT * FROM nope")
    finally:
        db.close()


def test_threads_sharing_one_database_serialize_transactions(tmp_path):
    db = open_db(tmp_path / "akm-journal.sqlite3")
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(40):
                with db.tx():
                    events.append_event(db, "tick", None, {"n": n, "i": i})
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        rows, last = events.list_events(db)
        assert len(rows) == 240 and len({e.id for e in rows}) == 240 and last == rows[-1].id
    finally:
        db.close()


def test_two_connections_wait_for_each_other(tmp_path):
    path = tmp_path / "akm-journal.sqlite3"
    a, b = open_db(path), open_db(path)
    order: list[str] = []
    try:
        started = threading.Event()

        def other() -> None:
            started.wait()
            with b.tx():
                order.append("b")
                events.append_event(b, "b", None, {})

        t = threading.Thread(target=other)
        t.start()
        with a.tx():
            started.set()
            events.append_event(a, "a", None, {})
            threading.Event().wait(0.1)  # b's BEGIN IMMEDIATE must block meanwhile
            order.append("a")
        t.join()
        assert order == ["a", "b"]
        assert [e.event_type for e in events.list_events(a)[0]] == ["a", "b"]
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ whose database is this? (issue 6 item 10)


def _upstream_like_state_db(path) -> bytes:
    """A database shaped like upstream akm's state.db: its own ledger ids and tables, DELETE journal mode."""
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE schema_migrations (id TEXT PRIMARY KEY, applied_at TEXT NOT NULL);"
        "INSERT INTO schema_migrations VALUES ('001-initial-schema', 'x'), ('020-three-db-cutover', 'y');"
        "CREATE TABLE workflow_runs (id TEXT PRIMARY KEY); CREATE TABLE proposals (id TEXT);"
    )
    con.commit()
    con.close()
    return path.read_bytes()


def test_upstream_state_db_is_foreign_and_left_untouched(tmp_path):
    path = tmp_path / "state.db"
    before = _upstream_like_state_db(path)
    with pytest.raises(JournalError) as info:
        open_db(path)
    err = info.value
    assert err.code == "JOURNAL_FOREIGN" and err.exit_status == 78
    assert "is not an akm (Python) journal" in err.message
    assert "upstream akm's state database (first migration '001-initial-schema')" in err.message
    assert "akm-journal.sqlite3" in err.hint and "AKM_DATA_DIR" in err.hint
    assert "newer version" not in err.message
    assert path.read_bytes() == before  # not switched to WAL, nothing created
    assert not (tmp_path / "state.db-wal").exists()


def test_any_other_database_with_tables_is_foreign(tmp_path):
    path = tmp_path / "akm-journal.sqlite3"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.commit()
    con.close()
    with pytest.raises(JournalError) as info:
        open_db(path)
    assert info.value.code == "JOURNAL_FOREIGN" and "(notes)" in info.value.message


def test_an_empty_sqlite_file_becomes_our_journal(tmp_path):
    path = tmp_path / "akm-journal.sqlite3"
    sqlite3.connect(path).close()
    db = open_db(path)
    try:
        assert applied_ids(db) == [mid for mid, _ in MIGRATIONS]
    finally:
        db.close()


def test_newer_akm_python_journal_is_too_new_not_foreign(tmp_path):
    path = tmp_path / "akm-journal.sqlite3"
    open_db(path).close()
    con = sqlite3.connect(path)
    con.execute("INSERT INTO schema_migrations (id, applied_at) VALUES ('0002-from-a-newer-akm', 'x')")
    con.commit()
    con.close()
    with pytest.raises(JournalError) as info:
        open_db(path)
    assert info.value.code == "JOURNAL_TOO_NEW"
    assert "written by a newer version of akm (Python)" in info.value.message


def test_the_journal_has_a_name_of_its_own_beside_upstreams_state_db(tmp_path, monkeypatch):
    from akm import api, paths

    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("AKM_DATA_DIR", str(data))
    before = _upstream_like_state_db(data / "state.db")
    project = tmp_path / "p"
    project.mkdir()
    (project / "w.md").write_text(
        '---\nsteps:\n  - id: a\n    unit: { exec: { command: ["true"] } }\n---\n\n## a\n\nx\n'
    )
    res = api.run_workflow("w.md", cwd=str(project))
    assert res.run.status == "completed"
    assert paths.journal_path() == data / "akm-journal.sqlite3" and paths.journal_path().exists()
    assert (data / "state.db").read_bytes() == before


def test_migration_0005_keeps_every_run_and_its_foreign_keys(tmp_path):
    """A journal written before `abandoned` existed: rebuilt runs table, same rows, cascades intact."""
    path = tmp_path / "state.db"
    old = open_db(path, migrate=False)
    apply_migrations(old, MIGRATIONS[:1])
    now = now_iso()
    with old.tx() as conn:
        conn.execute(
            "INSERT INTO runs (id, workflow_ref, title, status, params_json, created_at, updated_at, "
            "scope_key, plan_json, plan_hash, hash_version, lease_holder) "
            "VALUES ('r1', 'w', 't', 'active', '{\"a\":1}', ?, ?, 's', '{}', 'h', 4, 'eng')",
            (now, now),
        )
        conn.execute("INSERT INTO steps (run_id, step_id, sequence_index, status) VALUES ('r1', 'a', 0, 'pending')")
        conn.execute(
            "INSERT INTO units (run_id, unit_id, node_id, status, started_at) "
            "VALUES ('r1', 'a:solo', 'n', 'running', ?)",
            (now,),
        )
    old.close()
    db = open_db(path)
    try:
        assert "0005-run-status-abandoned" in applied_ids(db)
        row = db.query_one("SELECT * FROM runs WHERE id = 'r1'")
        assert (row["params_json"], row["lease_holder"], row["status"]) == ('{"a":1}', "eng", "active")
        assert _columns(db.conn, "runs") == EXPECTED_COLUMNS["runs"]
        with db.tx() as conn:
            conn.execute("UPDATE runs SET status = 'abandoned' WHERE id = 'r1'")
        with pytest.raises(JournalError):  # foreign keys are enforced again after the rebuild
            with db.tx() as conn:
                conn.execute(
                    "INSERT INTO steps (run_id, step_id, sequence_index, status) VALUES ('ghost', 'a', 0, 'pending')"
                )
        with db.tx() as conn:
            conn.execute("DELETE FROM runs WHERE id = 'r1'")
        assert db.query_one("SELECT count(*) AS n FROM steps")["n"] == 0  # the cascade still holds
        assert db.query_one("SELECT count(*) AS n FROM units")["n"] == 0
        indexes = {r[0] for r in db.query("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='runs'")}
        assert {"idx_runs_scope_ref_status", "idx_runs_status", "idx_runs_created"} <= indexes
    finally:
        db.close()
