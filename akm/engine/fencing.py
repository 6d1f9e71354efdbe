"""Self-fencing: a holder that can no longer prove it owns what it runs stops its units before anyone else may
run them.

Two things let another process run a holder's units: its lease (or a worker's claims) expiring on the
journal's clock, and — on PostgreSQL — a peer finding its liveness lock free. Neither proves the holder is
dead: a driver whose connection stalled, or whose liveness connection alone was dropped, is alive and its
units are still running. So each side keeps its half of a bound:

* the holder stops every unit (the lease cancellation: SIGTERM to each unit's process group, SIGKILL
  `KILL_GRACE_S` later, and the dispatch threads wait for them) once
  - its lease or claims are about to lapse: `stop_margin(ttl)` before the TTL runs out, counted from the
    moment the last successful renewal was *sent* (the journal stamped its expiry no earlier), or
  - it could not prove its liveness lock for `FENCE_AFTER_S` (store/postgres/liveness.py);
* a peer that finds a holder's liveness lock free keeps that lock itself (so the holder cannot take it back)
  and waits `TAKEOVER_GRACE_S` — longer than `FENCE_AFTER_S` plus the time units take to stop — before it
  takes the run over. An expired lease needs no grace: the holder fenced before it expired.

`Watchdog` is the holder's side: a thread that touches neither the journal nor its lock, so a journal call
blocked on a stalled socket cannot keep it from firing. Durations are on the monotonic clock; only the
lease's own expiry is on the journal's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from akm.dispatch.process import KILL_GRACE_S
from akm.errors import AkmError, JournalError, UsageError
from akm.store import runs as runs_store
from akm.store.journal import FENCE_AFTER_S, Journal
from akm.store.status import DRIVABLE_STATUSES

UNIT_STOP_S = KILL_GRACE_S + 1.0  # from the cancellation to every unit's process group gone (SIGKILL + reaping)
TAKEOVER_GRACE_S = FENCE_AFTER_S + UNIT_STOP_S + 2.0  # the peer's wait: the holder's fencing, and a margin
WATCH_EVERY_S = 0.1


def stop_margin(ttl_s: float) -> float:
    """How long before its lease or claims lapse a holder that could not renew stops its units.

    UNIT_STOP_S plus a second, but never more than a quarter of the TTL: a short TTL (tests,
    `AKM_LEASE_TTL_S`) keeps its renewals meaningful, and the guarantee for units that ignore SIGTERM then
    needs a TTL of at least 4 × (UNIT_STOP_S + 1) = 28 s (the defaults are 90 s).
    """
    return min(UNIT_STOP_S + 1.0, ttl_s / 4)


class Watchdog:
    """Calls `fire(reason)` once, as soon as one of `checks` returns a reason (checked every WATCH_EVERY_S)."""

    def __init__(self, checks: list[Callable[[], str | None]], fire: Callable[[str], None], name: str) -> None:
        self.checks = checks
        self.fire = fire
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            for check in self.checks:
                reason = check()
                if reason is not None:
                    self.fire(reason)
                    return


def lapse_check(renewed_at: Callable[[], float], ttl_s: float, reason: str) -> Callable[[], str | None]:
    """A check firing `reason` once `stop_margin` before a TTL counted from `renewed_at()` (monotonic) ends."""
    limit = ttl_s - stop_margin(ttl_s)

    def check() -> str | None:
        return reason if time.monotonic() - renewed_at() > limit else None

    return check


# Journal errors of a server that is reachable again later (PostgreSQL): they stop a driver, never fail a unit.
JOURNAL_DOWN = frozenset({"JOURNAL_CONNECTION_LOST", "JOURNAL_BUSY", "JOURNAL_UNREACHABLE"})

# Why a driver stopped itself (the reasons its lease cancellation is tripped with by the watchdog).
_STOPPED_ITSELF = {
    "lease_lapsing": "it could not renew its run lease (the journal server did not answer) and the lease was "
    "about to lapse.",
    "liveness_lost": "it lost the connection that proves to other hosts that it is alive, and could not take it "
    "back in time.",
}


def lost_lease_error(db: Journal, run_id: str, reason: str | None, journal_fault: JournalError | None) -> AkmError:
    """The error a driver that stopped driving `run_id` exits with, for the `reason` its lease cancellation
    was tripped with: the journal's own fault, its fencing, the run abandoned, or another holder's lease."""
    if reason == "journal_down" and journal_fault is not None:
        return journal_fault
    stopped = _STOPPED_ITSELF.get(reason or "")
    if stopped is not None:  # this driver stopped itself; the journal may be unreachable, so ask it nothing
        from akm.codes import Code

        return UsageError(
            f"This invocation stopped driving run {run_id}: {stopped} It stopped its units first so that "
            "another invocation can take the run over without running any of them twice at once.",
            code=Code.LEASE_LOST,
            details={"runId": run_id, "reason": reason},
            hint="Drive the run again once the journal server is reachable: it resumes where its journal stands.",
        )
    run = runs_store.get_run(db, run_id)
    if run is not None and run.status not in DRIVABLE_STATUSES:
        return UsageError(
            f"Run {run_id} became {run.status} while this invocation was driving it "
            f"({'abandoned' if run.status == 'abandoned' else 'changed'} by another command); stopped. "
            "Results of units that finished were kept in the journal.",
            code="RUN_ABANDONED" if run.status == "abandoned" else "RUN_NOT_ACTIVE",
        )
    lease = runs_store.read_lease(db, run_id)
    who = f"{lease.holder} (host {lease.host}, pid {lease.pid})" if lease else "(nobody)"
    from akm.codes import Code

    return UsageError(
        f"This invocation lost its lease on run {run_id} (now held by {who}); stopping to avoid racing it. "
        "Units it had in flight were stopped; their results are not journaled over the new holder's.",
        code=Code.LEASE_LOST,
        details={"runId": run_id},
        hint="Another invocation drives the run now (it redoes what this one left unfinished); "
        "`workflow status` shows it.",
    )
