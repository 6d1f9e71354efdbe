"""Numbered schema migrations and their ledger (our own schema, spec/decisions.md D2).

Rules (why: a journal must never be silently reinterpreted by the wrong akm):

* Ids are permanent and applied in registry order; each migration runs in its
  own `BEGIN IMMEDIATE` transaction and its ledger row is written in the same
  transaction, so a crash leaves either nothing or the whole step.
* The ledger re-read inside each transaction makes concurrent first opens by
  several processes safe: the loser sees the id already applied.
* The applied ids must be an exact ordered prefix of the registry. An id we do
  not know means a newer akm wrote this journal -> refuse and tell the user to
  upgrade; a known id out of order means the ledger is inconsistent -> refuse.
* Never drop, rename or retype durable columns; add new migrations instead.

Column meanings follow spec/engine.md (table names are ours: `runs`,
`steps`, `units`, `events`, `task_history`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence

from akm.errors import JournalError
from akm.paths import JOURNAL_FILE_NAME
from akm.store.clock import now_iso
from akm.store.sqlite.db import SqliteJournal

MIGRATION_0001 = """
CREATE TABLE IF NOT EXISTS runs (
    id                 TEXT PRIMARY KEY,
    workflow_ref       TEXT NOT NULL,
    workflow_path      TEXT,
    title              TEXT NOT NULL DEFAULT '',
    status             TEXT NOT NULL
                       CHECK (status IN ('active','completed','failed','blocked','awaiting_session')),
    params_json        TEXT NOT NULL DEFAULT '{}',
    current_step_id    TEXT,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL,
    completed_at       TEXT,
    scope_key          TEXT NOT NULL,
    plan_json          TEXT NOT NULL,
    plan_hash          TEXT NOT NULL,
    hash_version       INTEGER NOT NULL,
    lease_holder       TEXT,
    lease_host         TEXT,
    lease_pid          INTEGER,
    lease_until        TEXT,
    status_detail_json TEXT
);
CREATE INDEX IF NOT EXISTS idx_runs_scope_ref_status ON runs (scope_key, workflow_ref, status);
CREATE INDEX IF NOT EXISTS idx_runs_status ON runs (status);
CREATE INDEX IF NOT EXISTS idx_runs_created ON runs (created_at);

