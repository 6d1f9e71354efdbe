"""Is a lease holder's process still alive? A session advisory lock says "dead" at once (spec/journal.md).

Why: on one host the journal tells a dead driver by its pid; across hosts it could only wait for the lease
to expire (90 s). On PostgreSQL a holder keeps one dedicated *liveness connection* holding a session advisory
lock keyed on its holder id. When its process dies the kernel closes the socket, the backend exits and the
lock is gone; another host that can take the lock knows the holder is dead and may take the run over now.

The signal proves that the holder's *session* is gone, not that the holder is: a driver whose
liveness connection alone was dropped (a reset, a pooler's or the server's idle kill, `pg_terminate_backend`)
is alive and still running units. So a free lock never hands the run over by itself:

* the holder watches its lock (`PROBE_EVERY_S`, each probe bounded by `PROBE_TIMEOUT_S`), takes it back on a
  new connection when the old one failed, and records when it last proved it held (`proven_at`); a holder
  that cannot prove it for `FENCE_AFTER_S` must stop its units (`overdue`; the engine's watchdog does it);
* a peer that finds the lock free takes it itself (`hold_sql`, a session lock: the holder cannot take it
  back any more, so it will fence), waits out a grace longer than the holder's fencing, and only then takes
  the run over (`akm.engine.fencing`, `runs.hold_dead_holder`).

A frozen or partitioned host keeps its session (and looks alive) until the lease expires, which stays the
authority. A hash collision between two holders' keys can only make a dead holder look alive, never a live
one dead.

The key is the holder id, not (run, epoch): the holder takes its lock before it asks for the lease, so the
`UPDATE` that takes the lease records the key and the server's incarnation together and there is no moment
in which the row names a holder whose lock does not exist yet. The epoch still fences every write.

**Server restarts.** A restart, a failover, and also a crash of any one backend (the postmaster then
reinitializes shared memory without restarting, so `pg_postmaster_start_time()` does not change) drop every
session lock at once; judged naively every holder would look dead. So the holder records the server's
*incarnation* (`server_marker`: postmaster start time plus the shared statistics' reset time, which a crash
reset moves) alongside the lock, and a check only trusts a free lock when the incarnation is unchanged.
Otherwise the check answers "not dead" and the lease expires as it would without this module. A manual
`pg_stat_reset_shared('bgwriter')` also changes the marker, which only switches the fast path off until the
holders' next renewal records the new one.

Use from the journal (wired through `PgJournal.holder_liveness` and `PgDialect.lease_dead`; spec/journal.md
"Liveness of a lease holder"):

* holder: `lock = HolderLock.acquire(target, holder)` (or `HolderLock.start`, which opens the connection on a
  background thread; its `marker` stays None until the lock is held) before acquiring the lease; store
  `lock.key` and `lock.marker` in the lease row in the same UPDATE; before each renewal
  `marker = lock.refresh()` and store it with the renewal (a new connection re-takes the lock *before* the
  renewal writes the new marker); `lock.release()` after releasing the lease. A `None` marker means "no fast path for me" (store NULL).
* peer: `holder_is_dead(con, key, marker)` (or `dead_sql(...)` inside the statement that takes the lease)
  on a work connection, never on a liveness connection (advisory locks are re-entrant within a session);
  `hold_sql(...)` to keep the dead holder's lock through the takeover grace, `held_sql(...)` to check it is
  still kept (a reconnect loses it).

This module imports nothing above `store/`; pg8000 comes in through `connect`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from akm.store.journal import FENCE_AFTER_S
from akm.store.postgres import wire
from akm.store.postgres.connect import Target, connect

PROBE_EVERY_S = 1.0  # how often a holder proves (to itself) that its lock is still held
PROBE_TIMEOUT_S = 2.0  # a probe on the liveness connection answered later than this failed
CONNECT_TIMEOUT_S = 5.0  # opening a new liveness connection (TCP, TLS, SCRAM) under load
# FENCE_AFTER_S (store/journal.py): a holder that could not prove its lock for this long must stop its units

# The classid of akm's liveness locks (two-int4 key space; "akmL"): other programs' advisory locks on the
# same database use other classids or the one-bigint space, which does not overlap this one.
NAMESPACE = 0x616B6D4C

_ISO = 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'
MARKER_SQL = (
    f"(to_char(pg_postmaster_start_time() AT TIME ZONE 'UTC', '{_ISO}') || '/' ||"
    f" coalesce(to_char(pg_stat_get_bgwriter_stat_reset_time() AT TIME ZONE 'UTC', '{_ISO}'), '-'))"
)
"""The server's incarnation as text: changes on every restart, failover and crash reset."""

