"""The PostgreSQL journal: the `Journal` interface over one pg8000 connection, and the PostgreSQL `Dialect`.

Why it looks like this (spec/journal.md):

* The shared domain layer (`store/runs.py`, `units.py`, `events.py`) writes `?` placeholders and names tables
  without a schema; here `?` becomes `$n` (once per statement text) and the connection's `search_path` is
  the journal's schema (`?schema=` of the URL, `akm` by default).
* `tx()` is `BEGIN` … `COMMIT` under READ COMMITTED, re-entrant like SQLite's. What SQLite's
  `BEGIN IMMEDIATE` gave for free — every "read, check, write" atomic — the shared layer asks for here
  through the dialect: each write transaction first locks the run's row in the mode its operation needs
  (`lock_run`), an identical start takes an advisory lock on its identity, and every event INSERT is
  preceded by a transaction-scoped advisory lock, so event ids follow commit order and a cursor
  `id > N` never skips an event committed later with a smaller id. Each lock is a round trip, and store
  calls nest (a report's insert and finish, a group commit's many units): the connection remembers the
  locks its transaction holds (`Connection.locks`, emptied at commit and rollback) and the dialect skips
  one already held in that mode or a stronger one.
* `now()` is the server's clock (`clock_timestamp()`): with many hosts writing expiries, one clock decides.
* A small pool of connections per journal (`POOL_MAX`): a transaction holds one connection from
  `BEGIN` to `COMMIT`, a statement outside a transaction one for its round trip, so a process's threads (a
  worker's units finishing, its next claim, the heartbeat) wait for the server side by side instead of one
  behind the other; across a network each of those waits is a round trip. Connections open on demand, when
  every open one is busy, and the last one given back is the next one taken: a process that uses the
  journal from one thread at a time keeps one connection. A thread's nested transactions join its open one.
  Two threads of one process may now wait on each other's row locks on the server as they would on
  SQLite's write lock; nothing holds a Python lock while it waits for the server, and a transaction never
  needs a second connection, so they cannot deadlock. A session-level lock a connection keeps past its
  transaction (`PgDialect.hold_dead`) pins it to its thread until it is let go.
* Values: `timestamptz` columns come back in the journal's text format (`akm.store.clock`), integral
  numerics (SUM over bigint) as int; PostgreSQL text cannot hold NUL, so text holding one is stored
  escaped and read back unchanged (`clean_param`); a lone surrogate is refused as NOT_UTF8 as on SQLite.
* Driver and server errors become coded JournalErrors; users never see a pg8000 traceback. A connection
  that fails (reset, stalled past its socket timeout, ended by the server) is JOURNAL_CONNECTION_LOST and
  the server's own limits (`lock_timeout`, `statement_timeout`; connect.py) JOURNAL_BUSY. The transaction in
  flight is lost with its connection (the server rolls it back), so nothing is retried inside one; the
  journal reconnects when it is next used, and a read outside a transaction is retried once on the new
  connection (a read has no effect to repeat).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from akm.errors import JournalError
from akm.store.clock import format_iso, parse_iso
from akm.store.journal import RUN_LOCK_STRENGTH, Dialect, HolderLiveness, Journal, not_text_error
from akm.store.postgres import wire
from akm.store.postgres.connect import Target, connect, connection_fault, fault_error, lock_timed_out, sqlstate
from akm.store.postgres.liveness import NAMESPACE, dead_sql, held_sql, hold_sql

IDENTITY_LOCK = 4243
EVENT_LOCK = (4242, 0)
_ISO = 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'
_RETRY_STATES = ("40001", "40P01")  # serialization failure, deadlock detected


class PgDialect(Dialect):
    """What PostgreSQL needs where SQLite's single write lock and rowid did the work (spec/journal.md)."""

    name = "postgres"
    rowid = "seq"
    null_eq = "IS NOT DISTINCT FROM"
    liveness = True
    skip_locked = " FOR UPDATE SKIP LOCKED"
    row_lock = " FOR UPDATE"

    def lock_run(self, conn: Any, run_id: str, mode: str) -> None:
        strength = RUN_LOCK_STRENGTH[mode]
        if conn.locks.get(("run", run_id), 0) < strength:  # not held, or only in a weaker mode
            conn.execute(f"SELECT 1 FROM runs WHERE id = ? FOR {mode}", (run_id,))
            conn.holds(("run", run_id), strength)

    def identity_lock(self, conn: Any, key: str) -> None:
        if ("identity", key) not in conn.locks:
            conn.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (IDENTITY_LOCK, key))
            conn.holds(("identity", key))

    def event_lock(self, conn: Any) -> None:
        if ("event",) not in conn.locks:
            conn.execute("SELECT pg_advisory_xact_lock(?, ?)", EVENT_LOCK)
            conn.holds(("event",))

    def insert_id(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        return int(conn.execute(sql + " RETURNING id", params).fetchone()[0])

    def stamp_text(self, column: str) -> str:
        return f"to_char({column} AT TIME ZONE 'UTC', '{_ISO}')"

    def lease_dead(self, conn: Any, run_id: str) -> bool:
        """The holder's session lock is free on the server incarnation it recorded (liveness.dead_sql).

        Called inside the transaction that decides a takeover, after the run row is locked; a probe that
        finds the holder dead keeps its transaction-level lock until that transaction ends, harmlessly.
        """
        row = conn.execute(
            f"SELECT {dead_sql('lease_session', 'lease_liveness')} AS dead FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        return bool(row and row[0])

    def hold_dead(self, conn: Any, run_id: str) -> int | None:
        """The holder's liveness key, now held by this session (liveness.hold_sql), when the holder's lock was
        free on its recorded incarnation; None otherwise. Called under the run's row lock. The connection
        stays with this thread until `unhold` (the pool pins it: the lock lives in its session)."""
        row = conn.execute(
            f"SELECT {hold_sql('lease_session', 'lease_liveness')} AS held, lease_session FROM runs WHERE id = ?",
            (run_id,),
        ).fetchone()
        if row and row[0]:
            conn.session_keys.add(int(row[1]))
            return int(row[1])
        return None

    def holds_key(self, conn: Any, key: int) -> bool:
        row = conn.execute(f"SELECT {held_sql('?')}", (key,)).fetchone()
        return bool(row and row[0])

    def unhold(self, conn: Any, key: int) -> None:
        conn.execute("SELECT pg_advisory_unlock(?, ?)", (NAMESPACE, key))
        conn.let_go(key)


_statements: dict[str, str] = {}


def pg_statement(sql: str) -> str:
    """`?` placeholders (outside quotes) as `$1`, `$2`, …; cached per statement text."""
    cached = _statements.get(sql)
    if cached is not None:
        return cached
    out: list[str] = []
    n = 0
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "?":
            n += 1
            out.append(f"${n}")
            continue
        out.append(ch)
    text = "".join(out)
    if len(_statements) < 4096:
        _statements[sql] = text
    return text


# PostgreSQL text cannot hold NUL, and akm stores what units print (a NUL in stderr reaches a step's notes).
# Text holding NUL (or the escape mark itself, a Unicode noncharacter) is stored escaped and read back as
# it was, so both journals answer the same text; any other text is stored as it is.
_MARK = "\uffff"


def _escape(text: str) -> str:
    return text.replace(_MARK, _MARK + "1").replace("\x00", _MARK + "0")


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while (j := text.find(_MARK, i)) >= 0:
        out.append(text[i:j])
        out.append("\x00" if text[j + 1 : j + 2] == "0" else _MARK)
        i = j + 2
    out.append(text[i:])
    return "".join(out)


def clean_param(value: Any) -> Any:
    """A value PostgreSQL can bind: text checked as UTF-8 first (UnicodeEncodeError → NOT_UTF8, before
    anything is sent) and NUL escaped (`_escape`)."""
    if isinstance(value, str):
        value.encode("utf-8")
        if "\x00" in value or _MARK in value:
            return _escape(value)
    elif isinstance(value, bool):
        return int(value)
    return value


def _out(value: Any) -> Any:
    if isinstance(value, str):
        return _unescape(value) if _MARK in value else value
    if isinstance(value, datetime):
        return format_iso(value)
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    return value


class Row:
    """A result row read by column name (`row["status"]`), by position, as a mapping (`dict(row)`), or
    unpacked (`Unit(*row)`): what the shared layer does with sqlite3.Row."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values: list[Any]) -> None:
        self._index = index
        self._values = values

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return self._values[self._index[key]]
        return self._values[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._index)

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._index, self._values, strict=False))!r})"


class Cursor:
    """The result of one statement: rows (if any), `rowcount`, iteration."""

    __slots__ = ("_pos", "rowcount", "rows")

    def __init__(self, rows: list[Row], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount
        self._pos = 0

    def fetchone(self) -> Row | None:
        if self._pos >= len(self.rows):
            return None
        self._pos += 1
        return self.rows[self._pos - 1]

    def fetchall(self) -> list[Row]:
        rest = self.rows[self._pos :]
        self._pos = len(self.rows)
        return rest

    def __iter__(self) -> Iterator[Row]:
        return iter(self.fetchall())

    @property
    def lastrowid(self) -> None:  # PostgreSQL has none: `Dialect.insert_id` uses RETURNING
        return None


class Connection:
    """What `PgJournal.tx()` yields: `execute`, `executemany`, `in_transaction` over the pg8000 connection.

    `locks`: the locks the open transaction holds (`PgDialect`), key → strength; they end with it, so
    `begin` and `ended` empty it. `session_keys`: session-level liveness locks it keeps past its transaction
    (`PgDialect.hold_dead`); the pool leaves it with its thread while there are any. `broken`: it failed, and
    the next use outside a transaction replaces its server connection (`PgJournal.usable`). `trace`: a list
    to append each statement's text to (a test counting round trips), None otherwise.
    """

    PREPARED_MAX = 256  # statements kept prepared on the server per connection (the shared layer has ~60)

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.in_transaction = False
        self.begin_unsent = False  # the open transaction's BEGIN waits for its first statement (`wire`)
        self.prepared: dict[str, tuple[bytes, Any, Any]] = {}
        self.named = 0  # statements this session parsed into a name (prepared, or failed on their first run)
        self.locks: dict[tuple[str, ...], int] = {}
        self.session_keys: set[int] = set()
        self.broken = False
        self.trace: list[str] | None = None

    def replace(self, raw: Any) -> None:
        """A new server connection in place of a failed one: nothing of the old session carries over."""
        self.raw = raw
        self.in_transaction = False
        self.begin_unsent = False
        self.prepared.clear()
        self.named = 0
        self.locks.clear()
        self.session_keys.clear()
        self.broken = False

    def let_go(self, key: int) -> None:
        """A session lock `hold_dead` kept was released."""
        self.session_keys.discard(key)

    def begin(self) -> None:
        """Open a transaction. Its BEGIN goes to the server with the transaction's first statement, in that
        statement's round trip (`wire`); a transaction that sent nothing ends without a word to the server."""
        self.locks.clear()
        self.in_transaction = True
        self.begin_unsent = True

    def ended(self) -> None:
        """The transaction committed or rolled back: its locks are gone."""
        self.in_transaction = False
        self.begin_unsent = False
        self.locks.clear()

    def _opening(self) -> bool:
        """Whether this statement carries its transaction's BEGIN (which is then sent, and traced)."""
        if not self.begin_unsent:
            return False
        self.begin_unsent = False
        if self.trace is not None:
            self.trace.append("BEGIN")
        return True

    def holds(self, key: tuple[str, ...], strength: int = 1) -> None:
        """Remember a lock just taken; outside a transaction it ended with its statement."""
        if self.in_transaction:
            self.locks[key] = strength

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        if self.trace is not None:
            self.trace.append(sql)
        from pg8000.converters import make_params

        vals = make_params(self.raw.py_types, [clean_param(v) for v in params])
        statement = pg_statement(sql)
        ps = self.prepared.get(statement)
        name = wire.UNNAMED
        if ps is None and self.named < self.PREPARED_MAX:
            # parsed into a name on its first run, in that run's round trip: each later run binds it
            self.named += 1
            name = f"akm_{self.named}".encode("ascii") + wire.UNNAMED
        ctx = wire.run(self.raw, statement, vals, ps, name, begin=self._opening())
        if ps is None and name != wire.UNNAMED:
            self.prepared[statement] = (name, ctx.columns, ctx.input_funcs)
        rows: list[Row] = []
        if ctx.columns:
            index = {c["name"]: i for i, c in enumerate(ctx.columns)}
            rows = [Row(index, [_out(v) for v in r]) for r in (ctx.rows or ())]
        return Cursor(rows, ctx.row_count if ctx.row_count is not None else -1)

    def executemany(self, sql: str, seq: Sequence[Sequence[Any]]) -> None:
        for params in seq:
            self.execute(sql, params)

    def simple(self, sql: str) -> None:
        if self.begin_unsent and sql in ("COMMIT", "ROLLBACK"):
            self.begin_unsent = False  # the transaction sent nothing: nothing to end
            return
        begin = self._opening()
        if self.trace is not None:
            self.trace.append(sql)
        wire.simple(self.raw, sql, begin=begin)


def pg_error(exc: Exception, what: str, shown: str) -> JournalError:
    """A pg8000 error as a JournalError with a readable message (SQLSTATE kept in the text); a connection
    fault or a server-side timeout as its own code (`connect.fault_error`)."""
    if connection_fault(exc) or lock_timed_out(exc):
        return fault_error(exc, what, shown)
    arg = exc.args[0] if exc.args else None
    if isinstance(arg, dict):
        message = f"{arg.get('M', '')} (SQLSTATE {arg.get('C', '?')})"
    else:
        message = str(exc)
    hint = None
    state = sqlstate(exc)
    if state in _RETRY_STATES:
        hint = "Another akm process wrote the same run at the same moment; retry the command."
    elif state is None:
        hint = "The connection to the journal server failed; check that it is up and reachable."
    return JournalError(f"journal {what} failed ({shown}): {message}", hint=hint)


def _is_driver_error(exc: BaseException) -> bool:
    """An error from the driver or from its socket (pg8000 lets some socket errors through unwrapped)."""
    return type(exc).__module__.startswith("pg8000") or isinstance(exc, (OSError, EOFError))


class _Transaction:
    __slots__ = ("conn", "db", "owner")

    def __init__(self, db: PgJournal) -> None:
        self.db = db
        self.owner = False
        self.conn: Connection | None = None

    def __enter__(self) -> Connection:
        db = self.db
        held = db.held()
        if held is not None:
            return held  # this thread's transaction is open: join it
        conn = db.acquire()
        try:
            try:
                db.usable(conn).begin()
            except Exception as exc:
                if _is_driver_error(exc):
                    db.failed(conn, exc)
                    raise pg_error(exc, "begin", db.shown) from None
                raise
        except BaseException:
            db.release(conn)
            raise
        self.owner, self.conn = True, conn
        db.local.tx = conn
        return conn

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if not self.owner:
            return False
        db, conn = self.db, self.conn
        assert conn is not None
        try:
            if exc is not None:
                if _is_driver_error(exc):
                    db.failed(conn, exc)
                db.rollback_quietly(conn)
                if _is_driver_error(exc):
                    raise pg_error(exc, "write", db.shown) from None  # type: ignore[arg-type]
                if isinstance(exc, UnicodeEncodeError):
                    raise not_text_error(exc) from None
                return False
            try:
                conn.simple("COMMIT")
            except Exception as err:
                if _is_driver_error(err):
                    db.failed(conn, err)
                db.rollback_quietly(conn)
                if _is_driver_error(err):
                    raise pg_error(err, "commit", db.shown) from None
                raise
            finally:
                conn.ended()
            return False
        finally:
            db.local.tx = None
            db.release(conn)


POOL_MAX = 4  # connections per journal: a worker's units finishing, its next claim and its heartbeat at once


class PgJournal(Journal):
    """The journal on a PostgreSQL server. Open it with `akm.store.postgres.db.open_pg` (or `open_journal`)."""

    dialect = PgDialect()
    backend = "postgres"
    shared = True

    def __init__(self, raw: Any, target: Target, pool_max: int = POOL_MAX) -> None:
        self.target = target
        self.shown = target.shown
        self.schema = target.schema
        self.path = target.shown  # what messages name where SQLite names its file
        self.pool_max = max(1, pool_max)
        first = Connection(raw)
        self._all: list[Connection] = [first]
        self._free: list[Connection] = [first]  # the last given back is the next taken
        self._opening = 0
        self._closed = False
        self._cond = threading.Condition()
        self.local = threading.local()  # .tx: this thread's open transaction; .pinned: see Connection.session_keys
        self.reconnects = 0

    @property
    def conn(self) -> Connection:
        """The connection of this thread's open transaction, else the first one (the only one of a journal used
        from one thread at a time)."""
        held = self.held()
        return held if held is not None else self._all[0]

    @property
    def connections(self) -> int:
        """How many server connections the pool holds open."""
        return len(self._all)

    def tx(self) -> _Transaction:
        return _Transaction(self)

    def held(self) -> Connection | None:
        """The connection of this thread's open transaction, if any."""
        conn: Connection | None = getattr(self.local, "tx", None)
        return conn if conn is not None and conn.in_transaction else None

    def acquire(self) -> Connection:
        """A connection for this thread: its pinned one, a free one, a new one (when fewer than `pool_max` are
        open), or the next one given back."""
        pinned: Connection | None = getattr(self.local, "pinned", None)
        if pinned is not None:
            return pinned
        with self._cond:
            while not self._free:
                if len(self._all) + self._opening < self.pool_max:
                    self._opening += 1
                    break
                self._cond.wait()
            else:
                return self._free.pop()
        try:  # a handshake is several round trips: made without the pool's lock
            conn = Connection(reconnect(self.target))
        except BaseException:
            with self._cond:
                self._opening -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._opening -= 1
            self._all.append(conn)
        return conn

    def warm(self, connections: int, primers: Sequence[tuple[str, Sequence[Any]]] = ()) -> None:
        """Open connections up to `connections` (at most `pool_max`) on a background thread, into the free list:
        a handshake is several round trips, paid here before the statements that would wait for it. `primers` run
        once on each connection of the pool (the new ones, then those open already, each while it is free): a
        statement's first run on a connection is its parse, its plan and the loading of what they read from the
        catalogs — several milliseconds each, ten or more at a busy moment such as a run's first claims."""

        def open_more() -> None:
            while True:
                with self._cond:
                    if len(self._all) + self._opening >= min(connections, self.pool_max):
                        break
                    self._opening += 1
                try:
                    conn = Connection(reconnect(self.target))
                except BaseException:  # noqa: BLE001 - a statement that needs one opens it and names the fault
                    with self._cond:
                        self._opening -= 1
                        self._cond.notify()
                    return
                self._prime(conn, primers)
                with self._cond:
                    self._opening -= 1
                    closed = self._closed
                    if not closed:
                        self._all.append(conn)
                        self._free.insert(0, conn)  # behind the warm ones: the last given back is the next taken
                        self._cond.notify()
                if closed:  # the journal was closed meanwhile
                    with contextlib.suppress(Exception):
                        conn.raw.close()
                    return
            with self._cond:  # then those open already, each taken from the free list while it is primed
                todo = [c for c in self._all if not self._primed(c, primers)]
            for conn in todo:
                with self._cond:
                    if self._closed:
                        return
                    if conn not in self._free:
                        continue  # in use now: its statements' first runs are theirs
                    self._free.remove(conn)
                try:
                    self._prime(conn, primers)
                finally:
                    self.release(conn)

        threading.Thread(target=open_more, name="akm-pool-warm", daemon=True).start()

    @staticmethod
    def _primed(conn: Connection, primers: Sequence[tuple[str, Sequence[Any]]]) -> bool:
        return all(pg_statement(sql) in conn.prepared for sql, _ in primers)

    def _prime(self, conn: Connection, primers: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Run each primer not prepared yet on `conn`; best effort: a failure leaves the statement to its first
        real run (a statement is its own transaction: the connection stays usable, or is marked for a reconnect)."""
        for sql, params in primers:
            if conn.broken:
                return
            if pg_statement(sql) in conn.prepared:
                continue
            try:
                conn.execute(sql, params)
            except Exception as exc:  # noqa: BLE001 - see above
                if _is_driver_error(exc):
                    self.failed(conn, exc)

    def release(self, conn: Connection) -> None:
        """Give a connection back; one keeping a session lock stays with this thread (`Connection.session_keys`)."""
        if conn.session_keys:
            self.local.pinned = conn
            return
        if getattr(self.local, "pinned", None) is conn:
            self.local.pinned = None
        with self._cond:
            if conn in self._all:
                self._free.append(conn)
                self._cond.notify()

    def failed(self, conn: Connection, exc: BaseException) -> None:
        """Note a driver failure: a connection fault leaves the connection unusable (a timed-out socket cannot
        be read again, a reset one is gone), so its next use reconnects."""
        if connection_fault(exc):
            conn.broken = True

    def usable(self, conn: Connection) -> Connection:
        """`conn`, on a new server connection first when its last one failed (outside a transaction only: a
        transaction dies with its connection). Raises the coded error of `connect` when the server cannot be
        reached."""
        if conn.broken and not conn.in_transaction:
            with contextlib.suppress(Exception):
                conn.raw.close()
            conn.replace(reconnect(self.target))
            self.reconnects += 1
        return conn

    def rollback_quietly(self, conn: Connection) -> None:
        if conn.in_transaction:
            unsent = conn.begin_unsent
            conn.ended()
            if conn.broken or unsent:
                return  # the server rolls back a transaction whose connection is gone; or it never began
            with contextlib.suppress(Exception):
                conn.simple("ROLLBACK")

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Cursor:
        assert not isinstance(params, dict), "the shared layer binds by position"
        held = self.held()
        if held is not None:
            try:
                return held.execute(sql, params)
            except UnicodeEncodeError as exc:
                raise not_text_error(exc) from None
            except Exception as exc:
                if _is_driver_error(exc):
                    self.failed(held, exc)
                raise  # the owning tx() maps it after rolling back
        conn = self.acquire()
        try:
            for attempt in (1, 2):
                try:
                    return self.usable(conn).execute(sql, params)
                except UnicodeEncodeError as exc:
                    raise not_text_error(exc) from None
                except Exception as exc:
                    if not _is_driver_error(exc):
                        raise
                    self.failed(conn, exc)
                    # a read outside a transaction is retried once on a new connection (nothing to repeat)
                    if attempt == 1 and conn.broken and _is_read(sql):
                        continue
                    raise pg_error(exc, "statement", self.shown) from None
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self.release(conn)

    def let_go(self, key: int) -> None:
        """A session lock kept by `PgDialect.hold_dead` on this thread's pinned connection was released: the
        connection goes back to the pool."""
        pinned: Connection | None = getattr(self.local, "pinned", None)
        if pinned is not None:
            pinned.let_go(key)
            if not pinned.session_keys:
                self.release(pinned)

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Row]:
        return self.execute(sql, params).fetchall()

    def now(self, offset_s: float = 0.0) -> str:
        """The server's clock (+ offset): every host stamps and compares expiries on this one clock."""
        row = self.query_one(
            f"SELECT to_char((clock_timestamp() + make_interval(secs => ?)) AT TIME ZONE 'UTC', '{_ISO}')",
            (float(offset_s),),
        )
        return str(row[0])

    def later(self, now: str, offset_s: float) -> str:
        """Derived from `now`, not read again: each read of the server clock is a round trip."""
        return format_iso(parse_iso(now) + timedelta(seconds=offset_s))

    def holder_liveness(self, holder: str) -> HolderLiveness | None:
        """A liveness connection holding `holder`'s session lock (liveness.HolderLock), opened on a background
        thread so the driver does not wait for a second handshake: until it holds the lock the lease row
        records no marker, and the holder's next renewal records it. Liveness never stops a driver: when the
        server cannot be reached for it, peers wait for the lease to expire."""
        from akm.store.postgres.liveness import HolderLock

        return HolderLock.start(self.target, holder)

    def listener(self, channel: str, event: Any, payload: str | None = None) -> Any:
        from akm.store.postgres.wakeups import Listener

        return Listener(self.target, channel, event, payload)

    def notifier(self, channel: str) -> Any:
        from akm.store.postgres.wakeups import Notifier

        return Notifier(self.target, channel)

    @contextlib.contextmanager
    def bulk_writes(self) -> Iterator[None]:
        """Nothing to do: the server checkpoints on its own."""
        yield

    def close(self) -> None:
        with self._cond:
            self._closed = True
            conns = list(self._all)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.raw.close()


def _is_read(sql: str) -> bool:
    return sql.lstrip()[:6].upper() == "SELECT" and " FOR " not in sql.upper()


def reconnect(target: Target) -> Any:
    """A new work connection to a journal already opened (and migrated) once: the schema as search path."""
    return connect(target, search_path=target.schema)


def open_pg(url: str, *, migrate: bool = True) -> PgJournal:
    """Connect to the journal server named by `url`, refuse a foreign or newer schema, apply migrations."""
    from akm.store.migrations import check_ledger
    from akm.store.postgres import schema
    from akm.store.postgres.connect import parse_url

    target = parse_url(url)
    raw = connect(target)
    try:
        if migrate:
            schema.apply_migrations(raw, target.schema, target.shown)
        else:
            schema.refuse_foreign(raw, target.schema, target.shown, schema.PG_MIGRATIONS)
            check_ledger(schema.applied_ids(raw, target.schema), schema.PG_MIGRATIONS, target.shown)
        raw.execute_simple(f"SET search_path TO {target.schema}")
    except Exception as exc:
        with contextlib.suppress(Exception):
            raw.close()
        if _is_driver_error(exc):
            raise pg_error(exc, "open", target.shown) from None
        raise
    return PgJournal(raw, target)
