"""A running agent unit's live progress: from its CLI's stream to the listeners and the journal.

The agent dispatcher reads the CLI's lines (akm.dispatch.agent_stream) and calls the request's
`on_activity` with what changed — a turn, a tool call, a retry, the session id. `ActivityRelay` is that
callback for one attempt:

* every change goes at once to the drive's `on_progress` (the terminal board of `workflow run`, MCP
  progress notifications of a background driver) as an `UnitActivity`;
* the journal gets it too, so `status --watch` in another process sees it — but at most once every
  `JOURNAL_EVERY_S` per attempt (a chatty agent must not turn the journal into a log), the first change
  and a new session id always; the session id is written on the unit's row (`status --units`).

Live progress is advisory: a failed journal write is dropped, never the unit's failure. The journal
writes happen on one background thread (`_Writer`), never in the thread supervising the CLI: a journal
that is busy for a while must not delay noticing the CLI's timeout, nor leave its output pipes unread.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from akm.engine.progress import UnitActivity
from akm.store import units as units_store

JOURNAL_EVERY_S = 5.0


class _Writer:
    """One daemon thread journaling activity, fed through a bounded queue (a full queue drops a report)."""

    def __init__(self, size: int = 256) -> None:
        self.jobs: queue.Queue[Callable[[], object]] = queue.Queue(maxsize=size)
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def submit(self, job: Callable[[], object]) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="akm-activity", daemon=True)
                self.thread.start()
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            pass  # advisory: the next report says more anyway

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                job()
            except Exception:
                pass
            finally:
                self.jobs.task_done()

    def drain(self, timeout: float = 10.0) -> None:
        """Wait (bounded) until what was submitted is written (tests; nothing on the run path waits)."""
        end = time.monotonic() + timeout
        while self.jobs.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)


WRITER = _Writer()


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
        db, started_at, meta = self.db, self.started_at, dict(activity, elapsedS=round(now - self.began, 1))
        run_id, attempt_id, step_id = self.run_id, self.attempt_id, self.step_id
        WRITER.submit(
            lambda: units_store.note_activity(
                db, run_id=run_id, unit_id=attempt_id, started_at=started_at, step_id=step_id, activity=meta
            )
        )
