"""The per-unit writes of a fan-out over workers, each as ONE statement on PostgreSQL.

Why: across a network every statement is a round trip, and a transaction written the portable way
(`store/queue.py` on SQLite) costs one per step of it — BEGIN, the run-row lock, reading the run, the
journal's clock, the write, the event lock, the event, COMMIT — paid back to back while the run row and the
global event lock are held. Here each write is one statement in its own implicit transaction: a chain of
CTEs locks the run row, reads the journal's clock (`clock_timestamp()`, after the lock), decides, writes the
rows and appends the events, and the server commits it as soon as it ran; the locks are held for no round
trip at all. The rules are exactly those of the portable forms in `store/queue.py` (its docstrings are the
spec; the shared tests run both), in the same lock order (run row, unit rows, event lock), so the two can
be mixed on one journal:

* `queue_units`: many attempts of one run, fenced by the coordinator's lease, in one statement, with the NOTIFY
  that wakes idle workers;
* `claim_units`: up to N queued units over several (run, step) pairs a worker may run, `SKIP LOCKED`, with
  their `workflow_unit_started` events;
* `finish_claimed`: a worker's outcome, fenced by its claim token, with `workflow_unit_finished` and the
  NOTIFY that wakes the coordinator (a NOTIFY takes a global lock at commit, but so does the event lock the
  statement already holds; on its own connection it was one round trip more per unit);
* `finish_and_claim`: the two above as one statement, for the slot the finish frees (a worker paid the finish
  and its next claim back to back);
* `write_attempts`: a local driver's finishes and next inserts of one run, with their events;
* `finished_rows`: the coordinator's read of the rows its waiting units finished, one statement text whatever
  their number (the ids as one JSON array: with a placeholder per id, each count was a statement of its own,
  parsed and planned anew on each connection, and holding one of its prepared-statement slots);
* `take_free_lease`: a driver taking the lease nobody holds, with the epoch its fence needs;
* `renew_lease`: a driver's lease renewal, its expiry on the journal clock read in the statement itself (the
  portable form is a transaction around a clock read and the update: four round trips at each step's start and
  each heartbeat).

Values travel as one JSON parameter where a statement takes many rows (`json_to_recordset`); each text value
is first made bindable as any parameter is (`clean_param`: NUL escaped, lone surrogates refused) and the JSON
is ASCII, so nothing in it is escaped twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from akm.store.postgres.db import EVENT_LOCK, clean_param
from akm.store.status import DRIVABLE_STATUSES

_DRIVABLE = "(" + ",".join(f"'{s}'" for s in DRIVABLE_STATUSES) + ")"
_NOW = "date_trunc('milliseconds', clock_timestamp())"  # the journal clock at the precision of its stamps
_EVENT_LOCK = f"pg_advisory_xact_lock({EVENT_LOCK[0]}, {EVENT_LOCK[1]})"


def rows_json(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as one JSON parameter (ASCII; text values made bindable first, see the module doc)."""
    return json.dumps([{k: clean_param(v) for k, v in row.items()} for row in rows], ensure_ascii=True)


