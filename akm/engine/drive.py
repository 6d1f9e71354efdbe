"""The native drive loop: take the run lease, drive the run step by step, let `finalize` decide.

One invocation drives one run. The journal is the source of truth: a unit row
is inserted (status `running`) before anything is dispatched and finished
after, so a crash at any instant leaves either a completed row (reused on
re-run, never redone) or a running/failed row (dispatched again, `attempts`
bumped).

This module keeps the lease, the step loop and the decision. What a step does
next — dispatch more units, loop with gate feedback, await a verdict,
complete, fail, block — is decided by `akm.engine.finalize.decide_step` from
the journal alone and done by `akm.engine.apply.apply_decision`, the same two
functions the session protocol uses when a calling agent reports results. What
only this loop does is dispatch a pass of the units it can run
(`akm.engine.passes`), whose attempts a runner runs: here (`akm.engine.local`)
or on workers (`akm.engine.remote`). Units that need a model or an agent with
no engine are session units (D11): the loop drives everything it can, then
parks the run as `awaiting_session`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from akm import paths
from akm.dispatch.base import DispatcherRegistry
from akm.engine import fencing
from akm.engine import reuse as reuse_units
from akm.engine.apply import AGAIN, FINISHED, apply_decision, pass_failed
from akm.engine.budget import DispatchBudget
from akm.engine.cancel import Cancellation
from akm.engine.fencing import TAKEOVER_GRACE_S
from akm.engine.finalize import StepDecision, decide_step
from akm.engine.heartbeat import Heartbeat
from akm.engine.local import LocalRunner
from akm.engine.passes import Pass, units_to_dispatch
from akm.engine.progress import PassStarted, StepProgress, UnitActivity, UnitProgress
from akm.engine.results import DriveResult
from akm.engine.runner import RunnerFactory
from akm.engine.spend import RunSpend
from akm.engine.state import LoadedRun, load_run
from akm.engine.stepctx import Spine, finish_step, load_gate, load_spine, step_rows
from akm.errors import AkmError, JournalError, UsageError
from akm.ids import uuid4
from akm.plan.model import Plan, StepPlan
from akm.record import dataclass, field
from akm.store import runs as runs_store
from akm.store.journal import HolderLiveness, Journal
from akm.store.status import DRIVABLE_STATUSES, REPORT_LOCK_PREFIX

__all__ = ["DriveOptions", "UnitProgress", "drive_run"]


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
    # How the attempts of a pass run (akm.engine.runner), instead of here or on workers: a test's seam.
    runner: RunnerFactory | None = None
    # The run's trace (akm.telemetry.context.RunTrace) when tracing is on: each attempt's process gets TRACEPARENT
    trace: Any = None


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
        self.spend = RunSpend(db, loaded)  # the money and token accounting beside the budget
        self.budget: DispatchBudget = self.spend.budget
        self._warn_lock = threading.Lock()
        self.reused: dict[str, int] = {}  # per step: units restored by this invocation instead of run
        self.spine: Spine | None = None
        self.effects = _DriverEffects(self)
        # What workers check before they claim this run's units (akm.engine.attempt.to_payload).
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
        return fencing.lost_lease_error(self.db, self.run_id, self.lease_lost.reason, self.journal_fault)

    def fenced_out(self, exc: BaseException) -> bool:
        """Is `exc` a write refused because another driver took the lease, or one the journal server could not
        take at all (the connection lost or stalled, a lock it gave up on)? Then stop everything: what is in
        flight is stopped and not journaled, as after a lost lease, and the driver exits with that error; the
        run stays as the journal has it (active), for the next driver. A unit is never failed, nor a step
        decided, because of the journal's trouble."""
        if isinstance(exc, UsageError) and exc.code == "LEASE_LOST":
            self.lease_lost.trip("lease_lost")
            return True
        if isinstance(exc, JournalError) and exc.code in fencing.JOURNAL_DOWN:
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
            self._renew_before_step()
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

    def _renew_before_step(self) -> None:
        """Extend the lease before a step starts, unless it was taken or renewed within `recheck_after_s` (a
        quarter of its TTL: at least three quarters are left; a drive's first step follows its acquisition)."""
        if time.monotonic() - self.heartbeat.renewed_at < self.recheck_after_s:
            return
        sent = time.monotonic()
        if not runs_store.renew_lease(self.db, self.run_id, self.holder, epoch=self.fence.epoch):
            raise self.lost_lease_error()
        self.heartbeat.renewed_at = max(self.heartbeat.renewed_at, sent)

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
        runnable, adopt = units_to_dispatch(decision, self.registry, self.db.now)
        if adopt and not self.workers:
            # A coordinator died with units in the workers' hands: wait for them, as it would have,
            # rather than run them a second time here or park the run for the agent.
            self.warn(
                f"run {self.run_id} has units queued for or running on workers; this invocation waits for "
                "them and queues the rest of the run for workers too"
            )
            self.coordinate_with_workers()
        if not runnable:
            return None
        wl = decision.work_list
        assert wl is not None
        failure = Pass(self, step, runnable, self._runner(), adopt).execute(wl.concurrency)
        self._check_alive()
        if self._stopped():
            return False
        if failure is not None:
            apply_decision(self.effects, step, pass_failed(decision, failure.reason))
            return False
        return None

    def _runner(self) -> RunnerFactory:
        if self.opts.runner is not None:
            return self.opts.runner
        if self.workers:  # the worker queue's modules load only for a run whose units go to workers
            from akm.engine.remote import WorkerRunner

            return WorkerRunner
        return LocalRunner

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