_LOCK_HELD_SQL = (
    "EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
    " AND classid::bigint = :ns AND objid::bigint = :k AND objsubid = 2)"
)


def session_key(holder: str) -> int:
    """The advisory-lock key of a holder id: 31 bits of its sha256 (non-negative, so pg_locks shows it as is)."""
    return int.from_bytes(hashlib.sha256(holder.encode("utf-8", "surrogateescape")).digest()[:4], "big") >> 1


def dead_sql(key: str, marker: str) -> str:
    """A SQL boolean: the holder of lock `key` is dead, given the incarnation `marker` recorded with it.

    `key` and `marker` are SQL expressions (a column such as `lease_session`, or a `:param`). True only when
    the marker is the server's current one and the lock is free; the probe is a transaction-level lock, so
    it is released when the statement's transaction ends (at once under autocommit). CASE keeps the lock
    probe from running at all when the marker does not match.
    """
    return (
        f"(CASE WHEN {marker} IS NOT NULL AND {key} IS NOT NULL AND {marker} = {MARKER_SQL}"
        f" THEN pg_try_advisory_xact_lock({NAMESPACE}, ({key})::int) ELSE false END)"
    )


def holder_is_dead(con: Any, key: int | None, marker: str | None) -> bool:
    """Has the holder that recorded (`key`, `marker`) lost its liveness session on this very server incarnation?

    False when nothing was recorded, when the server restarted or crashed since (the fast path is off then:
    wait for expiry), or when the lock is held. Call it on a work connection, not on a liveness one.
    """
    if key is None or marker is None:
        return False
    rows = wire.query(con, f"SELECT {dead_sql('CAST(:k AS int)', 'CAST(:m AS text)')}", k=key, m=marker)
    return bool(rows[0][0])


def hold_sql(key: str, marker: str) -> str:
    """A SQL boolean: the holder of `key` is dead (`dead_sql`) *and* this session now holds its lock (a session
    lock, kept past the transaction), so the holder cannot take it back while a peer waits out the grace."""
    return f"(CASE WHEN {dead_sql(key, marker)} THEN pg_try_advisory_lock({NAMESPACE}, ({key})::int) ELSE false END)"


def held_sql(key: str) -> str:
    """A SQL boolean: this session holds the session lock of `key` (after `hold_sql`; a reconnect loses it)."""
    return _LOCK_HELD_SQL.replace(":ns", str(NAMESPACE)).replace(":k", f"({key})::bigint")


def server_marker(con: Any) -> str:
    """The incarnation of the server `con` talks to (MARKER_SQL)."""
    return str(con.run(f"SELECT {MARKER_SQL}")[0][0])


