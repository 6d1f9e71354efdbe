"""The journal interface: what the shared domain layer (runs, units, events) needs from a backend.

Why a seam here and not at the SQL level (spec/journal.md): the two journals differ in locks, clocks and
cursor semantics, not only in syntax. So the business rules stay in ONE Python layer (`store/runs.py`,
`store/units.py`, `store/events.py`), written once against this interface, and each backend supplies:

* a connection with the transaction rule (`tx()`: re-entrant, one unit of work; `execute`/`query`);
* `now()`: the journal's clock, the one every stored expiry is compared on (the host's on SQLite, whose
  journal lives on one host; the server's `now()` on PostgreSQL, shared by every host);
* `bulk_writes()`: a stretch of many small commits (a fan-out) — SQLite moves WAL checkpoints to a
  background thread, PostgreSQL does nothing;
* a `Dialect`: the few statements and locks that differ (below).

The SQL text itself is shared: `?` placeholders, tables named without a schema (PostgreSQL sets the
search path), and the dialect's words where the syntax differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from akm.errors import UsageError

# Row-lock modes of `Dialect.lock_run` (PostgreSQL's names; spec/journal.md). `UPDATE` conflicts with
# both others, so once an abandon (UPDATE) commits, no unit write (KEY_SHARE) can slip in before it.
RUN_UPDATE = "UPDATE"
RUN_WRITE = "NO KEY UPDATE"
RUN_UNIT_WRITE = "KEY SHARE"
# Their strength, PostgreSQL's order: a row lock held in one mode covers every weaker one, so a stronger
# one still has to be asked for (KEY SHARE held, NO KEY UPDATE wanted: lock again).
RUN_LOCK_STRENGTH = {RUN_UNIT_WRITE: 1, RUN_WRITE: 2, RUN_UPDATE: 3}

# A lease holder that could not prove its liveness for this long must have stopped its units (a peer may be
# about to take the run over; akm.engine.fencing).
FENCE_AFTER_S = 5.0


class Dialect:
    """The SQLite dialect; `akm.store.postgres.db.PgDialect` overrides what differs.

    * `rowid`: the column giving insertion order (SQLite's rowid; an identity column on PostgreSQL);
    * `null_eq`: the null-safe equality operator (`IS` / `IS NOT DISTINCT FROM`);
    * `lock_run`: lock the run's row in a mode before reading it — a no-op here, because
      `BEGIN IMMEDIATE` already holds the one write lock of the file;
    * `identity_lock`: serialize identical starts (same ref, scope, params) — no-op here, likewise;
    * `event_lock`: make event ids follow commit order (SQLite's serialized writers already do);
    * `insert_id`: the id of the row an INSERT just added (`lastrowid` / `RETURNING id`);
    * `skip_locked`: the clause a worker's claim SELECT ends with, so claimers skip each other's rows;
    * `stamp_text`: a timestamp column as text, to compare with a (possibly partial) stamp a user typed;
    * `liveness` / `lease_dead`: whether lease rows record the holder's liveness session, and whether the
      run's current holder's session is gone (PostgreSQL; SQLite's same-host dead-pid rule in
      `runs.holder_is_live` is all one host needs, so it records and asks nothing);
    * `hold_dead` / `holds_key` / `unhold`: keep a gone holder's liveness lock through the takeover grace
      (`runs.hold_dead_holder`).

    The lock calls come once per store call, and store calls nest in one transaction (`write_report` runs
    `insert_unit` and `finish_unit` inside its own; a group commit runs the writes of many units in one), so
    a transaction asks for the same lock many times. A dialect whose locks cost a statement remembers what
    the current transaction holds and skips a lock already held in the same or a stronger mode
    (`RUN_LOCK_STRENGTH`); what it remembers ends with the transaction, at commit and at rollback.
    """

    name = "sqlite"
    rowid = "rowid"
    null_eq = "IS"
    liveness = False
    skip_locked = ""  # after a queue SELECT's LIMIT: skip rows another claimer locked (SQLite: one writer)
    row_lock = ""  # after a SELECT whose rows the transaction goes on to decide about and write (PostgreSQL)

    def lock_run(self, conn: Any, run_id: str, mode: str) -> None:
        """Lock the run's row for the rest of the transaction (no-op on SQLite)."""

    def identity_lock(self, conn: Any, key: str) -> None:
        """Serialize transactions that start a run with this identity (no-op on SQLite)."""

    def event_lock(self, conn: Any) -> None:
        """Called right before an event INSERT: ids then follow commit order (no-op on SQLite)."""

    def insert_id(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        """Run an INSERT of one row and return the id it got."""
        return int(conn.execute(sql, params).lastrowid or 0)

    def stamp_text(self, column: str) -> str:
        """A timestamp column as the journal's text (`akm.store.clock`), for comparing with text a user gave
        (`log --since 2026-01`): SQLite stores that text already."""
        return column

    def lease_dead(self, conn: Any, run_id: str) -> bool:
        """Is the run's lease holder's liveness session gone? Never on SQLite. (Not a proof that the holder
        died: see `hold_dead`.)"""
        return False

    def hold_dead(self, conn: Any, run_id: str) -> int | None:
        """When the holder's liveness session is gone, keep its liveness lock on this connection (so the holder
        cannot take it back and must stop its units) and return its key; None otherwise (always on SQLite)."""
        return None

    def holds_key(self, conn: Any, key: int) -> bool:
        """Does this connection still keep the liveness lock `key` took by `hold_dead`?"""
        return False

    def unhold(self, conn: Any, key: int) -> None:
        """Let go of a liveness lock kept by `hold_dead`."""


class HolderLiveness(Protocol):
    """What a lease holder keeps while it drives, so peers on other hosts can tell it died
    (`akm.store.postgres.liveness.HolderLock`): `key`/`marker` go into the lease row."""

    key: int
    marker: str | None

    def overdue(self) -> bool:
        """Has the holder gone FENCE_AFTER_S without proving its liveness (after having held it once)?"""
        ...

    def refresh(self) -> str | None:
        """The marker to record with the next renewal (None: no fast path for this holder)."""
        ...

    def release(self) -> None:
        """Give the liveness up (after the lease is released)."""
        ...


class Journal:
    """A journal connection: the interface `store/` modules and the engine use (see the module doc).

    Implementations: `akm.store.sqlite.db.SqliteJournal` and `akm.store.postgres.db.PgJournal`. Open
    one with `akm.store.open_journal` (the configured backend) or `akm.store.open_db` (a SQLite file).
    """

    dialect: Dialect = Dialect()
    backend = "sqlite"
    shared = False  # one journal for many machines (PostgreSQL): the run scope is portable (akm.paths.scope_keys)

    def tx(self) -> AbstractContextManager[Any]:
        """A write transaction (joins one this thread already has open); yields a connection whose
        `execute(sql, params)` returns a cursor (`fetchone`, `fetchall`, `rowcount`, iteration)."""
        raise NotImplementedError

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """One statement (inside this thread's transaction, else on its own)."""
        raise NotImplementedError

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """All rows of a SELECT; a row reads by column name and by position."""
        raise NotImplementedError

    def query_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def now(self, offset_s: float = 0.0) -> str:
        """The journal's clock (+ offset seconds) in the journal's timestamp format (`akm.store.clock`)."""
        raise NotImplementedError

    def later(self, now: str, offset_s: float) -> str:
        """`now` (a stamp this transaction just took from `now()`) + offset seconds, on the journal's clock.

        For an expiry beside a stamp already in hand: where reading the clock is a round trip (PostgreSQL)
        the backend derives it from `now`; where it is a local call (SQLite) it reads the clock again, which
        is cheaper than parsing the stamp.
        """
        return self.now(offset_s)

    def holder_liveness(self, holder: str) -> HolderLiveness | None:
        """Start proving `holder` alive to other hosts while it holds a run lease; None when this journal
        needs no proof (SQLite: one host, pids tell) or cannot give one (then peers wait for expiry)."""
        return None

    def bulk_writes(self) -> AbstractContextManager[None]:
        """Wrap a stretch of many small commits (a fan-out); nests."""
        raise NotImplementedError

    def warm(self, connections: int, primers: Sequence[tuple[str, Sequence[Any]]] = ()) -> None:
        """Open up to `connections` server connections ahead, in the background, so that the first moments of a
        burst of concurrent statements do not each wait for a handshake (PostgreSQL's pool; a no-op elsewhere).
        `primers`: statements to run once on each of the pool's connections meanwhile, with parameters that match
        nothing (they write, lock and claim nothing): the process's hot statements, parsed and planned ahead."""

    def listener(self, channel: str, event: Any, payload: str | None = None) -> Any:
        """Set `event` (a threading.Event) whenever another process notifies `channel` (with `payload`, if
        given); an object with `close()`, or None where the journal has no notifications (SQLite: poll).
        A hint only: callers poll as well (`akm.store.postgres.wakeups`)."""
        return None

    def notifier(self, channel: str) -> Any:
        """An object whose `notify(payload)` wakes the listeners of `channel` after a write committed (sent
        off the write path, coalesced), with `close()`; None where the journal has no notifications."""
        return None

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def not_text_error(exc: UnicodeEncodeError) -> UsageError:
    """A value bound to a statement is not valid Unicode text (a lone surrogate).

    The last line of defence: fronts refuse such input where it enters
    (akm.text); this keeps any that slips through from surfacing as an internal
    error, and the transaction it was part of rolls back.
    """
    from akm.codes import Code

    return UsageError(
        f"a value is not valid UTF-8 text ({exc.reason} at character {exc.start + 1}) and cannot be stored in "
        "or looked up in the journal",
        code=Code.NOT_UTF8,
    )
