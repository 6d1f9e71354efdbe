"""A running agent unit's live progress: from its CLI's stream to the listeners and the journal.

The agent dispatcher reads the CLI's lines (akm.dispatch.agent_stream) and calls the request's
`on_activity` with what changed — a turn, a tool call, a retry, the session id. `ActivityRelay` is that
callback for one attempt:

* every change goes at once to the drive's `on_progress` (the terminal board of `workflow run`, MCP
  progress notifications of a background driver) as an `UnitActivity`;
* the journal gets it too, so `status --watch` in another process sees it — but at most once every
  `JOURNAL_EVERY_S` per attempt (a chatty agent must not turn the journal into a log), the first change
  and a new session id always; the session id is written on the unit's row (`status --units`).

Live progress is advisory: a failed journal write is dropped, never the unit's failure.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from akm.engine.progress import UnitActivity
from akm.store import units as units_store

JOURNAL_EVERY_S = 5.0


class ActivityRelay:
    """`UnitRequest.on_activity` for one attempt (see the module docstring)."""

    def __init__(
        self,
        db: Any,
        *,
        run_id: str,
        step_id: str,
        unit_id: str,
        attempt_id: str,
        started_at: str | None,
        on_progress: Callable[[Any], None] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db, self.run_id, self.step_id, self.unit_id = db, run_id, step_id, unit_id
        self.attempt_id, self.started_at, self.on_progress, self.clock = attempt_id, started_at, on_progress, clock
        self.began = clock()
        self.journaled_at: float | None = None
        self.session: str | None = None
        self.pending: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def __call__(self, activity: dict[str, Any]) -> None:
        now = self.clock()
        if self.on_progress is not None:
            try:
                self.on_progress(
                    UnitActivity(self.run_id, self.step_id, self.unit_id, self.attempt_id, activity, now - self.began)
                )
            except Exception:
                pass
        with self._lock:
            new_session = activity.get("sessionId") is not None and activity.get("sessionId") != self.session
            due = self.journaled_at is None or now - self.journaled_at >= JOURNAL_EVERY_S
            if not (due or new_session) or self.started_at is None or self.db is None:
                self.pending = activity  # journaled with the next due change, or not at all
                return
            self.journaled_at, self.pending = now, None
            self.session = activity.get("sessionId") or self.session
        try:
            units_store.note_activity(
                self.db,
                run_id=self.run_id,
                unit_id=self.attempt_id,
                started_at=self.started_at,
                step_id=self.step_id,
                activity=dict(activity, elapsedS=round(now - self.began, 1)),
            )
        except Exception:
            pass  # advisory (a busy journal, a lost lease): the unit's result is what counts
