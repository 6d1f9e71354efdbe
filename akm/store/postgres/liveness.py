"""Is a lease holder's process still alive? A session advisory lock says "dead" at once (postgres.md §2.4).

Why: on one host the journal tells a dead driver by its pid; across hosts it could only wait for the lease
to expire (90 s). On PostgreSQL a holder keeps one dedicated *liveness connection* holding a session advisory
lock keyed on its holder id. When its process dies the kernel closes the socket, the backend exits and the
lock is gone; another host that can take the lock knows the holder is dead and may take the run over now.

The signal only ever proves *dead*. A frozen or partitioned host keeps its session (and looks alive) until
the lease expires, which stays the authority. A hash collision between two holders' keys can only make a
dead holder look alive, never a live one dead.

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
  on a work connection, never on a liveness connection (advisory locks are re-entrant within a session).

This module imports nothing above `store/`; pg8000 comes in through `connect`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from akm.store.postgres.connect import Target, connect

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
    rows = con.run(f"SELECT {dead_sql('CAST(:k AS int)', 'CAST(:m AS text)')}", k=key, m=marker)
    return bool(rows[0][0])


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
        self._con: Any = None
        self._opening: threading.Thread | None = None

    @classmethod
    def acquire(cls, target: Target, holder: str, *, wait_s: float = 2.0) -> HolderLock:
        """Open the liveness connection and take the lock (raises a coded JournalError when unreachable)."""
        lock = cls(target, holder, wait_s)
        lock._connect_and_take(wait_s)
        return lock

    @classmethod
    def start(cls, target: Target, holder: str, *, wait_s: float = 2.0) -> HolderLock:
        """`acquire` without the wait: the connection opens and takes the lock on a background thread.

        Why: a new connection (TCP, SCRAM) costs tens of ms, and a driver need not wait for it before it
        takes the lease. `marker` is set only once the lock is held, so a lease taken meanwhile records
        NULL (no fast path yet) and the holder's next renewal, whose `refresh` waits for the thread,
        records the marker. Never raises: an unreachable server just means no fast path.
        """
        lock = cls(target, holder, wait_s)

        def open_and_take() -> None:
            try:
                lock._connect_and_take(wait_s)
            except Exception:  # unreachable now: refresh tries again
                lock._close()

        lock._opening = threading.Thread(target=open_and_take, name="akm-liveness", daemon=True)
        lock._opening.start()
        return lock

    def _settle(self) -> None:
        """Wait for a background open (`start`) to finish."""
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.join()

    def _connect_and_take(self, wait_s: float) -> None:
        self._close()
        self.marker = None
        self._con = connect(self.target)
        try:
            self._take(wait_s)
        except Exception:  # the new session failed at once: no lock, no fast path (never a driver traceback)
            self._close()

    def _take(self, wait_s: float) -> None:
        """Take the lock on the open connection, retrying for `wait_s` (a peer's probe holds it one statement)."""
        deadline = time.monotonic() + wait_s
        while True:
            rows = self._con.run(
                f"SELECT pg_try_advisory_lock(:ns, :k), {MARKER_SQL}, {_LOCK_HELD_SQL}", ns=NAMESPACE, k=self.key
            )
            if rows[0][0] and rows[0][2]:
                self.marker = str(rows[0][1])
                return
            if rows[0][0]:  # granted yet not visible on this backend (a pooler): do not leave it behind
                self._con.run("SELECT pg_advisory_unlock(:ns, :k)", ns=NAMESPACE, k=self.key)
            if time.monotonic() >= deadline:
                self.marker = None
                return
            time.sleep(0.05)

    def refresh(self) -> str | None:
        """The marker to record with the next renewal, after proving the lock is still held.

        When the liveness connection is gone (the server restarted or crashed, the network dropped it) a new
        one takes the lock again first, so a renewal never records an incarnation this holder holds no lock
        on. None when the lock cannot be had: record NULL (no fast path); liveness never stops a driver.
        One statement when all is well; never a wait when the session lives but the key is taken.
        """
        self._settle()
        if self._con is not None:
            try:
                rows = self._con.run(f"SELECT {MARKER_SQL}, {_LOCK_HELD_SQL}", ns=NAMESPACE, k=self.key)
                if rows[0][1]:
                    self.marker = str(rows[0][0])
                else:
                    self._take(0.0)  # the session lives, the lock was never had (a colliding key): one try
                return self.marker
            except Exception:  # any driver failure means the session (and the lock) is gone
                pass
        try:
            self._connect_and_take(self.wait_s)
        except Exception:  # unreachable now: no fast path until the next refresh
            self._close()
            self.marker = None
        return self.marker

    def release(self) -> None:
        """Give the lock up and close the liveness connection (idempotent)."""
        self._settle()
        if self._con is not None:
            try:
                self._con.run("SELECT pg_advisory_unlock(:ns, :k)", ns=NAMESPACE, k=self.key)
            except Exception:  # the connection is closing anyway; the lock goes with the session
                pass
        self._close()
        self.marker = None

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
