"""The local runner: a pass's attempts run here, each on the pass thread that claimed it.

An attempt's row is committed (`running`) before its unit is dispatched and finished after, so a crash at
any instant leaves either a completed row (reused, never redone) or a running one (dispatched again).
What makes a wide fan-out of quick units cheap without changing that:

* a finished attempt's row update waits for its lane's next write (`_PendingFinish`): finishing attempt k
  and inserting attempt k+1 is one transaction, half the commits of a fan-out;
* lanes writing at once share one transaction (`akm.engine.groupcommit`);
* a lane of quick units journals the next units' rows with its current one (`akm.engine.ahead`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from akm.engine import ahead as journal_ahead
from akm.engine.ahead import Ahead, JournalAhead
from akm.engine.attempt import Prepared, WorktreeError
from akm.engine.groupcommit import GroupCommit
from akm.engine.reduce import UnitOutcome, storable
from akm.engine.runner import Holder, PassView, Ticket, new_attempt, not_started
from akm.engine.worklist import WorkUnit
from akm.record import dataclass
from akm.store import units as units_store


@dataclass
class _PendingFinish:
    """A finished attempt whose row update waits for the same lane's next write.

    Finishing attempt k and inserting attempt k+1 in one transaction halves the
    commits of a fan-out. The window adds nothing to what a crash can lose: the
    next insert follows within microseconds, and a lane's last finish is
    flushed when it runs out of units. A crash inside the window leaves the row
    `running`, so the unit is dispatched again — as for a crash a moment earlier.
    """

    attempt: str
    started_at: str
    outcome: UnitOutcome  # mutated to journal_write_failed if the write fails
    result_json: str | None


class _Lane:
    """One thread of a pass of the local runner: what it carries from one unit to the next."""

    __slots__ = ("runner", "pending", "ahead", "last_s", "quick", "lock", "running_since")

    def __init__(self, runner: LocalRunner) -> None:
        self.runner = runner
        self.pending: list[_PendingFinish] = []  # finished attempts whose row update waits for the next write
        self.ahead: list[Ahead] = []  # units claimed (and journaled) ahead, in dispatch order
        self.last_s: float | None = None  # how long the last unit ran (None: none yet)
        self.quick = 0  # units in a row that succeeded in under AHEAD_FAST_S
        # While its unit runs the lane touches nothing of the above; the watch over rows journaled ahead
        # may then, holding `lock`, journal what it holds back. `running_since` is set only meanwhile.
        self.lock = threading.Lock()
        self.running_since: float | None = None

    def next(self) -> Ticket | None:
        if self.ahead:
            ahead = self.ahead.pop(0)
            if self.pending and not self.quick:
                # The last unit was not quick after all: journal the results held back for the
                # next write now, rather than after the rest of the units journaled ahead.
                self.runner.flush(self)
            return ahead
        i = self.runner.p.claim()
        return None if i is None else Ticket(i)

    def run(self, unit: WorkUnit, attempt: str, ticket: Ticket | None) -> UnitOutcome:
        return self.runner.attempt(self, unit, attempt, ticket if isinstance(ticket, Ahead) else None)

    def hand_back(self, ticket: Ticket) -> None:
        if isinstance(ticket, Ahead):
            self.ahead.append(ticket)  # its row, if journaled ahead, is closed by the lane's end

    def settle(self) -> None:
        self.runner.flush(self)

    def close(self) -> None:
        try:
            self.runner.flush(self)
        finally:
            if self.runner.ahead is not None:
                self.runner.ahead.close(self)


class LocalRunner:
    """`akm.engine.runner.Runner` for attempts run by this process's dispatchers."""

    def __init__(self, d: Holder, p: PassView) -> None:
        self.d = d
        self.p = p
        self._group = GroupCommit(d.db)  # lanes finishing together share a transaction
        self._lanes: list[_Lane] = []  # every lane's, for the watch over units journaled ahead
        self._lanes_lock = threading.Lock()
        eligible = journal_ahead.enabled() and journal_ahead.eligible(p.step.unit_template, d.budget)
        self.ahead = JournalAhead(d, p, self._lanes, self.flush) if eligible and p.units else None

    # ------------------------------------------------------------ the seam
    def lane(self) -> _Lane:
        lane = _Lane(self)
        with self._lanes_lock:
            self._lanes.append(lane)
        return lane

    def start(self) -> None:
        if self.ahead is not None:
            self.ahead.start()

    def halt(self) -> None:
        pass  # the pass starts nothing more; what runs finishes and is journaled

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.stop()

    # ------------------------------------------------------------ one attempt
    def attempt(self, lane: _Lane, unit: WorkUnit, attempt: str, ahead: Ahead | None) -> UnitOutcome:
        d = self.d
        attempts = self.p.attempts
        on_progress = d.opts.on_progress
        if ahead is not None and ahead.started_at is not None:
            # Journaled with an earlier unit's row (akm.engine.ahead): nothing to write before it starts.
            started_at, inserting = ahead.started_at, ahead.inserted_at
            prepared = attempts.prepare(unit, attempt, db=d.db, started_at=started_at, on_progress=on_progress)
        else:
            try:
                prepared = attempts.prepare(unit, attempt, db=d.db, on_progress=on_progress)
            except (WorktreeError, OSError) as exc:
                return UnitOutcome(
                    unit_id=unit.unit_id,
                    ok=False,
                    failure_reason="worktree_failed",
                    error=f"could not create the isolation worktree: {exc}",
                )
            tree = prepared.tree
            if tree is not None and tree.preserved_leftover:
                d.warn(f"a previous attempt of {attempt} left uncollected work; preserved at {tree.preserved_leftover}")
            inserting = time.monotonic()
            started = self._journal_start(lane, unit, attempt, prepared)
            if isinstance(started, UnitOutcome):
                return started
            started_at = prepared.started_at = started
        # The insert proved the lease ours and good for half a TTL more. Past a quarter TTL since
        # (this process was stopped, or starved), prove it again before starting the unit: a
        # driver that lost the lease in between must not start what the new holder now owns.
        if time.monotonic() - inserting > d.recheck_after_s and not d.reconfirm_lease():
            d.heartbeat.untrack(attempt)  # (tracked since its commit if it was journaled ahead)
            return self._not_started(unit, attempt, prepared)
        d.heartbeat.track(attempt)
        began = time.monotonic()
        with lane.lock:
            lane.running_since = began
        try:
            outcome = self._run(unit, attempt, prepared)
        except Exception as exc:  # the row is in the journal: it must be finished, whatever happened
            outcome = UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"unit {attempt} failed inside akm before it produced a result: {exc}",
            )
        finally:
            d.heartbeat.untrack(attempt)
            with lane.lock:  # waits for the watch if it is journaling what this lane held back
                lane.running_since = None
        ran_s = time.monotonic() - began
        lane.quick = lane.quick + 1 if outcome.ok and ran_s < journal_ahead.AHEAD_FAST_S else 0
        lane.last_s = ran_s
        outcome.dispatched = True
        outcome, result_json = storable(outcome, attempt)
        lane.pending.append(_PendingFinish(attempt, started_at, outcome, result_json))
        warning = prepared.cleanup()
        if warning:
            d.warn(warning)
        return outcome

    def _run(self, unit: WorkUnit, attempt: str, prepared: Prepared) -> UnitOutcome:
        dispatcher = self.d.registry.get(unit.runner)
        if dispatcher is None:
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"no dispatcher for {unit.runner} units in this akm",
            )
        outcome = prepared.run(dispatcher, self.p.event)
        if outcome.truncated and outcome.ok:
            self.d.warn(
                f"unit {attempt}: its output was cut at the capture limit; the step gets only its "
                "beginning (marked truncated in the journal and the step evidence)"
            )
        return outcome

    def _journal_start(self, lane: _Lane, unit: WorkUnit, attempt: str, prepared: Prepared) -> str | UnitOutcome:
        """Commit the attempt's `running` row (its started_at), or the outcome of not starting it.

        The lane's deferred finishes go in the same transaction (one commit per unit instead of
        two, see _PendingFinish), and so do the rows of the units it journals ahead (akm.engine.ahead);
        the transaction is shared with other lanes writing at once (see groupcommit).
        """
        d, step_id = self.d, self.p.step.step_id
        pending, lane.pending = lane.pending, []
        claimed = self.ahead.claim(lane) if self.ahead is not None else []
        tree = prepared.tree
        new = new_attempt(d.run_id, step_id, unit, attempt, worktree_path=tree.path if tree else None)
        extra = [new_attempt(d.run_id, step_id, a.unit, a.attempt) for a in claimed]
        started_at: str | None = None
        written: tuple[list[str], list[str]] | None = None
        try:
            if not pending and not claimed:
                started_at = self._group.submit(lambda: units_store.insert_unit(d.db, **new._asdict(), fence=d.fence))
            else:
                finishes = [self._finish_of(p) for p in pending]
                written = self._group.submit(
                    lambda: units_store.write_attempts(d.db, finishes, [new, *extra], fence=d.fence)
                )
        except Exception as exc:  # (groupcommit.Alone: the shared transaction rolled back; write alone below)
            if d.fenced_out(exc):  # another driver owns the run: nothing more is written or started
                for p in pending:
                    self._not_journaled(p)
                lane.ahead += claimed  # not journaled: not started either (the pass stops)
                return self._not_started(unit, attempt, prepared)
            for p in pending:  # find out which write failed: each alone
                self._flush_one(p)
        if written is not None:  # committed: what it did (outside the try: nothing here is written again)
            started_at = self._committed(pending, claimed, written)
        lane.ahead += claimed  # journaled, or (after a failure) to be journaled by their own writes
        if started_at is not None:
            return started_at
        try:
            return units_store.insert_unit(d.db, **new._asdict(), fence=d.fence)
        except Exception as exc:  # nothing was dispatched; the step decides what to do
            if d.fenced_out(exc):
                return self._not_started(unit, attempt, prepared)
            prepared.cleanup()
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"unit {attempt} could not journal its dispatch row (nothing was dispatched): {exc}",
            )

    def _committed(
        self, pending: list[_PendingFinish], claimed: list[Ahead], written: tuple[list[str], list[str]]
    ) -> str:
        """Apply a committed shared write: the deferred finishes are done, the rows journaled ahead read
        `running` from their stamps on. The unit's own started_at."""
        finished, stamps = written
        for p, result in zip(pending, finished, strict=True):
            self._finished(p, result)
        committed = time.monotonic()
        for a, stamp in zip(claimed, stamps[1:], strict=True):
            a.started_at, a.inserted_at = stamp, committed
            self.d.heartbeat.track(a.attempt)  # its row reads running from now on
        return stamps[0]

    def _not_started(self, unit: WorkUnit, attempt: str, prepared: Prepared) -> UnitOutcome:
        """The outcome of a unit this driver did not start because it lost the lease (nothing journaled)."""
        prepared.cleanup()
        return not_started(unit, attempt)

    # ------------------------------------------------------------ finishes held back
    def _not_journaled(self, p: _PendingFinish) -> None:
        """Drop a finished attempt whose driver lost the lease: the new holder owns (and redoes) its row."""
        o = p.outcome
        o.ok, o.failure_reason, o.result, o.has_result, o.text = False, "aborted", None, False, None
        o.error = f"unit {p.attempt} finished after this invocation lost the run lease; its result was not journaled"

    def _finish_of(self, p: _PendingFinish) -> units_store.UnitFinish:
        o = p.outcome
        return units_store.UnitFinish(
            run_id=self.d.run_id,
            unit_id=p.attempt,
            started_at=p.started_at,
            status="completed" if o.ok else "failed",
            result_json=p.result_json,
            tokens=o.tokens,
            failure_reason=None if o.ok else o.failure_reason,
            session_id=o.session_id,
            truncated=o.truncated,
            step_id=self.p.step.step_id,
            usage=o.usage,
            cost=o.cost,
        )

    def _write_finish(self, p: _PendingFinish) -> None:
        f = self._finish_of(p)
        self._finished(p, units_store.finish_unit(self.d.db, **f._asdict(), fence=self.d.fence))

    def _finished(self, p: _PendingFinish, finished: str) -> None:
        # The journal holds the artifact now and the step is decided from the journal: do not keep
        # every unit's output alive in memory until the pass ends (a wide fan-out of big outputs).
        p.outcome.text, p.outcome.result = None, None
        if finished == "superseded":
            self.d.warn(
                f"unit {p.attempt} was re-dispatched by another driver while it ran; this result was not "
                "journaled (the newer dispatch owns the row)"
            )

    def flush(self, lane: Any) -> None:
        """Journal a lane's deferred finishes now (before a wait, and at its end)."""
        pending, lane.pending = lane.pending, []
        if len(pending) > 1:
            try:
                finished, _ = units_store.write_attempts(
                    self.d.db, [self._finish_of(p) for p in pending], [], fence=self.d.fence
                )
            except Exception:
                pass  # each alone below, which tells what failed
            else:
                for p, result in zip(pending, finished, strict=True):
                    self._finished(p, result)
                return
        for p in pending:
            self._flush_one(p)

    def _flush_one(self, p: _PendingFinish) -> None:
        """Finish one deferred attempt in its own transaction; a failure fails the unit hard (except the
        journal's own: see the driver's `fenced_out`)."""
        if self.d.journal_fault is not None:  # the journal stopped this driver: the next one redoes the row
            self._not_journaled(p)
            return
        try:
            self._write_finish(p)
        except Exception as exc:
            if self.d.fenced_out(exc):
                self._not_journaled(p)
                return
            o = p.outcome
            state = "completed" if o.ok else f"failed ({o.failure_reason})"
            o.ok, o.failure_reason, o.result, o.has_result, o.text = False, "journal_write_failed", None, False, None
            o.error = f'unit "{p.attempt}" dispatched and {state}, but its result could not be journaled: {exc}'