CREATE TABLE IF NOT EXISTS steps (
    run_id          TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step_id         TEXT NOT NULL,
    sequence_index  INTEGER NOT NULL,
    status          TEXT NOT NULL
                    CHECK (status IN ('pending','running','completed','failed','skipped','blocked')),
    notes           TEXT,
    evidence_json   TEXT,
    summary         TEXT,
    completed_at    TEXT,
    PRIMARY KEY (run_id, step_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_steps_run_sequence ON steps (run_id, sequence_index);

CREATE TABLE IF NOT EXISTS units (
    run_id            TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    unit_id           TEXT NOT NULL,
    step_id           TEXT,
    node_id           TEXT NOT NULL,
    parent_unit_id    TEXT,
    phase             TEXT CHECK (phase IS NULL OR phase = 'gate'),
    runner            TEXT,
    engine            TEXT,
    model             TEXT,
    status            TEXT NOT NULL CHECK (status IN ('running','completed','failed')),
    input_hash        TEXT,
    result_json       TEXT,
    tokens            INTEGER,
    failure_reason    TEXT,
    worktree_path     TEXT,
    started_at        TEXT NOT NULL,
    finished_at       TEXT,
    session_id        TEXT,
    last_checkin_at   TEXT,
    attempts          INTEGER NOT NULL DEFAULT 1,
    claim_holder      TEXT,
    claim_host        TEXT,
    claim_pid         INTEGER,
    claim_expires_at  TEXT,
    PRIMARY KEY (run_id, unit_id)
);
CREATE INDEX IF NOT EXISTS idx_units_run_step ON units (run_id, step_id);

CREATE TABLE IF NOT EXISTS events (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    event_type     TEXT NOT NULL,
    ts             TEXT NOT NULL,
    run_id         TEXT,
    metadata_json  TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS idx_events_run ON events (run_id, id);
CREATE INDEX IF NOT EXISTS idx_events_type ON events (event_type);
CREATE INDEX IF NOT EXISTS idx_events_ts ON events (ts);

CREATE TABLE IF NOT EXISTS task_history (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id         TEXT,
    started_at     TEXT NOT NULL,
    finished_at    TEXT,
    outcome        TEXT NOT NULL,
    metadata_json  TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS idx_task_history_run ON task_history (run_id);
CREATE INDEX IF NOT EXISTS idx_task_history_started ON task_history (started_at);
"""

# D7: `resume` of a step whose last gate loop was rejected gives it a fresh loop budget.
# Gate loops are derived from the journal (1 + the highest rejected loop), so the step
# remembers how many loops were consumed before the resume.
MIGRATION_0003 = """
ALTER TABLE steps ADD COLUMN gate_loop_base INTEGER NOT NULL DEFAULT 0;
"""

# A unit's stdout was cut at the capture cap: its artifact is the kept beginning.
MIGRATION_0004 = """
ALTER TABLE units ADD COLUMN truncated INTEGER NOT NULL DEFAULT 0;
"""

# 0005: runs may be `abandoned` — final, unlike `failed` (which `resume` reopens). SQLite cannot
# alter a CHECK constraint, so the table is rebuilt (SQLite's documented 12-step procedure: the
# runner turns foreign keys off around it, so dropping the old table cascades nothing, and checks
# `foreign_key_check` before committing). Columns, order and indexes are unchanged.
MIGRATION_0005 = """
CREATE TABLE runs_0005 (
    id                 TEXT PRIMARY KEY,
    workflow_ref       TEXT NOT NULL,
    workflow_path      TEXT,
    title              TEXT NOT NULL DEFAULT '',
    status             TEXT NOT NULL
                       CHECK (status IN ('active','completed','failed','blocked','awaiting_session','abandoned')),
    params_json        TEXT NOT NULL DEFAULT '{}',
    current_step_id    TEXT,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL,
    completed_at       TEXT,
    scope_key          TEXT NOT NULL,
    plan_json          TEXT NOT NULL,
    plan_hash          TEXT NOT NULL,
    hash_version       INTEGER NOT NULL,
    lease_holder       TEXT,
    lease_host         TEXT,
    lease_pid          INTEGER,
    lease_until        TEXT,
    status_detail_json TEXT
);
INSERT INTO runs_0005 SELECT id, workflow_ref, workflow_path, title, status, params_json, current_step_id,
    created_at, updated_at, completed_at, scope_key, plan_json, plan_hash, hash_version, lease_holder,
    lease_host, lease_pid, lease_until, status_detail_json FROM runs;
DROP TABLE runs;
ALTER TABLE runs_0005 RENAME TO runs;
CREATE INDEX IF NOT EXISTS idx_runs_scope_ref_status ON runs (scope_key, workflow_ref, status);
CREATE INDEX IF NOT EXISTS idx_runs_status ON runs (status);
CREATE INDEX IF NOT EXISTS idx_runs_created ON runs (created_at);
"""

# 0006: no query of akm's reads events by type or by time alone — every one filters on the event id
# range (`ORDER BY id`, paging by offset) or on the run (`idx_events_run`), which is what SQLite's plans
# use — yet each of these two indexes cost every unit's transaction a b-tree insert and a page write
# (about a fifth of its time). Dropped; nothing else changes.
MIGRATION_0006 = """
DROP INDEX IF EXISTS idx_events_type;
DROP INDEX IF EXISTS idx_events_ts;
"""

# 0007: the lease's fencing counter (spec/engine.md). Bumped by every acquisition of the run lease by a
# new holder; a driver's unit inserts, unit finishes and spine writes commit only while the run still
# carries its (holder, epoch), so a driver that lost the lease (stopped past its TTL, then continued)
# can neither start a unit nor journal one over the new holder's.
MIGRATION_0007 = """
ALTER TABLE runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
"""

# 0008: a session unit the agent reported failed for good fails its step; resuming the run reopens it
# (`reopened = 1` on its failed row), so the brief offers it again (`action: rerun`) instead of the step
# failing again on every resume. A re-dispatch (a new attempt) clears it.
MIGRATION_0008 = """
ALTER TABLE units ADD COLUMN reopened INTEGER NOT NULL DEFAULT 0;
"""

# 0009: phase 2 of a shared journal (`akm worker`, spec/journal.md "Workers"). A unit the coordinator hands
# to workers is journaled `queued` (committed before any worker can see it, as a `running` row is before
# a local dispatch) with what a worker needs to run it (`dispatch_json`: the prompt or the exec context,
# never a secret) and when it was queued; a worker's claim turns it `running`. `host` records where each
# attempt ran (the driver's or the worker's host), kept after the claim is released. SQLite cannot alter a
# CHECK constraint, so the table is rebuilt; no table references `units`, so foreign keys stay on.
MIGRATION_0009 = """
CREATE TABLE units_0009 (
    run_id            TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    unit_id           TEXT NOT NULL,
    step_id           TEXT,
    node_id           TEXT NOT NULL,
    parent_unit_id    TEXT,
    phase             TEXT CHECK (phase IS NULL OR phase = 'gate'),
    runner            TEXT,
    engine            TEXT,
    model             TEXT,
    status            TEXT NOT NULL CHECK (status IN ('queued','running','completed','failed')),
    input_hash        TEXT,
    result_json       TEXT,
    tokens            INTEGER,
    failure_reason    TEXT,
    worktree_path     TEXT,
    started_at        TEXT NOT NULL,
    finished_at       TEXT,
    session_id        TEXT,
    last_checkin_at   TEXT,
    attempts          INTEGER NOT NULL DEFAULT 1,
    claim_holder      TEXT,
    claim_host        TEXT,
    claim_pid         INTEGER,
    claim_expires_at  TEXT,
    truncated         INTEGER NOT NULL DEFAULT 0,
    reopened          INTEGER NOT NULL DEFAULT 0,
    queued_at         TEXT,
    host              TEXT,
    dispatch_json     TEXT,
    PRIMARY KEY (run_id, unit_id)
);
INSERT INTO units_0009 (run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner, engine, model, status,
    input_hash, result_json, tokens, failure_reason, worktree_path, started_at, finished_at, session_id,
    last_checkin_at, attempts, claim_holder, claim_host, claim_pid, claim_expires_at, truncated, reopened)
    SELECT run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner, engine, model, status,
    input_hash, result_json, tokens, failure_reason, worktree_path, started_at, finished_at, session_id,
    last_checkin_at, attempts, claim_holder, claim_host, claim_pid, claim_expires_at, truncated, reopened
    FROM units;
DROP TABLE units;
ALTER TABLE units_0009 RENAME TO units;
CREATE INDEX IF NOT EXISTS idx_units_run_step ON units (run_id, step_id);
CREATE INDEX IF NOT EXISTS idx_units_queue ON units (run_id, step_id, queued_at) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS idx_units_claimed ON units (claim_expires_at) WHERE status = 'running' AND queued_at IS NOT NULL;
"""

# 0010: going back without losing anything (spec/engine.md "Rewind and reuse"). A rewind reopens a step
# and every later one: the step rows it reopens are copied to `superseded_steps` and the unit and gate rows of
# those steps move, unchanged, to `superseded_units` — each marked with the rewind (`rewinds`) that superseded
# it, never deleted. `reusable = 1` marks a superseded completed row the engine may restore when it meets the
# same unit (same content id and input hash) again. `units.reused_from` names the row a restored unit was
# copied from (no process ran for it); `runs.reuse_from` is the run `workflow run FILE --from RUN` reuses.
# `superseded_units` holds every column of `units` (a later migration adding one to `units` adds it here too;
# tests/test_rewind.py checks the two agree).
MIGRATION_0010 = """
ALTER TABLE runs ADD COLUMN reuse_from TEXT;
ALTER TABLE units ADD COLUMN reused_from TEXT;
CREATE TABLE IF NOT EXISTS rewinds (
    id            TEXT PRIMARY KEY,
    run_id        TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    seq           INTEGER NOT NULL,
    to_step       TEXT NOT NULL,
    redo_json     TEXT,
    from_status   TEXT NOT NULL,
    from_step     TEXT,
    created_at    TEXT NOT NULL,
    lease_epoch   INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS idx_rewinds_run_seq ON rewinds (run_id, seq);
CREATE TABLE IF NOT EXISTS superseded_steps (
    rewind_id       TEXT NOT NULL REFERENCES rewinds (id) ON DELETE CASCADE,
    run_id          TEXT NOT NULL,
    step_id         TEXT NOT NULL,
    sequence_index  INTEGER NOT NULL,
    status          TEXT NOT NULL,
    notes           TEXT,
    evidence_json   TEXT,
    summary         TEXT,
    completed_at    TEXT,
    gate_loop_base  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (rewind_id, step_id)
);
CREATE INDEX IF NOT EXISTS idx_superseded_steps_run ON superseded_steps (run_id);
CREATE TABLE IF NOT EXISTS superseded_units (
    rewind_id         TEXT NOT NULL REFERENCES rewinds (id) ON DELETE CASCADE,
    reusable          INTEGER NOT NULL DEFAULT 0,
    run_id            TEXT NOT NULL,
    unit_id           TEXT NOT NULL,
    step_id           TEXT,
    node_id           TEXT NOT NULL,
    parent_unit_id    TEXT,
    phase             TEXT,
    runner            TEXT,
    engine            TEXT,
    model             TEXT,
    status            TEXT NOT NULL,
    input_hash        TEXT,
    result_json       TEXT,
    tokens            INTEGER,
    failure_reason    TEXT,
    worktree_path     TEXT,
    started_at        TEXT NOT NULL,
    finished_at       TEXT,
    session_id        TEXT,
    last_checkin_at   TEXT,
    attempts          INTEGER NOT NULL DEFAULT 1,
    claim_holder      TEXT,
    claim_host        TEXT,
    claim_pid         INTEGER,
    claim_expires_at  TEXT,
    truncated         INTEGER NOT NULL DEFAULT 0,
    reopened          INTEGER NOT NULL DEFAULT 0,
    queued_at         TEXT,
    host              TEXT,
    dispatch_json     TEXT,
    reused_from       TEXT,
    PRIMARY KEY (rewind_id, unit_id)
);
CREATE INDEX IF NOT EXISTS idx_superseded_units_step ON superseded_units (run_id, step_id);
"""

# 0011: what each attempt cost in US dollars (its usage times its engine's prices, spec/engine.md "Budgets");
# NULL when unknown or not a model call. `superseded_units` keeps every column of `units`.
MIGRATION_0011 = """
ALTER TABLE units ADD COLUMN cost REAL;
ALTER TABLE superseded_units ADD COLUMN cost REAL;
"""

# (id, sql). Append only; never edit an entry that has shipped.
MIGRATIONS: list[tuple[str, str]] = [
    ("0001-initial-schema", MIGRATION_0001),
    ("0003-step-gate-loop-base", MIGRATION_0003),
    ("0004-unit-output-truncated", MIGRATION_0004),
    ("0005-run-status-abandoned", MIGRATION_0005),
    ("0006-drop-unused-event-indexes", MIGRATION_0006),
    ("0007-lease-epoch", MIGRATION_0007),
    ("0008-unit-reopened", MIGRATION_0008),
    ("0009-unit-queue", MIGRATION_0009),
    ("0010-rewind-history", MIGRATION_0010),
    ("0011-unit-cost", MIGRATION_0011),
]

# Migrations that rebuild a table other tables reference: run with foreign keys off (a pragma that
# only takes effect outside a transaction), then verified with `PRAGMA foreign_key_check`.
REBUILDS_REFERENCED_TABLE = frozenset({"0005-run-status-abandoned"})

LEDGER_DDL = "CREATE TABLE IF NOT EXISTS schema_migrations (id TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"


def split_statements(sql: str) -> list[str]:
    """Split a script into complete statements (executescript would COMMIT our transaction)."""
    statements: list[str] = []
    buf = ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                statements.append(buf.strip())
            buf = ""
    if buf.strip():
        raise ValueError(f"incomplete SQL statement in migration: {buf.strip()[:80]!r}")
    return statements


def _ledger_exists(db: SqliteJournal) -> bool:
    row = db.query_one("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_migrations'")
    return row is not None


def applied_ids(db: SqliteJournal) -> list[str]:
    """Ledger ids in the order they were applied (empty for a fresh file)."""
    if not _ledger_exists(db):
        return []
    return [r["id"] for r in db.query("SELECT id FROM schema_migrations ORDER BY rowid")]


_UPSTREAM_ID = re.compile(r"^\d{3}-")


def refuse_foreign(
    conn: sqlite3.Connection, path: object = None, registry: Sequence[tuple[str, str]] | None = None
) -> None:
    """Raise `JOURNAL_FOREIGN` unless the file is empty or an akm (Python) journal.

    Ours means: a `schema_migrations` ledger whose first applied id is one of our
    migration ids (ids are permanent and applied in order, so every journal we
    ever wrote starts with our first one — a newer akm's included, which
    `check_ledger` then refuses as too new). Anything else holding tables is some
    other program's database — upstream akm keeps a `state.db` with its own
    ledger (`001-initial-schema`, …) — and is neither read nor modified: this
    check runs before akm sets any pragma that would change the file.
    """
    registry = MIGRATIONS if registry is None else registry
    tables = sorted(
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")
    )
    if not tables:
        return
    applied: list[str] = []
    if "schema_migrations" in tables:
        try:
            applied = [r[0] for r in conn.execute("SELECT id FROM schema_migrations ORDER BY rowid LIMIT 1")]
        except sqlite3.Error:
            applied = []
        if not applied and tables == ["schema_migrations"]:
            return  # an empty ledger and nothing else: nothing to protect
    if applied and applied[0] in {mid for mid, _ in registry}:
        return
    where = f" {path}" if path is not None else ""
    shown = ", ".join(tables[:6]) + (", …" if len(tables) > 6 else "")
    looks_like = ""
    if applied and isinstance(applied[0], str) and _UPSTREAM_ID.match(applied[0]):
        looks_like = f" It looks like upstream akm's state database (first migration {applied[0]!r})."
    from akm.codes import Code

    raise JournalError(
        f"the file{where} is not an akm (Python) journal: it holds tables ({shown}) that akm did not create, "
        f"so akm will neither read nor change it.{looks_like}",
        code=Code.JOURNAL_FOREIGN,
        hint=f"akm keeps its journal in its own file, {JOURNAL_FILE_NAME}, in its data directory "
        "(AKM_DATA_DIR, else the per-user data directory); move this file away or point AKM_DATA_DIR "
        "at another directory.",
    )


def check_ledger(applied: Sequence[str], registry: Sequence[tuple[str, str]], path: object = None) -> str:
    """Classify the ledger: "current" | "old" (pending remain); raise JournalError for newer/inconsistent."""
    known = [mid for mid, _ in registry]
    where = f" at {path}" if path is not None else ""
    unknown = [a for a in applied if a not in known]
    if unknown:
        from akm.codes import Code

        raise JournalError(
            f"the akm journal{where} was written by a newer version of akm (Python) "
            f"(unknown schema migration {unknown[0]!r})",
            code=Code.JOURNAL_TOO_NEW,
            hint="Upgrade akm to a version that knows this schema, or point AKM_DATA_DIR elsewhere.",
        )
    if list(applied) != known[: len(applied)]:
        from akm.codes import Code

        raise JournalError(
            f"the akm journal{where} has an inconsistent migration ledger "
            f"(applied {list(applied)!r}, expected a prefix of {known!r})",
            code=Code.JOURNAL_INCONSISTENT,
            hint="The state database was modified outside akm; restore a backup or use a fresh AKM_DATA_DIR.",
        )
    return "current" if len(applied) == len(known) else "old"


def apply_migrations(db: SqliteJournal, registry: Sequence[tuple[str, str]] | None = None) -> list[str]:
    """Apply pending migrations, each in its own transaction. Returns the ids applied now."""
    registry = MIGRATIONS if registry is None else registry
    with db.lock:
        refuse_foreign(db.conn, db.path, registry)
    if check_ledger(applied_ids(db), registry, db.path) == "current":
        return []
    done: list[str] = []
    for mid, sql in registry:
        rebuild = mid in REBUILDS_REFERENCED_TABLE
        if rebuild:
            db.execute("PRAGMA foreign_keys=OFF")
        try:
            with db.tx() as conn:
                conn.execute(LEDGER_DDL)
                applied = [r[0] for r in conn.execute("SELECT id FROM schema_migrations ORDER BY rowid")]
                check_ledger(applied, registry, db.path)
                if mid in applied:
                    continue
                for statement in split_statements(sql):
                    conn.execute(statement)
                if rebuild and conn.execute("PRAGMA foreign_key_check").fetchone() is not None:
                    raise JournalError(
                        f"schema migration {mid} of {db.path} would break foreign keys; nothing was changed"
                    )
                conn.execute("INSERT INTO schema_migrations (id, applied_at) VALUES (?, ?)", (mid, now_iso()))
            done.append(mid)
        finally:
            if rebuild:
                db.execute("PRAGMA foreign_keys=ON")
    return done
