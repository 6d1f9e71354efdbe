"""The unit journal: one row per attempt id (spec/engine.md; spec/decisions.md D8, D13).

A row is inserted (`running`) *before* a unit is dispatched and finished
after, so nothing dispatched is ever silently dropped. Re-inserting the same
attempt id (a crashed engine's leftover `running` row, a rerun) lands
`running` again, clears the value columns and bumps `attempts`.

The finish guard keys on `started_at`: if another driver re-inserted the row
meanwhile (new stamp), a stale finish must not clobber it ("superseded").
To make that guard exact, `insert_unit` never reuses a stamp: a re-insert in
the same millisecond gets the previous stamp + 1 ms.

Claims (D13) let a session driver hold one running unit: holder + host + pid
+ expiry, with the same liveness rule as the run lease (a dead local pid is
expired at once).

Fencing: a driver passes its lease `Fence` to every insert and finish; the
write commits only while the run still carries it (else LEASE_LOST, nothing
written), checked in the write's own transaction. A fenced insert also needs
the lease to run for at least half a TTL more (the common case: the heartbeat
renews it long before), renewing it in that transaction otherwise, so a unit
whose row committed cannot be taken over for that long. Return type: `Unit` frozen dataclass, `ClaimInfo` (= the
lease's `LeaseInfo` shape).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal, NamedTuple

from akm.canonical import compact_json
from akm.errors import JournalError, NotFoundError
from akm.store.clock import format_iso, parse_iso
from akm.store.journal import RUN_UNIT_WRITE, Journal
from akm.store.runs import (
    Fence,
    LeaseInfo,
    check_fence,
    host_id,
    lease_ttl_s,
    not_drivable_error,
)
from akm.store.status import (  # noqa: F401 - drivers and reports name it units.REPORT_LOCK_PREFIX
    DRIVABLE_STATUSES,
    REPORT_LOCK_PREFIX,
    ReportRecorded,
    UnitStatus,
)

CLAIM_TTL_S = 90.0
ClaimInfo = LeaseInfo


class Unit(NamedTuple):
    """One `units` row (`unit_id` is the attempt id)."""

    run_id: str
    unit_id: str
    step_id: str | None
    node_id: str
    parent_unit_id: str | None
    phase: str | None
    runner: str | None
    engine: str | None
    model: str | None
    status: UnitStatus
    input_hash: str | None
    result_json: str | None
    tokens: int | None
    failure_reason: str | None
    worktree_path: str | None
    started_at: str
    finished_at: str | None
    session_id: str | None
    last_checkin_at: str | None
    attempts: int
    claim_holder: str | None
    claim_host: str | None
    claim_pid: int | None
    claim_expires_at: str | None
    truncated: int = 0  # 1: the unit's output was cut at the capture cap (result_json holds its beginning)
    reopened: int = 0  # 1: a failed session unit reopened by resuming the run (offered again as a re-run)
    queued_at: str | None = None  # set: the attempt was handed to workers (phase 2, akm.store.queue)
    host: str | None = None  # the host id the attempt ran on (driver or worker), kept after it finished
    reused_from: str | None = None  # set: restored from an earlier row (compact JSON naming it); nothing ran
    cost: float | None = None  # USD the attempt cost (usage x the engine's prices); None: unknown or no model call


_UNIT_FIELDS = Unit._fields
_UNIT_COLUMNS = ", ".join(_UNIT_FIELDS)


def _unit(row: Any) -> Unit:
    return Unit(*row)  # rows are selected as _UNIT_COLUMNS: the dataclass's own field order


def _next_stamp(now: str, previous: str | None) -> str:
    if previous is not None and now <= previous:
        return format_iso(parse_iso(previous) + timedelta(milliseconds=1))
    return now


_UNIT_ROW_COLUMNS = (
    "INSERT INTO units (run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner, engine, model, "
    "status, input_hash, worktree_path, host, started_at) VALUES (?,?,?,?,?,?,?,?,?,'running',?,?,?,?) "
)
# The common case, a unit's first dispatch of a drivable run: one statement, no read. It writes
# nothing when the row exists or the run cannot be driven (then `_insert_row` finds out which).
_INSERT_FRESH = (
    "INSERT INTO units (run_id, unit_id, step_id, node_id, parent_unit_id, phase, runner, engine, model, "
    "status, input_hash, worktree_path, host, started_at) SELECT ?,?,?,?,?,?,?,?,?,'running',?,?,?,? "
    "WHERE EXISTS (SELECT 1 FROM runs WHERE id = ? AND status IN ("
    + ",".join(f"'{status}'" for status in DRIVABLE_STATUSES)
    + ")) "
    "ON CONFLICT (run_id, unit_id) DO NOTHING"
)
# The same for a driver holding the lease: the run must still carry its fence, and for a while yet.
_INSERT_FRESH_FENCED = _INSERT_FRESH.replace(
    ")) ON CONFLICT", ") AND lease_holder = ? AND lease_epoch = ? AND lease_until >= ?) ON CONFLICT"
)
assert _INSERT_FRESH_FENCED != _INSERT_FRESH
_REINSERT = _UNIT_ROW_COLUMNS + (
    "ON CONFLICT (run_id, unit_id) DO UPDATE SET step_id = excluded.step_id, node_id = excluded.node_id, "
    "parent_unit_id = excluded.parent_unit_id, phase = excluded.phase, runner = excluded.runner, "
    "engine = excluded.engine, model = excluded.model, status = 'running', "
    "input_hash = excluded.input_hash, worktree_path = excluded.worktree_path, host = excluded.host, "
    "queued_at = NULL, dispatch_json = NULL, started_at = excluded.started_at, result_json = NULL, tokens = NULL, cost = NULL, "
    "failure_reason = NULL, "
    "session_id = NULL, finished_at = NULL, last_checkin_at = NULL, claim_holder = NULL, "
    "claim_host = NULL, claim_pid = NULL, claim_expires_at = NULL, truncated = 0, reopened = 0, "
    "reused_from = NULL, attempts = units.attempts + 1"
)
_FINISH = (
    "UPDATE units SET status = ?, result_json = ?, tokens = ?, cost = ?, failure_reason = ?, session_id = ?, "
    "truncated = ?, finished_at = ?, claim_holder = NULL, claim_host = NULL, claim_pid = NULL, "
    "claim_expires_at = NULL WHERE run_id = ? AND unit_id = ? AND status = 'running' AND started_at = ?"
)


_INSERT_EVENTS = "INSERT INTO events (event_type, ts, run_id, metadata_json) VALUES (?, ?, ?, ?)"
_json_str = json.encoder.encode_basestring  # a JSON string literal exactly as compact_json writes it


def _json_opt(value: str | None) -> str:
    return "null" if value is None else _json_str(value)


def _started_meta(run_id: str, step_id: str | None, unit_id: str) -> str:
    """compact_json({"runId", "stepId", "unitId"}), written directly: it is built for every dispatch."""
    return f'{{"runId":{_json_str(run_id)},"stepId":{_json_opt(step_id)},"unitId":{_json_str(unit_id)}}}'


class UnitFinish(NamedTuple):
    """One dispatch's outcome, as `finish_unit` records it (see there)."""

    run_id: str
    unit_id: str
    started_at: str
    status: UnitStatus
    result_json: str | None = None
    tokens: int | None = None
    failure_reason: str | None = None
    session_id: str | None = None
    truncated: bool = False
    step_id: str | None = None  # the step the row was inserted with (saves reading it back)
    usage: dict[str, Any] | None = None  # the parts of `tokens` the runner reported (event only, no column)
    cost: float | None = None  # USD (akm.engine.cost); None: unknown, or no model call

    def meta(self, step_id: str | None) -> str:
        """The `workflow_unit_finished` metadata (compact JSON; ids, status, reason, tokens and their parts)."""
        text = (
            f'{{"runId":{_json_str(self.run_id)},"stepId":{_json_opt(step_id)},'
            f'"unitId":{_json_str(self.unit_id)},"status":{_json_str(self.status)}'
        )
        if self.failure_reason is not None:
            text += f',"failureReason":{_json_str(self.failure_reason)}'
        if self.tokens is not None:
            text += f',"tokens":{compact_json(self.tokens)}'
        if self.usage:
            text += f',"usage":{compact_json(self.usage)}'
        if self.cost is not None:
            text += f',"cost":{compact_json(self.cost)}'
        if self.truncated:
            text += ',"truncated":true'
        return text + "}"


