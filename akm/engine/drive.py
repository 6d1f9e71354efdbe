"""The native drive loop: take the run lease, dispatch units, let `finalize` decide.

One invocation drives one run. The journal is the source of truth: a unit row
is inserted (status `running`) before anything is dispatched and finished
after, so a crash at any instant leaves either a completed row (reused on
re-run, never redone) or a running/failed row (dispatched again, `attempts`
bumped).

This module keeps only scheduling, the lease and dispatch. What a step does
next — dispatch more units, loop with gate feedback, await a verdict,
complete, fail, block — is decided by `akm.engine.finalize.decide_step` from
the journal alone and done by `akm.engine.apply.apply_decision`, the same two
functions the session protocol uses when a calling agent reports results; what
only this loop does is dispatch a pass of the units it can run. Units that need a model or an agent with no engine are
session units (D11): the loop drives everything it can, then parks the run as
`awaiting_session`.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from akm import paths
from akm.dispatch.base import DispatcherRegistry, UnitRequest
from akm.dispatch.exec import build_exec_context
from akm.dispatch.redact import sensitive_values_from
from akm.engine import reuse as reuse_units
from akm.engine import worktree as worktrees
from akm.engine.activity import ActivityRelay
from akm.engine.apply import AGAIN, FINISHED, apply_decision, pass_failed
from akm.engine.budget import LIFETIME_UNIT_CAP, DispatchBudget
from akm.engine.cancel import Cancellation
from akm.engine.concurrency import UNBOUNDED, host_concurrency_limit, step_width
from akm.engine.env_bindings import EnvBindingError, project_sensitive_values, resolve_env_refs
from akm.engine.fencing import TAKEOVER_GRACE_S
from akm.engine.finalize import (
    DONE,
    RUNNING,
    StepDecision,
    UnitState,
    decide_step,
    retry_index,
)
from akm.engine.groupcommit import GroupCommit
from akm.engine.heartbeat import Heartbeat
from akm.engine.progress import PassStarted, StepProgress, UnitActivity
from akm.engine.reduce import UnitOutcome, outcome_from_row, storable
from akm.engine.results import DriveResult
from akm.engine.state import LoadedRun, load_run
from akm.engine.stepctx import (
    Spine,
    finish_step,
    load_gate,
    load_spine,
    step_rows,
)
from akm.engine.structured import run_structured
from akm.engine.worklist import WorkUnit
from akm.errors import AkmError, JournalError, UsageError
from akm.ids import uuid4
from akm.plan.identity import NO_ITEM, attempt_id
from akm.plan.model import Plan, StepPlan
from akm.record import dataclass, field
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.journal import HolderLiveness, Journal
from akm.store.runs import holder_is_live
from akm.store.status import DRIVABLE_STATUSES

if TYPE_CHECKING:
    from akm.engine import remote

# Longest wait a unit-level retry honours from a server's Retry-After (the LLM client's own cap).
MAX_RETRY_AFTER_WAIT_S = 120.0


@dataclass
class UnitProgress:
    """Reported once per finished dispatched unit (for the CLI's stderr progress line)."""

    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    ok: bool
    failure_reason: str | None
    done: int
    total: int


@dataclass
class DriveOptions:
    work_dir: Path
    project_root: Path
    max_steps: int | None = None
    cancel: Cancellation = field(default_factory=Cancellation)
    # from worker threads too; UnitActivity from the thread running an agent unit, as its CLI does things
    on_progress: Callable[[UnitProgress | StepProgress | PassStarted | UnitActivity], None] | None = None
    on_warning: Callable[[str], None] | None = None
    heartbeat_interval: float | None = None
    registry: DispatcherRegistry | None = None
    # Phase 2 (akm.engine.remote): queue the units for `akm worker` processes instead of running them here.
    workers: bool = False


@dataclass
class _PendingFinish:
    """A finished attempt whose row update waits for the same worker's next write.

    Finishing attempt k and inserting attempt k+1 in one transaction halves the
    commits of a fan-out. The window adds nothing to what a crash can lose: the
    next insert follows within microseconds, and a worker's last finish is
    flushed when it runs out of units. A crash inside the window leaves the row
    `running`, so the unit is dispatched again — as for a crash a moment earlier.
    """

    attempt: str
    started_at: str
    outcome: UnitOutcome  # mutated to journal_write_failed if the write fails
    result_json: str | None


# A fan-out of quick units journals several units' rows per transaction (see `_Ahead`).
AHEAD_FAST_S = 0.01  # a worker whose last unit ran this quickly journals the next ones ahead
AHEAD_WINDOW_S = 0.03  # ... as many as it would run in this long at that pace
AHEAD_UNITS = 7  # and never more than this many
AHEAD_AFTER = 2  # ... once this many units in a row succeeded that quickly (a failure is often instant)


@dataclass
class _Ahead:
    """A unit a worker claimed with its current one and journaled (`running`) in that unit's transaction.

    Units that run in a few milliseconds (an exec fan-out of small commands) would pay a journal
    transaction each, which costs about as much as the unit's own process. A worker whose last
    `AHEAD_AFTER` units succeeded in under `AHEAD_FAST_S` each therefore claims as many more units as
    it would run in `AHEAD_WINDOW_S` at that pace (at most `AHEAD_UNITS`, and no more than its share of
    the units left) when it journals its next one, inserts their rows in the same transaction, and
    runs them one after another without writing in between; each finish waits for the worker's next
    transaction (see `_PendingFinish`).

    The protocol holds: every row is committed before its unit is dispatched, and every finished
    result is journaled by the worker's next write. When a unit outlasts the window (the prediction
    was wrong), the pass's watch (`_Pass._watch_ahead`) journals what its worker holds back and
    closes the rows journaled after it (`not_run`, dispatch taken back; journaled again when their
    turn comes). A crash inside the window dispatches the quick units run in it again, as it does a
    unit running at the crash. Rows journaled ahead whose units do not run (the pass stopped, fail
    fast) are closed the same way by the worker's last write. Only for exec steps without retries,
    worktrees or budget ceilings, and not with workers: there each unit keeps its own transaction.
    """

    index: int
    unit: WorkUnit
    attempt: str
    started_at: str | None = None  # None: claimed but not journaled (the shared write failed): it runs as usual
    inserted_at: float = 0.0  # monotonic time of the commit that journaled it
    prepaid: bool = True  # its dispatch is reserved in the budget already


class _WorkerState:
    """What one worker thread of a pass carries from one unit to the next."""

    __slots__ = ("pending", "ahead", "last_s", "quick", "lock", "running_since")

    def __init__(self) -> None:
        self.pending: list[_PendingFinish] = []  # finished attempts whose row update waits for the next write
        self.ahead: list[_Ahead] = []  # units claimed (and journaled) ahead, in dispatch order
        self.last_s: float | None = None  # how long the last unit ran (None: none yet)
        self.quick = 0  # units in a row that succeeded in under AHEAD_FAST_S
        # While its unit runs the worker touches nothing of the above; the pass's watch (`_watch_ahead`)
        # may then, holding `lock`, journal what it holds back. `running_since` is set only meanwhile.
        self.lock = threading.Lock()
        self.running_since: float | None = None


@dataclass
class _PassFailure:
    """A dispatch pass that cannot be reduced: the step fails with `reason` whatever `on_error` says."""

    reason: str


class _Pass:
    """One dispatch pass over some units of one step (one gate loop). Holds the per-step cancellation."""

    def __init__(
        self, driver: "_Driver", step: StepPlan, units: list[WorkUnit], adopt: dict[str, int] | None = None
    ) -> None:
        self.d = driver
        self.step = step
        self.units = units
        # Workers (phase 2): units whose attempt is already with the workers, by the retry index it has; the
        # pass waits for that attempt instead of queueing the unit's first one again (a takeover).
        self.adopt = adopt or {}
        self.waiter: remote.Waiter | None = None
        if driver.workers:  # the worker queue's modules load only for a run whose units go to workers
            from akm.engine import remote as remote_waits

            self.waiter = remote_waits.Waiter(
                driver.db, driver.run_id, on_unclaimed=self._unclaimed, on_error=self._journal_trouble
            )
        self.event = threading.Event()
        self.env_values: dict[str, str] = {}
        self.sensitive: list[str] = []
        self.done_count = 0
        self.total = len(units)
        # Fail fast: a unit that failed for good under `on_error: fail` fixes the step's verdict, so
        # no further unit is started (units already running finish and are journaled).
        self.halted = False
        self._ctx_base: dict[str, str] | None = None
        self._count_lock = threading.Lock()
        self._local = threading.local()  # per worker: its _WorkerState
        self._claim: Callable[[], int | None] = lambda: None  # the next unit's index (set by _schedule)
        self._unclaimed = len(units)  # units no worker has claimed yet (an estimate read without the lock)
        self._states: list[_WorkerState] = []  # every worker's, for the watch over units journaled ahead
        self._width = 1
        tmpl = units[0].template if units else None
        budget = driver.budget
        self._ahead_ok = (
            tmpl is not None
            and tmpl.exec is not None  # a model or agent call that fails fast predicts nothing of the next
            and self.waiter is None
            and tmpl.isolation != "worktree"
            and not (tmpl.retry and tmpl.retry.max)
            and budget.max_units is None
            and budget.max_tokens is None
        )
        self._parent_env = dict(os.environ)  # one snapshot per step for every unit's environment
        self._group = GroupCommit(driver.db)  # workers finishing together share a transaction

    # ------------------------------------------------------------ one attempt
    def _state(self) -> _WorkerState:
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _WorkerState()
            with self._count_lock:
                self._states.append(state)
        return state

    def _dispatch_attempt(self, unit: WorkUnit, attempt: str, ahead: _Ahead | None = None) -> UnitOutcome:
        if self.waiter is not None:
            return self._dispatch_to_workers(unit, attempt, self.waiter)
        d = self.d
        tmpl = unit.template
        base_dir = str(d.opts.project_root)
        tree = None
        state = self._state()
        if ahead is not None and ahead.started_at is not None:
            # Journaled with an earlier unit's row (see _Ahead): nothing to write before it starts.
            started_at, inserting = ahead.started_at, ahead.inserted_at
        else:
            if tmpl.isolation == "worktree":
                try:
                    tree = worktrees.create(base_dir, d.run_id, attempt)
                except (worktrees.WorktreeError, OSError) as exc:
                    return UnitOutcome(
                        unit_id=unit.unit_id,
                        ok=False,
                        failure_reason="worktree_failed",
                        error=f"could not create the isolation worktree: {exc}",
                    )
                if tree.preserved_leftover:
                    d.warn(
                        f"a previous attempt of {attempt} left uncollected work; preserved at {tree.preserved_leftover}"
                    )
                base_dir = tree.path
            inserting = time.monotonic()
            started = self._journal_start(unit, attempt, tree, state)
            if isinstance(started, UnitOutcome):
                return started
            started_at = started
        # The insert proved the lease ours and good for half a TTL more. Past a quarter TTL since
        # (this process was stopped, or starved), prove it again before starting the unit: a
        # driver that lost the lease in between must not start what the new holder now owns.
        if time.monotonic() - inserting > d.recheck_after_s and not d.reconfirm_lease():
            d.heartbeat.untrack(attempt)  # (tracked since its commit if it was journaled ahead)
            return self._not_started(unit, attempt, tree)
        d.heartbeat.track(attempt)
        began = time.monotonic()
        with state.lock:
            state.running_since = began
        try:
            outcome = self._run(unit, attempt, base_dir, started_at)
        except Exception as exc:  # the row is in the journal: it must be finished, whatever happened
            outcome = UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"unit {attempt} failed inside akm before it produced a result: {exc}",
            )
        finally:
            d.heartbeat.untrack(attempt)
            with state.lock:  # waits for the watch if it is journaling what this worker held back
                state.running_since = None
        ran_s = time.monotonic() - began
        state.quick = state.quick + 1 if outcome.ok and ran_s < AHEAD_FAST_S else 0
        state.last_s = ran_s
        outcome.dispatched = True
        outcome, result_json = storable(outcome, attempt)
        state.pending.append(_PendingFinish(attempt, started_at, outcome, result_json))
        if tree is not None:
            warning = worktrees.cleanup(tree)
            if warning:
                d.warn(warning)
        return outcome

    def _journal_start(self, unit: WorkUnit, attempt: str, tree: Any, state: _WorkerState) -> str | UnitOutcome:
        """Commit the attempt's `running` row (its started_at), or the outcome of not starting it.

        The worker's deferred finishes go in the same transaction (one commit per unit instead of
        two, see _PendingFinish), and so do the rows of the units it journals ahead (see _Ahead); the
        transaction is shared with other workers writing at once (see groupcommit).
        """
        d = self.d
        pending, state.pending = state.pending, []
        claimed = self._claim_ahead(state)
        new = self._new_attempt(unit, attempt, worktree_path=tree.path if tree else None)
        extra = [self._new_attempt(a.unit, a.attempt) for a in claimed]
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
                state.ahead += claimed  # not journaled: not started either (the pass stops)
                return self._not_started(unit, attempt, tree)
            for p in pending:  # find out which write failed: each alone
                self._flush_one(p)
        if written is not None:  # committed: what it did (outside the try: nothing here is written again)
            finished, stamps = written
            for p, result in zip(pending, finished, strict=True):
                self._finished(p, result)
            started_at, committed = stamps[0], time.monotonic()
            for a, stamp in zip(claimed, stamps[1:], strict=True):
                a.started_at, a.inserted_at = stamp, committed
                d.heartbeat.track(a.attempt)  # its row reads running from now on
        state.ahead += claimed  # journaled, or (after a failure) to be journaled by their own writes
        try:
            if started_at is None:
                started_at = units_store.insert_unit(d.db, **new._asdict(), fence=d.fence)
        except Exception as exc:  # nothing was dispatched; the step decides what to do
            if d.fenced_out(exc):
                return self._not_started(unit, attempt, tree)
            if tree is not None:
                worktrees.cleanup(tree)
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"unit {attempt} could not journal its dispatch row (nothing was dispatched): {exc}",
            )
        return started_at

    def _claim_ahead(self, state: _WorkerState) -> list[_Ahead]:
        """The units this worker journals ahead with its current one (see _Ahead); often none.

        Each is a dispatch of the budget, reserved here (so its own dispatch does not reserve it again).
        """
        last = state.last_s
        if not self._ahead_ok or state.quick < AHEAD_AFTER or last is None or state.ahead:
            return []
        if self.event.is_set() or self.halted:
            return []
        wanted = min(AHEAD_UNITS, int(AHEAD_WINDOW_S / max(last, 1e-6)))
        # Near the end, a worker holding many units would run them while the others have none left.
        wanted = min(wanted, self._unclaimed // self._width)
        claimed: list[_Ahead] = []
        while len(claimed) < wanted:
            i = self._claim()
            if i is None:
                break
            unit = self.units[i]
            ahead = _Ahead(i, unit, attempt_id(unit.base_id, 0))
            if self.d.budget.try_consume() is not None:  # the lifetime cap (no ceilings here): it runs as usual
                ahead.prepaid = False
                state.ahead.append(ahead)
                break
            claimed.append(ahead)
        return claimed

    def _journal_trouble(self, exc: BaseException) -> None:
        self.d.warn(f"reading the workers' results from the journal failed (retrying every poll): {exc}")

    def _unclaimed(self, waiting: int, quiet_s: float) -> None:
        self.d.warn(
            f'{waiting} unit(s) of step "{self.step.step_id}" are queued for workers and no worker has claimed any '
            f"for {quiet_s:g} s: start a worker in a checkout of this project at its commit "
            "(a worker that cannot run them says why on its stderr); this run waits for them"
        )

    def _dispatch_to_workers(self, unit: WorkUnit, attempt: str, waiter: remote.Waiter) -> UnitOutcome:
        """Queue the attempt for workers (fenced, committed first) and wait for a worker to finish its row."""
        from akm.engine import remote as remote_waits
        from akm.store import queue as queue_store

        d = self.d
        payload = remote_waits.dispatch_payload(
            self._request(unit, attempt, ""), scope_key=d.scope_key, commit=d.commit
        )
        try:
            queued = queue_store.queue_unit(d.db, **self._row_fields(unit, attempt, dispatch_json=payload))
        except Exception as exc:
            if d.fenced_out(exc):
                return self._not_started(unit, attempt, None)
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"unit {attempt} could not be queued for workers (nothing was dispatched): {exc}",
            )
        if queued.outcome == "queued" and d.work_notifier is not None:
            d.work_notifier.notify(d.run_id)  # after the commit: wake idle workers now
        row = waiter.wait(attempt, self.event)
        if row is None and not (d.opts.cancel.tripped or d.lease_lost.tripped):
            # Stopped by the step itself (a budget ceiling): the unit is not to run any more. An interrupted
            # invocation leaves its rows for the next driver instead, which waits for them.
            self._withdraw(attempt)
        if row is None:
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="aborted",
                error=f"unit {attempt} was left with the workers when this invocation stopped (its row stays "
                "in the journal: the next driver waits for it)",
            )
        outcome = outcome_from_row(unit.unit_id, row, unit.template.output_schema is not None)
        outcome.reused, outcome.dispatched = False, True
        return outcome

    def _new_attempt(self, unit: WorkUnit, attempt: str, worktree_path: str | None = None) -> units_store.NewAttempt:
        """What the attempt's journal row records of it, whether it runs here or is queued for workers."""
        return units_store.NewAttempt(
            run_id=self.d.run_id,
            unit_id=attempt,
            step_id=self.step.step_id,
            node_id=unit.node_id,
            parent_unit_id=unit.parent_unit_id,
            runner=unit.runner,
            engine=unit.engine,
            model=unit.model,
            input_hash=unit.input_hash,
            worktree_path=worktree_path,
        )

    def _row_fields(self, unit: WorkUnit, attempt: str, **extra: Any) -> dict[str, Any]:
        """`_new_attempt` (and `extra`) as `queue_unit`'s keyword arguments, fenced by this driver's lease."""
        fields = self._new_attempt(unit, attempt)._asdict()
        del fields["worktree_path"]  # a worker makes its own
        return dict(fields, fence=self.d.fence, **extra)

    def _not_started(self, unit: WorkUnit, attempt: str, tree: Any) -> UnitOutcome:
        """The outcome of a unit this driver did not start because it lost the lease (nothing journaled)."""
        if tree is not None:
            worktrees.cleanup(tree)
        return UnitOutcome(
            unit_id=unit.unit_id,
            ok=False,
            failure_reason="aborted",
            error=f"unit {attempt} was not started: this invocation lost the run lease",
        )

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
            step_id=self.step.step_id,
            usage=o.usage,
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

    def _flush(self, state: _WorkerState | None = None) -> None:
        """Journal this worker's deferred finishes now (before a wait, and at its end)."""
        state = state or self._state()
        pending, state.pending = state.pending, []
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
        journal's own: see `fenced_out`)."""
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

    def _watch_ahead(self, done: threading.Event) -> None:
        """While the pass runs: when a unit outlasts the window the rows ahead of it were journaled for,
        journal the finished results its worker holds back and close the rows journaled ahead of it
        (`not_run`: they are journaled again when their turn comes), so a slow unit keeps neither a quick
        one's result in memory nor rows reading `running` that have not started."""
        while not done.wait(AHEAD_WINDOW_S / 2):
            now = time.monotonic()
            for state in list(self._states):
                since = state.running_since
                if since is None or now - since < AHEAD_WINDOW_S:
                    continue
                with state.lock:
                    if state.running_since is not None and (
                        state.pending or any(a.started_at is not None for a in state.ahead)
                    ):
                        self._journal_held(state)

    def _journal_held(self, state: _WorkerState) -> None:
        """`_watch_ahead` for one worker whose unit runs long (its lock held)."""
        self._flush(state)
        journaled = [a for a in state.ahead if a.started_at is not None]
        if journaled and self._unstart(journaled, "they run as journaled"):
            for a in journaled:
                a.started_at = None  # journaled again, the usual way, when its turn comes
                self.d.heartbeat.untrack(a.attempt)

    def _close_ahead(self) -> None:
        """At a worker's end: close the rows it journaled ahead whose units did not run (`failed`, `not_run`).

        Their dispatches are taken back (in the journal's attempt count and this run's budget): a later
        drive dispatches them as the first attempts they are.
        """
        state = self._state()
        left, state.ahead = state.ahead, []
        for a in left:
            if a.prepaid:
                self.d.budget.release()
        journaled = [a for a in left if a.started_at is not None]
        if journaled:
            self._unstart(journaled, "the next drive dispatches them")
            for a in journaled:
                self.d.heartbeat.untrack(a.attempt)

    def _unstart(self, journaled: list[_Ahead], otherwise: str) -> bool:
        """Close these rows journaled ahead `not_run` (dispatch taken back); False when that failed (they
        read `running`: `otherwise` says what then happens to them)."""
        rows = [(a.attempt, a.started_at) for a in journaled if a.started_at is not None]
        try:
            units_store.unstart_units(self.d.db, self.d.run_id, self.step.step_id, rows, fence=self.d.fence)
        except Exception as exc:
            if not self.d.fenced_out(exc):  # (fenced out: a new holder owns, and redoes, the rows)
                self.d.warn(
                    f"{len(rows)} unit row(s) of step {self.step.step_id} journaled ahead of a dispatch could not "
                    f"be closed ({exc}); {otherwise}"
                )
            return False
        return True

    def _request(self, unit: WorkUnit, attempt: str, base_dir: str, started_at: str | None = None) -> UnitRequest:
        tmpl = unit.template
        d = self.d
        if tmpl.exec is not None:
            if self._ctx_base is None:
                # Params and inputs are the same for every unit of the step: serialise them once.
                self._ctx_base = build_exec_context(
                    run_id=d.run_id,
                    step_id=self.step.step_id,
                    unit_id="",
                    params=d.loaded.params,
                    inputs=dict(unit.inputs) if tmpl.inputs else None,
                )
            ctx = dict(self._ctx_base, AKM_UNIT_ID=unit.unit_id)
            if unit.item is not NO_ITEM:  # what item_context(unit.item, unit.index) gives, serialised once already
                ctx["AKM_ITEM"], ctx["AKM_ITEM_INDEX"] = unit.item_json, str(unit.index)
            return UnitRequest(
                run_id=d.run_id,
                step_id=self.step.step_id,
                unit_id=unit.unit_id,
                attempt_id=attempt,
                kind="exec",
                cwd=base_dir,
                output_schema=tmpl.output_schema,
                timeout_ms=tmpl.exec.timeout_ms,
                exec_spec=tmpl.exec,
                exec_context=ctx,
                env_bindings=self.env_values,
                sensitive_values=self.sensitive,
                parent_env=self._parent_env,
            )
        engine = d.plan.execution.engines.get(unit.engine) if unit.engine else None
        return UnitRequest(
            run_id=d.run_id,
            step_id=self.step.step_id,
            unit_id=unit.unit_id,
            attempt_id=attempt,
            kind=unit.runner,
            cwd=base_dir,
            prompt=unit.prompt,
            output_schema=tmpl.output_schema,
            timeout_ms=unit.timeout_ms,
            engine_name=unit.engine,
            engine=engine,
            model=unit.model,
            llm_options=tmpl.invocation.llm if tmpl.invocation else None,
            env_bindings=self.env_values,
            sensitive_values=self.sensitive,
            parent_env=self._parent_env,
            on_activity=self._activity(unit, attempt, started_at) if unit.runner == "agent" else None,
        )

    def _activity(self, unit: WorkUnit, attempt: str, started_at: str | None) -> ActivityRelay:
        """Where an agent unit's live progress goes: the drive's listener, and (throttled) the journal."""
        d = self.d
        return ActivityRelay(
            d.db,
            run_id=d.run_id,
            step_id=self.step.step_id,
            unit_id=unit.unit_id,
            attempt_id=attempt,
            started_at=started_at,
            on_progress=d.opts.on_progress,
        )

    def _run(self, unit: WorkUnit, attempt: str, base_dir: str, started_at: str | None = None) -> UnitOutcome:
        dispatcher = self.d.registry.get(unit.runner)
        if dispatcher is None:
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"no dispatcher for {unit.runner} units in this akm",
            )
        res = run_structured(dispatcher, self._request(unit, attempt, base_dir, started_at), self.event)
        if res.truncated and res.ok:
            self.d.warn(
                f"unit {attempt}: its output was cut at the capture limit; the step gets only its "
                "beginning (marked truncated in the journal and the step evidence)"
            )
        return UnitOutcome(unit_id=unit.unit_id, **vars(res))

    # ------------------------------------------------------------ one unit
    def run_unit(self, unit: WorkUnit, ahead: _Ahead | None = None) -> UnitOutcome:
        outcome = self._run_unit(unit, ahead)
        # (a driver that is stopping — its lease lost, or the journal gone — decides nothing about the step)
        if not outcome.ok and unit.template.on_error == "fail" and not self.d.lease_lost.tripped:
            self.halted = True
            if self.waiter is not None:
                # Fail fast with workers: what they have not claimed yet is never started, as a local pass
                # starts no further unit; what they run already finishes and is journaled.
                self._withdraw(None)
        return outcome

    def _withdraw(self, attempt: str | None) -> None:
        """Take this step's queued attempts (or one) back from the workers: failed `aborted`, never run."""
        from akm.store import queue as queue_store

        try:
            queue_store.withdraw(self.d.db, self.d.run_id, self.step.step_id, attempt, fence=self.d.fence)
        except Exception as exc:
            if not self.d.fenced_out(exc):
                self.d.warn(f"could not take queued units of step {self.step.step_id} back from the workers: {exc}")

    def _run_unit(self, unit: WorkUnit, ahead: _Ahead | None = None) -> UnitOutcome:
        d = self.d
        retry = unit.template.retry
        max_attempts = 1 + (retry.max if retry else 0)
        last: UnitOutcome | None = None
        for k in range(min(self.adopt.get(unit.unit_id, 0), max_attempts - 1), max_attempts):
            if self.event.is_set():
                if ahead is not None and k == 0:
                    self._state().ahead.append(ahead)  # its row, if journaled ahead, is closed by the worker
                return last or UnitOutcome(
                    unit_id=unit.unit_id,
                    ok=False,
                    failure_reason="aborted",
                    error="unit was not dispatched because the run was interrupted",
                )
            prepaid = ahead is not None and ahead.prepaid and k == 0
            refusal = None if prepaid else d.budget.try_consume()
            if refusal:
                return last or UnitOutcome(
                    unit_id=unit.unit_id,
                    ok=False,
                    failure_reason=refusal,
                    error=d.budget.exceeded or d.budget.cap_message,
                )
            att = attempt_id(unit.base_id, k)
            outcome = self._dispatch_attempt(unit, att, ahead if k == 0 else None)
            if outcome.tokens:
                d.budget.add_tokens(outcome.tokens)
            with self._count_lock:
                if k == 0:
                    self.done_count += 1
                done = self.done_count
            if d.opts.on_progress is not None:
                d.opts.on_progress(
                    UnitProgress(
                        d.run_id,
                        self.step.step_id,
                        unit.unit_id,
                        att,
                        outcome.ok,
                        outcome.failure_reason,
                        done,
                        self.total,
                    )
                )
            last = outcome
            if outcome.ok or self.event.is_set():
                return outcome
            if not retry or outcome.failure_reason not in retry.on:
                return outcome
            if k + 1 < max_attempts and outcome.retry_after_s:
                # a rate-limited server said when to come back (429 Retry-After): re-asking sooner only
                # earns another 429 and burns the retry; the wait ends at once if the run is cancelled.
                # The failed attempt is journaled first, so no row looks `running` while nothing runs.
                self._flush()
                if outcome.failure_reason not in retry.on:  # its journal write failed
                    return outcome
                if self.event.wait(min(outcome.retry_after_s, MAX_RETRY_AFTER_WAIT_S)):
                    return outcome
        assert last is not None
        return last

    # ------------------------------------------------------------ the pass
    def execute(self, concurrency: int) -> _PassFailure | None:
        """Dispatch every unit once (with its retries). None = the journal now holds each unit's outcome."""
        d, step = self.d, self.step
        tmpl = step.unit_template
        assert tmpl is not None
        if d.budget.used + len(self.units) > LIFETIME_UNIT_CAP:
            # Refused before the first dispatch: the step could never finish, and running 9,999 of its units
            # first only to fail on the cap wastes them all.
            return _PassFailure(
                f'Step "{step.step_id}" has {len(self.units)} units to dispatch, but the run has already dispatched '
                f"{d.budget.used} of its lifetime cap of {LIFETIME_UNIT_CAP} units: it can never finish. Nothing "
                "of it was dispatched; split the list over several runs or steps that run fewer units."
            )
        # D6 (engine/concurrency.py): with workers the units run elsewhere, so this host's CPUs do not bound
        # the step; its other limits do. The width (and a note when an engine holds it down) is progress too.
        self.width = step_width(
            d.plan,
            step,
            units=len(self.units),
            engine=self.units[0].engine if self.units else None,
            host_limit=UNBOUNDED if d.workers else host_concurrency_limit(),
            declared=concurrency,
        )
        if d.opts.on_progress is not None:
            d.opts.on_progress(
                PassStarted(d.run_id, step.step_id, self.total, width=self.width.width, note=self.width.note())
            )
        if tmpl.env:
            try:
                self.env_values = resolve_env_refs(tmpl.env, d.opts.project_root)
            except EnvBindingError as exc:
                return _PassFailure(f'Step "{step.step_id}" env binding failed: {exc}')
            self.sensitive = sensitive_values_from(self.env_values)
        # Every env file the project can see is secret, bound by this unit or not.
        self.sensitive = self.sensitive + project_sensitive_values(d.opts.project_root)
        if tmpl.isolation == "worktree":
            problem = worktrees.preflight(str(d.opts.project_root))
            if problem:
                return _PassFailure(f'Step "{step.step_id}" cannot use isolation: worktree: {problem}')
        width = self.width.width
        d.opts.cancel.link(self.event)
        d.lease_lost.link(self.event)
        d.budget.set_exceed_hook(self.event.set)
        try:
            with d.db.bulk_writes(), _old_objects_frozen():
                outcomes = self._schedule(width)
        finally:
            d.opts.cancel.unlink(self.event)
            d.lease_lost.unlink(self.event)
            if self.waiter is not None:
                self.waiter.close()
        if d.budget.exceeded:
            return _PassFailure(d.budget.exceeded)
        if d.budget.cap_message:
            return _PassFailure(d.budget.cap_message)
        unjournaled = [o.error for o in outcomes if o.failure_reason == "journal_write_failed" and o.error]
        if unjournaled:
            return _PassFailure(" ".join(unjournaled))
        return None

    def _schedule(self, width: int) -> list[UnitOutcome]:
        units = self.units
        results: list[UnitOutcome | None] = [None] * len(units)
        next_index = iter(range(len(units)))
        claim_lock = threading.Lock()

        def claim() -> int | None:
            with claim_lock:
                i = next(next_index, None)
                if i is not None:
                    self._unclaimed -= 1
                return i

        self._claim = claim
        self._width = max(1, width)

        def worker() -> None:
            try:
                work()
            finally:
                try:
                    self._flush()
                finally:
                    self._close_ahead()

        def work() -> None:
            state = self._state()
            while True:
                if self.event.is_set() or self.halted:
                    return
                ahead = state.ahead.pop(0) if state.ahead else None
                if ahead is not None and state.pending and not state.quick:
                    # The last unit was not quick after all: journal the results held back for the
                    # next write now, rather than after the rest of the units journaled ahead.
                    self._flush()
                i = ahead.index if ahead is not None else claim()
                if i is None:
                    return
                try:
                    results[i] = self.run_unit(units[i], ahead)
                except AkmError:
                    raise
                except Exception as exc:  # a runner bug must not lose the slot silently
                    results[i] = UnitOutcome(
                        unit_id=units[i].unit_id,
                        ok=False,
                        failure_reason="dispatch_error",
                        error=f"internal error while running the unit: {exc}",
                    )

        watch_done = threading.Event()
        watch = None
        if self._ahead_ok and len(units) > 1:
            watch = threading.Thread(target=self._watch_ahead, args=(watch_done,), name="akm-ahead", daemon=True)
            watch.start()
        try:
            if width <= 1 or len(units) <= 1:
                worker()
            else:
                _run_workers(worker, width)
        finally:
            watch_done.set()
            if watch is not None:
                watch.join()
        return [
            r
            if r is not None
            else UnitOutcome(
                unit_id=units[i].unit_id,
                ok=False,
                failure_reason="aborted",
                error="unit was not dispatched (interrupted)",
            )
            for i, r in enumerate(results)
        ]


