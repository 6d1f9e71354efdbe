"""The unit queue of a run spread over workers (phase 2; spec/journal.md "Workers").

The coordinator (the driver holding the run lease, started with `--workers`) journals an attempt `queued`
instead of `running`, with what a worker needs to run it (`dispatch_json`). An `akm worker` on any host
claims queued rows, runs them with the same dispatchers and finishes them. The rules, each kept in one
transaction here:

* **Queueing is fenced** like a local dispatch (`insert_unit`): it commits only while the coordinator still
  holds the lease, and only into a drivable run. An attempt already in the queue, or running under a live
  worker claim, is *adopted* (left as it is): a coordinator that took a run over waits for it instead of
  queueing it twice. A finished row is left alone too: the caller reads it.
* **A claim** turns a queued row `running` for one worker: `attempts + 1` is the claim's fencing token,
  `claim_expires_at` is set on the journal's clock and renewed by the worker's heartbeat, `host` records
  where the attempt runs. On PostgreSQL claimers skip rows another claimer has locked (`SKIP LOCKED`), so
  two workers never claim one row and never wait for each other; on SQLite the file's one write lock
  serializes claims.
* **A finish is fenced** by that token and the claimant: a worker that was frozen past its claim's expiry
  (the row was re-queued and claimed by another worker since) finds no row to finish, its result is
  rejected ("superseded") and the newer claim's result stands.
* **The sweep** puts back in the queue the worker rows whose claim expired on the journal clock (a worker
  that stopped renewing: killed, frozen, partitioned) or whose claimant is a dead process on this host. A
  re-queued attempt keeps its id; the next claim bumps `attempts` again. Any worker or coordinator sweeps;
  it is idempotent.

Nothing here is an engine decision: which units to queue, and what a finished row means for the step, stay
with the coordinator's drive loop (`akm.engine.remote`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection, Iterable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any, NamedTuple

from akm.codes import Code
from akm.errors import NotFoundError
from akm.store.batch import Coalescer
from akm.store.clock import format_iso, parse_iso
from akm.store.journal import RUN_UNIT_WRITE, Journal
from akm.store.runs import (
    Fence,
    check_fence,
    holder_is_live,
    host_id,
    lease_lost_error,
    not_drivable_error,
    pid_alive,
    seconds_from_env,
)
from akm.store.status import DRIVABLE_STATUSES, UnitStatus
from akm.store.units import _INSERT_EVENTS, UnitFinish, _json_opt, _started_meta

# Wake-up channels (`Journal.listener` / `Journal.notifier`; PostgreSQL only, a hint beside polling).
WORK_CHANNEL = "akm_work"  # coordinator → workers: units were queued (payload: the run id)
RUN_CHANNEL = "akm_run"  # worker → coordinator: a unit of the run finished (payload: the run id)

WORKER_CLAIM_TTL_S = 90.0
WORKER_CLAIM_TTL_ENV = "AKM_WORKER_CLAIM_TTL_S"  # overrides the claim TTL (seconds); tests, slow links

_DRIVABLE_SQL = "(" + ",".join(f"'{s}'" for s in DRIVABLE_STATUSES) + ")"


def claim_ttl_s() -> float:
    """A worker claim's TTL: AKM_WORKER_CLAIM_TTL_S when set (INVALID_ENV unless a number > 0), else 90 s."""
    return seconds_from_env(WORKER_CLAIM_TTL_ENV, WORKER_CLAIM_TTL_S)


class Queued(NamedTuple):
    """What `queue_unit` did: `queued` (written now), `adopted` (already in the queue or running under a live
    worker claim), or `finished` (the row completed already: read it). A failed row is queued again, as a
    local driver dispatches a failed unit again. `wake`: idle workers are still to be told (`WORK_CHANNEL`,
    after the commit): the write that queued it did not tell them itself. On PostgreSQL the one-statement
    queue write does, at its commit, whenever it queued units."""

    outcome: str
    status: str
    wake: bool = False


class Claim(NamedTuple):
    """One attempt a worker claimed: `token` (the row's `attempts` after the claim) fences its finish."""

    run_id: str
    unit_id: str
    step_id: str | None
    runner: str | None
    engine: str | None
    model: str | None
    input_hash: str | None
    dispatch_json: str | None
    token: int
    started_at: str