QUEUE_UNITS = f"""
WITH run AS MATERIALIZED (
    SELECT status, lease_holder, lease_epoch FROM runs WHERE id = ? FOR KEY SHARE
), ok AS MATERIALIZED (
    SELECT {_NOW} AS now FROM run WHERE status IN {_DRIVABLE} AND lease_holder = ? AND lease_epoch = ?::bigint
), want AS MATERIALIZED (
    SELECT * FROM json_to_recordset(?::json) AS w(unit_id text, step_id text, node_id text, parent_unit_id text,
        runner text, engine text, model text, input_hash text, dispatch_json text)
), cur AS MATERIALIZED (
    SELECT u.unit_id, u.status, u.queued_at, u.claim_holder, u.claim_host, u.claim_pid, u.claim_expires_at
    FROM units u WHERE u.run_id = $1 AND u.unit_id IN (SELECT unit_id FROM want) AND EXISTS (SELECT 1 FROM ok)
    ORDER BY u.unit_id FOR UPDATE OF u
), put AS (
    INSERT INTO units (run_id, unit_id, step_id, node_id, parent_unit_id, runner, engine, model, status,
        input_hash, started_at, queued_at, attempts, dispatch_json)
    SELECT $1, w.unit_id, w.step_id, w.node_id, w.parent_unit_id, w.runner, w.engine, w.model, 'queued',
        w.input_hash, ok.now, ok.now, 0, w.dispatch_json
    FROM want w CROSS JOIN ok
    WHERE NOT EXISTS (
        SELECT 1 FROM cur c WHERE c.unit_id = w.unit_id AND (c.status IN ('completed', 'queued') OR (
            c.status = 'running' AND c.queued_at IS NOT NULL AND c.claim_holder IS NOT NULL
            AND c.claim_expires_at >= ok.now)))
    ON CONFLICT (run_id, unit_id) DO UPDATE SET step_id = excluded.step_id, node_id = excluded.node_id,
        parent_unit_id = excluded.parent_unit_id, runner = excluded.runner, engine = excluded.engine,
        model = excluded.model, phase = NULL, status = 'queued', input_hash = excluded.input_hash,
        started_at = excluded.started_at, queued_at = excluded.queued_at, dispatch_json = excluded.dispatch_json,
        result_json = NULL, tokens = NULL, failure_reason = NULL, session_id = NULL, finished_at = NULL,
        last_checkin_at = NULL, claim_holder = NULL, claim_host = NULL, claim_pid = NULL,
        claim_expires_at = NULL, truncated = 0, reopened = 0, worktree_path = NULL, host = NULL,
        reused_from = NULL
    RETURNING unit_id
), nt AS MATERIALIZED (
    SELECT pg_notify(?, $1) FROM (SELECT 1 FROM put LIMIT 1) AS any_put
)
SELECT 'run' AS what, status AS a, lease_holder AS b, lease_epoch::text AS c, NULL AS d
FROM run CROSS JOIN (SELECT count(*) FROM nt) AS told
UNION ALL SELECT 'put', unit_id, NULL, NULL, NULL FROM put
UNION ALL SELECT 'cur', unit_id, status, claim_host, claim_pid::text FROM cur
"""


class QueueAnswer:
    """What `queue_units` read and did: the run's row (None: no such run), the units it queued now, and the
    current rows of the others (unit id → (status, claim host, claim pid))."""

    def __init__(self, rows: Sequence[Any]) -> None:
        self.run: tuple[str, str | None, int] | None = None
        self.put: set[str] = set()
        self.current: dict[str, tuple[str, str | None, int | None]] = {}
        for what, a, b, c, d in rows:
            if what == "run":
                self.run = (a, b, int(c))
            elif what == "put":
                self.put.add(a)
            else:
                self.current[a] = (b, c, int(d) if d is not None else None)


def queue_units(
    db: Any, run_id: str, holder: str, epoch: int, rows: Sequence[dict[str, Any]], channel: str
) -> QueueAnswer:
    """One statement: lock the run row, check it drivable and fenced, lock the rows it decides about, write the
    new and re-queued attempts (`rows`: the `units` columns of each, unit ids distinct), and, when it queued
    some, wake idle workers (a NOTIFY on `channel` at its commit). Each such write tells them, also when units
    were waiting already: a worker whose claim lost the race for the last ones (they were locked by another's
    claim, or kept for an idle worker by `queue.take_ahead`) is idle while units wait, and otherwise slept until
    its next poll (1 s by default); a busy worker's loop is not woken by it (`worker.loop._Hint`)."""
    return QueueAnswer(db.execute(QUEUE_UNITS, (run_id, holder, epoch, rows_json(rows), channel)).fetchall())


# Which picked units a claim takes (`queue.take_ahead`): `pick` holds up to limit + ahead (+ 1 when ahead) queued
# units, oldest first; the first `limit` (the bound parameter) are taken, each further one only while one picked
# after it stays queued. Ends open: the statement closes the CTE's parenthesis.
_TAKE = """take AS MATERIALIZED (
    SELECT p.run_id, p.unit_id FROM (
        SELECT pick.run_id, pick.unit_id, row_number() OVER (ORDER BY u.queued_at, u.unit_id) AS rn,
            count(*) OVER () AS found
        FROM pick JOIN units u ON u.run_id = pick.run_id AND u.unit_id = pick.unit_id
    ) AS p WHERE p.rn <= ?::int OR p.rn < p.found"""


