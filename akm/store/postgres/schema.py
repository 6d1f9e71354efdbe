"""The PostgreSQL journal's schema: the same migration ids as the SQLite journal, applied under an advisory lock.

Why the same ids: the ledger is how akm refuses a journal written by a newer akm (`JOURNAL_TOO_NEW`) or by
another program (`JOURNAL_FOREIGN`); sharing the ids lets `check_ledger` judge both backends by one rule. The
statements differ (spec/journal.md): `timestamptz(3)` (milliseconds, the precision of akm's stamps,
so a stamp read back as text compares equal to the stored value) compared with the server's `now()`, identity
columns for `rowid`/AUTOINCREMENT, `COLLATE "C"` where ordering must stay byte-wise as on SQLite, JSON kept
as text (jsonb rejects \\u0000), and 0005 as a constraint swap instead of a table rebuild. PostgreSQL DDL
is transactional, so each migration and its ledger row commit together; concurrent first opens by several
processes are serialized by `pg_advisory_lock(4242, 1)`.
"""

from __future__ import annotations

from typing import Any

from akm.codes import Code
from akm.errors import JournalError
from akm.store.migrations import check_ledger
from akm.store.postgres import wire
from akm.store.postgres.connect import STATEMENT_TIMEOUT_S

MIGRATION_LOCK = (4242, 1)
MIGRATION_SOCKET_TIMEOUT_S = 1800.0

PG_0001 = """
CREATE TABLE {s}.runs (
    id                 text COLLATE "C" PRIMARY KEY,
    seq                bigint GENERATED ALWAYS AS IDENTITY,
    workflow_ref       text COLLATE "C" NOT NULL,
    workflow_path      text,
    title              text NOT NULL DEFAULT '',
    status             text NOT NULL,
    params_json        text NOT NULL DEFAULT '{{}}',
    params_hash        text NOT NULL DEFAULT '',
    current_step_id    text COLLATE "C",
    created_at         timestamptz(3) NOT NULL DEFAULT now(),
    updated_at         timestamptz(3) NOT NULL DEFAULT now(),
    completed_at       timestamptz(3),
    scope_key          text COLLATE "C" NOT NULL,
    plan_json          text NOT NULL,
    plan_hash          text NOT NULL,
    hash_version       integer NOT NULL,
    lease_holder       text,
    lease_host         text,
    lease_pid          integer,
    lease_until        timestamptz(3),
    lease_session      integer,
    lease_liveness     text,
    lease_renewed_at   timestamptz(3),
    status_detail_json text,
    CONSTRAINT runs_status_check
        CHECK (status IN ('active','completed','failed','blocked','awaiting_session'))
);
CREATE INDEX idx_runs_scope_ref_status ON {s}.runs (scope_key, workflow_ref, status);
CREATE INDEX idx_runs_status ON {s}.runs (status);
CREATE INDEX idx_runs_created ON {s}.runs (created_at, seq);
CREATE TABLE {s}.steps (
    run_id          text COLLATE "C" NOT NULL REFERENCES {s}.runs (id) ON DELETE CASCADE,
    step_id         text COLLATE "C" NOT NULL,
    sequence_index  integer NOT NULL,
    status          text NOT NULL
                    CHECK (status IN ('pending','running','completed','failed','skipped','blocked')),
    notes           text,
    evidence_json   text,
    summary         text,
    completed_at    timestamptz(3),
    PRIMARY KEY (run_id, step_id)
);
CREATE UNIQUE INDEX idx_steps_run_sequence ON {s}.steps (run_id, sequence_index);
CREATE TABLE {s}.units (
    run_id            text COLLATE "C" NOT NULL REFERENCES {s}.runs (id) ON DELETE CASCADE,
    unit_id           text COLLATE "C" NOT NULL,
    seq               bigint GENERATED ALWAYS AS IDENTITY,
    step_id           text COLLATE "C",
    node_id           text NOT NULL,
    parent_unit_id    text,
    phase             text CHECK (phase IS NULL OR phase = 'gate'),
    runner            text,
    engine            text,
    model             text,
    status            text NOT NULL CHECK (status IN ('running','completed','failed')),
    input_hash        text,
    result_json       text,
    tokens            bigint,
    failure_reason    text,
    worktree_path     text,
    started_at        timestamptz(3) NOT NULL DEFAULT now(),
    finished_at       timestamptz(3),
    session_id        text,
    last_checkin_at   timestamptz(3),
    attempts          integer NOT NULL DEFAULT 1,
    claim_holder      text,
    claim_host        text,
    claim_pid         integer,
    claim_expires_at  timestamptz(3),
    claim_session     integer,
    PRIMARY KEY (run_id, unit_id)
) WITH (fillfactor = 85);
CREATE INDEX idx_units_run_step ON {s}.units (run_id, step_id);
CREATE TABLE {s}.events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_type     text NOT NULL,
    ts             timestamptz(3) NOT NULL DEFAULT now(),
    run_id         text COLLATE "C",
    metadata_json  text NOT NULL DEFAULT '{{}}'
);
CREATE INDEX idx_events_run ON {s}.events (run_id, id);
CREATE INDEX idx_events_type ON {s}.events (event_type);
CREATE INDEX idx_events_ts ON {s}.events (ts);
CREATE TABLE {s}.task_history (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id         text,
    started_at     timestamptz(3) NOT NULL DEFAULT now(),
    finished_at    timestamptz(3),
    outcome        text NOT NULL,
    metadata_json  text NOT NULL DEFAULT '{{}}'
);
CREATE INDEX idx_task_history_run ON {s}.task_history (run_id);
CREATE INDEX idx_task_history_started ON {s}.task_history (started_at);
"""

