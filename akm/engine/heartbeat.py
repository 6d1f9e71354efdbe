"""Keeps the run lease alive, marks running units as alive (D8), and notices an abandon.

Runs on its own thread. Every `interval` seconds it renews the lease; a
renewal that fails means another driver took the run over (or it was
abandoned): the heartbeat trips the lease cancellation so in-flight units
stop, and the drive loop raises instead of double-driving the run. Between
renewals it polls the run's status every `STATUS_POLL_S` (one indexed read),
so `workflow abandon` stops in-flight units within about a second rather
than a whole heartbeat; no new unit can start meanwhile anyway, because the
unit insert itself refuses a run that is no longer drivable.
"""

from __future__ import annotations

import threading

from akm.engine.cancel import Cancellation
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.db import Database

HEARTBEAT_S = 10.0  # well inside the lease TTL (runs_store.LEASE_TTL_S)
STATUS_POLL_S = 1.0  # how soon an abandon stops the units a driver has in flight


class Heartbeat:
    def __init__(self, db: Database, run_id: str, holder: str, lost: Cancellation,
                 interval: float = HEARTBEAT_S) -> None:
        self.db, self.run_id, self.holder, self.lost = db, run_id, holder, lost
        self.interval = interval
        self._stop = threading.Event()
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="akm-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def track(self, unit_id: str) -> None:
        with self._lock:
            self._running.add(unit_id)

    def untrack(self, unit_id: str) -> None:
        with self._lock:
            self._running.discard(unit_id)

    def beat(self) -> bool:
        """One renewal; False (and the lease cancellation tripped) when the lease is gone."""
        try:
            ok = runs_store.renew_lease(self.db, self.run_id, self.holder)
        except Exception:  # a failing renewal is treated as a lost lease
            ok = False
        if not ok:
            self.lost.trip("lease_lost")
            return False
        with self._lock:
            running = sorted(self._running)
        if running:
            try:
                units_store.heartbeat_units(self.db, self.run_id, running)
            except Exception:
                pass  # liveness marks are advisory; the lease renewal above is what matters
        return True

    def still_drivable(self) -> bool:
        """False (and the lease cancellation tripped) once another command abandoned the run.

        Only `abandoned` counts: completed/failed/blocked are written by this
        driver itself, which must not be stopped by its own last step.
        """
        try:
            status = runs_store.run_status(self.db, self.run_id)
        except Exception:
            return True  # a failed read proves nothing; the next renewal decides
        if status != "abandoned":
            return True
        self.lost.trip("abandoned")
        return False

    def _loop(self) -> None:
        poll = min(self.interval, STATUS_POLL_S)
        since_beat = 0.0
        while not self._stop.wait(poll):
            since_beat += poll
            if since_beat >= self.interval:
                since_beat = 0.0
                if not self.beat():
                    return
            elif not self.still_drivable():
                return