CLAIM_UNITS = f"""
WITH tgt AS MATERIALIZED (
    SELECT * FROM json_to_recordset(?::json) AS t(run_id text, step_id text)
), kinds AS MATERIALIZED (
    SELECT json_array_elements_text(?::json) AS runner
), live AS MATERIALIZED (
    SELECT r.id FROM runs r WHERE r.id IN (SELECT run_id FROM tgt) AND r.status IN {_DRIVABLE}
    ORDER BY r.id FOR KEY SHARE OF r
), clk AS MATERIALIZED (
    SELECT {_NOW} AS now FROM (SELECT count(*) FROM live) AS locked
), pick AS MATERIALIZED (
    SELECT u.run_id, u.unit_id FROM units u
    WHERE u.status = 'queued' AND u.run_id IN (SELECT id FROM live) AND u.runner IN (SELECT runner FROM kinds)
      AND EXISTS (SELECT 1 FROM tgt WHERE tgt.run_id = u.run_id AND tgt.step_id IS NOT DISTINCT FROM u.step_id)
    ORDER BY u.queued_at, u.unit_id LIMIT ?::int FOR UPDATE OF u SKIP LOCKED
), {_TAKE}
), upd AS (
    UPDATE units u SET status = 'running', attempts = u.attempts + 1, claim_holder = ?, claim_host = ?,
        claim_pid = ?::int, claim_expires_at = clk.now + make_interval(secs => ?::float8), started_at = clk.now,
        last_checkin_at = clk.now, host = $6
    FROM take AS pick, clk
    WHERE u.run_id = pick.run_id AND u.unit_id = pick.unit_id AND u.status = 'queued'
    RETURNING u.run_id, u.unit_id, u.step_id, u.runner, u.engine, u.model, u.input_hash, u.dispatch_json,
        u.attempts, u.started_at, u.queued_at
), lk AS MATERIALIZED (
    SELECT {_EVENT_LOCK} FROM (SELECT 1 FROM upd LIMIT 1) AS any_claimed
), ev AS (
    INSERT INTO events (event_type, ts, run_id, metadata_json)
    SELECT 'workflow_unit_started', upd.started_at, upd.run_id,
        '{{"runId":' || to_json(upd.run_id::text)::text || ',"stepId":' || coalesce(to_json(upd.step_id::text)::text,
        'null') || ',"unitId":' || to_json(upd.unit_id::text)::text || ?
    FROM upd CROSS JOIN lk ORDER BY upd.queued_at, upd.unit_id
)
SELECT run_id, unit_id, step_id, runner, engine, model, input_hash, dispatch_json, attempts, started_at
FROM upd ORDER BY queued_at, unit_id
"""


def claim_units(
    db: Any,
    *,
    targets: Sequence[tuple[str, str | None]],
    kinds: Sequence[str],
    holder: str,
    host: str,
    pid: int | None,
    ttl_s: float,
    limit: int,
    meta_tail: str,
    ahead: int = 0,
) -> list[Any]:
    """One statement: claim up to `limit` queued units of `kinds` over the (run, step) `targets`, oldest queued
    first, skipping rows other claimers hold, and up to `ahead` more (`queue.take_ahead`); the claimed rows
    (`meta_tail` ends each started event's metadata)."""
    tgt = rows_json([{"run_id": r, "step_id": s} for r, s in targets])
    picked = limit + ahead + (1 if ahead else 0)
    params = (tgt, json.dumps(list(kinds)), picked, limit, holder, host, pid, ttl_s, meta_tail)
    claimed: list[Any] = db.execute(CLAIM_UNITS, params).fetchall()
    return claimed


def _finish_the_claim(run: str) -> str:
    """The UPDATE both one-statement finishes share: the claim's row takes its outcome (or `abandoned` when `run`,
    a CTE, says the run was abandoned), fenced by holder and attempt; binds status, result, tokens, cost, reason,
    session, truncated, the start stamp (None: the claim's), then unit, holder, attempt (`ClaimFinish.row_params` after the run id `run` names)."""
    return f"""UPDATE units u SET status = CASE WHEN run.gone THEN 'failed' ELSE ? END,
        result_json = CASE WHEN run.gone THEN NULL ELSE ? END, tokens = ?::bigint, cost = ?::float8,
        failure_reason = CASE WHEN run.gone THEN 'abandoned' ELSE ? END, session_id = ?,
        truncated = CASE WHEN run.gone THEN 0 ELSE ?::int END, started_at = coalesce(?::timestamptz, u.started_at),
        finished_at = clk.now, claim_holder = NULL,
        claim_pid = NULL, claim_expires_at = NULL, claim_host = NULL
    FROM run, clk
    WHERE u.run_id = {run} AND u.unit_id = ? AND u.status = 'running' AND u.claim_holder = ? AND u.attempts = ?::int
    RETURNING run.gone, clk.now"""


