"""A dispatch pass: every unit of a step the driver can run, once (with its retries), over the step's width.

The pass decides what happens to the units — which runs next (scheduling), how many at once (the width,
`akm.engine.concurrency`), that none starts after one failed for good under `on_error: fail` (fail fast),
that none starts once the run is cancelled or the lease lost, retries and their Retry-After waits, the
dispatch budget, and the progress it reports. How an attempt runs (journaled and dispatched here, or
queued for workers) is its runner's (`akm.engine.runner`). What the step then does is decided from the
journal by the driver (`akm.engine.drive`).
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Protocol

from akm.engine.attempt import EnvBindingError, StepAttempts, worktree_problem
from akm.engine.budget import LIFETIME_UNIT_CAP
from akm.engine.concurrency import UNBOUNDED, host_concurrency_limit, step_width
from akm.engine.finalize import DONE, RUNNING, StepDecision, UnitState, retry_index
from akm.engine.progress import PassStarted, UnitProgress
from akm.engine.reduce import UnitOutcome
from akm.engine.runner import Holder, Lane, Runner, RunnerFactory, Ticket
from akm.engine.worklist import WorkUnit
from akm.errors import AkmError
from akm.plan.identity import attempt_id
from akm.plan.model import Plan, StepPlan
from akm.record import dataclass
from akm.store.runs import holder_is_live

if TYPE_CHECKING:
    from akm.dispatch.base import DispatcherRegistry
    from akm.engine.spend import RunSpend
    from akm.engine.state import LoadedRun

# Longest wait a unit-level retry honours from a server's Retry-After (the LLM client's own cap).
MAX_RETRY_AFTER_WAIT_S = 120.0


class Driver(Holder, Protocol):
    """What a pass needs of the driver holding the run's lease, besides what its runner does."""

    @property
    def plan(self) -> Plan: ...

    @property
    def loaded(self) -> LoadedRun: ...

    @property
    def workers(self) -> bool: ...  # the units run on workers: this host's CPUs do not bound the width

    @property
    def spend(self) -> RunSpend: ...  # the money and token accounting beside the budget


@dataclass
class PassFailure:
    """A dispatch pass that cannot be reduced: the step fails with `reason` whatever `on_error` says."""

    reason: str


