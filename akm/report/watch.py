"""`akm workflow status RUN --watch`: follow a run driven elsewhere, by polling its journal.

The run's events are read through the api's `events` from the beginning (so the
board starts with what already happened, at the journal's own times) and then
polled every `POLL_S`; the run's status is read after each drained page, and
the watch ends once the run is no longer `active` — completed, failed,
blocked, abandoned, or parked `awaiting_session` for the calling agent (no
driver works on it then). The events after the last status read are drained
once more so the final board is complete. A run that is active but held by no
driver says so on the board and is followed until someone drives it.

The front hands in the api (`RunSource`): report/ sits below the api and never imports it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Protocol, TextIO

from akm.report.live import Board, LineProgress, LiveProgress

if TYPE_CHECKING:
    from akm.views import EventPage, RunView

POLL_S = 0.5
PAGE = 10_000


def exit_status(status: str) -> int:
    """Of a watched run that stopped: 0 completed, 3 awaiting the calling agent, 1 anything else."""
    return {"completed": 0, "awaiting_session": 3}.get(status, 1)


class RunSource(Protocol):
    """What a watch reads: `akm.api` itself (its `run_status` and `events`)."""

    def run_status(self, run_id: str) -> RunView: ...

    def events(self, *, run_id: str | None = None, since: str | None = None, limit: int | None = None) -> EventPage: ...


def follow(run_id: str, stream: TextIO, api: RunSource, *, poll_s: float = POLL_S) -> int:
    """Show the run's progress on `stream` (redrawn in place on a terminal) until it stops; its exit status.

    A missing run raises RUN_NOT_FOUND before anything is drawn."""
    from akm.report.timeline_svg import seconds

    view = api.run_status(run_id)
    run_id = view.run_id  # a prefix or `@last`, resolved once: a newer run must not take over the follow
    board = Board(started=seconds(view.created_at))
    board.run_id = view.run_id
    tty = bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"
    out: LiveProgress | LineProgress = LiveProgress(stream, board) if tty else LineProgress(stream, board)
    cursor = 0
    try:
        while True:
            cursor = _drain(api, run_id, cursor, out)
            view = api.run_status(run_id)
            if view.status != "active":
                cursor = _drain(api, run_id, cursor, out)
                break
            with board.lock:
                board.note = None if view.engine_lease is not None else "no driver holds this run right now"
            out.refresh()
            time.sleep(poll_s)
    finally:
        out.stop()
    if isinstance(out, LineProgress):  # not a terminal
        out.line(f"run {run_id} is {view.status}")
    return exit_status(view.status)


def _drain(api: RunSource, run_id: str, cursor: int, out: LiveProgress | LineProgress) -> int:
    """Feed every event after `cursor` to `out`; the new cursor."""
    while True:
        page = api.events(run_id=run_id, since=f"@offset:{cursor}", limit=PAGE)
        for ev in page.events:
            out.event(ev.to_json())
        cursor = page.next_offset
        if not page.has_more:
            return cursor