FINISH_CLAIMED = f"""
WITH run AS MATERIALIZED (
    SELECT status = 'abandoned' AS gone FROM runs WHERE id = ? FOR KEY SHARE
), clk AS MATERIALIZED (
    SELECT {_NOW} AS now FROM run
), upd AS (
    {_finish_the_claim("$1")}
), lk AS MATERIALIZED (
    SELECT {_EVENT_LOCK} FROM upd
), ev AS (
    INSERT INTO events (event_type, ts, run_id, metadata_json)
    SELECT 'workflow_unit_finished', upd.now, $1, CASE WHEN upd.gone THEN ? ELSE ? END FROM upd CROSS JOIN lk
), nt AS MATERIALIZED (
    SELECT pg_notify(?, $1) FROM upd
)
SELECT gone FROM upd CROSS JOIN (SELECT count(*) FROM nt) AS told
"""


class ClaimFinish(NamedTuple):
    """A worker's outcome of its claim (`holder`, `token`), as the statements that record it take it: the row's
    values, its event (`meta`, or `meta_abandoned` when the run was abandoned meanwhile) and the coordinator's
    NOTIFY `channel`."""

    run_id: str
    unit_id: str
    holder: str
    token: int
    status: str
    result_json: str | None
    tokens: int | None
    cost: float | None
    failure_reason: str | None
    session_id: str | None
    truncated: bool
    started_at: str | None  # when the unit really started, if later than its claim (claimed ahead); None: the claim's
    meta: str
    meta_abandoned: str
    channel: str

    def row_params(self) -> tuple[Any, ...]:
        """The finish's parameters in the order both statements bind them (the run, the row's values, the claim)."""
        return (
            self.run_id,
            self.status,
            self.result_json,
            self.tokens,
            self.cost,
            self.failure_reason,
            self.session_id,
            int(bool(self.truncated)),
            self.started_at,
            self.unit_id,
            self.holder,
            self.token,
        )


def finish_claimed(db: Any, f: ClaimFinish) -> bool:
    """One statement: record the outcome of the claim with its event, and tell the coordinator (a NOTIFY sent at
    the statement's commit: no round trip of its own); False when the row is not this claim's any more."""
    params = (*f.row_params(), f.meta_abandoned, f.meta, f.channel)
    return bool(db.execute(FINISH_CLAIMED, params).fetchall())