def _insert_row(
    db: Journal, conn: Any, now: str, row: list[Any], fence: Fence | None = None, min_until: str | None = None
) -> str:
    """Write the `running` row (`row` ends with the stamp to use); returns the stamp it got.

    Refuses (RUN_NOT_FOUND / RUN_ABANDONED / RUN_NOT_ACTIVE, nothing written) when the run
    cannot be driven — checked in the caller's transaction, so once an abandon commits no unit
    of that run can start — and LEASE_LOST when `fence` is given and no longer the run's.
    `min_until`: `_lease_floor(db, now)`, when the caller inserts several rows at `now`.
    """
    run_id = row[0]
    if fence is None:
        if conn.execute(_INSERT_FRESH, [*row, run_id]).rowcount == 1:
            return now
    else:
        min_until = min_until or _lease_floor(db, now)
        if conn.execute(_INSERT_FRESH_FENCED, [*row, run_id, fence.holder, fence.epoch, min_until]).rowcount == 1:
            return now
    run = conn.execute("SELECT status, lease_until FROM runs WHERE id = ?", (run_id,)).fetchone()
    if run is None:
        from akm.codes import Code

        raise NotFoundError(f"workflow run {run_id!r} not found", code=Code.RUN_NOT_FOUND, details={"runId": run_id})
    if run["status"] not in DRIVABLE_STATUSES:
        raise not_drivable_error(run_id, run["status"], "given new units")
    if fence is not None:
        check_fence(conn, run_id, fence)
        if run["lease_until"] is None or run["lease_until"] < min_until:
            conn.execute("UPDATE runs SET lease_until = ? WHERE id = ?", (db.later(now, lease_ttl_s()), run_id))
    prev = conn.execute("SELECT started_at FROM units WHERE run_id = ? AND unit_id = ?", (run_id, row[1])).fetchone()
    row[-1] = _next_stamp(now, prev["started_at"] if prev else None)
    conn.execute(_REINSERT, row)
    return str(row[-1])


def _lease_floor(db: Journal, now: str) -> str:
    """How long a fenced insert needs the lease to run on: half a TTL from `now`."""
    return db.later(now, lease_ttl_s() / 2)