# (id, sql): the ids of akm.store.migrations.MIGRATIONS, in the same order. Append only.
PG_MIGRATIONS: list[tuple[str, str]] = [
    ("0001-initial-schema", PG_0001),
    ("0003-step-gate-loop-base", "ALTER TABLE {s}.steps ADD COLUMN gate_loop_base integer NOT NULL DEFAULT 0;"),
    ("0004-unit-output-truncated", "ALTER TABLE {s}.units ADD COLUMN truncated integer NOT NULL DEFAULT 0;"),
    (
        "0005-run-status-abandoned",
        "ALTER TABLE {s}.runs DROP CONSTRAINT runs_status_check, ADD CONSTRAINT runs_status_check"
        " CHECK (status IN ('active','completed','failed','blocked','awaiting_session','abandoned'));",
    ),
    (
        "0006-drop-unused-event-indexes",
        "DROP INDEX IF EXISTS {s}.idx_events_type;\nDROP INDEX IF EXISTS {s}.idx_events_ts;",
    ),
    ("0007-lease-epoch", "ALTER TABLE {s}.runs ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0;"),
    ("0008-unit-reopened", "ALTER TABLE {s}.units ADD COLUMN reopened integer NOT NULL DEFAULT 0;"),
    (
        "0009-unit-queue",
        "ALTER TABLE {s}.units DROP CONSTRAINT units_status_check, ADD CONSTRAINT units_status_check"
        " CHECK (status IN ('queued','running','completed','failed')),"
        " ADD COLUMN queued_at timestamptz(3), ADD COLUMN host text, ADD COLUMN dispatch_json text;\n"
        "CREATE INDEX idx_units_queue ON {s}.units (run_id, step_id, queued_at) WHERE status = 'queued';\n"
        "CREATE INDEX idx_units_claimed ON {s}.units (claim_expires_at)"
        " WHERE status = 'running' AND queued_at IS NOT NULL;",
    ),
    (
        "0010-rewind-history",
        "ALTER TABLE {s}.runs ADD COLUMN reuse_from text;\n"
        "ALTER TABLE {s}.units ADD COLUMN reused_from text;\n"
        'CREATE TABLE {s}.rewinds (id text COLLATE "C" PRIMARY KEY,'
        ' run_id text COLLATE "C" NOT NULL REFERENCES {s}.runs (id) ON DELETE CASCADE,'
        ' seq integer NOT NULL, to_step text COLLATE "C" NOT NULL, redo_json text, from_status text NOT NULL,'
        " from_step text, created_at timestamptz(3) NOT NULL DEFAULT now(), lease_epoch bigint NOT NULL);\n"
        "CREATE UNIQUE INDEX idx_rewinds_run_seq ON {s}.rewinds (run_id, seq);\n"
        'CREATE TABLE {s}.superseded_steps (rewind_id text COLLATE "C" NOT NULL'
        ' REFERENCES {s}.rewinds (id) ON DELETE CASCADE, run_id text COLLATE "C" NOT NULL,'
        ' step_id text COLLATE "C" NOT NULL, sequence_index integer NOT NULL, status text NOT NULL, notes text,'
        " evidence_json text, summary text, completed_at timestamptz(3), gate_loop_base integer NOT NULL DEFAULT 0,"
        " PRIMARY KEY (rewind_id, step_id));\n"
        "CREATE INDEX idx_superseded_steps_run ON {s}.superseded_steps (run_id);\n"
        'CREATE TABLE {s}.superseded_units (rewind_id text COLLATE "C" NOT NULL'
        " REFERENCES {s}.rewinds (id) ON DELETE CASCADE, reusable integer NOT NULL DEFAULT 0,"
        ' run_id text COLLATE "C" NOT NULL, unit_id text COLLATE "C" NOT NULL, step_id text COLLATE "C",'
        " node_id text NOT NULL, parent_unit_id text, phase text, runner text, engine text, model text,"
        " status text NOT NULL, input_hash text, result_json text, tokens bigint, failure_reason text,"
        " worktree_path text, started_at timestamptz(3) NOT NULL, finished_at timestamptz(3), session_id text,"
        " last_checkin_at timestamptz(3), attempts integer NOT NULL DEFAULT 1, claim_holder text, claim_host text,"
        " claim_pid integer, claim_expires_at timestamptz(3), truncated integer NOT NULL DEFAULT 0,"
        " reopened integer NOT NULL DEFAULT 0, queued_at timestamptz(3), host text, dispatch_json text,"
        " reused_from text, PRIMARY KEY (rewind_id, unit_id));\n"
        "CREATE INDEX idx_superseded_units_step ON {s}.superseded_units (run_id, step_id);",
    ),
    (
        "0011-unit-cost",
        "ALTER TABLE {s}.units ADD COLUMN cost double precision;\n"
        "ALTER TABLE {s}.superseded_units ADD COLUMN cost double precision;",
    ),
]

