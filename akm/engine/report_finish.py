"""Finishing a step after a report: where a report decides its step, once, under the finalize lock.

After its write commits, a report takes the run lease briefly (the finalize lock; another report's is waited
for, the engine's is left alone), reads the whole step and decides it (`current_step.decided`), and applies
the decision through `apply.apply_decision` — the one way a step finishes, shared with the drive loop. It
decides again only when applying journaled something that changes the answer (a verdict: a judged artifact,
a rejection's next loop), as the drive loop does. A report never drives further steps: `workflow run` does.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from akm.codes import Code
from akm.engine import reuse
from akm.engine.apply import AGAIN, PARKED, Applied, apply_decision, pass_failed
from akm.engine.current_step import CurrentStep, decided, read_current
from akm.engine.finalize import PENDING, RUNNING, StepDecision, UnitState
from akm.engine.session_types import OutcomeKind, StepOutcome
from akm.engine.state import LoadedRun
from akm.engine.stepctx import finish_step
from akm.errors import AkmError, InternalError
from akm.plan.model import StepPlan
from akm.record import dataclass
from akm.store import runs as runs_store
from akm.store.journal import Journal
from akm.store.status import DRIVABLE_STATUSES, REPORT_LOCK_PREFIX

FINALIZE_WAIT_S = 30.0
# Each pass journals a verdict or finishes the step, so a step settles in a few; this bounds a bug.
MAX_SETTLE_PASSES = 1000


@dataclass(frozen=True)
class Settled:
    """What finishing the step after a report came to. `current`: the step as last read and decided (the
    brief a report answers with is built from it); None when this report did not finish the step."""

    message: str
    remaining_units: int = 0
    step_outcome: StepOutcome | None = None
    current: CurrentStep | None = None


def unreported(states: list[UnitState], claimed: str | None = None) -> int:
    """`remainingUnits`: the units of the step with no result yet — never reported, or only claimed (and the
    unit being claimed now). A failure that `retry.on` lets be re-run is reported: it keeps the step open
    and the brief offers it as `rerun`, but it is not counted here (as upstream)."""
    return sum(1 for s in states if s.status in (PENDING, RUNNING) or s.unit.base_id == claimed)


def settle_written(
    db: Journal,
    run_id: str,
    project_root: Path,
    registry: Any,
    *,
    budget_message: str | None = None,
    prior: LoadedRun | None = None,
) -> Settled:
    """`settle` after the report's write committed. The write stands whatever happens next: a run
    abandoned (or otherwise stopped) between the write and the step's finish is answered as written —
    the step is simply not finished — never as a refusal (a report that raced an abandon was committed)."""
    try:
        return settle(db, run_id, project_root, registry, budget_message=budget_message, prior=prior)
    except AkmError as exc:
        if exc.code not in (Code.RUN_ABANDONED, Code.RUN_NOT_ACTIVE, Code.RUN_NOT_FOUND):
            raise
        run = runs_store.get_run(db, run_id)
        now = run.status if run is not None else "gone"
        return Settled(
            f"Recorded. The run is {now} now (it stopped after this report was written), so its step was not finished."
        )


def settle(
    db: Journal,
    run_id: str,
    project_root: Path,
    registry: Any,
    *,
    budget_message: str | None = None,
    prior: LoadedRun | None = None,
) -> Settled:
    """Decide the current step and apply the decision until it needs more work or finishes. `budget_message`:
    a budget ceiling this report reached: the step fails with it."""
    lock = _acquire_finalize_lock(db, run_id)
    if lock is None:
        return Settled("Recorded. Another driver is finishing this step.")
    try:
        restored_loop: int | None = None
        for _ in range(MAX_SETTLE_PASSES):
            cur = read_current(db, run_id, prior=prior)
            prior = cur.loaded
            step, d = cur.step, decided(db, cur)
            if step is None or d is None:
                return Settled("Recorded.", current=cur)
            if d.kind == "work" and restored_loop != d.loop and budget_message is None:
                # A new gate loop's units a rewind superseded with the same identity: restored, as the drive
                # loop restores them (the same graph either way).
                restored_loop = d.loop
                if reuse.restore(db, cur.loaded, step, d):
                    continue
            fx = _ReportEffects(db, cur, lock, project_root, registry)
            if budget_message is not None:
                apply_decision(fx, step, pass_failed(d, budget_message))
                outcome = StepOutcome("failed", summary=budget_message)
                return Settled(f"Step {step.step_id} failed: {budget_message}.", 0, outcome, cur)
            applied = apply_decision(fx, step, d)
            if applied.next != AGAIN:
                return _settled(cur, step, d, applied)
        raise InternalError(f"Run {run_id}: finishing step did not converge.", code=Code.INTERNAL_LOOP)
    finally:
        runs_store.release_lease(db, run_id, lock)


def _settled(cur: CurrentStep, step: StepPlan, d: StepDecision, applied: Applied) -> Settled:
    """What an applied decision means for the agent: work left, a verdict awaited, or the step's end."""
    if d.kind == "work":
        return _work_left(cur, step, d)
    if applied.next == PARKED:  # the gate awaits the agent's verdict
        return Settled(
            f"Step {step.step_id}'s units are done; its gate needs your verdict (the judge brief is in this answer).",
            0,
            StepOutcome("awaiting_verdict", gate_loop=d.loop),
            cur,
        )
    if applied.judge_failed:
        summary = (applied.notes or "").strip() or None  # as stored
        return Settled(f"Step {step.step_id} is blocked: its judge failed.", 0, StepOutcome("blocked", summary), cur)
    status, notes = applied.status, applied.notes
    assert status is not None
    kind = _OUTCOME_OF[status]
    detail = d.detail or {}
    outcome = StepOutcome(
        kind,
        summary=d.summary if status == "completed" else notes,
        missing=detail.get("missing"),
        feedback=detail.get("feedback"),
    )
    message = {
        "completed": f"Step {step.step_id} completed: continue the run to go on.",
        "failed": f"Step {step.step_id} failed: {notes}",
        "blocked": f"Step {step.step_id} is blocked: {notes}",
    }[status]
    return Settled(message, 0, outcome, cur)