def _finish_row(
    conn: Any, now: str, f: UnitFinish, fence: Fence | None = None, *, insert_follows: bool = False
) -> str | None:
    """Finish this dispatch's row; its event metadata, or None when the row was superseded.

    A missing row raises JournalError, a lost `fence` LEASE_LOST (the caller's transaction rolls back).
    `insert_follows`: an insert of the same run follows in this transaction (`finish_and_insert`); its
    guard refuses every run that is not drivable, an abandoned one included, and rolls this finish
    back with it, so the run's status need not be read here (the caller then finishes alone).
    """
    if f.status not in ("completed", "failed"):
        raise ValueError(f"finish_unit status must be completed or failed, not {f.status!r}")
    run = None if insert_follows else conn.execute("SELECT status FROM runs WHERE id = ?", (f.run_id,)).fetchone()
    if run is not None and run["status"] == "abandoned":
        # A driver's in-flight unit finishing after an abandon (it stops them, but they end after the commit):
        # its result is not journaled; the row ends as abandon ends a dead driver's rows.
        f = f._replace(status="failed", result_json=None, failure_reason="abandoned", truncated=False)
    else:
        check_fence(conn, f.run_id, fence)
    cur = conn.execute(
        _FINISH,
        (
            f.status,
            f.result_json,
            f.tokens,
            f.cost,
            f.failure_reason,
            f.session_id,
            int(bool(f.truncated)),
            now,
            f.run_id,
            f.unit_id,
            f.started_at,
        ),
    )
    if cur.rowcount == 1:
        step_id = f.step_id
        if step_id is None:
            step_id = conn.execute(
                "SELECT step_id FROM units WHERE run_id = ? AND unit_id = ?", (f.run_id, f.unit_id)
            ).fetchone()["step_id"]
        return f.meta(step_id)
    if conn.execute("SELECT 1 FROM units WHERE run_id = ? AND unit_id = ?", (f.run_id, f.unit_id)).fetchone() is None:
        raise JournalError(
            f"unit {f.unit_id!r} of run {f.run_id} finished ({f.status}) but its journal row is gone; "
            "the result could not be journaled"
        )
    return None


def insert_unit(
    db: Journal,
    *,
    run_id: str,
    unit_id: str,
    step_id: str | None,
    node_id: str,
    parent_unit_id: str | None = None,
    phase: str | None = None,
    runner: str | None = None,
    engine: str | None = None,
    model: str | None = None,
    input_hash: str | None = None,
    worktree_path: str | None = None,
    fence: Fence | None = None,
) -> str:
    """Upsert the attempt row as `running`; returns its `started_at` (pass it to `finish_unit`).

    On conflict: dispatch metadata overwritten, value columns and claim
    cleared, `attempts + 1`. Emits `workflow_unit_started` in the same tx.
    Refuses (RUN_ABANDONED / RUN_NOT_ACTIVE, nothing written) when the run can
    no longer be driven: checked in the insert's own transaction, so once an
    abandon commits no unit of that run can start.
    A first dispatch is one INSERT; only a re-dispatch reads the old stamp.
    `fence`: the driver's lease; LEASE_LOST (nothing written) once another holder took the run.
    """
    new = NewAttempt(
        run_id, unit_id, step_id, node_id, parent_unit_id, runner, engine, model, input_hash, worktree_path
    )
    fast = _one_statement(db, run_id, [], [new], fence, phase=phase)
    if fast is not None:
        return fast[1][0]
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        now = db.now()
        started_at = _insert_row(
            db,
            conn,
            now,
            [
                run_id,
                unit_id,
                step_id,
                node_id,
                parent_unit_id,
                phase,
                runner,
                engine,
                model,
                input_hash,
                worktree_path,
                host_id(),
                now,
            ],
            fence,
        )
        db.dialect.event_lock(conn)
        conn.execute(_INSERT_EVENTS, ("workflow_unit_started", now, run_id, _started_meta(run_id, step_id, unit_id)))
    return started_at


def finish_unit(
    db: Journal,
    *,
    run_id: str,
    unit_id: str,
    started_at: str,
    status: UnitStatus,
    result_json: str | None = None,
    tokens: int | None = None,
    failure_reason: str | None = None,
    session_id: str | None = None,
    truncated: bool = False,
    step_id: str | None = None,
    fence: Fence | None = None,
    usage: dict[str, Any] | None = None,
    cost: float | None = None,
    at: str | None = None,
) -> str:
    """Record this dispatch's outcome. Returns "finished" or "superseded".

    Only the row still `running` with *this* dispatch's `started_at` is
    updated (and its claim released); then `workflow_unit_finished` is
    appended in the same tx. A row re-inserted or finished by someone else
    is left alone ("superseded", no event). A missing row is a JournalError.
    `step_id`: the step the caller inserted the row with (saves reading it back).
    `fence`: the driver's lease; LEASE_LOST (nothing written) once another holder took the run —
    the row then belongs to the new holder, which dispatches it again.
    `at`: the finish's stamp when it is not now — a report written whole in one transaction (started and
    finished at one instant: the report shows it as not timed, never as the milliseconds between two clocks).
    """
    f = UnitFinish(
        run_id=run_id,
        unit_id=unit_id,
        started_at=started_at,
        status=status,
        result_json=result_json,
        tokens=tokens,
        failure_reason=failure_reason,
        session_id=session_id,
        truncated=truncated,
        step_id=step_id,
        usage=usage,
        cost=cost,
    )
    fast = None if at is not None else _one_statement(db, run_id, [f], [], fence)
    if fast is not None:
        return fast[0][0]
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        now = at or db.now()
        meta = _finish_row(conn, now, f, fence)
        if meta is None:
            return "superseded"
        db.dialect.event_lock(conn)
        conn.execute(_INSERT_EVENTS, ("workflow_unit_finished", now, run_id, meta))
    return "finished"


class NewAttempt(NamedTuple):
    """What `insert_unit` records of an attempt it inserts (`write_attempts` takes several)."""

    run_id: str
    unit_id: str
    step_id: str | None
    node_id: str
    parent_unit_id: str | None = None
    runner: str | None = None
    engine: str | None = None
    model: str | None = None
    input_hash: str | None = None
    worktree_path: str | None = None


_EVENT_VALUES = ", (?, ?, ?, ?)"
_MANY_EVENTS: dict[int, str] = {}