FINISH_AND_CLAIM = f"""
WITH tgt AS MATERIALIZED (
    SELECT * FROM json_to_recordset(?::json) AS t(run_id text, step_id text)
), kinds AS MATERIALIZED (
    SELECT json_array_elements_text(?::json) AS runner
), locked AS MATERIALIZED (
    SELECT r.id, r.status FROM runs r WHERE r.id = ? OR r.id IN (SELECT run_id FROM tgt)
    ORDER BY r.id FOR KEY SHARE OF r
), run AS MATERIALIZED (
    SELECT status = 'abandoned' AS gone FROM locked WHERE id = $3
), clk AS MATERIALIZED (
    SELECT {_NOW} AS now FROM (SELECT count(*) FROM locked) AS held
), fin AS (
    {_finish_the_claim("$3")}
), pick AS MATERIALIZED (
    SELECT u.run_id, u.unit_id FROM units u
    WHERE u.status = 'queued' AND u.runner IN (SELECT runner FROM kinds)
      AND u.run_id IN (SELECT id FROM locked WHERE status IN {_DRIVABLE})
      AND EXISTS (SELECT 1 FROM tgt WHERE tgt.run_id = u.run_id AND tgt.step_id IS NOT DISTINCT FROM u.step_id)
    ORDER BY u.queued_at, u.unit_id LIMIT ?::int FOR UPDATE OF u SKIP LOCKED
), {_TAKE}
), upd AS (
    UPDATE units u SET status = 'running', attempts = u.attempts + 1, claim_holder = $13, claim_host = ?,
        claim_pid = ?::int, claim_expires_at = clk.now + make_interval(secs => ?::float8), started_at = clk.now,
        last_checkin_at = clk.now, host = $17
    FROM take AS pick, clk
    WHERE u.run_id = pick.run_id AND u.unit_id = pick.unit_id AND u.status = 'queued'
    RETURNING u.run_id, u.unit_id, u.step_id, u.runner, u.engine, u.model, u.input_hash, u.dispatch_json,
        u.attempts, u.started_at, u.queued_at
), lk AS MATERIALIZED (
    SELECT {_EVENT_LOCK} FROM (SELECT 1 FROM fin UNION ALL SELECT 1 FROM upd LIMIT 1) AS any_written
), ev AS (
    INSERT INTO events (event_type, ts, run_id, metadata_json)
    SELECT e.kind, e.ts, e.run_id, e.meta FROM (
        SELECT 0 AS ord, 'workflow_unit_finished' AS kind, fin.now AS ts, $3 AS run_id,
            CASE WHEN fin.gone THEN ? ELSE ? END AS meta, NULL::timestamptz AS queued_at, NULL AS unit_id
        FROM fin
        UNION ALL
        SELECT 1, 'workflow_unit_started', upd.started_at, upd.run_id,
            '{{"runId":' || to_json(upd.run_id::text)::text || ',"stepId":' || coalesce(to_json(upd.step_id::text)::text,
            'null') || ',"unitId":' || to_json(upd.unit_id::text)::text || ?, upd.queued_at, upd.unit_id
        FROM upd
    ) AS e CROSS JOIN lk ORDER BY e.ord, e.queued_at, e.unit_id
), nt AS MATERIALIZED (
    SELECT pg_notify(?, $3) FROM fin
)
SELECT 0 AS ord, 'fin' AS what, NULL AS run_id, NULL AS unit_id, NULL AS step_id, NULL AS runner, NULL AS engine,
    NULL AS model, NULL AS input_hash, NULL AS dispatch_json, NULL::int AS attempts,
    NULL::timestamptz AS started_at, NULL::timestamptz AS queued_at
FROM fin CROSS JOIN (SELECT count(*) FROM nt) AS told
UNION ALL
SELECT 1, 'claim', run_id, unit_id, step_id, runner, engine, model, input_hash, dispatch_json, attempts, started_at,
    queued_at
FROM upd
ORDER BY ord, queued_at, unit_id
"""


class FinishedAndClaimed:
    """What `finish_and_claim` did: whether the finish was written (False: the row is not the claim's any more),
    and the rows it claimed next (the columns of `claim_units`' rows)."""

    def __init__(self, rows: Sequence[Any]) -> None:
        self.finished = False
        self.claimed: list[dict[str, Any]] = []
        names = ("run_id", "unit_id", "step_id", "runner", "engine", "model", "input_hash", "dispatch_json")
        for row in rows:
            if row[1] == "fin":
                self.finished = True
            else:
                self.claimed.append(dict(zip((*names, "attempts", "started_at"), row[2:12], strict=True)))


def finish_and_claim(
    db: Any,
    f: ClaimFinish,
    *,
    targets: Sequence[tuple[str, str | None]],
    kinds: Sequence[str],
    host: str,
    pid: int | None,
    ttl_s: float,
    limit: int,
    meta_tail: str,
    ahead: int = 0,
) -> FinishedAndClaimed:
    """One statement: `finish_claimed` and then `claim_units` for the slot it frees (a worker's unit finishes and
    its next is claimed in one round trip instead of two), `limit` units and up to `ahead` more under the rule of
    `queue.take_ahead` (the statement locks one queued unit more than it may take, to see whether one stays).
    Both keep their rules and their lock order: the run rows (the finished one's and the targets', by id), the
    unit rows, the event lock; the claim does not depend on the finish (a superseded finish still claims: the
    slot is free either way)."""
    tgt = rows_json([{"run_id": r, "step_id": s} for r, s in targets])
    params = (
        tgt,
        json.dumps(list(kinds)),
        *f.row_params(),
        limit + ahead + (1 if ahead else 0),
        limit,
        host,
        pid,
        ttl_s,
        f.meta_abandoned,
        f.meta,
        meta_tail,
        f.channel,
    )
    return FinishedAndClaimed(db.execute(FINISH_AND_CLAIM, params).fetchall())