class Pass:
    """One dispatch pass over some units of one step (one gate loop). Holds the per-step cancellation."""

    def __init__(
        self,
        driver: Driver,
        step: StepPlan,
        units: list[WorkUnit],
        runner: RunnerFactory,
        adopt: dict[str, int] | None = None,
    ) -> None:
        self.d = driver
        self.step = step
        self.units = units
        # Workers: units whose attempt is already with the workers, by the retry index it has; the
        # pass waits for that attempt instead of queueing the unit's first one again (a takeover).
        self.adopt = adopt or {}
        self.event = threading.Event()
        self.done_count = 0
        self.total = len(units)
        # Fail fast: a unit that failed for good under `on_error: fail` fixes the step's verdict, so
        # no further unit is started (units already running finish and are journaled).
        self.halted = False
        self._count_lock = threading.Lock()
        self._claim: Callable[[], int | None] = lambda: None  # the next unit's index (set by _schedule)
        self.unclaimed = len(units)  # units no lane has claimed yet (an estimate read without the lock)
        self.lanes = 1
        self._attempts: StepAttempts | None = None
        self.runner: Runner = runner(driver, self)

    @property
    def attempts(self) -> StepAttempts:
        """What every attempt of the step shares (its env bindings and secrets), opened by `execute`."""
        assert self._attempts is not None
        return self._attempts

    def claim(self) -> int | None:
        return self._claim()

    # ------------------------------------------------------------ one unit
    def run_unit(self, unit: WorkUnit, lane: Lane, ticket: Ticket) -> UnitOutcome:
        outcome = self._run_unit(unit, lane, ticket)
        # (a driver that is stopping — its lease lost, or the journal gone — decides nothing about the step)
        if not outcome.ok and unit.template.on_error == "fail" and not self.d.lease_lost.tripped:
            self.halted = True
            self.runner.halt()
        return outcome

    def _run_unit(self, unit: WorkUnit, lane: Lane, ticket: Ticket) -> UnitOutcome:
        d = self.d
        retry = unit.template.retry
        max_attempts = 1 + (retry.max if retry else 0)
        last: UnitOutcome | None = None
        for k in range(min(self.adopt.get(unit.unit_id, 0), max_attempts - 1), max_attempts):
            not_made = self._not_made(unit, lane, ticket, k)
            if not_made is not None:
                return last or not_made
            att = attempt_id(unit.base_id, k)
            outcome = lane.run(unit, att, ticket if k == 0 else None)
            d.spend.count(unit, outcome)
            self._progress(unit, att, outcome, first=k == 0)
            last = outcome
            if outcome.ok or self.event.is_set():
                return outcome
            if not retry or outcome.failure_reason not in retry.on:
                return outcome
            if (
                k + 1 < max_attempts
                and outcome.retry_after_s
                and not self._waited(outcome, lane, retry.on, outcome.retry_after_s)
            ):
                return outcome
        assert last is not None
        return last

    def _not_made(self, unit: WorkUnit, lane: Lane, ticket: Ticket, k: int) -> UnitOutcome | None:
        """Why attempt `k` of the unit is not made — the run was interrupted (a first attempt hands its lane
        ticket back), or the budget refuses it — or None: go on (the budget then counts it)."""
        d = self.d
        if self.event.is_set():
            if k == 0:
                lane.hand_back(ticket)
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="aborted",
                error="unit was not dispatched because the run was interrupted",
            )
        prepaid = ticket.prepaid and k == 0
        refusal = None if prepaid else d.budget.try_consume(model=d.spend.is_model(unit))
        if refusal:
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason=refusal,
                error=d.budget.exceeded or d.budget.cap_message,
            )
        return None

    def _progress(self, unit: WorkUnit, att: str, outcome: UnitOutcome, *, first: bool) -> None:
        """Count a unit's first attempt as done and tell `on_progress` of every attempt's outcome."""
        d = self.d
        with self._count_lock:
            if first:
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

    def _waited(self, outcome: UnitOutcome, lane: Lane, retry_on: list[str], delay_s: float) -> bool:
        """Wait as long as a rate-limited server said (429 Retry-After) before the retry; False when the unit
        must not be tried again after all (its failed attempt could not be journaled, or the run was cancelled).

        Re-asking sooner only earns another 429 and burns the retry; the wait ends at once if the run is
        cancelled. The failed attempt is journaled first, so no row looks `running` while nothing runs."""
        lane.settle()
        if outcome.failure_reason not in retry_on:  # its journal write failed
            return False
        return not self.event.wait(min(delay_s, MAX_RETRY_AFTER_WAIT_S))

    # ------------------------------------------------------------ the pass
    def execute(self, concurrency: int) -> PassFailure | None:
        """Dispatch every unit once (with its retries). None = the journal now holds each unit's outcome."""
        d, step = self.d, self.step
        tmpl = step.unit_template
        assert tmpl is not None
        if d.budget.used + len(self.units) > LIFETIME_UNIT_CAP:
            # Refused before the first dispatch: the step could never finish, and running 9,999 of its units
            # first only to fail on the cap wastes them all.
            return PassFailure(
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
        try:
            # one snapshot of the environment per step for every unit's
            self._attempts = StepAttempts.open(
                d.plan,
                step,
                run_id=d.run_id,
                project_root=d.opts.project_root,
                params=d.loaded.params,
                parent_env=dict(os.environ),
                trace=d.opts.trace,
            )
        except EnvBindingError as exc:
            return PassFailure(f'Step "{step.step_id}" env binding failed: {exc}')
        problem = worktree_problem(tmpl, d.opts.project_root)
        if problem:
            return PassFailure(f'Step "{step.step_id}" cannot use isolation: worktree: {problem}')
        unpriced = d.spend.unpriced(step, self.units)
        if unpriced:
            return PassFailure(unpriced)
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
        if d.budget.exceeded:
            return PassFailure(d.budget.exceeded)
        if d.budget.cap_message:
            return PassFailure(d.budget.cap_message)
        unjournaled = [o.error for o in outcomes if o.failure_reason == "journal_write_failed" and o.error]
        if unjournaled:
            return PassFailure(" ".join(unjournaled))
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
                    self.unclaimed -= 1
                return i

        self._claim = claim
        self.lanes = max(1, width)

        def worker() -> None:
            lane = self.runner.lane()
            try:
                work(lane)
            finally:
                lane.close()

        def work(lane: Lane) -> None:
            while True:
                if self.event.is_set() or self.halted:
                    return
                ticket = lane.next()
                if ticket is None:
                    return
                i = ticket.index
                try:
                    results[i] = self.run_unit(units[i], lane, ticket)
                except AkmError:
                    raise
                except Exception as exc:  # a runner bug must not lose the slot silently
                    results[i] = UnitOutcome(
                        unit_id=units[i].unit_id,
                        ok=False,
                        failure_reason="dispatch_error",
                        error=f"internal error while running the unit: {exc}",
                    )

        self.runner.start()
        try:
            if width <= 1 or len(units) <= 1:
                worker()
            else:
                _run_workers(worker, width)
        finally:
            self.runner.close()
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


def units_to_dispatch(
    decision: StepDecision, registry: DispatcherRegistry, clock: Callable[[], str]
) -> tuple[list[WorkUnit], dict[str, int]]:
    """The units of a `work` decision that this driver dispatches, and `adopt`: those already with workers
    (queued or claimed there), by the retry index of their attempt, which the pass waits for instead of
    queueing the unit again. Units another live claimant holds (D13) and units this akm has no dispatcher
    for (the calling agent does those, D11) are left out. `clock` (the journal's) is read once, and only
    when a running row's claim must be judged: a step's first pass has none (across a network, a round trip)."""
    runnable: list[WorkUnit] = []
    adopt: dict[str, int] = {}
    read: list[str] = []

    def now() -> str:
        if not read:
            read.append(clock())
        return read[0]

    for s in decision.states:
        if s.status == DONE:
            continue
        if s.row is not None and s.row.get("queued_at") is not None and s.status == RUNNING:
            adopt[s.unit.unit_id] = retry_index(s.row["unit_id"])
        elif s.status == RUNNING and _claimed_by_other(s, now()):
            continue
        if registry.get(s.unit.runner) is None:
            continue
        runnable.append(s.unit)
    return runnable, adopt


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