# How long a driver waits for a report that holds the lease while it finishes a step (a short hold:
# journal reads and writes, or an engine judge) before it answers LEASE_HELD.
REPORT_LOCK_WAIT_S = 10.0


def _acquire(
    db: Journal,
    run_id: str,
    holder: str,
    liveness: HolderLiveness | None = None,
    note: Callable[[str], None] | None = None,
) -> tuple[runs_store.LeaseInfo | None, float, tuple[runs_store.Fence, str] | None]:
    """`take_free_lease`, else `acquire_lease`, waiting (up to REPORT_LOCK_WAIT_S) while a report's finalize lock holds the run, and
    taking over a holder whose liveness session is gone only after the grace (below). Returns the live holder
    (None: the lease is ours), when the acquisition that succeeded was sent (monotonic), and, when the lease was
    free, the fence it got and the run's status (else they are read after).

    A report finishing a step takes the run lease for a moment; a driver started at that moment
    is not racing another driver and must not be told so. It watches the journal's lease row and
    retries as soon as that holder lets go (or its lease lapses); any other holder is answered at once.

    A holder whose liveness lock is free (PostgreSQL) may be a live driver that only lost that connection.
    Its lock is kept from it here (`runs.hold_dead_holder`), so it stops its units within its
    fencing time, and the run is taken over only after TAKEOVER_GRACE_S, or at once should the holder let go
    of its lease meanwhile (it stopped, and released it).
    """
    sent = time.monotonic()
    taken = runs_store.take_free_lease(db, run_id, holder, liveness=liveness)  # nobody holds it: one round trip
    if taken is not None:
        return None, sent, taken
    deadline = time.monotonic() + REPORT_LOCK_WAIT_S
    while True:
        sent = time.monotonic()
        live = runs_store.acquire_lease(db, run_id, holder, liveness=liveness)
        if live is None:
            return None, sent, None
        if live.holder.startswith(REPORT_LOCK_PREFIX):
            if not runs_store.wait_lease_change(db, run_id, live, deadline):
                return live, sent, None
            continue
        dead = runs_store.hold_dead_holder(db, run_id)
        if dead is None:
            return live, sent, None
        try:
            if note is not None:
                note(
                    f"the driver {live.holder} (host {live.host}, pid {live.pid}) of run {run_id} lost its liveness "
                    f"connection; waiting up to {TAKEOVER_GRACE_S:g} s for it to stop its units before taking over"
                )
            if runs_store.wait_lease_change(db, run_id, live, time.monotonic() + TAKEOVER_GRACE_S):
                continue  # it let go (or lapsed): an ordinary acquisition now
            sent = time.monotonic()
            return runs_store.acquire_lease(db, run_id, holder, liveness=liveness, dead=dead), sent, None
        finally:
            runs_store.release_dead_holder(db, dead)


def drive_run(db: Journal, run_id: str, opts: DriveOptions) -> DriveResult:
    """Drive `run_id` as far as it can go in this invocation."""
    holder = uuid4()
    # PostgreSQL: the holder's liveness session (opening in the background, while the run loads) proves it
    # alive to other hosts; the lease row records its marker only once the lock is held, and a peer that finds
    # the lock gone takes the run over after a grace in which a live holder stops its units
    # (store/postgres/liveness.py, engine/fencing.py). Released after the lease, on every exit.
    liveness = db.holder_liveness(holder)
    try:
        loaded = load_run(db, run_id)
        result = DriveResult(run_id=run_id)
        if loaded.status == "completed":
            result.done = True
            return result
        if loaded.status not in DRIVABLE_STATUSES:
            raise runs_store.not_drivable_error(run_id, loaded.status, "executed")
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
        live, acquired_at, taken = _acquire(db, run_id, holder, liveness, note)
    except UsageError as exc:  # a report we waited for finished the run meanwhile
        if exc.code == "RUN_NOT_ACTIVE" and (exc.details or {}).get("status") == "completed":
            result.done = True
            return result
        raise
    if live is not None:
        reporting = live.holder.startswith(REPORT_LOCK_PREFIX)
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
        fence = taken[0] if taken is not None else runs_store.lease_fence(db, run_id, holder)
        if fence is None:  # taken from us between the acquisition and this read: a takeover
            from akm.codes import Code

            raise UsageError(
                f"This invocation lost its lease on run {run_id} as soon as it took it; "
                "stopping to avoid racing the new holder.",
                code=Code.LEASE_LOST,
            )
        driver = _Driver(db, loaded, fence, opts, result, liveness, acquired_at)
        driver.heartbeat.start()
        status = taken[1] if taken is not None else runs_store.run_status(db, run_id)
        if status == "awaiting_session":
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