class HolderLock:
    """One holder's liveness connection and the session lock it keeps while the holder drives.

    `marker` is the server incarnation the lock was taken on, or None when the lock could not be taken (a
    key collision with a live holder, a pooler that drops session state): the holder then records NULL and
    peers simply wait for its lease to expire.
    """

    def __init__(self, target: Target, holder: str, wait_s: float) -> None:
        self.target = target
        self.holder = holder
        self.key = session_key(holder)
        self.wait_s = wait_s
        self.marker: str | None = None
        # monotonic time a probe that found the lock held was sent; None until the lock was first held
        self.proven_at: float | None = None
        self._con: Any = None
        self._io = threading.RLock()  # one user of the liveness connection at a time (monitor, refresh)
        self._stop = threading.Event()

    @classmethod
    def acquire(cls, target: Target, holder: str, *, wait_s: float = 2.0) -> HolderLock:
        """Open the liveness connection and take the lock (raises a coded JournalError when unreachable)."""
        lock = cls(target, holder, wait_s)
        lock._connect_and_take(wait_s)
        return lock

    @classmethod
    def start(cls, target: Target, holder: str, *, wait_s: float = 2.0) -> HolderLock:
        """`acquire` without the wait, and watched: the connection opens and takes the lock on a background
        thread, which then probes it every PROBE_EVERY_S (taking it back on a new connection when the old
        one failed) and keeps `proven_at` (see `overdue`).

        Why: a new connection (TCP, SCRAM) costs tens of ms, and a driver need not wait for it before it
        takes the lease. `marker` is set only once the lock is held, so a lease taken meanwhile records
        NULL (no fast path yet) and the holder's next renewal, whose `refresh` waits for the open,
        records the marker. Never raises: an unreachable server just means no fast path.
        """
        lock = cls(target, holder, wait_s)
        opened = threading.Event()

        def open_and_watch() -> None:
            try:
                with lock._io:
                    lock._connect_and_take(wait_s)
            except Exception:  # unreachable now: the next probe tries again
                lock._close()
            opened.set()
            while not lock._stop.wait(PROBE_EVERY_S):
                lock.probe()

        lock._opened = opened
        threading.Thread(target=open_and_watch, name="akm-liveness", daemon=True).start()
        return lock

    _opened: threading.Event | None = None

    def overdue(self) -> bool:
        """Has this holder gone FENCE_AFTER_S without proving it holds its lock (after having held it)? Then a
        peer may hold the lock now and take the run over once its grace ends: stop every unit."""
        proven = self.proven_at
        return proven is not None and time.monotonic() - proven > FENCE_AFTER_S

    def probe(self) -> str | None:
        """Prove the lock is held (one statement), or take it back on a new connection when the old one failed
        (one try: a peer holding the key now means this holder must fence, not wait); `proven_at` moves on
        success. Returns the marker (None: not held)."""
        with self._io:
            if self._stop.is_set():  # released: never take the lock again
                return None
            if self._con is not None:
                try:
                    sent = time.monotonic()
                    rows = wire.query(self._con, f"SELECT {MARKER_SQL}, {_LOCK_HELD_SQL}", ns=NAMESPACE, k=self.key)
                    if rows[0][1]:
                        self.marker = str(rows[0][0])
                        self.proven_at = sent
                    else:
                        self._take(0.0)  # the session lives, the lock is not held (a colliding key): one try
                    return self.marker
                except Exception:  # any driver failure means the session (and the lock) is gone
                    self._close()
            try:
                self._connect_and_take(0.0)
            except Exception:  # unreachable now: no fast path until the next probe
                self._close()
                self.marker = None
            return self.marker

    def _settle(self) -> None:
        """Wait for a background open (`start`) to finish."""
        if self._opened is not None:
            self._opened.wait()

    def _connect_and_take(self, wait_s: float) -> None:
        self._close()
        self.marker = None
        self._con = connect(self.target, timeout=CONNECT_TIMEOUT_S, role="akm-liveness")
        try:
            self._con._usock.settimeout(PROBE_TIMEOUT_S)
            self._take(wait_s)
        except Exception:  # the new session failed at once: no lock, no fast path (never a driver traceback)
            self._close()

    def _take(self, wait_s: float) -> None:
        """Take the lock on the open connection, retrying for `wait_s` (a peer's probe holds it one statement)."""
        deadline = time.monotonic() + wait_s
        while True:
            sent = time.monotonic()
            rows = wire.query(
                self._con,
                f"SELECT pg_try_advisory_lock(:ns, :k), {MARKER_SQL}, {_LOCK_HELD_SQL}",
                ns=NAMESPACE,
                k=self.key,
            )
            if rows[0][0] and rows[0][2]:
                self.marker = str(rows[0][1])
                self.proven_at = sent
                return
            if rows[0][0]:  # granted yet not visible on this backend (a pooler): do not leave it behind
                wire.query(self._con, "SELECT pg_advisory_unlock(:ns, :k)", ns=NAMESPACE, k=self.key)
            if time.monotonic() >= deadline:
                self.marker = None
                return
            time.sleep(0.05)

    def refresh(self) -> str | None:
        """The marker to record with the next renewal, after proving the lock is still held (`probe`).

        When the liveness connection is gone (the server restarted or crashed, the network dropped it) a new
        one takes the lock again first, so a renewal never records an incarnation this holder holds no lock
        on. None when the lock cannot be had: record NULL (no fast path). One statement when all is well;
        never a wait when the session lives but the key is taken.
        """
        self._settle()
        return self.probe()

    def release(self) -> None:
        """Stop watching, give the lock up and close the liveness connection (idempotent)."""
        self._stop.set()
        self._settle()
        with self._io:
            if self._con is not None:
                try:
                    wire.query(self._con, "SELECT pg_advisory_unlock(:ns, :k)", ns=NAMESPACE, k=self.key)
                except Exception:  # the connection is closing anyway; the lock goes with the session
                    pass
            self._close()
            self.marker = None
            self.proven_at = None

    def _close(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            try:
                con.close()
            except Exception:  # a dead socket cannot be closed politely
                pass

    def __enter__(self) -> HolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