class Eligible(NamedTuple):
    """A (run, step) with queued units, as a worker decides whether it can run them (before claiming), with the
    dispatch payload of one of them, read in the same statement: units claimed by others meanwhile cannot
    leave the step without one (the race of issue 40, in which a worker refused a step it could run); and the
    run's frozen plan and its hash, unless the worker said it has the plan already (`eligible_work(known=...)`)."""

    run_id: str
    step_id: str | None
    scope_key: str
    queued: int
    payload: str | None = None
    plan_json: str | None = None
    plan_hash: str | None = None


class _ToQueue(NamedTuple):
    """One attempt `queue_unit` was asked to queue."""

    run_id: str
    unit_id: str
    step_id: str | None
    node_id: str
    parent_unit_id: str | None
    runner: str | None
    engine: str | None
    model: str | None
    input_hash: str | None
    dispatch_json: str
    fence: Fence


def _pg(db: Journal) -> ModuleType | None:
    """The one-statement forms of these writes (`store/postgres/hotpath.py`) where the journal is PostgreSQL."""
    if db.backend != "postgres":
        return None
    from akm.store.postgres import hotpath

    return hotpath


def worker_primers(db: Journal) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """A worker's hot statements for `Journal.warm` to run ahead on each pooled connection, matching nothing
    (PostgreSQL: its one-statement claims and finishes; nothing elsewhere)."""
    hot = _pg(db)
    return hot.WORKER_PRIMERS if hot is not None else ()


def coordinator_primers(db: Journal) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """A coordinator's hot statements (its queue writes, its reads of finished rows) for `Journal.warm`, as
    `worker_primers`."""
    hot = _pg(db)
    return hot.COORDINATOR_PRIMERS if hot is not None else ()


def finish_notifies(db: Journal) -> bool:
    """Whether `finish_claimed` itself tells the coordinator a unit finished (PostgreSQL: in its statement), so a
    worker sends no NOTIFY of its own."""
    return _pg(db) is not None


def queue_unit(
    db: Journal,
    *,
    run_id: str,
    unit_id: str,
    step_id: str | None,
    node_id: str,
    parent_unit_id: str | None,
    runner: str | None,
    engine: str | None,
    model: str | None,
    input_hash: str | None,
    dispatch_json: str,
    fence: Fence,
) -> Queued:
    """Put one attempt in the queue for workers, fenced by the coordinator's lease (see the module doc).

    Refuses like `insert_unit` (RUN_NOT_FOUND / RUN_ABANDONED / RUN_NOT_ACTIVE / LEASE_LOST, nothing written).
    A new row gets `attempts = 0` (no dispatch yet; each claim adds one); a re-queued failed or abandoned-claim
    row keeps its count. On PostgreSQL the calls of many threads at once are written together, one statement
    per run (`akm.store.batch`, `queue_units`); the answer is the same.
    """
    item = _ToQueue(
        run_id, unit_id, step_id, node_id, parent_unit_id, runner, engine, model, input_hash, dispatch_json, fence
    )
    if _pg(db) is None:
        return _queue_one(db, item)
    return _queue_batches(db).submit(item)


_batches: weakref.WeakKeyDictionary[Journal, Coalescer[_ToQueue, Queued]] = weakref.WeakKeyDictionary()
_batches_lock = threading.Lock()


def _queue_batches(db: Journal) -> Coalescer[_ToQueue, Queued]:
    """The journal's one coalescer of `queue_unit` calls."""
    with _batches_lock:
        batches = _batches.get(db)
        if batches is None:
            ref = weakref.ref(db)

            def write(items: list[_ToQueue]) -> list[Queued | BaseException]:
                journal = ref()
                assert journal is not None  # a caller holds it
                return queue_units(journal, items)

            batches = _batches[db] = Coalescer(write)
        return batches


