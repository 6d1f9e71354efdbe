"""Rows journaled ahead: a fan-out of quick units journals several units' rows per transaction.

Units that run in a few milliseconds (an exec fan-out of small commands) would pay a journal transaction
each, which costs about as much as the unit's own process. A lane of the local runner (`akm.engine.local`)
whose last `AHEAD_AFTER` units succeeded in under `AHEAD_FAST_S` each therefore claims as many more units
as it would run in `AHEAD_WINDOW_S` at that pace (at most `AHEAD_UNITS`, and no more than its share of the
units left) when it journals its next one, inserts their rows in the same transaction, and runs them one
after another without writing in between; each finish waits for the lane's next transaction.

The protocol holds: every row is committed before its unit is dispatched, and every finished result is
journaled by the lane's next write. When a unit outlasts the window (the prediction was wrong), the watch
journals what its lane holds back and closes the rows journaled after it (`not_run`, dispatch taken back;
journaled again when their turn comes). A crash inside the window dispatches the quick units run in it
again, as it does a unit running at the crash. Rows journaled ahead whose units do not run (the pass
stopped, fail fast) are closed the same way by the lane's last write. Only for exec steps without retries,
worktrees or budget ceilings, and never with workers: there each unit keeps its own transaction.

Set `AKM_JOURNAL_AHEAD=0` to switch it off (every unit then has a transaction of its own, as a slow one
does); `bench/bench_engine.py --ahead-off` measures the difference.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Protocol

from akm.engine.runner import Holder, PassView, Ticket
from akm.plan.identity import attempt_id
from akm.store import units as units_store

if TYPE_CHECKING:
    from akm.engine.budget import DispatchBudget
    from akm.engine.worklist import WorkUnit
    from akm.plan.model import UnitNode

AHEAD_FAST_S = 0.01  # a lane whose last unit ran this quickly journals the next ones ahead
AHEAD_WINDOW_S = 0.03  # ... as many as it would run in this long at that pace
AHEAD_UNITS = 7  # and never more than this many
AHEAD_AFTER = 2  # ... once this many units in a row succeeded that quickly (a failure is often instant)


def enabled() -> bool:
    """Not switched off by `AKM_JOURNAL_AHEAD=0`."""
    return os.environ.get("AKM_JOURNAL_AHEAD", "").strip() != "0"


def eligible(template: UnitNode | None, budget: DispatchBudget) -> bool:
    """May a pass over this step's units journal rows ahead (see the module docstring)?"""
    return (
        template is not None
        and template.exec is not None  # a model or agent call that fails fast predicts nothing of the next
        and template.isolation != "worktree"
        and not (template.retry and template.retry.max)
        and budget.max_units is None
        and budget.max_tokens is None
    )


class Ahead(Ticket):
    """A unit a lane claimed with its current one and journaled (`running`) in that unit's transaction."""

    __slots__ = ("unit", "attempt", "started_at", "inserted_at")

    def __init__(self, index: int, unit: WorkUnit, attempt: str) -> None:
        super().__init__(index, prepaid=True)  # its dispatch is reserved in the budget already (unless not)
        self.unit = unit
        self.attempt = attempt
        self.started_at: str | None = None  # None: claimed but not journaled (the shared write failed): runs as usual
        self.inserted_at = 0.0  # monotonic time of the commit that journaled it


class AheadLane(Protocol):
    """What of a local lane the rows journaled ahead touch."""

    ahead: list[Ahead]  # units claimed (and journaled) ahead, in dispatch order
    pending: list[Any]  # finished attempts whose row update waits for the lane's next write
    last_s: float | None  # how long the last unit ran (None: none yet)
    quick: int  # units in a row that succeeded in under AHEAD_FAST_S
    # While its unit runs the lane touches nothing of the above; the watch may then, holding `lock`,
    # journal what it holds back. `running_since` is set only meanwhile.
    lock: threading.Lock
    running_since: float | None