WRITE_ATTEMPTS = f"""
WITH run AS MATERIALIZED (
    SELECT status, lease_holder, lease_epoch, lease_until FROM runs WHERE id = ? FOR KEY SHARE
), clk AS MATERIALIZED (
    SELECT {_NOW} AS now FROM run
), fin_in AS MATERIALIZED (
    SELECT * FROM json_to_recordset(?::json) AS f(ord int, unit_id text, started_at timestamptz, status text,
        result_json text, tokens bigint, failure_reason text, session_id text, truncated int, meta text)
), new_in AS MATERIALIZED (
    SELECT * FROM json_to_recordset(?::json) AS n(ord int, unit_id text, step_id text, node_id text,
        parent_unit_id text, phase text, runner text, engine text, model text, input_hash text, worktree_path text,
        meta text)
), ok AS MATERIALIZED (
    SELECT clk.now FROM run CROSS JOIN clk
    WHERE (?::text IS NULL OR (run.lease_holder = $4 AND run.lease_epoch = ?::bigint))
      AND CASE WHEN EXISTS (SELECT 1 FROM new_in)
          THEN run.status IN {_DRIVABLE} AND ($4 IS NULL OR run.lease_until >= clk.now + make_interval(secs => ?::float8))
          ELSE run.status <> 'abandoned' END
      AND NOT EXISTS (SELECT 1 FROM units u WHERE u.run_id = $1 AND u.unit_id IN (SELECT unit_id FROM new_in))
      AND NOT EXISTS (SELECT 1 FROM fin_in f WHERE NOT EXISTS (
          SELECT 1 FROM units u WHERE u.run_id = $1 AND u.unit_id = f.unit_id))
), fin AS (
    UPDATE units u SET status = f.status, result_json = f.result_json, tokens = f.tokens,
        failure_reason = f.failure_reason, session_id = f.session_id, truncated = f.truncated, finished_at = ok.now,
        claim_holder = NULL, claim_host = NULL, claim_pid = NULL, claim_expires_at = NULL
    FROM fin_in f CROSS JOIN ok
    WHERE u.run_id = $1 AND u.unit_id = f.unit_id AND u.status = 'running' AND u.started_at = f.started_at
    RETURNING f.ord, f.unit_id, f.meta
), ins AS (
    INSERT INTO units (run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner, engine, model, status,
        input_hash, worktree_path, host, started_at)
    SELECT $1, n.unit_id, n.step_id, n.node_id, n.parent_unit_id, n.phase, n.runner, n.engine, n.model, 'running',
        n.input_hash, n.worktree_path, ?, ok.now
    FROM new_in n CROSS JOIN ok ORDER BY n.ord
    ON CONFLICT (run_id, unit_id) DO NOTHING
    RETURNING unit_id
), lk AS MATERIALIZED (
    SELECT {_EVENT_LOCK} FROM ok WHERE EXISTS (SELECT 1 FROM fin_in) OR EXISTS (SELECT 1 FROM new_in)
), ev AS (
    INSERT INTO events (event_type, ts, run_id, metadata_json)
    SELECT e.kind, ok.now, $1, e.meta FROM (
        SELECT 'workflow_unit_finished' AS kind, fin.meta, fin.ord FROM fin
        UNION ALL
        SELECT 'workflow_unit_started', n.meta, 1000000 + n.ord FROM new_in n JOIN ins ON ins.unit_id = n.unit_id
    ) AS e CROSS JOIN ok CROSS JOIN lk ORDER BY e.ord
)
SELECT 'ok' AS what, NULL AS unit_id, now FROM ok
UNION ALL SELECT 'fin', unit_id, NULL FROM fin
UNION ALL SELECT 'ins', unit_id, NULL FROM ins
"""


class Written:
    """What `write_attempts` did: None when it wrote nothing (a guard it does not decide held: the caller writes
    the portable way, which refuses or handles the case), else the stamp, the finished and the inserted ids."""

    def __init__(self, rows: Sequence[Any]) -> None:
        self.now: str | None = None
        self.finished: set[str] = set()
        self.inserted: set[str] = set()
        for what, unit_id, now in rows:
            if what == "ok":
                self.now = now
            elif what == "fin":
                self.finished.add(unit_id)
            else:
                self.inserted.add(unit_id)


def write_attempts(
    db: Any,
    run_id: str,
    finishes: Sequence[dict[str, Any]],
    inserts: Sequence[dict[str, Any]],
    *,
    holder: str | None,
    epoch: int | None,
    lease_floor_s: float,
    host: str,
) -> Written:
    """One statement: the local driver's finishes and fresh inserts of one run with their events, when every
    guard passes at once (the run drivable for inserts, not abandoned for finishes alone; the fence and, for
    inserts, `lease_floor_s` of lease left; no inserted id present; every finished row present); nothing
    otherwise (`Written.now` None)."""
    params = (
        run_id,
        rows_json([dict(r, ord=i) for i, r in enumerate(finishes)]),
        rows_json([dict(r, ord=i) for i, r in enumerate(inserts)]),
        holder,
        epoch,
        lease_floor_s,
        host,
    )
    return Written(db.execute(WRITE_ATTEMPTS, params).fetchall())