def queue_units(db: Journal, items: Sequence[_ToQueue]) -> list[Queued | BaseException]:
    """Queue many attempts: each one's `Queued`, or the error that refused it (nothing written for it).

    On PostgreSQL one statement per run and fence (`hotpath.queue_units`): a refusal of the run (not found, not
    drivable, lease lost) or a journal error is the answer of every attempt of that statement, and a value
    that cannot be stored (NOT_UTF8) the answer of its own attempt only (the others are written without it).
    Elsewhere each attempt is its own transaction.
    """
    out: list[Queued | BaseException | None] = [None] * len(items)
    hot = _pg(db)
    if hot is None:
        for i, item in enumerate(items):
            try:
                out[i] = _queue_one(db, item)
            except Exception as exc:
                out[i] = exc
        return [r for r in out if r is not None]
    groups: dict[tuple[str, Fence], list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault((item.run_id, item.fence), []).append(i)
    for (run_id, fence), idxs in groups.items():
        while idxs:  # a statement writes each unit once: a repeated id goes in the next one
            now: list[int] = []
            later: list[int] = []
            seen: set[str] = set()
            for i in idxs:
                (later if items[i].unit_id in seen else now).append(i)
                seen.add(items[i].unit_id)
            idxs = later
            answers: list[Queued | BaseException]
            try:
                answers = list(_queue_statement(db, hot, run_id, fence, [items[i] for i in now]))
            except UnicodeEncodeError:
                answers = []
                for i in now:  # which value it is: each alone
                    try:
                        answers += _queue_statement(db, hot, run_id, fence, [items[i]])
                    except Exception as exc:
                        answers.append(_as_error(exc))
            except Exception as exc:
                answers = [exc for _ in now]
            for i, answer in zip(now, answers, strict=True):
                out[i] = answer
    return [r for r in out if r is not None]


def _as_error(exc: Exception) -> Exception:
    if isinstance(exc, UnicodeEncodeError):
        from akm.store.journal import not_text_error

        return not_text_error(exc)
    return exc


def _queue_statement(
    db: Journal, hot: ModuleType, run_id: str, fence: Fence, items: Sequence[_ToQueue]
) -> list[Queued]:
    """One `hotpath.queue_units` statement and what it means for each attempt (a refusal raises)."""
    rows = [
        {
            "unit_id": t.unit_id,
            "step_id": t.step_id,
            "node_id": t.node_id,
            "parent_unit_id": t.parent_unit_id,
            "runner": t.runner,
            "engine": t.engine,
            "model": t.model,
            "input_hash": t.input_hash,
            "dispatch_json": t.dispatch_json,
        }
        for t in items
    ]
    answer = hot.queue_units(db, run_id, fence.holder, fence.epoch, rows, WORK_CHANNEL)
    if answer.run is None:
        raise NotFoundError(f"workflow run {run_id!r} not found", code=Code.RUN_NOT_FOUND, details={"runId": run_id})
    status, holder, epoch = answer.run
    if status not in DRIVABLE_STATUSES:
        raise not_drivable_error(run_id, status, "given new units")
    if holder != fence.holder or epoch != fence.epoch:
        raise lease_lost_error(run_id, fence, holder, epoch)
    out: list[Queued] = []
    for t in items:
        if t.unit_id in answer.put:
            out.append(Queued("queued", "queued"))  # the statement woke idle workers itself
            continue
        row_status, claim_host, claim_pid = answer.current[t.unit_id]
        if row_status == "completed":
            out.append(Queued("finished", row_status))
        elif row_status == "running" and claim_host == host_id() and claim_pid and not pid_alive(claim_pid):
            out.append(_queue_one(db, t))  # its claimant died on this host: queued again now, as `_queue_one` does
        else:
            out.append(Queued("adopted", row_status))
    return out


def _queue_one(db: Journal, t: _ToQueue) -> Queued:
    """`queue_unit` as one transaction of several statements (SQLite; and a dead claimant's row on PostgreSQL)."""
    run_id, unit_id, fence = t.run_id, t.unit_id, t.fence
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        run = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if run is None:
            raise NotFoundError(
                f"workflow run {run_id!r} not found", code=Code.RUN_NOT_FOUND, details={"runId": run_id}
            )
        if run["status"] not in DRIVABLE_STATUSES:
            raise not_drivable_error(run_id, run["status"], "given new units")
        check_fence(conn, run_id, fence)
        now = db.now()
        row = conn.execute(
            "SELECT status, queued_at, claim_holder, claim_host, claim_pid, claim_expires_at FROM units "
            f"WHERE run_id = ? AND unit_id = ?{db.dialect.row_lock}",
            (run_id, unit_id),
        ).fetchone()
        if row is not None:
            status = row["status"]
            if status == "completed":
                return Queued("finished", status)
            if status == "queued":
                return Queued("adopted", status)
            if (
                status == "running"
                and row["queued_at"] is not None
                and holder_is_live(
                    row["claim_holder"], row["claim_host"], row["claim_pid"], row["claim_expires_at"], now
                )
            ):
                return Queued("adopted", status)
        values = (
            run_id,
            unit_id,
            t.step_id,
            t.node_id,
            t.parent_unit_id,
            t.runner,
            t.engine,
            t.model,
            t.input_hash,
            now,
            now,
        )
        conn.execute(
            "INSERT INTO units (run_id, unit_id, step_id, node_id, parent_unit_id, runner, engine, model, "
            "status, input_hash, started_at, queued_at, attempts, dispatch_json) "
            "VALUES (?,?,?,?,?,?,?,?,'queued',?,?,?,0,?) "
            "ON CONFLICT (run_id, unit_id) DO UPDATE SET step_id = excluded.step_id, node_id = excluded.node_id, "
            "parent_unit_id = excluded.parent_unit_id, runner = excluded.runner, engine = excluded.engine, "
            "model = excluded.model, phase = NULL, status = 'queued', input_hash = excluded.input_hash, "
            "started_at = excluded.started_at, queued_at = excluded.queued_at, "
            "dispatch_json = excluded.dispatch_json, result_json = NULL, tokens = NULL, cost = NULL, failure_reason = NULL, "
            "session_id = NULL, finished_at = NULL, last_checkin_at = NULL, claim_holder = NULL, "
            "claim_host = NULL, claim_pid = NULL, claim_expires_at = NULL, truncated = 0, reopened = 0, "
            "worktree_path = NULL, host = NULL, reused_from = NULL",
            (*values, t.dispatch_json),
        )
    return Queued("queued", "queued", wake=True)


def eligible_work(db: Journal, kinds: Sequence[str], known: Collection[str] = ()) -> list[Eligible]:
    """The (run, step) pairs of drivable runs with queued units a worker of these `kinds` could claim, each with
    one of those units' dispatch payload and, for the runs not in `known`, the run's frozen plan (see `Eligible`):
    a worker's first claim of a run reads it here instead of in round trips of its own."""
    if not kinds:
        return []
    marks = ",".join("?" * len(kinds))
    runs = sorted(known)
    plan = f"CASE WHEN r.id IN ({','.join('?' * len(runs))}) THEN NULL ELSE r.plan_json END" if runs else "r.plan_json"
    rows = db.query(
        f"SELECT r.id AS run_id, u.step_id, r.scope_key, COUNT(*) AS n, MIN(u.dispatch_json) AS payload, "
        f"{plan} AS plan_json, r.plan_hash FROM units u "
        f"JOIN runs r ON r.id = u.run_id WHERE u.status = 'queued' AND u.runner IN ({marks}) "
        f"AND r.status IN {_DRIVABLE_SQL} "
        "GROUP BY r.id, u.step_id ORDER BY MIN(u.queued_at), r.id",
        (*runs, *kinds),
    )
    return [
        Eligible(r["run_id"], r["step_id"], r["scope_key"], int(r["n"]), r["payload"], r["plan_json"], r["plan_hash"])
        for r in rows
    ]


def claim_units(
    db: Journal,
    *,
    run_id: str,
    step_id: str | None,
    kinds: Sequence[str],
    holder: str,
    host: str,
    pid: int | None,
    limit: int,
) -> list[Claim]:
    """Claim up to `limit` queued units of one step for `holder` (`claim_work` with one target)."""
    return claim_work(db, targets=[(run_id, step_id)], kinds=kinds, holder=holder, host=host, pid=pid, limit=limit)


def claim_work(
    db: Journal,
    *,
    targets: Sequence[tuple[str, str | None]],
    kinds: Sequence[str],
    holder: str,
    host: str,
    pid: int | None,
    limit: int,
    ahead: int = 0,
) -> list[Claim]:
    """Claim up to `limit` queued units of the (run, step) `targets` for `holder`, oldest queued first, and up to
    `ahead` more while each leaves another unit queued (`take_ahead`).

    The run row is locked first (as every unit write does), so a claim cannot slip in after an abandon
    commits; rows another claimer holds are skipped, not waited for. Each claim writes
    `workflow_unit_started` (with the host) in the same transaction. On PostgreSQL one statement claims over
    every target (`hotpath.claim_units`); elsewhere one transaction per target, until `limit` is reached.
    """
    if limit + ahead <= 0 or not kinds or not targets:
        return []
    hot = _pg(db)
    if hot is not None:
        rows = hot.claim_units(
            db,
            targets=targets,
            kinds=kinds,
            holder=holder,
            host=host,
            pid=pid,
            ttl_s=claim_ttl_s(),
            limit=limit,
            meta_tail=_started_tail(host, holder),
            ahead=ahead,
        )
        return [_claim_of(r) for r in rows]
    claims: list[Claim] = []
    for run_id, step_id in targets:
        if len(claims) >= limit + ahead:
            break
        now_n = max(0, limit - len(claims))
        claims += _claim_step(db, run_id, step_id, kinds, holder, host, pid, now_n, limit + ahead - len(claims) - now_n)
    return claims


def take_ahead(found: int, now: int, ahead: int) -> int:
    """How many of the `found` queued units (picked oldest first, at most `now + ahead + 1` when `ahead`) a claim
    takes: the `now` ones the claimer runs at once, and each of the `ahead` ones it would hold for later only while
    another unit stays queued behind it — a worker claiming ahead never takes the last queued unit from a worker
    that is idle now (issue 40: in a step narrower than its workers' slots the queue holds few units)."""
    return min(found, max(now, min(now + ahead, found - 1)))


def _claim_step(
    db: Journal,
    run_id: str,
    step_id: str | None,
    kinds: Sequence[str],
    holder: str,
    host: str,
    pid: int | None,
    limit: int,
    ahead: int = 0,
) -> list[Claim]:
    """Claim up to `limit` queued units of one step, and `ahead` more (`take_ahead`), in one transaction of several
    statements."""
    marks = ",".join("?" * len(kinds))
    ttl = claim_ttl_s()
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        run = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if run is None or run["status"] not in DRIVABLE_STATUSES:
            return []
        picked = conn.execute(
            "SELECT unit_id FROM units WHERE run_id = ? AND step_id "
            f"{db.dialect.null_eq} ? AND status = 'queued' AND runner IN ({marks}) "
            f"ORDER BY queued_at, unit_id LIMIT ?{db.dialect.skip_locked}",
            (run_id, step_id, *kinds, limit + ahead + (1 if ahead else 0)),
        ).fetchall()
        picked = picked[: take_ahead(len(picked), limit, ahead)]
        if not picked:
            return []
        now = db.now()
        until = db.later(now, ttl)
        claims: list[Claim] = []
        for p in picked:
            row = conn.execute(
                "UPDATE units SET status = 'running', attempts = attempts + 1, claim_holder = ?, claim_host = ?, "
                "claim_pid = ?, claim_expires_at = ?, started_at = ?, last_checkin_at = ?, host = ? "
                "WHERE run_id = ? AND unit_id = ? AND status = 'queued' "
                "RETURNING unit_id, step_id, runner, engine, model, input_hash, dispatch_json, attempts",
                (holder, host, pid, until, now, now, host, run_id, p["unit_id"]),
            ).fetchone()
            if row is None:
                continue
            claims.append(
                Claim(
                    run_id,
                    row["unit_id"],
                    row["step_id"],
                    row["runner"],
                    row["engine"],
                    row["model"],
                    row["input_hash"],
                    row["dispatch_json"],
                    int(row["attempts"]),
                    now,
                )
            )
        if claims:
            db.dialect.event_lock(conn)
            for c in claims:
                # a driver's `workflow_unit_started` metadata, and where and by whom the attempt runs
                meta = _started_meta(run_id, c.step_id, c.unit_id)[:-1] + _started_tail(host, holder)
                conn.execute(_INSERT_EVENTS, ("workflow_unit_started", now, run_id, meta))
    return claims


def finish_claimed(
    db: Journal,
    claim: Claim,
    holder: str,
    *,
    status: UnitStatus,
    result_json: str | None,
    tokens: int | None,
    failure_reason: str | None,
    session_id: str | None = None,
    truncated: bool = False,
    usage: dict[str, Any] | None = None,
    cost: float | None = None,
    started_at: str | None = None,
) -> str:
    """Record a worker's outcome of its claim: "finished", or "superseded" (nothing written) when the row is
    no longer this claim's (re-queued after the claim expired, re-claimed, or finished by someone else).

    `started_at`: when the unit really started, where that is later than its claim (a unit claimed ahead waited
    in its slot: `started_later`); the row's start stamp becomes it, so the wait is not shown as run time.

    A unit of a run abandoned meanwhile ends `failed` (`abandoned`) without its result, as a driver's does.
    On PostgreSQL the same statement wakes the coordinator (`RUN_CHANNEL`; see `finish_notifies`).
    """
    if status not in ("completed", "failed"):
        raise ValueError(f"finish_claimed status must be completed or failed, not {status!r}")
    hot = _pg(db)
    if hot is not None:
        written = hot.finish_claimed(
            db,
            _claim_finish(
                hot,
                claim,
                holder,
                status,
                result_json,
                tokens,
                failure_reason,
                session_id,
                truncated,
                usage,
                cost,
                started_at,
            ),
        )
        return "finished" if written else "superseded"
    with db.tx() as conn:
        db.dialect.lock_run(conn, claim.run_id, RUN_UNIT_WRITE)
        run = conn.execute("SELECT status FROM runs WHERE id = ?", (claim.run_id,)).fetchone()
        if run is not None and run["status"] == "abandoned":
            status, result_json, failure_reason, truncated = "failed", None, "abandoned", False
        now = db.now()
        cur = conn.execute(
            "UPDATE units SET status = ?, result_json = ?, tokens = ?, cost = ?, failure_reason = ?, session_id = ?, "
            "truncated = ?, started_at = coalesce(?, started_at), finished_at = ?, claim_holder = NULL, "
            "claim_pid = NULL, claim_expires_at = NULL, claim_host = NULL WHERE run_id = ? AND unit_id = ? "
            "AND status = 'running' AND claim_holder = ? AND attempts = ?",
            (
                status,
                result_json,
                tokens,
                cost,
                failure_reason,
                session_id,
                int(bool(truncated)),
                started_at,
                now,
                claim.run_id,
                claim.unit_id,
                holder,
                claim.token,
            ),
        )
        if cur.rowcount != 1:
            return "superseded"
        meta = UnitFinish(
            claim.run_id,
            claim.unit_id,
            claim.started_at,
            status,
            tokens=tokens,
            failure_reason=failure_reason,
            truncated=truncated,
            usage=usage,
            cost=cost,
        ).meta(claim.step_id)  # the same `workflow_unit_finished` metadata a driver's finish writes
        db.dialect.event_lock(conn)
        conn.execute(_INSERT_EVENTS, ("workflow_unit_finished", now, claim.run_id, meta))
    return "finished"


def finish_and_claim(
    db: Journal,
    claim: Claim,
    holder: str,
    *,
    status: UnitStatus,
    result_json: str | None,
    tokens: int | None,
    failure_reason: str | None,
    session_id: str | None = None,
    truncated: bool = False,
    usage: dict[str, Any] | None = None,
    cost: float | None = None,
    started_at: str | None = None,
    targets: Sequence[tuple[str, str | None]],
    kinds: Sequence[str],
    host: str,
    pid: int | None,
    limit: int,
    ahead: int = 0,
) -> tuple[str, list[Claim]]:
    """`finish_claimed`, then `claim_work` for up to `limit` units of `targets` and `ahead` more: a worker's slot
    records its outcome and takes its next unit, and maybe one to hold ahead (`take_ahead`). Each keeps its own
    rules (a claim does not depend on the finish: the slot is free either way). On PostgreSQL one statement does
    both (`hotpath.finish_and_claim`), one round trip instead of two; elsewhere they are two transactions, one
    after the other."""
    if status not in ("completed", "failed"):
        raise ValueError(f"finish_and_claim status must be completed or failed, not {status!r}")
    hot = _pg(db)
    if hot is None or limit + ahead <= 0 or not kinds or not targets:
        written = finish_claimed(
            db,
            claim,
            holder,
            status=status,
            result_json=result_json,
            tokens=tokens,
            failure_reason=failure_reason,
            session_id=session_id,
            truncated=truncated,
            usage=usage,
            cost=cost,
            started_at=started_at,
        )
        claims = claim_work(
            db, targets=targets, kinds=kinds, holder=holder, host=host, pid=pid, limit=limit, ahead=ahead
        )
        return written, claims
    done = hot.finish_and_claim(
        db,
        _claim_finish(
            hot,
            claim,
            holder,
            status,
            result_json,
            tokens,
            failure_reason,
            session_id,
            truncated,
            usage,
            cost,
            started_at,
        ),
        targets=targets,
        kinds=kinds,
        host=host,
        pid=pid,
        ttl_s=claim_ttl_s(),
        limit=limit,
        ahead=ahead,
        meta_tail=_started_tail(host, holder),
    )
    return "finished" if done.finished else "superseded", [_claim_of(r) for r in done.claimed]


def _claim_finish(
    hot: ModuleType,
    claim: Claim,
    holder: str,
    status: UnitStatus,
    result_json: str | None,
    tokens: int | None,
    failure_reason: str | None,
    session_id: str | None,
    truncated: bool,
    usage: dict[str, Any] | None,
    cost: float | None,
    started_at: str | None,
) -> Any:
    """The one-statement finish of `claim` (`hotpath.ClaimFinish`) with both events it may append: the outcome's,
    and the `abandoned` one written instead when the run was abandoned meanwhile."""
    finish = UnitFinish(
        claim.run_id,
        claim.unit_id,
        claim.started_at,
        status,
        tokens=tokens,
        failure_reason=failure_reason,
        truncated=truncated,
        usage=usage,
        cost=cost,
    )
    gone = finish._replace(status="failed", failure_reason="abandoned", truncated=False)
    return hot.ClaimFinish(
        run_id=claim.run_id,
        unit_id=claim.unit_id,
        holder=holder,
        token=claim.token,
        status=status,
        result_json=result_json,
        tokens=tokens,
        cost=cost,
        failure_reason=failure_reason,
        session_id=session_id,
        truncated=truncated,
        started_at=started_at,
        meta=finish.meta(claim.step_id),
        meta_abandoned=gone.meta(claim.step_id),
        channel=RUN_CHANNEL,
    )


def started_later(claim: Claim, waited_s: float) -> str:
    """The claim's start stamp moved on by `waited_s`, on the journal's clock: when a unit claimed ahead
    (`akm.worker.loop`) really started, for `finish_claimed(started_at=...)`. Derived from the stamp the claim
    statement took, not read again (on PostgreSQL each clock read is a round trip)."""
    return format_iso(parse_iso(claim.started_at) + timedelta(seconds=max(0.0, waited_s)))


def _started_tail(host: str, holder: str) -> str:
    """How a worker's `workflow_unit_started` metadata ends: where and by whom the attempt runs."""
    return f',"host":{_json_opt(host)},"worker":{_json_opt(holder)}}}'


def _claim_of(r: Any) -> Claim:
    return Claim(
        r["run_id"],
        r["unit_id"],
        r["step_id"],
        r["runner"],
        r["engine"],
        r["model"],
        r["input_hash"],
        r["dispatch_json"],
        int(r["attempts"]),
        r["started_at"],
    )


class Renewal(NamedTuple):
    """What a worker's heartbeat learned: `gone`, claims that are no longer its own (re-queued after they lapsed,
    re-claimed, finished by another: write nothing); `ended`, its claims whose run can no longer be driven
    (abandoned, failed, completed: stop the unit and finish the row, which records it)."""

    gone: list[Claim]
    ended: list[Claim]


def renew_claims(db: Journal, holder: str, claims: Iterable[Claim]) -> Renewal:
    """The worker's heartbeat: push the expiry of its running claims one TTL on (in key order, as the sweep
    locks rows, so the two never deadlock on PostgreSQL)."""
    keys = sorted(claims, key=lambda c: (c.run_id, c.unit_id))
    gone: list[Claim] = []
    ended: list[Claim] = []
    if not keys:
        return Renewal(gone, ended)
    ttl = claim_ttl_s()
    with db.tx() as conn:
        now = db.now()
        until = db.later(now, ttl)
        drivable: dict[str, bool] = {}
        for c in keys:
            if c.run_id not in drivable:
                run = conn.execute("SELECT status FROM runs WHERE id = ?", (c.run_id,)).fetchone()
                drivable[c.run_id] = run is not None and run["status"] in DRIVABLE_STATUSES
            cur = conn.execute(
                "UPDATE units SET claim_expires_at = ?, last_checkin_at = ? WHERE run_id = ? AND unit_id = ? "
                "AND status = 'running' AND claim_holder = ? AND attempts = ?",
                (until, now, c.run_id, c.unit_id, holder, c.token),
            )
            if cur.rowcount != 1:
                gone.append(c)
            elif not drivable[c.run_id]:
                ended.append(c)
    return Renewal(gone, ended)


def _put_back(db: Journal, conn: Any, run_id: str, unit_id: str, now: str, where: str, args: Sequence[Any]) -> bool:
    """A claim given up (lapsed, or released by its worker): `queued` again while its run is drivable;
    in a run that can no longer be driven it ends `failed` (`abandoned` for an abandoned run, else `aborted`),
    since no coordinator will wait for it and a resume re-dispatches failed units anyway."""
    db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
    run = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    if run is not None and run["status"] in DRIVABLE_STATUSES:
        sql = (
            "UPDATE units SET status = 'queued', queued_at = ?, claim_holder = NULL, claim_host = NULL, "
            "claim_pid = NULL, claim_expires_at = NULL WHERE run_id = ? AND unit_id = ? AND status = 'running' "
        )
        values: tuple[Any, ...] = (now, run_id, unit_id)
    else:
        sql = (
            "UPDATE units SET status = 'failed', failure_reason = ?, finished_at = ?, claim_holder = NULL, "
            "claim_host = NULL, claim_pid = NULL, claim_expires_at = NULL WHERE run_id = ? AND unit_id = ? "
            "AND status = 'running' "
        )
        reason = "abandoned" if run is not None and run["status"] == "abandoned" else "aborted"
        values = (reason, now, run_id, unit_id)
    changed: int = conn.execute(sql + where, (*values, *args)).rowcount
    return changed == 1


def sweep(db: Journal, host: str | None = None) -> list[tuple[str, str]]:
    """Give up every worker claim that lapsed (see the module doc); returns the (run, unit) keys.

    A claim lapses when its expiry is past on the journal clock — its worker stopped renewing it — or when
    its claimant is a process of this host (`host`, the caller's host id) that no longer exists. Its row goes
    back in the queue (`_put_back`). The candidates are read first, without the write lock (an index holds
    only in-flight worker rows), and each is given up in a transaction that re-checks it, in key order.
    """
    host = host_id() if host is None else host
    now = db.now()
    rows = db.query(
        "SELECT run_id, unit_id, claim_host, claim_pid, claim_expires_at FROM units "
        "WHERE status = 'running' AND queued_at IS NOT NULL AND (claim_expires_at < ? OR claim_host = ?) "
        "ORDER BY run_id, unit_id",
        (now, host),
    )
    lapsed = [
        r
        for r in rows
        if r["claim_expires_at"] is None
        or r["claim_expires_at"] < now
        or (r["claim_pid"] is not None and not pid_alive(int(r["claim_pid"])))
    ]
    put_back: list[tuple[str, str]] = []
    if not lapsed:
        return put_back
    with db.tx() as conn:
        now = db.now()
        for r in lapsed:
            if _put_back(
                db,
                conn,
                r["run_id"],
                r["unit_id"],
                now,
                f"AND claim_expires_at {db.dialect.null_eq} ?",
                (r["claim_expires_at"],),
            ):
                put_back.append((r["run_id"], r["unit_id"]))
    return put_back


def finished_rows(db: Journal, run_id: str, unit_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The rows among `unit_ids` of the run that are finished (completed or failed), by unit id."""
    hot = _pg(db)
    rows = hot.finished_rows(db, run_id, unit_ids) if hot is not None else _finished_rows(db, run_id, unit_ids)
    return {r["unit_id"]: dict(zip(r.keys(), tuple(r), strict=False)) for r in rows}


def _finished_rows(db: Journal, run_id: str, unit_ids: Sequence[str]) -> list[Any]:
    """`finished_rows` on SQLite: the ids as placeholders, at most 500 a statement (its variable limit)."""
    ids = list(unit_ids)
    out: list[Any] = []
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        out.extend(
            db.query(
                "SELECT unit_id, status, result_json, tokens, cost, failure_reason, session_id, truncated FROM units "
                f"WHERE run_id = ? AND unit_id IN ({marks}) AND status IN ('completed','failed')",
                (run_id, *chunk),
            )
        )
    return out


def release_claim(db: Journal, claim: Claim, holder: str) -> bool:
    """Give a claim back (a worker that stops before its unit finished): queued again, or failed in a run that
    can no longer be driven (`_put_back`); False when the claim is not ours any more."""
    with db.tx() as conn:
        return _put_back(
            db,
            conn,
            claim.run_id,
            claim.unit_id,
            db.now(),
            "AND claim_holder = ? AND attempts = ?",
            (holder, claim.token),
        )


def claimed_count(db: Journal, run_id: str) -> int:
    """How many of the run's worker rows are claimed (running) now."""
    row = db.query_one(
        "SELECT COUNT(*) AS n FROM units WHERE run_id = ? AND status = 'running' AND queued_at IS NOT NULL", (run_id,)
    )
    return int(row["n"]) if row else 0


def withdraw(db: Journal, run_id: str, step_id: str, unit_id: str | None, *, fence: Fence) -> int:
    """The coordinator takes queued attempts of a step back (one, or all with `unit_id` None) before any
    worker claimed them: `failed` with reason `aborted`, never run. Fenced by its lease; rows a worker
    claimed meanwhile are left to it. Returns the rows withdrawn."""
    with db.tx() as conn:
        db.dialect.lock_run(conn, run_id, RUN_UNIT_WRITE)
        check_fence(conn, run_id, fence)
        sql = (
            "UPDATE units SET status = 'failed', failure_reason = 'aborted', finished_at = ? "
            "WHERE run_id = ? AND step_id = ? AND status = 'queued'"
        )
        args: list[Any] = [db.now(), run_id, step_id]
        if unit_id is not None:
            sql += " AND unit_id = ?"
            args.append(unit_id)
        return int(conn.execute(sql, args).rowcount)