LEDGER_DDL = (
    "CREATE TABLE IF NOT EXISTS {s}.schema_migrations (seq integer PRIMARY KEY, id text UNIQUE NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
)


def _tables(con: Any, schema: str) -> list[str]:
    rows = wire.query(
        con, "SELECT table_name FROM information_schema.tables WHERE table_schema = :s ORDER BY table_name", s=schema
    )
    return [r[0] for r in rows]


def applied_ids(con: Any, schema: str) -> list[str]:
    """Ledger ids in the order they were applied (empty when the schema holds no ledger)."""
    if "schema_migrations" not in _tables(con, schema):
        return []
    return [r[0] for r in con.run(f"SELECT id FROM {schema}.schema_migrations ORDER BY seq")]


def refuse_foreign(con: Any, schema: str, shown: str, registry: list[tuple[str, str]]) -> None:
    """`JOURNAL_FOREIGN` unless the schema is empty or holds an akm ledger whose first id is ours."""
    tables = _tables(con, schema)
    if not tables or tables == ["schema_migrations"] and not applied_ids(con, schema):
        return
    applied = applied_ids(con, schema)
    if applied and applied[0] in {mid for mid, _ in registry}:
        return
    raise JournalError(
        f"the schema {schema!r} of {shown} is not an akm journal: it holds tables ({', '.join(tables[:6])}) that "
        "akm did not create, so akm will neither read nor change it.",
        code=Code.JOURNAL_FOREIGN,
        hint="Point the journal URL at another database, or choose another schema with ?schema=NAME.",
    )


def apply_migrations(
    con: Any, schema: str, shown: str = "the journal server", registry: list[tuple[str, str]] | None = None
) -> list[str]:
    """Apply the pending migrations (each with its ledger row in one transaction). Returns the ids applied now."""
    registry = PG_MIGRATIONS if registry is None else registry
    applied = applied_ids(con, schema)
    if applied and applied[0] in {mid for mid, _ in registry} and check_ledger(applied, registry, shown) == "current":
        return []  # the common open: an up-to-date journal of ours needs neither the lock nor a foreign check
    wire.query(con, "SELECT pg_advisory_lock(:a, :b)", a=MIGRATION_LOCK[0], b=MIGRATION_LOCK[1])
    # A migration may rewrite a big table: the session's statement_timeout does not apply to it and the socket's
    # read timeout (connect.py) is half an hour (a stall still ends); lock_timeout still applies.
    timeout = con._usock.gettimeout()
    con._usock.settimeout(MIGRATION_SOCKET_TIMEOUT_S)
    con.run("SET statement_timeout = 0")
    try:
        refuse_foreign(con, schema, shown, registry)
        if check_ledger(applied_ids(con, schema), registry, shown) == "current":
            return []
        done: list[str] = []
        con.run("BEGIN")
        try:
            con.run(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            con.run(LEDGER_DDL.format(s=schema))
            con.run("COMMIT")
        except BaseException:
            con.run("ROLLBACK")
            raise
        for seq, (mid, sql) in enumerate(registry, start=1):
            if mid in applied_ids(con, schema):
                continue
            con.run("BEGIN")
            try:
                for statement in (s.strip() for s in sql.format(s=schema).split(";")):
                    if statement:
                        con.run(statement)
                wire.query(con, f"INSERT INTO {schema}.schema_migrations (seq, id) VALUES (:q, :i)", q=seq, i=mid)
                con.run("COMMIT")
            except BaseException:
                con.run("ROLLBACK")
                raise
            done.append(mid)
        return done
    finally:
        wire.query(con, "SELECT pg_advisory_unlock(:a, :b)", a=MIGRATION_LOCK[0], b=MIGRATION_LOCK[1])
        con.run(f"SET statement_timeout = '{STATEMENT_TIMEOUT_S}s'")
        con._usock.settimeout(timeout)