_OUTCOME_OF: dict[str, OutcomeKind] = {"completed": "completed", "failed": "failed", "blocked": "blocked"}


def _work_left(cur: CurrentStep, step: StepPlan, d: StepDecision) -> Settled:
    """Units of the step still need a report (or the gate sent the step to its next loop)."""
    left = unreported(d.units)
    rerunnable = len(d.units) - left
    gate = cur.gate
    assert gate is not None
    if gate.loop > 1 and d.loop == gate.loop and gate.feedback is not None and all(s.row is None for s in d.states):
        outcome = StepOutcome(
            "next_loop", gate_loop=d.loop, feedback=gate.feedback["feedback"], missing=gate.feedback["missing"]
        )
        return Settled(
            f"Step {step.step_id} goes to gate loop {d.loop}: redo its units with the feedback (the brief is in "
            "this answer).",
            left,
            outcome,
            cur,
        )
    parts = [f"{left} unit(s) of step {step.step_id} still need a report"] if left else []
    if rerunnable:
        parts.append(
            f"{rerunnable} failed unit(s) of step {step.step_id} may be re-run (their retry.on lists "
            "the reason): do them again and report with rerun"
        )
    return Settled("Recorded. " + "; ".join(parts) + ".", left, None, cur)


# ---------------------------------------------------------------- the finalize lock and the effects


def _acquire_finalize_lock(db: Journal, run_id: str) -> str | None:
    """The run lease, held briefly by this report while it finishes the step; waits for another report's."""
    holder = f"{REPORT_LOCK_PREFIX}{uuid.uuid4()}"
    deadline = time.monotonic() + FINALIZE_WAIT_S
    delay = 0.01
    while True:
        live = runs_store.acquire_lease(db, run_id, holder)
        if live is None:
            return holder
        if not live.holder.startswith(REPORT_LOCK_PREFIX) or time.monotonic() > deadline:
            return None  # the engine took over (it finishes the step itself), or a stuck reporter
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _park(db: Journal, run_id: str, stub: dict[str, Any]) -> None:
    """Mark the run as waiting for the agent (a no-op when it already says exactly that)."""
    run = runs_store.get_run(db, run_id)
    if run is None or run.status not in DRIVABLE_STATUSES:
        return
    if run.status == "awaiting_session" and run.status_detail == stub:
        return
    runs_store.set_run_status(db, run_id, "awaiting_session", stub)


class _ReportEffects:
    """`apply.Effects` for a report finishing its step under the finalize lock: unfenced writes, no
    bookkeeping, a judge nobody cancels."""

    park_without_judge_dispatcher = False  # the plan names a judge engine: without its dispatcher it fails
    fence: runs_store.Fence | None = None  # a report holds the finalize lock, not a driver's fence

    def __init__(self, db: Journal, cur: CurrentStep, lock: str, project_root: Path, registry: Any) -> None:
        self.db = db
        self.run_id = cur.run_id
        self.plan = cur.loaded.plan
        self.cwd = str(project_root)
        self.lock = lock
        self.registry = registry

    def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def dispatcher_for(self, kind: str) -> Any:
        if self.registry is None:
            from akm.dispatch.registry import default_registry

            self.registry = default_registry()
        return self.registry.get(kind)

    @contextmanager
    def judging(self) -> Iterator[threading.Event]:
        yield threading.Event()

    def interrupted(self) -> bool:
        return False

    def record(self, step_id: str, decision: StepDecision, *, ok: bool, summary: str | None = None) -> None:
        return None  # a report answers with the step's outcome instead

    def park(self, brief: dict[str, Any]) -> None:
        _park(self.db, self.run_id, brief)

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
        holder: str | None = self.lock
        if judge_failed:
            # A failed judge finishes the step as whoever holds the lease when it returns (a judge call may
            # outlast the finalize lock); kept as it was, see spec/engine.md §4.
            lease = runs_store.read_lease(self.db, self.run_id)
            holder = lease.holder if lease else None
        status, notes, _ = finish_step(
            self.db,
            self.run_id,
            step_id,
            status,
            summary=summary,
            notes=notes,
            evidence=evidence,
            lease_holder=holder,
            status_detail=detail,
        )
        return status, notes
