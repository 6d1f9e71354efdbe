"""Cancellation that fans out to the events runners wait on.

Python's threading.Event cannot be chained, so a `Cancellation` keeps a set of
linked events and sets them all when tripped: the caller's signal (SIGINT,
SIGTERM, --timeout), a lost lease, or a crossed budget each trip the events of
the units in flight, which then kill their process groups.
"""

from __future__ import annotations

import threading


class Cancellation:
    def __init__(self) -> None:
        self.reason: str | None = None
        self._events: set[threading.Event] = set()
        # Re-entrant: `trip` runs from signal handlers, which may interrupt the main
        # thread inside `link`/`unlink` while it holds this lock.
        self._lock = threading.RLock()

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def trip(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            events = list(self._events)
        for ev in events:
            ev.set()

    def link(self, event: threading.Event) -> None:
        with self._lock:
            self._events.add(event)
            tripped = self.reason is not None
        if tripped:
            event.set()

    def unlink(self, event: threading.Event) -> None:
        with self._lock:
            self._events.discard(event)