def renew_lease(
    db: Any, run_id: str, holder: str, ttl_s: float, *, epoch: int | None, marker: str | None, set_marker: bool
) -> bool:
    """One statement: `store.runs.renew_lease` (its docstring is the rule), the expiry `ttl_s` from the journal clock
    as the statement runs; whether the lease was renewed."""
    sets = ", lease_liveness = ?" if set_marker else ""
    sql = (
        f"UPDATE runs SET lease_until = {_NOW} + make_interval(secs => ?::float8){sets} "
        f"WHERE id = ? AND lease_holder = ? AND status IN {_DRIVABLE}"
        + (" AND lease_epoch = ?::bigint" if epoch is not None else "")
    )
    params = (ttl_s, *((marker,) if set_marker else ()), run_id, holder, *((epoch,) if epoch is not None else ()))
    return int(db.execute(sql, params).rowcount) == 1


def take_free_lease(
    db: Any, run_id: str, holder: str, host: str, pid: int, ttl_s: float, sets: str, extra: Sequence[Any]
) -> Any:
    """One statement: `store.runs.take_free_lease` (its docstring is the rule), the expiry `ttl_s` from the journal
    clock as the statement runs; the row (lease_epoch, status), or None when the lease was not free."""
    sql = (
        f"UPDATE runs SET lease_holder = ?, lease_host = ?, lease_pid = ?, "
        f"lease_until = {_NOW} + make_interval(secs => ?::float8), lease_epoch = lease_epoch + 1{sets} "
        f"WHERE id = ? AND status IN {_DRIVABLE} AND lease_holder IS NULL RETURNING lease_epoch, status"
    )
    return db.execute(sql, (holder, host, pid, ttl_s, *extra, run_id)).fetchone()


FINISHED_ROWS = """
SELECT unit_id, status, result_json, tokens, cost, failure_reason, session_id, truncated FROM units
WHERE run_id = ? AND unit_id = ANY (ARRAY(SELECT json_array_elements_text(?::json))) AND status IN ('completed','failed')
"""


def finished_rows(db: Any, run_id: str, unit_ids: Sequence[str]) -> list[Any]:
    """The finished (completed or failed) rows among `unit_ids` of the run, in one statement. The ids become an array
    once (an init plan): as `IN (SELECT json_array_elements_text(…))` the planner joined the function to each of
    the run's rows and parsed the JSON again for each, 4 ms a read at 200 units, ten times the old IN list."""
    ids = json.dumps([clean_param(u) for u in unit_ids], ensure_ascii=True)
    return list(db.query(FINISHED_ROWS, (run_id, ids)))


# Each hot statement with parameters that match nothing (no run has the id ''), for `Journal.warm` to run once on each
# pooled connection ahead of a run: a statement's first run on a connection parses it, plans it and loads what that
# reads from the catalogs. Run this way they lock, write, claim and notify nothing. A worker's sessions first take
# the generic plan of each statement from its first run: the server plans each statement once per connection (here,
# ahead) instead of for each of its first five runs (~2 ms each, at a run's busy start), and the plan it keeps
# afterwards is the generic one anyway (each of these statements looks its rows up by key). Before PostgreSQL 12 the
# setting does not exist: that primer fails and the others run.
_NO_FINISH = ("", "completed", None, None, None, None, None, 0, None, "", "", 0)  # `ClaimFinish.row_params`' shape
WORKER_PRIMERS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("SET plan_cache_mode = force_generic_plan", ()),  # a session setting, for the statements below
    (CLAIM_UNITS, ("[]", "[]", 0, 0, "", "", None, 1.0, "}")),
    (FINISH_AND_CLAIM, ("[]", "[]", *_NO_FINISH, 0, 0, "", None, 1.0, "{}", "{}", "}", "")),
    (FINISH_CLAIMED, (*_NO_FINISH, "{}", "{}", "")),
)
COORDINATOR_PRIMERS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    (QUEUE_UNITS, ("", "", 0, "[]", "")),
    (FINISHED_ROWS, ("", "[]")),
)
