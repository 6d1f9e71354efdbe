"""Keeps the run lease alive, marks running units as alive (D8), and notices an abandon.

Runs on its own thread. Every `interval` seconds (a quarter of the lease TTL
at most) it renews the lease; a renewal the journal refuses means another
driver took the run over (or it was abandoned): the heartbeat trips the lease
cancellation so in-flight units stop, and the drive loop raises instead of
double-driving the run. A renewal that cannot reach the journal (a dropped or
stalled connection) is tried again at the next poll; if none succeeds in
time, the fencing watchdog (`akm.engine.fencing`) stops the units before the
lease can lapse, and likewise when the driver's liveness lock cannot be proven
(PostgreSQL): a peer may take the run over after that, and must never find
this driver's units still running. Between renewals it polls the run's status and lease
(holder, epoch) every `STATUS_POLL_S` (one primary-key read), so an abandon or
a takeover stops in-flight units within about a second rather than a whole
heartbeat — e.g. a driver that was SIGSTOPped past its TTL and continued. No
new unit can start meanwhile anyway: the unit insert itself refuses a run
that is no longer drivable or no longer carries this driver's fence.
Intervals are measured on the monotonic clock, so after a stop the first poll
renews (or finds the lease lost) at once. On a journal that records holder
liveness (PostgreSQL) each renewal first refreshes the driver's liveness
session and records the server marker it holds its lock on; the first renewal
comes at once, as soon as that session holds its lock (it opens in the
background while the driver takes the lease).
"""

from __future__ import annotations

import threading
import time

from akm.engine.cancel import Cancellation
from akm.engine.fencing import Watchdog, lapse_check
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.journal import HolderLiveness, Journal

HEARTBEAT_S = 10.0  # well inside the lease TTL (runs_store.LEASE_TTL_S)
STATUS_POLL_S = 1.0  # how soon an abandon or a takeover stops the units a driver has in flight


def default_interval() -> float:
    """Renew every 10 s, or every quarter of a shorter lease TTL (AKM_LEASE_TTL_S)."""
    return min(HEARTBEAT_S, runs_store.lease_ttl_s() / 4)


class Heartbeat:
    def __init__(
        self,
        db: Journal,
        run_id: str,
        holder: str,
        lost: Cancellation,
        interval: float | None = None,
        epoch: int | None = None,
        liveness: HolderLiveness | None = None,
        renewed_at: float | None = None,
    ) -> None:
        self.db, self.run_id, self.holder, self.lost = db, run_id, holder, lost
        self.epoch = epoch
        self.liveness = liveness  # refreshed with each renewal (PostgreSQL: the holder's session lock)
        self.interval = default_interval() if interval is None else interval
        # when the last renewal the journal accepted was sent (monotonic): the lease runs a TTL from no earlier
        self.renewed_at = time.monotonic() if renewed_at is None else renewed_at
        self._stop = threading.Event()
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="akm-heartbeat", daemon=True)
        checks = [lapse_check(lambda: self.renewed_at, runs_store.lease_ttl_s(), "lease_lapsing")]
        if liveness is not None:
            checks.append(lambda: "liveness_lost" if liveness.overdue() else None)
        self.watchdog = Watchdog(checks, self.lost.trip, "akm-fence")

    def start(self) -> None:
        self.watchdog.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.watchdog.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def track(self, unit_id: str) -> None:
        with self._lock:
            self._running.add(unit_id)

    def untrack(self, unit_id: str) -> None:
        with self._lock:
            self._running.discard(unit_id)

    def beat(self) -> bool | None:
        """One renewal: True; False (and the lease cancellation tripped) when the journal says the lease is
        gone; None when the journal could not be asked (the caller tries again soon; the watchdog fences)."""
        if self.lost.tripped:
            return False  # fenced or lost: renewing now would only keep a lease this driver no longer uses
        sent = time.monotonic()
        try:
            ok = runs_store.renew_lease(self.db, self.run_id, self.holder, epoch=self.epoch, liveness=self.liveness)
        except Exception:  # the journal is unreachable now: proves nothing either way
            return None
        if not ok:
            self.lost.trip("lease_lost")
            return False
        self.renewed_at = sent
        with self._lock:
            running = sorted(self._running)
        if running:
            try:
                units_store.heartbeat_units(self.db, self.run_id, running)
            except Exception:
                pass  # liveness marks are advisory; the lease renewal above is what matters
        return True

    def still_drivable(self) -> bool:
        """False (and the lease cancellation tripped) once another command abandoned the run or
        another driver took its lease (a new holder or epoch).

        Only `abandoned` counts among statuses: completed/failed/blocked are written by this
        driver itself, which must not be stopped by its own last step (a finished run keeps
        this driver's lease until it releases it, so the lease check agrees).
        """
        try:
            row = runs_store.run_status_and_lease(self.db, self.run_id)
        except Exception:
            return True  # a failed read proves nothing; the next renewal decides
        if row is None:
            return True
        status, holder, epoch = row
        if status == "abandoned":
            self.lost.trip("abandoned")
            return False
        if holder != self.holder or (self.epoch is not None and epoch != self.epoch):
            self.lost.trip("lease_lost")
            return False
        return True

    def _loop(self) -> None:
        poll = min(self.interval, STATUS_POLL_S)
        due = self.liveness is not None  # the first renewal records the liveness marker as soon as it is held
        last_beat = time.monotonic()
        while due or not self._stop.wait(poll):
            if self.lost.tripped:
                return
            if not due and not self.still_drivable():
                return
            if due or time.monotonic() - last_beat >= self.interval:
                last_beat = time.monotonic()
                renewed = self.beat()
                if renewed is False:
                    return
                due = False
                if renewed is None:
                    last_beat -= self.interval - poll  # unreachable: try again at the next poll
