"""The domain operations where a line-for-line port of the SQLite journal races (postgres.md §2.3–§2.9).

Why these first: under READ COMMITTED a "read, check, write" transaction is atomic only if it locks what it
checks, and stored timestamps are comparable across hosts only on one clock. Each function here is one
transaction that takes its lock first (the table in postgres.md §2.5) and compares times with the server's
`now()` only:

* `create_run` — an identical start (same ref, scope, params) joins the drivable run instead of making a
  second one: a transaction-scoped advisory lock keyed on the identity serializes the check and the insert.
* `acquire_lease` / `renew_lease` / `release_lease` — the run row locked `FOR NO KEY UPDATE`, expiry in DB
  time, `lease_epoch` bumped on every acquisition by a new holder (the fencing token).
* `insert_unit` — the run row locked `FOR KEY SHARE` first, so an `abandon_run` (`FOR UPDATE`) either
  commits before it (the insert is refused) or waits for it; the caller's (holder, epoch) must still hold.
* `append_event` / `read_events` — a transaction-scoped advisory lock before each event insert makes ids
  follow commit order, so a cursor `id > N` never skips an event committed later with a smaller id.
* `clean_text` — PostgreSQL text cannot hold NUL: it is stored as the visible escape `\\u0000`.

Not wired into the engine yet (spec/journal.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from akm.errors import AkmError

IDENTITY_LOCK = 4243
EVENT_LOCK = (4242, 0)
DRIVABLE = ("active", "awaiting_session")
ISO = 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'


def clean_text(value: str | None) -> str | None:
    """Text PostgreSQL can store: NUL shown as `\\u0000`; a lone surrogate (not UTF-8) is refused."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise AkmError("text to journal is not valid UTF-8 (a lone surrogate)", code="NOT_UTF8") from None
    return value.replace("\x00", "\\u0000")