class JournalAhead:
    """Rows journaled ahead for one pass of the local runner."""

    def __init__(self, d: Holder, p: PassView, lanes: list[Any], flush: Callable[[Any], None]) -> None:
        self.d = d
        self.p = p
        self.lanes: list[AheadLane] = lanes  # every lane of the pass (the local runner's list)
        self.flush = flush  # journal a lane's held-back finishes now
        self._done = threading.Event()
        self._watch: threading.Thread | None = None

    def claim(self, lane: AheadLane) -> list[Ahead]:
        """The units `lane` journals ahead with its current one; often none.

        Each is a dispatch of the budget, reserved here (so its own dispatch does not reserve it again).
        """
        last = lane.last_s
        if lane.quick < AHEAD_AFTER or last is None or lane.ahead:
            return []
        p = self.p
        if p.event.is_set() or p.halted:
            return []
        wanted = min(AHEAD_UNITS, int(AHEAD_WINDOW_S / max(last, 1e-6)))
        # Near the end, a lane holding many units would run them while the others have none left.
        wanted = min(wanted, p.unclaimed // p.lanes)
        claimed: list[Ahead] = []
        while len(claimed) < wanted:
            i = p.claim()
            if i is None:
                break
            unit = p.units[i]
            ahead = Ahead(i, unit, attempt_id(unit.base_id, 0))
            if self.d.budget.try_consume() is not None:  # the lifetime cap (no ceilings here): it runs as usual
                ahead.prepaid = False
                lane.ahead.append(ahead)
                break
            claimed.append(ahead)
        return claimed

    # ------------------------------------------------------------ the watch
    def start(self) -> None:
        """Watch the lanes while the pass runs (a pass of one unit has nothing to journal ahead)."""
        if len(self.p.units) > 1:
            self._watch = threading.Thread(target=self._watch_lanes, name="akm-ahead", daemon=True)
            self._watch.start()

    def stop(self) -> None:
        self._done.set()
        if self._watch is not None:
            self._watch.join()

    def _watch_lanes(self) -> None:
        """When a unit outlasts the window the rows ahead of it were journaled for, journal the finished
        results its lane holds back and close the rows journaled ahead of it (`not_run`: journaled again
        when their turn comes), so a slow unit keeps neither a quick one's result in memory nor rows reading
        `running` that have not started."""
        while not self._done.wait(AHEAD_WINDOW_S / 2):
            now = time.monotonic()
            for lane in list(self.lanes):
                since = lane.running_since
                if since is None or now - since < AHEAD_WINDOW_S:
                    continue
                with lane.lock:
                    if lane.running_since is not None and (
                        lane.pending or any(a.started_at is not None for a in lane.ahead)
                    ):
                        self._journal_held(lane)

    def _journal_held(self, lane: AheadLane) -> None:
        """The watch, for one lane whose unit runs long (its lock held)."""
        self.flush(lane)
        journaled = [a for a in lane.ahead if a.started_at is not None]
        if journaled and self.unstart(journaled, "they run as journaled"):
            for a in journaled:
                a.started_at = None  # journaled again, the usual way, when its turn comes
                self.d.heartbeat.untrack(a.attempt)

    # ------------------------------------------------------------ the end
    def close(self, lane: AheadLane) -> None:
        """At a lane's end: close the rows it journaled ahead whose units did not run (`failed`, `not_run`).

        Their dispatches are taken back (in the journal's attempt count and this run's budget): a later
        drive dispatches them as the first attempts they are.
        """
        left, lane.ahead = lane.ahead, []
        for a in left:
            if a.prepaid:
                self.d.budget.release()
        journaled = [a for a in left if a.started_at is not None]
        if journaled:
            self.unstart(journaled, "the next drive dispatches them")
            for a in journaled:
                self.d.heartbeat.untrack(a.attempt)

    def unstart(self, journaled: list[Ahead], otherwise: str) -> bool:
        """Close these rows journaled ahead `not_run` (dispatch taken back); False when that failed (they
        read `running`: `otherwise` says what then happens to them)."""
        d, step_id = self.d, self.p.step.step_id
        rows = [(a.attempt, a.started_at) for a in journaled if a.started_at is not None]
        try:
            units_store.unstart_units(d.db, d.run_id, step_id, rows, fence=d.fence)
        except Exception as exc:
            if not d.fenced_out(exc):  # (fenced out: a new holder owns, and redoes, the rows)
                d.warn(
                    f"{len(rows)} unit row(s) of step {step_id} journaled ahead of a dispatch could not "
                    f"be closed ({exc}); {otherwise}"
                )
            return False
        return True
