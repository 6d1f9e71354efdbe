"""The coordinator's half of a fan-out spread over workers (phase 2; spec/journal.md "Workers").

A driver started with `--workers` keeps everything it does today — the lease, the work list, retries,
budgets, per-step and per-engine concurrency, fail fast, the one finalize path — and changes one thing: its
pass's runner is a `WorkerRunner`. An attempt is not run on one of the pass's threads but journaled `queued`
(`akm.store.queue.queue_unit`, fenced by its lease) with its dispatch payload, and the thread waits for a
worker to finish the row. So every limit that bounds the pass's threads bounds the units in flight across all
workers, and every decision is still taken from the journal by the lease holder alone.

The payload (`akm.engine.attempt.to_payload`) holds what the coordinator computed for the attempt and a
worker cannot: the prompt or the exec context (run id, params, inputs, item), the timeout, the engine and
model, and the project's identity and commit, which a worker checks before it claims anything. Never a
secret: env bindings and credentials are resolved by the worker, from its own environment and env files.

One `Waiter` per pass polls the journal for finished rows (one indexed read per interval for all waiting
threads, however wide the fan-out) and sweeps lapsed worker claims back into the queue, so a fan-out whose
workers all died goes on as soon as any worker starts again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from akm.engine.attempt import to_payload
from akm.engine.reduce import UnitOutcome, outcome_from_row
from akm.engine.runner import Holder, PassView, PlainLane, new_attempt, not_started
from akm.engine.worklist import WorkUnit
from akm.store import queue as queue_store
from akm.store.journal import Journal

POLL_S = 0.25  # between reads of the finished rows; a worker's NOTIFY (PostgreSQL) wakes the read sooner
SWEEP_EVERY_S = 2.0
UNCLAIMED_WARN_S = 30.0  # queued units no worker touched for this long: say so (once, until work moves again)


class Waiter:
    """Wait, on many threads at once, for queued attempts of one run to be finished by workers."""

    def __init__(
        self,
        db: Journal,
        run_id: str,
        *,
        poll_s: float = POLL_S,
        on_unclaimed: Callable[[int, float], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        unclaimed_warn_s: float | None = None,
    ) -> None:
        self.db = db
        self.run_id = run_id
        self.poll_s = poll_s
        # Told (the number of units waiting, and for how long nothing moved) when no worker has claimed or
        # finished any of them for `unclaimed_warn_s`: no worker runs, or every one refuses the step.
        self.on_unclaimed = on_unclaimed
        self.unclaimed_warn_s = UNCLAIMED_WARN_S if unclaimed_warn_s is None else unclaimed_warn_s
        self.on_error = on_error  # told of the first journal failure of a series (the loop keeps retrying)
        self._poke = threading.Event()  # set by a worker's notification: read the rows now
        self._listener: Any = None
        self._lock = threading.Lock()
        self._waiting: dict[str, threading.Event] = {}
        self._rows: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def wait(self, attempt: str, cancel: threading.Event) -> dict[str, Any] | None:
        """The attempt's finished row, or None once `cancel` is set first (the row stays queued or claimed)."""
        done = threading.Event()
        with self._lock:
            self._waiting[attempt] = done
        self.listen()
        try:
            while not done.wait(self.poll_s):
                if cancel.is_set():
                    return None
        finally:
            with self._lock:
                self._waiting.pop(attempt, None)
        with self._lock:
            return self._rows.pop(attempt, None)

    def listen(self) -> None:
        """Start listening for the workers' finishes, and the loop that reads them (once)."""
        with self._lock:
            if self._thread is None:
                self._listener = self.db.listener(queue_store.RUN_CHANNEL, self._poke, self.run_id)
                self._thread = threading.Thread(target=self._loop, name="akm-remote-wait", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        last_sweep = 0.0
        last_progress = time.monotonic()
        warned = False
        while not self._stop.is_set():
            with self._lock:
                ids = list(self._waiting)
            if not ids:
                last_progress = time.monotonic()
            else:
                try:
                    rows = queue_store.finished_rows(self.db, self.run_id, ids)
                    now = time.monotonic()
                    if rows:
                        last_progress, warned = now, False
                    if now - last_sweep >= SWEEP_EVERY_S:
                        last_sweep = now
                        queue_store.sweep(self.db)
                        if queue_store.claimed_count(self.db, self.run_id):
                            last_progress, warned = now, False
                        elif not warned and now - last_progress >= self.unclaimed_warn_s:
                            warned = True
                            if self.on_unclaimed is not None:
                                self.on_unclaimed(len(ids), self.unclaimed_warn_s)
                except Exception as exc:  # a journal hiccup: try again next interval; waiting threads keep waiting
                    if self._error is None and self.on_error is not None:
                        self.on_error(exc)
                    self._error = exc
                    rows = {}
                else:
                    self._error = None
                self._deliver(rows)
            self._poke.wait(self.poll_s)
            self._poke.clear()

    def _deliver(self, rows: dict[str, Any]) -> None:
        """Hand each finished row to the thread waiting for it (once), and stop asking for it: the waiting thread
        may wake after the loop's next read (each finish pokes it), which read the row again with every other
        finished one not yet picked up — with 64 units in flight, each row about four times."""
        with self._lock:
            for unit_id, row in rows.items():
                event = self._waiting.pop(unit_id, None)
                if event is not None:
                    self._rows[unit_id] = row
                    event.set()

    def close(self) -> None:
        self._stop.set()
        self._poke.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()


class WorkerRunner:
    """`akm.engine.runner.Runner` for attempts run by `akm worker` processes: queue, then wait for the row."""

    def __init__(self, d: Holder, p: PassView) -> None:
        self.d = d
        self.p = p
        self.waiter = Waiter(d.db, d.run_id, on_unclaimed=self._unclaimed, on_error=self._journal_trouble)

    def lane(self) -> PlainLane:
        return PlainLane(self.p, self.dispatch)  # a thread waits for one queued attempt at a time

    def start(self) -> None:
        # Before the first queue write: the wake-ups of the first finishes are not missed, and the statements of
        # a wide pass's first moments (queue writes, reads of finished rows, sweeps) find connections open.
        self.waiter.listen()
        self.d.db.warm(4)

    def halt(self) -> None:
        # Fail fast with workers: what they have not claimed yet is never started, as a local pass
        # starts no further unit; what they run already finishes and is journaled.
        self._withdraw(None)

    def close(self) -> None:
        self.waiter.close()

    def _journal_trouble(self, exc: BaseException) -> None:
        self.d.warn(f"reading the workers' results from the journal failed (retrying every poll): {exc}")

    def _unclaimed(self, waiting: int, quiet_s: float) -> None:
        self.d.warn(
            f'{waiting} unit(s) of step "{self.p.step.step_id}" are queued for workers and no worker has claimed '
            f"any for {quiet_s:g} s: start a worker in a checkout of this project at its commit "
            "(a worker that cannot run them says why on its stderr); this run waits for them"
        )

    def dispatch(self, unit: WorkUnit, attempt: str) -> UnitOutcome:
        """Queue the attempt for workers (fenced, committed first) and wait for a worker to finish its row."""
        d, p = self.d, self.p
        payload = to_payload(p.attempts.spec_of(unit), scope_key=d.scope_key, commit=d.commit)
        row_fields = new_attempt(d.run_id, p.step.step_id, unit, attempt)._asdict()
        del row_fields["worktree_path"]  # a worker makes its own
        try:
            queued = queue_store.queue_unit(d.db, **row_fields, dispatch_json=payload, fence=d.fence)
        except Exception as exc:
            if d.fenced_out(exc):
                return not_started(unit, attempt)
            return UnitOutcome(
                unit_id=unit.unit_id,
                ok=False,
                failure_reason="dispatch_error",
                error=f"unit {attempt} could not be queued for workers (nothing was dispatched): {exc}",
            )
        if queued.wake and d.work_notifier is not None:
            d.work_notifier.notify(d.run_id)  # after the commit: wake idle workers now (unless the write did)
        row = self.waiter.wait(attempt, p.event)
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

    def _withdraw(self, attempt: str | None) -> None:
        """Take this step's queued attempts (or one) back from the workers: failed `aborted`, never run."""
        d, step_id = self.d, self.p.step.step_id
        try:
            queue_store.withdraw(d.db, d.run_id, step_id, attempt, fence=d.fence)
        except Exception as exc:
            if not d.fenced_out(exc):
                d.warn(f"could not take queued units of step {step_id} back from the workers: {exc}")