def params_hash(params_json: str) -> str:
    """sha256 of the canonical params: the key of the identical-start lock."""
    canonical = json.dumps(json.loads(params_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@contextlib.contextmanager
def transaction(con: Any) -> Iterator[Any]:
    """BEGIN … COMMIT on a pg8000 native connection; ROLLBACK on any exception."""
    con.run("BEGIN")
    try:
        yield con
    except BaseException:
        with contextlib.suppress(Exception):
            con.run("ROLLBACK")
        raise
    con.run("COMMIT")


def db_now(con: Any) -> str:
    """The server's clock as akm's fixed-width ISO-ms text (the one clock of every host)."""
    return str(con.run(f"SELECT to_char(now() AT TIME ZONE 'UTC', '{ISO}')")[0][0])


# ------------------------------------------------------------------ runs


def create_run(
    con: Any,
    s: str,
    *,
    run_id: str,
    workflow_ref: str,
    scope_key: str,
    params_json: str,
    plan_json: str,
    plan_hash: str,
    hash_version: int,
    title: str = "",
    join_identical: bool = True,
) -> tuple[str, bool]:
    """Insert a run, or join the drivable identical one: (run id, created?). One start never makes two."""
    phash = params_hash(params_json)
    with transaction(con):
        if join_identical:
            con.run(
                "SELECT pg_advisory_xact_lock(:k, hashtext(:r || chr(31) || :sc || chr(31) || :p))",
                k=IDENTITY_LOCK,
                r=workflow_ref,
                sc=scope_key,
                p=phash,
            )
            rows = con.run(
                f"SELECT id FROM {s}.runs WHERE workflow_ref = :r AND scope_key = :sc AND params_hash = :p"
                " AND status IN ('active', 'awaiting_session') ORDER BY created_at, seq LIMIT 1",
                r=workflow_ref,
                sc=scope_key,
                p=phash,
            )
            if rows:
                return str(rows[0][0]), False
        con.run(
            f"INSERT INTO {s}.runs (id, workflow_ref, title, status, params_json, params_hash, scope_key,"
            " plan_json, plan_hash, hash_version) VALUES (:id, :r, :t, 'active', :pj, :p, :sc, :plan, :ph, :hv)",
            id=run_id,
            r=workflow_ref,
            t=clean_text(title),
            pj=clean_text(params_json),
            p=phash,
            sc=scope_key,
            plan=plan_json,
            ph=plan_hash,
            hv=hash_version,
        )
    return run_id, True


def abandon_run(con: Any, s: str, run_id: str) -> bool:
    """Mark a run abandoned (final), releasing its lease; False when it was already final or abandoned.

    `FOR UPDATE` conflicts with the `FOR KEY SHARE` every unit write takes first, so no unit can start in
    the run once this commits.
    """
    with transaction(con):
        rows = con.run(f"SELECT status FROM {s}.runs WHERE id = :id FOR UPDATE", id=run_id)
        if not rows:
            raise AkmError(f"no run {run_id}", code="RUN_NOT_FOUND")
        if rows[0][0] in ("completed", "abandoned"):
            return False
        con.run(
            f"UPDATE {s}.runs SET status = 'abandoned', updated_at = now(), completed_at = now(),"
            " lease_holder = NULL, lease_host = NULL, lease_pid = NULL, lease_until = NULL WHERE id = :id",
            id=run_id,
        )
        _insert_event(con, s, "workflow_abandoned", run_id, "{}")
    return True


# ------------------------------------------------------------------ lease


@dataclass(frozen=True)
class Lease:
    """The run lease as read under its row lock; `acquired` tells whether the caller now holds it."""

    holder: str | None
    host: str | None
    pid: int | None
    epoch: int
    until: str | None
    acquired: bool


def acquire_lease(con: Any, s: str, run_id: str, holder: str, host: str, pid: int, ttl_s: float) -> Lease:
    """Take the run lease when it is free, expired (DB clock) or already ours; report the live holder otherwise.

    A new holder bumps `lease_epoch`; the same holder re-acquiring keeps it (a renewal).
    """
    with transaction(con):
        rows = con.run(
            f"SELECT status, lease_holder, lease_host, lease_pid, lease_epoch,"
            f" lease_until IS NULL OR lease_until < now(), to_char(lease_until AT TIME ZONE 'UTC', '{ISO}')"
            f" FROM {s}.runs WHERE id = :id FOR NO KEY UPDATE",
            id=run_id,
        )
        if not rows:
            raise AkmError(f"no run {run_id}", code="RUN_NOT_FOUND")
        status, cur, cur_host, cur_pid, epoch, free, until = rows[0]
        if status not in DRIVABLE:
            code = "RUN_ABANDONED" if status == "abandoned" else "RUN_NOT_ACTIVE"
            raise AkmError(f"run {run_id} is {status}", code=code)
        if cur is not None and cur != holder and not free:
            return Lease(cur, cur_host, cur_pid, int(epoch), until, False)
        bump = 0 if cur == holder and not free else 1
        out = con.run(
            f"UPDATE {s}.runs SET lease_holder = :h, lease_host = :host, lease_pid = :pid,"
            " lease_until = now() + make_interval(secs => :ttl), lease_renewed_at = now(),"
            f" lease_epoch = lease_epoch + :b WHERE id = :id"
            f" RETURNING lease_epoch, to_char(lease_until AT TIME ZONE 'UTC', '{ISO}')",
            h=holder,
            host=host,
            pid=pid,
            ttl=float(ttl_s),
            b=bump,
            id=run_id,
        )
    return Lease(holder, host, pid, int(out[0][0]), str(out[0][1]), True)


def renew_lease(con: Any, s: str, run_id: str, holder: str, epoch: int, ttl_s: float) -> bool:
    """Extend our lease in DB time; False (the caller has lost it: LEASE_LOST) when (holder, epoch) moved on."""
    with transaction(con):
        rows = con.run(
            f"UPDATE {s}.runs SET lease_until = now() + make_interval(secs => :ttl), lease_renewed_at = now()"
            " WHERE id = :id AND lease_holder = :h AND lease_epoch = :e AND status IN ('active', 'awaiting_session')"
            " RETURNING 1",
            ttl=float(ttl_s),
            id=run_id,
            h=holder,
            e=epoch,
        )
    return bool(rows)


def release_lease(con: Any, s: str, run_id: str, holder: str, epoch: int) -> bool:
    """Give the lease up (only ours, at our epoch)."""
    with transaction(con):
        rows = con.run(
            f"UPDATE {s}.runs SET lease_holder = NULL, lease_host = NULL, lease_pid = NULL, lease_until = NULL"
            " WHERE id = :id AND lease_holder = :h AND lease_epoch = :e RETURNING 1",
            id=run_id,
            h=holder,
            e=epoch,
        )
    return bool(rows)


# ------------------------------------------------------------------ units


def insert_unit(
    con: Any,
    s: str,
    *,
    run_id: str,
    unit_id: str,
    step_id: str | None,
    node_id: str,
    holder: str,
    epoch: int,
    runner: str | None = None,
) -> None:
    """Start a unit attempt (`running`) for the lease holder at `epoch`.

    Refused with `RUN_ABANDONED` / `RUN_NOT_ACTIVE` when the run is not drivable, and with `LEASE_LOST` when
    the run's lease is no longer (holder, epoch) or has expired in DB time.
    """
    with transaction(con):
        rows = con.run(
            f"SELECT status, lease_holder, lease_epoch, lease_until >= now() FROM {s}.runs"
            " WHERE id = :id FOR KEY SHARE",
            id=run_id,
        )
        if not rows:
            raise AkmError(f"no run {run_id}", code="RUN_NOT_FOUND")
        status, cur, cur_epoch, live = rows[0]
        if status not in DRIVABLE:
            code = "RUN_ABANDONED" if status == "abandoned" else "RUN_NOT_ACTIVE"
            raise AkmError(f"run {run_id} is {status}: unit {unit_id} not started", code=code)
        if cur != holder or int(cur_epoch) != epoch or not live:
            raise AkmError(
                f"the lease of run {run_id} is no longer held by this driver (epoch {epoch}): unit {unit_id} not started",
                code="LEASE_LOST",
            )
        con.run(
            f"INSERT INTO {s}.units (run_id, unit_id, step_id, node_id, runner, status, claim_holder)"
            " VALUES (:r, :u, :st, :n, :rn, 'running', :h)",
            r=run_id,
            u=unit_id,
            st=step_id,
            n=node_id,
            rn=runner,
            h=holder,
        )


def unit_count(con: Any, s: str, run_id: str) -> int:
    return int(con.run(f"SELECT count(*) FROM {s}.units WHERE run_id = :r", r=run_id)[0][0])


# ------------------------------------------------------------------ events


def _insert_event(con: Any, s: str, event_type: str, run_id: str | None, metadata_json: str) -> int:
    """Insert an event inside the caller's transaction; the xact lock makes ids follow commit order."""
    con.run("SELECT pg_advisory_xact_lock(:a, :b)", a=EVENT_LOCK[0], b=EVENT_LOCK[1])
    rows = con.run(
        f"INSERT INTO {s}.events (event_type, run_id, metadata_json) VALUES (:t, :r, :m) RETURNING id",
        t=event_type,
        r=run_id,
        m=clean_text(metadata_json),
    )
    return int(rows[0][0])


def append_event(con: Any, s: str, event_type: str, run_id: str | None, metadata: dict[str, Any]) -> int:
    """Append one event in its own transaction; returns its id (the cursor position)."""
    with transaction(con):
        return _insert_event(con, s, event_type, run_id, json.dumps(metadata, ensure_ascii=False))


def read_events(con: Any, s: str, after: int = 0, limit: int = 1000) -> list[tuple[int, str, str | None, str]]:
    """Events with id > `after`, in id order: (id, type, run id, metadata json). Gap-free: see `_insert_event`."""
    rows = con.run(
        f"SELECT id, event_type, run_id, metadata_json FROM {s}.events WHERE id > :a ORDER BY id LIMIT :n",
        a=after,
        n=limit,
    )
    return [(int(r[0]), str(r[1]), r[2], str(r[3])) for r in rows]


def set_step_notes(con: Any, s: str, run_id: str, step_id: str, sequence_index: int, notes: str) -> None:
    """Write a step's notes (NUL-safe): the spot where a unit's captured stderr reaches the journal."""
    with transaction(con):
        con.run(
            f"INSERT INTO {s}.steps (run_id, step_id, sequence_index, status, notes)"
            " VALUES (:r, :st, :i, 'pending', :n) ON CONFLICT (run_id, step_id) DO UPDATE SET notes = excluded.notes",
            r=run_id,
            st=step_id,
            i=sequence_index,
            n=clean_text(notes),
        )


def step_notes(con: Any, s: str, run_id: str, step_id: str) -> str | None:
    rows = con.run(f"SELECT notes FROM {s}.steps WHERE run_id = :r AND step_id = :st", r=run_id, st=step_id)
    return rows[0][0] if rows else None