def _run_workers(worker: Callable[[], None], width: int) -> None:
    """Run `worker` on `width` threads and wait for all; the first exception raised in one is re-raised here.

    Plain threads, not a `ThreadPoolExecutor`: `concurrent.futures` imports `logging` (with
    `traceback`, `linecache`, `tokenize`), several milliseconds of every short run's start.
    """
    errors: list[BaseException] = []

    def body() -> None:
        try:
            worker()
        except BaseException as exc:  # noqa: BLE001 - handed to the driver's thread, as Future.result() did
            errors.append(exc)

    threads = [threading.Thread(target=body, name=f"akm-unit_{i}", daemon=True) for i in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """Keep the cyclic GC's full collections off everything that existed before the pass.

    A pass allocates per unit; now and then that triggers a full collection, which
    walks every object of the process (the plan, the modules, ...) while holding the
    GIL that every worker needs. Frozen objects are skipped (they are still freed by
    reference counting); the pass's end gives them back to the collector. Left alone
    when someone else froze objects already (e.g. a long-running front).
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _claimed_by_other(state: UnitState, now: str) -> bool:
    """D13: a running row with a live claim belongs to its claimant; the engine must not dispatch it."""
    row = state.row
    return (
        state.status == RUNNING
        and row is not None
        and holder_is_live(
            row.get("claim_holder"), row.get("claim_host"), row.get("claim_pid"), row.get("claim_expires_at"), now
        )
    )


class _Driver:
    def __init__(
        self,
        db: Journal,
        loaded: LoadedRun,
        fence: runs_store.Fence,
        opts: DriveOptions,
        result: DriveResult,
        liveness: HolderLiveness | None = None,
        acquired_at: float | None = None,
    ) -> None:
        self.db = db
        self.loaded = loaded
        self.plan: Plan = loaded.plan
        self.run_id = loaded.run_id
        self.holder = fence.holder
        self.fence = fence
        self.recheck_after_s = runs_store.lease_ttl_s() / 4
        self.opts = opts
        self.result = result
        self.registry = opts.registry or _default_registry()
        self.native_kinds = frozenset(self.registry.kinds())
        self.lease_lost = Cancellation()
        self.journal_fault: JournalError | None = None  # the journal error that stopped this driver (fenced_out)
        self.heartbeat = Heartbeat(
            db,
            self.run_id,
            fence.holder,
            self.lease_lost,
            interval=opts.heartbeat_interval or None,
            epoch=fence.epoch,
            liveness=liveness,
            renewed_at=acquired_at,
        )
        used, tokens = units_store.journal_totals(db, self.run_id)
        budget = self.plan.budget
        self.budget = DispatchBudget(
            used=used,
            tokens=tokens,
            max_units=budget.max_units if budget else None,
            max_tokens=budget.max_tokens if budget else None,
        )
        self._warn_lock = threading.Lock()
        self.reused: dict[str, int] = {}  # per step: units restored by this invocation instead of run
        self.spine: Spine | None = None
        self.effects = _DriverEffects(self)
        # What workers check before they claim this run's units (akm.engine.remote.dispatch_payload).
        self.scope_key = loaded.run.scope_key
        self.commit: str | None = None
        self.work_notifier: Any = None
        self.workers = False  # queue units for workers (DriveOptions.workers, or a takeover; see below)
        if opts.workers:
            self.coordinate_with_workers()

    def coordinate_with_workers(self) -> None:
        """From now on queue this run's units for workers (`--workers`, or a takeover of a run whose units
        are with workers): record the project's commit for them, and wake them on PostgreSQL."""
        self.workers = True
        self.commit = paths.project_commit(self.opts.project_root)
        if self.work_notifier is None:
            from akm.store import queue as queue_store

            self.work_notifier = self.db.notifier(queue_store.WORK_CHANNEL)

    def warn(self, message: str) -> None:
        with self._warn_lock:
            self.result.warnings.append(message)
        if self.opts.on_warning is not None:
            self.opts.on_warning(message)

    def lost_lease_error(self) -> AkmError:
        if self.lease_lost.reason == "journal_down" and self.journal_fault is not None:
            return self.journal_fault
        fenced = _FENCED.get(self.lease_lost.reason or "")
        if fenced is not None:  # this driver stopped itself; the journal may be unreachable, so ask it nothing
            from akm.codes import Code

            return UsageError(
                f"This invocation stopped driving run {self.run_id}: {fenced} It stopped its units first so that "
                "another invocation can take the run over without running any of them twice at once.",
                code=Code.LEASE_LOST,
                details={"runId": self.run_id, "reason": self.lease_lost.reason},
                hint="Drive the run again once the journal server is reachable: it resumes where its journal stands.",
            )
        run = runs_store.get_run(self.db, self.run_id)
        if run is not None and run.status not in DRIVABLE_STATUSES:
            return UsageError(
                f"Run {self.run_id} became {run.status} while this invocation was driving it "
                f"({'abandoned' if run.status == 'abandoned' else 'changed'} by another command); stopped. "
                "Results of units that finished were kept in the journal.",
                code="RUN_ABANDONED" if run.status == "abandoned" else "RUN_NOT_ACTIVE",
            )
        lease = runs_store.read_lease(self.db, self.run_id)
        who = f"{lease.holder} (host {lease.host}, pid {lease.pid})" if lease else "(nobody)"
        from akm.codes import Code

        return UsageError(
            f"This invocation lost its lease on run {self.run_id} (now held by {who}); stopping to avoid racing it. "
            "Units it had in flight were stopped; their results are not journaled over the new holder's.",
            code=Code.LEASE_LOST,
            details={"runId": self.run_id},
            hint="Another invocation drives the run now (it redoes what this one left unfinished); "
            "`workflow status` shows it.",
        )

    def fenced_out(self, exc: BaseException) -> bool:
        """Is `exc` a write refused because another driver took the lease, or one the journal server could not
        take at all (the connection lost or stalled, a lock it gave up on)? Then stop everything: what is in
        flight is stopped and not journaled, as after a lost lease, and the driver exits with that error; the
        run stays as the journal has it (active), for the next driver. A unit is never failed, nor a step
        decided, because of the journal's trouble."""
        if isinstance(exc, UsageError) and exc.code == "LEASE_LOST":
            self.lease_lost.trip("lease_lost")
            return True
        if isinstance(exc, JournalError) and exc.code in _JOURNAL_DOWN:
            if self.journal_fault is None:
                self.journal_fault = exc
            self.lease_lost.trip("journal_down")
            return True
        return False

    def reconfirm_lease(self) -> bool:
        """Renew the lease under this driver's fence now; False (lease cancellation tripped) when lost."""
        try:
            ok = runs_store.renew_lease(self.db, self.run_id, self.holder, epoch=self.fence.epoch)
        except Exception:
            ok = False
        if not ok:
            self.lease_lost.trip("lease_lost")
        return ok

    def _check_alive(self) -> None:
        if self.lease_lost.tripped:
            if self.journal_fault is None:
                try:
                    run = runs_store.get_run(self.db, self.run_id)
                except JournalError:
                    run = None
                if run is not None and run.status == "completed":
                    return  # the heartbeat's renewal met the run this driver just completed: nothing was lost
            raise self.lost_lease_error()

    def _stopped(self) -> bool:
        if self.opts.cancel.tripped:
            self.result.aborted, self.result.abort_reason = True, self.opts.cancel.reason
            return True
        return False

    # -------------------------------------------------------- spine writes
    def finish(
        self,
        step_id: str,
        status: str,
        *,
        summary: str | None,
        notes: str | None,
        evidence: dict[str, Any] | None,
        detail: dict[str, Any] | None = None,
    ) -> tuple[str, str | None]:
        """End the step (fenced); returns (status written, notes written)."""
        try:
            status, notes, warnings = finish_step(
                self.db,
                self.run_id,
                step_id,
                status,
                summary=summary,
                notes=notes,
                evidence=evidence,
                lease_holder=self.holder,
                status_detail=detail,
                fence=self.fence,
            )
        except UsageError as exc:
            if exc.code in ("RUN_NOT_ACTIVE", "RUN_ABANDONED", "LEASE_HELD", "LEASE_LOST"):
                raise self.lost_lease_error() from None  # abandoned or taken over meanwhile: say so
            raise
        for w in warnings:
            self.warn(w)
        if status == "failed" and notes and self.result.executed and self.result.executed[-1]["stepId"] == step_id:
            entry = self.result.executed[-1]
            if entry["ok"]:
                entry.update(ok=False, summary=notes)
        self.spine = load_spine(self.db, self.run_id, self.plan)
        if self.opts.on_progress is not None:
            self.opts.on_progress(StepProgress(self.run_id, step_id, status, summary or notes))
        return status, notes

    def record(self, step_id: str, decision: StepDecision, *, ok: bool, summary: str | None = None) -> None:
        """One `executed` entry per finished loop of a step."""
        r = decision.result
        self.result.executed.append(
            {
                "stepId": step_id,
                "ok": ok,
                "skipped": False,
                "unitCount": r.unit_count if r else 0,
                "failedUnits": r.failed_units if r else 0,
                "reusedUnits": self.reused.get(step_id, 0),
                "summary": summary if summary is not None else (r.summary if r else decision.notes),
                **({"gateLoop": decision.loop} if decision.loop > 1 else {}),
            }
        )

    # -------------------------------------------------------- main loop
    def run(self) -> None:
        res = self.result
        self.spine = load_spine(self.db, self.run_id, self.plan)
        while True:
            self._check_alive()
            if self._stopped():
                return
            run = runs_store.get_run(self.db, self.run_id)
            if run is None or run.status != "active" or run.current_step_id is None:
                return
            if self.opts.max_steps is not None and res.steps_processed >= self.opts.max_steps:
                return
            if not runs_store.renew_lease(self.db, self.run_id, self.holder, epoch=self.fence.epoch):
                raise self.lost_lease_error()
            step = self.plan.step(run.current_step_id)
            if step is None:
                from akm.codes import Code

                raise UsageError(
                    f"Run {self.run_id}: current step {run.current_step_id} is not present in its frozen plan.",
                    code=Code.CORRUPT_RUN,
                )
            why = self.spine.routes.skip_reason(step)
            if why is not None:
                self.spine.routes.skip(step)
                self.finish(step.step_id, "skipped", summary=None, notes=f"Skipped: {why}.", evidence=None)
                res.executed.append(
                    {
                        "stepId": step.step_id,
                        "ok": True,
                        "skipped": True,
                        "unitCount": 0,
                        "failedUnits": 0,
                        "reusedUnits": 0,
                        "summary": f"skipped ({why})",
                    }
                )
                continue
            if not self.run_step(step):
                return

    def run_step(self, step: StepPlan) -> bool:
        """Drive one step until it finishes (True: the run moves on) or the drive must stop (False)."""
        settled_loop: int | None = None  # the loop this invocation already dispatched
        restored_loop: int | None = None  # the loop whose reusable units this invocation restored
        # The work list is a pure function of the step, params, earlier outputs and the gate state: the
        # decision after a dispatch pass reuses the one computed before it (a new loop computes its own).
        work_list: Any = None
        work_list_gate: tuple[int, Any] | None = None
        while True:
            self._check_alive()
            if self._stopped():
                return False
            assert self.spine is not None
            rows, gate_rows = step_rows(self.db, self.run_id, step.step_id)
            gate = load_gate(self.db, self.run_id, step, self.spine, gate_rows)
            reuse = work_list is not None and work_list_gate == (gate.loop, gate.feedback)
            decision = decide_step(
                run_id=self.run_id,
                step=step,
                params=self.loaded.params,
                outputs=self.spine.outputs,
                engines=self.plan.execution.engines,
                gate=gate,
                rows=rows,
                native_kinds=self.native_kinds,
                settled=settled_loop == gate.loop,
                fail_fast=settled_loop == gate.loop,
                work_list=work_list if reuse else None,
                hash_version=self.loaded.run.hash_version,
            )
            if decision.work_list is not None:
                work_list, work_list_gate = decision.work_list, (gate.loop, gate.feedback)
            if decision.kind == "work" and restored_loop != gate.loop:
                # Units a rewind superseded or a `--from` run completed, with the same identity: restored, not run.
                restored_loop = gate.loop
                restored = reuse_units.restore(
                    self.db, self.loaded, step, decision, fence=self.fence, write=self._fenced_write
                )
                if restored:
                    self.reused[step.step_id] = self.reused.get(step.step_id, 0) + restored
                    continue
            if decision.kind == "work" and settled_loop != gate.loop:
                # Only this driver dispatches: one pass over the units it can run, then decide again with
                # the pass settled (what is still outstanding then is claimed elsewhere, or session work).
                if self.dispatch_pass(step, decision) is False:
                    return False
                settled_loop = gate.loop
                continue
            applied = apply_decision(self.effects, step, decision)
            if applied.next == AGAIN:
                continue
            return applied.next == FINISHED and applied.status == "completed"

    def dispatch_pass(self, step: StepPlan, decision: StepDecision) -> bool | None:
        """Dispatch the decision's units that this engine can run. False = stop driving."""
        now = self.db.now()
        runnable: list[WorkUnit] = []
        adopt: dict[str, int] = {}
        for s in decision.states:
            if s.status == DONE:
                continue
            with_workers = s.row is not None and s.row.get("queued_at") is not None and s.status == RUNNING
            if with_workers and not self.workers:
                # A coordinator died with units in the workers' hands: wait for them, as it would have,
                # rather than run them a second time here or park the run for the agent.
                self.warn(
                    f"run {self.run_id} has units queued for or running on workers; this invocation waits for "
                    "them and queues the rest of the run for workers too"
                )
                self.coordinate_with_workers()
            if with_workers:
                assert s.row is not None
                adopt[s.unit.unit_id] = retry_index(s.row["unit_id"])  # wait for it, do not queue it again
            elif _claimed_by_other(s, now):
                continue
            if self.registry.get(s.unit.runner) is None:
                continue  # the calling agent does these (D11)
            runnable.append(s.unit)
        if not runnable:
            return None
        wl = decision.work_list
        assert wl is not None
        failure = _Pass(self, step, runnable, adopt).execute(wl.concurrency)
        self._check_alive()
        if self._stopped():
            return False
        if failure is not None:
            apply_decision(self.effects, step, pass_failed(decision, failure.reason))
            return False
        return None

    def park(self, brief: dict[str, Any]) -> None:
        """Stop with `awaiting_session`: the remaining work needs a model, an agent or a judge."""
        self._fenced_write(runs_store.set_run_status, self.db, self.run_id, "awaiting_session", brief, fence=self.fence)
        self.result.awaiting = brief

    def _fenced_write(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A journal write under this driver's fence; a refusal because the lease was lost says so."""
        try:
            return write(*args, **kwargs)
        except UsageError as exc:
            if self.fenced_out(exc):
                raise self.lost_lease_error() from None
            raise


class _DriverEffects:
    """`apply.Effects` for the drive loop: fenced writes, the `executed` bookkeeping, cancellable judges."""

    park_without_judge_dispatcher = True  # the agent may judge what this akm has no dispatcher for

    def __init__(self, driver: _Driver) -> None:
        self.d = driver
        self.db = driver.db
        self.run_id = driver.run_id
        self.plan = driver.plan
        self.fence: runs_store.Fence | None = driver.fence
        self.cwd = str(driver.opts.project_root)

    def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.d._fenced_write(fn, *args, **kwargs)

    def dispatcher_for(self, kind: str) -> Any:
        return self.d.registry.get(kind)

    @contextmanager
    def judging(self) -> Iterator[threading.Event]:
        event = threading.Event()
        self.d.opts.cancel.link(event)
        self.d.lease_lost.link(event)
        try:
            yield event
        finally:
            self.d.opts.cancel.unlink(event)
            self.d.lease_lost.unlink(event)

    def interrupted(self) -> bool:
        self.d._check_alive()
        return self.d._stopped()

    def record(self, step_id: str, decision: StepDecision, *, ok: bool, summary: str | None = None) -> None:
        self.d.record(step_id, decision, ok=ok, summary=summary)

    def park(self, brief: dict[str, Any]) -> None:
        self.d.park(brief)

    def finish(
        self,
        step_id: str,
        status: str,
        *,
        summary: str | None,
        notes: str | None,
        evidence: dict[str, Any] | None,
        detail: dict[str, Any] | None,
        judge_failed: bool,
    ) -> tuple[str, str | None]:
        written = self.d.finish(step_id, status, summary=summary, notes=notes, evidence=evidence, detail=detail)
        self.d.result.steps_processed += 1
        return written


def _default_registry() -> DispatcherRegistry:
    from akm.dispatch.registry import default_registry

    return default_registry()


# Journal errors of a server that is reachable again later (PostgreSQL): they stop a driver, never fail a unit.
_JOURNAL_DOWN = frozenset({"JOURNAL_CONNECTION_LOST", "JOURNAL_BUSY", "JOURNAL_UNREACHABLE"})

# Why a driver stopped itself (the lease cancellation's reasons from akm.engine.fencing's watchdog).
_FENCED = {
    "lease_lapsing": "it could not renew its run lease (the journal server did not answer) and the lease was "
    "about to lapse.",
    "liveness_lost": "it lost the connection that proves to other hosts that it is alive, and could not take it "
    "back in time.",
}


# How long a driver waits for a report that holds the lease while it finishes a step (a short hold:
# journal reads and writes, or an engine judge) before it answers LEASE_HELD.
REPORT_LOCK_WAIT_S = 10.0


def _acquire(
    db: Journal,
    run_id: str,
    holder: str,
    liveness: HolderLiveness | None = None,
    note: Callable[[str], None] | None = None,
) -> tuple[runs_store.LeaseInfo | None, float]:
    """`acquire_lease`, waiting (up to REPORT_LOCK_WAIT_S) while a report's finalize lock holds the run, and
    taking over a holder whose liveness session is gone only after the grace (below). Returns the live holder
    (None: the lease is ours) and when the acquisition that succeeded was sent (monotonic).

    A report finishing a step takes the run lease for a moment; a driver started at that moment
    is not racing another driver and must not be told so. It watches the journal's lease row and
    retries as soon as that holder lets go (or its lease lapses); any other holder is answered at once.

    A holder whose liveness lock is free (PostgreSQL) may be a live driver that only lost that connection.
    Its lock is kept from it here (`runs.hold_dead_holder`), so it stops its units within its
    fencing time, and the run is taken over only after TAKEOVER_GRACE_S, or at once should the holder let go
    of its lease meanwhile (it stopped, and released it).
    """
    deadline = time.monotonic() + REPORT_LOCK_WAIT_S
    while True:
        sent = time.monotonic()
        live = runs_store.acquire_lease(db, run_id, holder, liveness=liveness)
        if live is None:
            return None, sent
        if live.holder.startswith(units_store.REPORT_LOCK_PREFIX):
            if not runs_store.wait_lease_change(db, run_id, live, deadline):
                return live, sent
            continue
        dead = runs_store.hold_dead_holder(db, run_id)
        if dead is None:
            return live, sent
        try:
            if note is not None:
                note(
                    f"the driver {live.holder} (host {live.host}, pid {live.pid}) of run {run_id} lost its liveness "
                    f"connection; waiting up to {TAKEOVER_GRACE_S:g} s for it to stop its units before taking over"
                )
            if runs_store.wait_lease_change(db, run_id, live, time.monotonic() + TAKEOVER_GRACE_S):
                continue  # it let go (or lapsed): an ordinary acquisition now
            sent = time.monotonic()
            return runs_store.acquire_lease(db, run_id, holder, liveness=liveness, dead=dead), sent
        finally:
            runs_store.release_dead_holder(db, dead)


def drive_run(db: Journal, run_id: str, opts: DriveOptions) -> DriveResult:
    """Drive `run_id` as far as it can go in this invocation."""
    loaded = load_run(db, run_id)
    result = DriveResult(run_id=run_id)
    if loaded.status == "completed":
        result.done = True
        return result
    if loaded.status not in DRIVABLE_STATUSES:
        raise runs_store.not_drivable_error(run_id, loaded.status, "executed")
    holder = uuid4()
    # PostgreSQL: the holder's liveness session (opening in the background) proves it alive to other hosts;
    # the lease row records its marker only once the lock is held, and a peer that finds the lock gone takes
    # the run over after a grace in which a live holder stops its units (store/postgres/liveness.py,
    # engine/fencing.py). Released after the lease, on every exit.
    liveness = db.holder_liveness(holder)
    try:
        return _drive_held(db, run_id, holder, liveness, loaded, opts, result)
    finally:
        if liveness is not None:
            liveness.release()


def _drive_held(
    db: Journal,
    run_id: str,
    holder: str,
    liveness: HolderLiveness | None,
    loaded: LoadedRun,
    opts: DriveOptions,
    result: DriveResult,
) -> DriveResult:
    """`drive_run` once this holder's liveness (if the journal keeps one) is held: take the lease, drive."""

    def note(message: str) -> None:
        result.warnings.append(message)
        if opts.on_warning is not None:
            opts.on_warning(message)

    try:
        live, acquired_at = _acquire(db, run_id, holder, liveness, note)
    except UsageError as exc:  # a report we waited for finished the run meanwhile
        if exc.code == "RUN_NOT_ACTIVE" and (exc.details or {}).get("status") == "completed":
            result.done = True
            return result
        raise
    if live is not None:
        reporting = live.holder.startswith(units_store.REPORT_LOCK_PREFIX)
        from akm.codes import Code

        raise UsageError(
            (
                f"Workflow run {run_id} is held by a report that has been finishing its step for over "
                f"{REPORT_LOCK_WAIT_S:g} s (lease holder {live.holder} until {live.until})."
                if reporting
                else f"Workflow run {run_id} is being driven by another invocation: lease holder {live.holder} "
                f"(host {live.host}, pid {live.pid}) until {live.until}."
            )
            + " A second driver would race it.",
            code=Code.LEASE_HELD,
            details={"runId": run_id, "holder": live.holder, "until": live.until},
            hint="Wait for that invocation to finish, or for its lease to expire.",
        )
    driver: _Driver | None = None
    try:
        fence = runs_store.lease_fence(db, run_id, holder)
        if fence is None:  # taken from us between the acquisition and this read: a takeover
            from akm.codes import Code

            raise UsageError(
                f"This invocation lost its lease on run {run_id} as soon as it took it; "
                "stopping to avoid racing the new holder.",
                code=Code.LEASE_LOST,
            )
        driver = _Driver(db, loaded, fence, opts, result, liveness, acquired_at)
        driver.heartbeat.start()
        if runs_store.run_status(db, run_id) == "awaiting_session":
            runs_store.set_run_status(db, run_id, "active", None, fence=fence)
        driver.run()
        final = runs_store.get_run(db, run_id)
        result.done = final is not None and final.status == "completed"
        return result
    finally:
        if driver is not None:
            driver.heartbeat.stop()
            if driver.work_notifier is not None:
                driver.work_notifier.close()
        try:
            runs_store.release_lease(db, run_id, holder)
        except JournalError as exc:
            result.warnings.append(f"could not release the run lease: {exc}")