def _insert_events_sql(n: int) -> str:
    """One INSERT of `n` event rows (the statement text is cached per count)."""
    sql = _MANY_EVENTS.get(n)
    if sql is None:
        sql = _MANY_EVENTS[n] = _INSERT_EVENTS + _EVENT_VALUES * (n - 1)
    return sql


def finish_and_insert(
    db: Journal,
    finish: UnitFinish,
    *,
    run_id: str,
    unit_id: str,
    step_id: str | None,
    node_id: str,
    parent_unit_id: str | None = None,
    runner: str | None = None,
    engine: str | None = None,
    model: str | None = None,
    input_hash: str | None = None,
    worktree_path: str | None = None,
    fence: Fence | None = None,
) -> tuple[str, str]:
    """`finish_unit(finish)` then `insert_unit(...)` in ONE transaction: (finish result, new started_at).

    For a worker that finishes one attempt and dispatches its next: one commit per unit
    (the insert still commits before its unit is dispatched). Any failure rolls back both
    and raises; the caller may then write each alone to learn which one failed.
    """
    new = NewAttempt(
        run_id, unit_id, step_id, node_id, parent_unit_id, runner, engine, model, input_hash, worktree_path
    )
    finished, started = write_attempts(db, [finish], [new], fence=fence)
    return finished[0], started[0]


def write_attempts(
    db: Journal, finishes: Sequence[UnitFinish], inserts: Sequence[NewAttempt], *, fence: Fence | None = None
) -> tuple[list[str], list[str]]:
    """Finish some attempts and insert others (`running`) in ONE transaction, with their events.

    Returns ("finished" | "superseded" per finish, the `started_at` of each insert). A worker's
    deferred finishes and the rows of the units it dispatches next share one commit; all of one run.
    Every insert is fenced (LEASE_LOST, nothing written) and guarded (a run that cannot be driven
    refuses), which covers the finishes; without inserts each finish is fenced itself. Any failure
    rolls everything back and raises: the caller may then write each alone.
    """
    if not finishes and not inserts:
        return [], []
    run_id = inserts[0].run_id if inserts else finishes[0].run_id
    if any(f.run_id != run_id for f in finishes) or any(n.run_id != run_id for n in inserts):  # one run: one lease
        raise ValueError("write_attempts writes the attempts of one run")
    fast = _one_statement(db, run_id, finishes, inserts, fence)
    if fast is not None:
        return fast
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        now = db.now()
        events: list[Any] = []
        results: list[str] = []
        for f in finishes:
            # With inserts, their fenced guard covers the finishes (a refusal rolls back both).
            meta = _finish_row(conn, now, f, insert_follows=True) if inserts else _finish_row(conn, now, f, fence)
            results.append("superseded" if meta is None else "finished")
            if meta is not None:
                events += ("workflow_unit_finished", now, f.run_id, meta)
        host = host_id()
        floor = _lease_floor(db, now) if fence is not None and inserts else None
        stamps: list[str] = []
        for n in inserts:
            row = [n.run_id, n.unit_id, n.step_id, n.node_id, n.parent_unit_id, None, n.runner, n.engine, n.model]
            row += [n.input_hash, n.worktree_path, host, now]
            stamps.append(_insert_row(db, conn, now, row, fence, floor))
            events += ("workflow_unit_started", now, n.run_id, _started_meta(n.run_id, n.step_id, n.unit_id))
        if events:
            db.dialect.event_lock(conn)
            conn.execute(_insert_events_sql(len(events) // 4), events)
    return results, stamps


def _one_statement(
    db: Journal,
    run_id: str,
    finishes: Sequence[UnitFinish],
    inserts: Sequence[NewAttempt],
    fence: Fence | None,
    *,
    phase: str | None = None,
) -> tuple[list[str], list[str]] | None:
    """`write_attempts` as ONE statement on PostgreSQL (`hotpath.write_attempts`, issue 40: across a network each
    statement is a round trip): (the finishes' results, the inserts' stamps), or None where it does not apply
    (SQLite; a finish whose step the caller does not know) or wrote nothing because a guard it leaves to the
    portable transaction held (a run not drivable or abandoned, a lost fence, a lease to extend, a re-dispatch,
    a finished row gone), which the caller then writes, and which refuses or handles the case as it always did.
    Not inside an open transaction either: there the portable statements take no lock it holds already."""
    if db.backend != "postgres" or any(f.step_id is None for f in finishes):
        return None
    if db.held() is not None:  # type: ignore[attr-defined]
        return None  # inside a transaction (a group commit, a report): its statements skip the locks it holds
    from akm.store.postgres import hotpath

    fin_rows = [
        {
            "unit_id": f.unit_id,
            "started_at": f.started_at,
            "status": f.status,
            "result_json": f.result_json,
            "tokens": f.tokens,
            "failure_reason": f.failure_reason,
            "session_id": f.session_id,
            "truncated": int(bool(f.truncated)),
            "meta": f.meta(f.step_id),
        }
        for f in finishes
    ]
    if any(f.status not in ("completed", "failed") for f in finishes):
        raise ValueError("finish_unit status must be completed or failed")
    new_rows = [dict(n._asdict(), phase=phase, meta=_started_meta(n.run_id, n.step_id, n.unit_id)) for n in inserts]
    for row in new_rows:
        del row["run_id"]
    written = hotpath.write_attempts(
        db,
        run_id,
        fin_rows,
        new_rows,
        holder=fence.holder if fence is not None else None,
        epoch=fence.epoch if fence is not None else None,
        lease_floor_s=lease_ttl_s() / 2,
        host=host_id(),
    )
    if written.now is None:
        return None
    missing = [n.unit_id for n in inserts if n.unit_id not in written.inserted]
    if missing:  # only the lease holder inserts a run's rows: another writer of the same id is a journal fault
        raise JournalError(f"unit {missing[0]!r} of run {run_id} was inserted by another writer at the same time")
    results = ["finished" if f.unit_id in written.finished else "superseded" for f in finishes]
    return results, [written.now] * len(inserts)


_UNSTART = (
    "UPDATE units SET status = 'failed', failure_reason = 'not_run', finished_at = ?, attempts = attempts - 1 "
    "WHERE run_id = ? AND unit_id = ? AND status = 'running' AND started_at = ?"
)


def unstart_units(
    db: Journal, run_id: str, step_id: str | None, rows: Sequence[tuple[str, str]], *, fence: Fence | None = None
) -> int:
    """Close `running` rows whose units were never started (`rows`: (attempt id, its started_at)).

    A driver that journaled rows ahead of their dispatch (akm.engine.ahead) and then
    stopped: each row ends `failed` / `not_run` with its dispatch taken back (`attempts - 1`), so a
    later drive dispatches it as the attempt it is, and budgets do not count it. Fenced; rows
    re-dispatched by someone else meanwhile (another stamp) are left alone. Returns rows closed.
    """
    closed = 0
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        check_fence(conn, run_id, fence)
        now = db.now()
        events: list[Any] = []
        for unit_id, started_at in rows:
            if conn.execute(_UNSTART, (now, run_id, unit_id, started_at)).rowcount == 1:
                closed += 1
                meta = UnitFinish(run_id, unit_id, started_at, "failed", failure_reason="not_run").meta(step_id)
                events += ("workflow_unit_finished", now, run_id, meta)
        if events:
            db.dialect.event_lock(conn)
            conn.execute(_insert_events_sql(len(events) // 4), events)
    return closed


def heartbeat_units(db: Journal, run_id: str, unit_ids: Sequence[str]) -> int:
    """Stamp `last_checkin_at = now` on these running units (D8); returns rows touched."""
    ids = list(unit_ids)
    if not ids:
        return 0
    marks = ",".join("?" * len(ids))
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        cur = conn.execute(
            f"UPDATE units SET last_checkin_at = ? WHERE run_id = ? AND status = 'running' AND unit_id IN ({marks})",
            (db.now(), run_id, *ids),
        )
        return int(cur.rowcount)


def get_unit(db: Journal, run_id: str, unit_id: str) -> Unit | None:
    row = db.query_one(f"SELECT {_UNIT_COLUMNS} FROM units WHERE run_id = ? AND unit_id = ?", (run_id, unit_id))
    return _unit(row) if row else None


def get_units(db: Journal, run_id: str, step_id: str | None = None) -> list[Unit]:
    """Journal rows of a run (or one step), ordered started_at, unit_id."""
    sql = f"SELECT {_UNIT_COLUMNS} FROM units WHERE run_id = ?"
    params: list[Any] = [run_id]
    if step_id is not None:
        sql += " AND step_id = ?"
        params.append(step_id)
    return [_unit(r) for r in db.query(sql + " ORDER BY started_at, unit_id", params)]


# The columns a step decision reads from its rows (`akm.engine.finalize` classifies and reduces them, the
# drive loop and the session protocol look at claims and queueing): `unit_rows` selects only these, since
# most of a fan-out's per-row cost is building the values of columns nobody reads (ids, stamps, paths).
DECISION_FIELDS = (
    "unit_id",
    "phase",
    "status",
    "input_hash",
    "result_json",
    "tokens",
    "failure_reason",
    "session_id",
    "truncated",
    "attempts",
    "reopened",
    "queued_at",
    "claim_holder",
    "claim_host",
    "claim_pid",
    "claim_expires_at",
)
assert set(DECISION_FIELDS) <= set(_UNIT_FIELDS)
_UNIT_ROWS = (
    f"SELECT {', '.join(DECISION_FIELDS)} FROM units WHERE run_id = ? AND step_id = ? ORDER BY started_at, unit_id"
)


def unit_rows(db: Journal, run_id: str, step_id: str) -> list[dict[str, Any]]:
    """The rows of one step as plain dicts of `DECISION_FIELDS`, ordered as `get_units` orders them, for
    readers that decide from many rows at once: a frozen dataclass per row costs more than the query itself."""
    names = DECISION_FIELDS  # every row has them all (the query names them): zip's strict check would cost 0.5 us a row
    return [dict(zip(names, row, strict=False)) for row in db.query(_UNIT_ROWS, (run_id, step_id))]


_GATE_ROWS = (
    f"SELECT {', '.join(DECISION_FIELDS)} FROM units WHERE run_id = ? AND step_id = ? AND phase = 'gate' "
    "ORDER BY started_at, unit_id"
)
_ATTEMPT_ROWS = (
    f"SELECT {', '.join(DECISION_FIELDS)} FROM units WHERE run_id = ? AND step_id = ? AND phase IS NULL "
    "AND (unit_id = ? OR (unit_id > ? AND unit_id < ?)) ORDER BY started_at, unit_id"
)


def gate_rows(db: Journal, run_id: str, step_id: str) -> list[dict[str, Any]]:
    """The gate rows of one step (`unit_rows`' gate half): what a gate's loop is read from."""
    return [dict(zip(DECISION_FIELDS, row, strict=False)) for row in db.query(_GATE_ROWS, (run_id, step_id))]


def attempt_rows(db: Journal, run_id: str, step_id: str, base_id: str) -> list[dict[str, Any]]:
    """The dispatch rows of one unit's attempts in one gate loop (`base_id` and its retries `base_id~r<k>`),
    as `unit_rows` gives them: what a report needs of its own unit, without reading the whole step."""
    rows = db.query(_ATTEMPT_ROWS, (run_id, step_id, base_id, base_id + "~r", base_id + "~r\x7f"))
    out = [dict(zip(DECISION_FIELDS, row, strict=False)) for row in rows]
    return [r for r in out if r["unit_id"] == base_id or _is_retry_of(r["unit_id"], base_id)]


def _is_retry_of(unit_id: str, base_id: str) -> bool:
    """`base_id~r<digits>`: a retry of that attempt (the range the query reads may hold other ids)."""
    tail = unit_id[len(base_id) + 2 :]
    return unit_id.startswith(base_id + "~r") and tail.isdigit() and tail.isascii()


def family_rows(db: Journal, run_id: str, content_id: str) -> list[dict[str, Any]]:
    """Every journaled attempt of one unit (`X` and every `X~…`: all gate loops and retries), oldest first."""
    return [
        dict(r)
        for r in db.query(
            "SELECT unit_id, step_id, status, result_json, failure_reason, input_hash FROM units WHERE run_id = ? "
            f"AND phase IS NULL AND (unit_id = ? OR (unit_id > ? AND unit_id < ?)) ORDER BY {db.dialect.rowid}",
            (run_id, content_id, content_id + "~", content_id + "\x7f"),
        )
    ]  # `X~…`: a key range of the primary key


class StepTally(NamedTuple):
    """How much work a step took: logical units, dispatches (retries and re-runs included), gate loops."""

    units: int
    attempts: int
    gate_loops: int


# One pass over a run's dispatch rows: the first attempts of loop 1 (ids with no `~`, nearly every row of a
# fan-out) collapse into one group per step, counted by the journal; each other row comes back on its own.
_TALLIES = (
    "SELECT step_id, CASE WHEN unit_id LIKE '%~%' THEN unit_id END AS marked, COUNT(*) AS n, "
    "SUM(attempts) AS a FROM units WHERE run_id = ? AND phase IS NULL GROUP BY step_id, marked"
)
_TALLY_OVERLAP_CHUNK = 500  # ids per `IN (...)`: far below either journal's bound on parameters


def step_tallies(db: Journal, run_id: str) -> dict[str, StepTally]:
    """Per step id, from the dispatch rows (gate rows excluded).

    A unit id is `<base>[~l<n>][~r<k>]` (gate loop n, retry k; step ids and
    unit bases never hold `~`), so the logical unit is the text before the
    first `~`; a row's `attempts` counts its re-dispatches after a crash.
    Rows without a `~` are counted and summed in SQL (a fan-out's thousand rows are not read); the others
    are parsed here, not in SQL: the text functions differ between the journals (PostgreSQL has no
    `instr`, and its integer cast refuses `2~r1` where SQLite reads the leading digits).
    """
    units: dict[str, int] = {}
    attempts: dict[str, int] = {}
    loops: dict[str, int] = {}
    bases: dict[str, set[str]] = {}  # per step: the logical units of its `~` rows
    for r in db.query(_TALLIES, (run_id,)):
        step, marked = r["step_id"] or "", r["marked"]
        attempts[step] = attempts.get(step, 0) + int(r["a"])
        if marked is None:
            units[step] = units.get(step, 0) + int(r["n"])
            loop = 1
        else:
            bases.setdefault(step, set()).add(marked.partition("~")[0])
            units.setdefault(step, 0)
            loop = _gate_loop_of(marked)
        loops[step] = max(loops.get(step, loop), loop)
    for step, extra in bases.items():
        units[step] += len(extra)
    # A `~` row's logical unit is usually journaled under its plain id too (its first attempt): once only.
    wanted = sorted(set().union(*bases.values())) if bases else []
    for at in range(0, len(wanted), _TALLY_OVERLAP_CHUNK):
        chunk = wanted[at : at + _TALLY_OVERLAP_CHUNK]
        marks = ", ".join("?" * len(chunk))
        for r in db.query(
            f"SELECT step_id, unit_id FROM units WHERE run_id = ? AND phase IS NULL AND unit_id IN ({marks})",
            (run_id, *chunk),
        ):
            step = r["step_id"] or ""
            if r["unit_id"] in bases.get(step, ()):
                units[step] -= 1
    return {step: StepTally(units[step], attempts[step], loops[step] or 0) for step in attempts}


def reused_counts(db: Journal, run_id: str) -> dict[str, int]:
    """Per step id: the unit rows restored from an earlier identical one (`reused_from` set), not run."""
    return {
        r["step_id"] or "": int(r["n"])
        for r in db.query(
            "SELECT step_id, COUNT(*) AS n FROM units WHERE run_id = ? AND reused_from IS NOT NULL GROUP BY step_id",
            (run_id,),
        )
    }


def _gate_loop_of(unit_id: str) -> int:
    """The gate loop a unit id names (`…~l<n>…`: the digits after the first `~l`, 0 when none follow), 1 when
    it names none — what SQLite's `CAST(substr(unit_id, instr(unit_id, '~l') + 2) AS INTEGER)` read."""
    at = unit_id.find("~l")
    if at < 0:
        return 1
    digits = ""
    for ch in unit_id[at + 2 :]:
        if not ("0" <= ch <= "9"):
            break
        digits += ch
    return int(digits) if digits else 0


# A budget counts a run's dispatches over its whole life: the rows a rewind superseded count too.
_TOTALS = (
    "SELECT COALESCE(SUM(attempts), 0) AS a, COALESCE(SUM(tokens), 0) AS t FROM ("
    "SELECT attempts, tokens FROM units WHERE run_id = ? AND phase IS NULL{mine} UNION ALL "
    "SELECT attempts, tokens FROM superseded_units WHERE run_id = ? AND phase IS NULL) AS lifetime"
)


def journal_totals(db: Journal, run_id: str) -> tuple[int, int]:
    """(sum of attempts, sum of tokens) over dispatch rows (gate rows excluded), superseded ones included (a
    rewind does not give a budget back) — seeds budgets."""
    row = db.query_one(_TOTALS.format(mine=""), (run_id, run_id))
    assert row is not None
    return int(row["a"]), int(row["t"])


class Spend(NamedTuple):
    """What a run has spent over its whole life (rewound rows included, gate rows not): the budget's seed."""

    attempts: int
    tokens: int
    cost: float  # USD of the attempts whose cost is known
    unknown_tokens: int  # finished model attempts of an engine that reported no token figure
    unknown_cost: int  # ... whose cost is not known (no figures, or the engine has no prices)


def _unknown_sql(column: str) -> str:
    """1 for a finished model attempt of an engine with `column` null (akm.engine.cost.counts_as_unknown)."""
    from akm.store.status import MODEL_RUNNERS, NOTHING_SPENT

    runners = ", ".join(f"'{r}'" for r in MODEL_RUNNERS)
    spent = ", ".join(f"'{r}'" for r in sorted(NOTHING_SPENT))
    return (
        f"CASE WHEN {column} IS NULL AND runner IN ({runners}) AND engine IS NOT NULL AND reused_from IS NULL "
        f"AND (status = 'completed' OR (status = 'failed' AND COALESCE(failure_reason, '') NOT IN ({spent}))) "
        "THEN 1 ELSE 0 END"
    )


_SPEND_COLUMNS = "attempts, tokens, cost, runner, engine, reused_from, status, failure_reason"
_SPEND: dict[str, str] = {}


def _spend_sql(mine: str = "") -> str:
    """The lifetime sums of a run (`Spend`'s columns a, t, c, ut, uc); `mine` narrows the live rows."""
    sql = _SPEND.get(mine)
    if sql is None:
        sql = _SPEND[mine] = (
            "SELECT COALESCE(SUM(attempts), 0) AS a, COALESCE(SUM(tokens), 0) AS t, COALESCE(SUM(cost), 0) AS c, "
            f"COALESCE(SUM({_unknown_sql('tokens')}), 0) AS ut, COALESCE(SUM({_unknown_sql('cost')}), 0) AS uc FROM ("
            f"SELECT {_SPEND_COLUMNS} FROM units WHERE run_id = ? AND phase IS NULL{mine} UNION ALL "
            f"SELECT {_SPEND_COLUMNS} FROM superseded_units WHERE run_id = ? AND phase IS NULL) AS lifetime"
        )
    return sql


def journal_spend(db: Journal, run_id: str) -> Spend:
    """The run's lifetime spend (`Spend`): what the money and token ceilings count (akm.engine.budget)."""
    row = db.query_one(_spend_sql(), (run_id, run_id))
    assert row is not None
    return Spend(int(row["a"]), int(row["t"]), float(row["c"]), int(row["ut"]), int(row["uc"]))


def project_spend_since(
    db: Journal, scope_key: str, since: str, *, only: str | None = None, but: str | None = None
) -> float:
    """USD the runs of one project (`scope_key`) spent in attempts finished at or after `since` (config
    `limits.maxCostPerDay`: `since` is the start of the journal clock's UTC day); `only` / `but` one run."""
    which = " AND r.id = ?" if only is not None else " AND r.id != ?" if but is not None else ""
    extra = (only,) if only is not None else (but,) if but is not None else ()
    row = db.query_one(
        "SELECT COALESCE(SUM(c), 0) AS c FROM ("
        "SELECT u.cost AS c FROM units u JOIN runs r ON r.id = u.run_id WHERE r.scope_key = ? AND u.cost IS NOT NULL "
        f"AND u.finished_at >= ?{which} UNION ALL "
        "SELECT s.cost AS c FROM superseded_units s JOIN runs r ON r.id = s.run_id WHERE r.scope_key = ? "
        f"AND s.cost IS NOT NULL AND s.finished_at >= ?{which}) AS today",
        (scope_key, since, *extra, scope_key, since, *extra),
    )
    return float(row["c"]) if row is not None else 0.0


# -- claims (D13) -----------------------------------------------------------------------------


def _claim_of(row: Any) -> ClaimInfo:
    return ClaimInfo(
        holder=row["claim_holder"], host=row["claim_host"], pid=row["claim_pid"], until=row["claim_expires_at"]
    )


class ReportWrite(NamedTuple):
    """What `write_report` did: `recorded` is written | idempotent | heartbeat."""

    recorded: ReportRecorded
    claim: ClaimInfo | None = None
    tokens_crossed: str | None = None  # the max_tokens message when this report reached the ceiling


class ReportedAttempt(NamedTuple):
    """One report of the calling agent as the journal records it (`write_report`'s one argument).

    `attempt`: the row the report writes (its unit's identity in the plan); then what the report says,
    redacted and normalised by the engine; who reports it; the run's budget ceilings it is held to."""

    attempt: NewAttempt
    status: Literal["completed", "failed", "running"]
    result_json: str | None
    tokens: int | None
    failure_reason: str | None
    holder: str
    rerun: bool
    max_units: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    allow_unknown: bool = False


def write_report(db: Journal, report: ReportedAttempt) -> ReportWrite:
    """Record one report of the calling agent in ONE transaction, with every guard inside it.

    The guards are pure decisions (`report_guards.check_report`, `check_budget`) over the rows read here,
    in this transaction: nothing can change between a guard and the write it allows.

    Guards (UsageError, nothing written): the run is drivable (RUN_NOT_ACTIVE), no live engine
    lease (LEASE_HELD), the row's input hash is the plan's (REPLAY_DIVERGED), a live claim of another holder (CLAIM_HELD), the reporter's own claim
    expired (CLAIM_EXPIRED), a finished row reported again with other content and no `rerun`
    (REPORT_CONFLICT), a running report on a finished row without `rerun` (UNIT_TERMINAL), a
    unit ceiling of the run's budget (BUDGET_EXCEEDED). The same content again is
    `idempotent`. `status` running claims the unit (or renews the reporter's claim).

    A reporter is often a short-lived process (one `akm workflow report` per call), so its claim
    records no pid: it lives until it expires or is renewed, never "dies with" the reporting process.
    """
    # The session protocol's guards: loaded on its first report, not on every engine start.
    from akm.store.report_guards import Report, carried_tokens, check_budget, check_report, tokens_crossed

    a = report.attempt
    run_id, unit_id = a.run_id, a.unit_id
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        now = db.now()
        run = conn.execute(
            "SELECT status, lease_holder, lease_host, lease_pid, lease_until FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        row = conn.execute(
            "SELECT status, result_json, failure_reason, tokens, attempts, input_hash, claim_holder, claim_host, "
            "claim_pid, claim_expires_at, step_id FROM units WHERE run_id = ? AND unit_id = ?",
            (run_id, unit_id),
        ).fetchone()
        asked = Report(
            unit_id, report.status, report.result_json, report.failure_reason, report.holder, report.rerun, a.input_hash
        )
        plan = check_report(run_id, run, row, asked, now)
        if plan.kind == "idempotent":
            return ReportWrite("idempotent")
        if plan.kind == "renew":
            return ReportWrite("heartbeat", _claim(db, conn, now, a, report.holder, renew=True))
        totals = conn.execute(_spend_sql(" AND unit_id != ?"), (run_id, unit_id, run_id)).fetchone()
        check_budget(
            plan,
            row,
            other_attempts=int(totals["a"]),
            other_tokens=int(totals["t"]),
            max_units=report.max_units,
            max_tokens=report.max_tokens,
            other_cost=float(totals["c"]),
            unknown_tokens=int(totals["ut"]),
            unknown_cost=int(totals["uc"]),
            max_cost=report.max_cost,
            allow_unknown=report.allow_unknown,
        )
        if not plan.finishing_claim:
            started = insert_unit(db, **a._asdict())
        else:
            started = conn.execute(
                "SELECT started_at FROM units WHERE run_id = ? AND unit_id = ?", (run_id, unit_id)
            ).fetchone()["started_at"]
        if report.status == "running":
            return ReportWrite("heartbeat", _claim(db, conn, now, a, report.holder))  # a claim is a sign of life
        carried = carried_tokens(plan, report.tokens)
        finish_unit(
            db,
            run_id=run_id,
            unit_id=unit_id,
            started_at=started,
            status=report.status,
            result_json=report.result_json,
            tokens=carried,
            failure_reason=report.failure_reason,
            session_id=None,
            at=None if plan.finishing_claim else started,
        )
        return ReportWrite("written", tokens_crossed=tokens_crossed(int(totals["t"]), carried, report.max_tokens))


def _claim(db: Journal, conn: Any, now: str, a: NewAttempt, holder: str, *, renew: bool = False) -> ClaimInfo:
    """Claim the attempt row for `holder` (or renew the holder's claim) for CLAIM_TTL_S from `now`. A
    reporter's claim records no pid (see `write_report`)."""
    until, host = db.later(now, CLAIM_TTL_S), host_id()
    if renew:
        conn.execute(
            "UPDATE units SET claim_expires_at = ?, claim_host = ?, claim_pid = ?, last_checkin_at = ? "
            "WHERE run_id = ? AND unit_id = ?",
            (until, host, None, now, a.run_id, a.unit_id),
        )
    else:
        conn.execute(
            "UPDATE units SET claim_holder = ?, claim_host = ?, claim_pid = ?, claim_expires_at = ?, "
            "last_checkin_at = ? WHERE run_id = ? AND unit_id = ?",
            (holder, host, None, until, now, a.run_id, a.unit_id),
        )
    return ClaimInfo(holder, host, None, until)


def guard_session_write(db: Journal, run_id: str) -> None:
    """Refuse a session write (a verdict) when the run cannot take it: not drivable, or driven by the engine.

    The run half of the report guards (`report_guards.check_run_takes_reports`), for a caller that holds
    the transaction its write joins."""
    from akm.store.report_guards import check_run_takes_reports

    run = db.query_one(
        "SELECT status, lease_holder, lease_host, lease_pid, lease_until FROM runs WHERE id = ?", (run_id,)
    )
    check_run_takes_reports(run_id, run, db.now(), lease_details=False)


def note_activity(
    db: Journal, *, run_id: str, unit_id: str, started_at: str, step_id: str | None, activity: dict[str, Any]
) -> bool:
    """Journal what a running agent unit's CLI is doing: a `workflow_unit_activity` event (`status --watch` of
    another process shows it) and, once the CLI said it, its session id on the row (`status --units`).

    Written only while the row is still this dispatch's running one (started_at); False when it is not (the
    unit finished, or was re-dispatched): live progress is advisory and never touches what is settled.
    """
    session = activity.get("sessionId")
    meta = compact_json({"runId": run_id, "stepId": step_id, "unitId": unit_id, **activity})
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        cur = conn.execute(
            "UPDATE units SET session_id = COALESCE(?, session_id) "
            "WHERE run_id = ? AND unit_id = ? AND status = 'running' AND started_at = ?",
            (session if isinstance(session, str) else None, run_id, unit_id, started_at),
        )
        if cur.rowcount != 1:
            return False
        db.dialect.event_lock(conn)
        conn.execute(_INSERT_EVENTS, ("workflow_unit_activity", db.now(), run_id, meta))
    return True
