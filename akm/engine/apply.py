"""One way to apply a step decision: the journal writes `finalize.decide_step`'s answer calls for.

`decide_step` says what happens next; this module does it, for both drivers of a run: the native drive
loop (`drive.py`) and a report finishing its step (`session.py`). Before, each carried its own switch over
the decision kinds, and they could drift; now the same function writes the same gate rows, parks the run
with the same brief stub and finishes the step with the same status, summary, notes, evidence and detail,
which is what makes a natively driven run and a report-driven one journal the same graph
(tests/test_parity.py).

What the two drivers really do differently is handed in as `Effects`:

* **who dispatches**: only the drive loop runs units; it dispatches a pass *before* asking this module
  (a `work` decision that reaches here is work left for the calling agent: the run is parked);
* **how a write is fenced**: the drive loop writes under its lease fence and turns a lost lease into
  its own error; a report writes under its short finalize lock, unfenced;
* **bookkeeping**: the drive loop keeps one `executed` entry per finished loop, progress callbacks and
  warnings; a report answers with a step outcome built from what `apply_decision` returns;
* **the judge**: the drive loop links its cancellation and lease loss to the judge call and may stop
  after it; a report's judge is never cancelled.

Nothing here decides: every branch follows the decision's kind.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any, Callable, Protocol

from akm.engine.finalize import StepDecision
from akm.engine.stepctx import journal_verdict, judge_failure, judge_with_engine
from akm.plan.model import Plan, StepPlan
from akm.record import dataclass
from akm.store.journal import Journal
from akm.store.runs import Fence

# What the driver does after `apply_decision`:
AGAIN = "again"  # decide again: a verdict was journaled (a new loop, or a judged artifact)
PARKED = "parked"  # the run awaits the calling agent (its units, or its verdict); stop driving
FINISHED = "finished"  # the step ended (`status`); the drive goes on only when it completed
STOPPED = "stopped"  # the driver was cancelled while judging; nothing was concluded

# The decision kinds that end the step, and the step status each writes.
TERMINAL_STATUS = {"complete": "completed", "fail": "failed", "block": "blocked"}


@dataclass(frozen=True)
class Applied:
    """What applying one decision did (the driver's next move and what it needs to say about it)."""

    next: str  # AGAIN | PARKED | FINISHED | STOPPED
    status: str | None = None  # FINISHED: the status the step got (a too-large artifact fails a completion)
    notes: str | None = None  # FINISHED: the notes written with it
    judge_failed: bool = False  # FINISHED because the engine judge failed (fail-closed), not by the decision


class Effects(Protocol):
    """The driver-specific half of applying a decision (see the module docstring)."""

    db: Journal
    run_id: str
    plan: Plan
    fence: Fence | None  # the drive loop's lease fence; None for a report (it holds the finalize lock)
    cwd: str  # where an engine judge runs (the project root)
    # A judge engine named by the plan but with no dispatcher here: the drive loop parks the run for the
    # calling agent, a report fails the judge (the step blocks). Kept as it was; see spec/engine.md §4.
    park_without_judge_dispatcher: bool

    def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one journal write (the drive loop maps a fenced-out write to its lost-lease error)."""
        ...

    def dispatcher_for(self, kind: str) -> Any:
        """The dispatcher of a judge engine's kind, or None."""
        ...

    def judging(self) -> AbstractContextManager[threading.Event]:
        """The cancellation an engine judge call watches, linked for the call's duration."""
        ...

    def interrupted(self) -> bool:
        """After a judge call: stop now? (The drive loop raises if its lease was lost.)"""
        ...

    def record(self, step_id: str, decision: StepDecision, *, ok: bool, summary: str | None = None) -> None:
        """Note one finished loop of the step (the drive loop's `executed` list; a report keeps none)."""
        ...

    def park(self, brief: dict[str, Any]) -> None:
        """Mark the run `awaiting_session` with this status detail."""
        ...

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
        """End the step through `stepctx.finish_step`; returns (status written, notes written)."""
        ...


def units_brief(step: StepPlan, decision: StepDecision) -> dict[str, Any]:
    """The status detail of a run parked on its step's units (the agent does them)."""
    return {"kind": "units", "stepId": step.step_id, "gateLoop": decision.loop}


def judge_brief(step: StepPlan, decision: StepDecision) -> dict[str, Any]:
    """The status detail of a run parked on its step's verdict (the agent judges it)."""
    return {"kind": "judge", "stepId": step.step_id, "gateLoop": decision.loop}


def pass_failed(decision: StepDecision, reason: str) -> StepDecision:
    """A step that fails whatever `on_error` says: a dispatch pass that cannot be reduced (env binding,
    isolation, unit cap, budget, unjournaled results) or a report refused by the budget. Applied like
    any `fail` decision, so both drivers journal it the same way."""
    return StepDecision("fail", loop=decision.loop, notes=reason, evidence={"error": reason})


def apply_decision(fx: Effects, step: StepPlan, decision: StepDecision) -> Applied:
    """Do what `decision` says for `step`: journal a verdict, park the run, judge, or finish the step."""
    kind = decision.kind
    if kind == "work":
        # Units remain that this driver does not run (the drive loop dispatched its pass already).
        fx.park(units_brief(step, decision))
        return Applied(PARKED)
    if kind == "retry":
        # The artifact missed its `output` schema with loops left: journal the rejection; the next loop re-runs.
        assert decision.verdict is not None
        fx.record(step.step_id, decision, ok=False)
        fx.write(
            journal_verdict, fx.db, fx.run_id, step, decision.loop, decision.verdict, runner="schema", fence=fx.fence
        )
        return Applied(AGAIN)
    if kind == "judge":
        return _judge(fx, step, decision)
    if kind not in TERMINAL_STATUS:
        raise ValueError(f"unknown step decision {kind!r}")
    status = TERMINAL_STATUS[kind]
    completed = status == "completed"
    fx.record(step.step_id, decision, ok=completed, summary=decision.summary if completed else decision.notes)
    status, notes = fx.finish(
        step.step_id,
        status,
        summary=decision.summary if completed else None,
        notes=None if completed else decision.notes,
        evidence=decision.evidence,
        detail=decision.detail if status == "blocked" else None,
        judge_failed=False,
    )
    return Applied(FINISHED, status=status, notes=notes)


def _judge(fx: Effects, step: StepPlan, decision: StepDecision) -> Applied:
    """A verdict for the current loop: from the step's judge engine now, or from the calling agent later."""
    from akm.engine import gates  # a gate's judging (and the answer parsing it needs): only for a step with a gate
    from akm.engine.reuse import restore_verdict
    from akm.store.runs import get_run

    # The same question answered before (a rewind's history, a `--from` run): its verdict, not a new judgement.
    run = get_run(fx.db, fx.run_id)
    if run is not None and restore_verdict(
        fx.db, fx.run_id, run.reuse_from, fx.plan, step, decision, fence=fx.fence, write=fx.write
    ):
        return Applied(AGAIN)
    name, snapshot = gates.judge_engine(fx.plan, step)
    kind = (snapshot or {}).get("kind")
    dispatcher = fx.dispatcher_for(kind) if (name is not None and kind) else None
    if name is None or (dispatcher is None and fx.park_without_judge_dispatcher):
        fx.record(step.step_id, decision, ok=True)
        fx.park(judge_brief(step, decision))
        return Applied(PARKED)
    with fx.judging() as cancel:
        verdict, error = fx.write(
            judge_with_engine,
            fx.db,
            fx.run_id,
            fx.plan,
            step,
            decision.loop,
            result=decision.result,
            artifact=decision.artifact,
            dispatcher=dispatcher,
            cwd=fx.cwd,
            cancel=cancel,
            fence=fx.fence,
        )
    if fx.interrupted():
        return Applied(STOPPED)
    if verdict is None:
        # Fail-closed: no verdict, no loop consumed; the step is blocked until the run is resumed.
        why, detail = judge_failure(step, error)
        fx.record(step.step_id, decision, ok=False, summary=why)
        status, notes = fx.finish(
            step.step_id,
            "blocked",
            summary=None,
            notes=why,
            evidence=decision.evidence,
            detail=detail,
            judge_failed=True,
        )
        return Applied(FINISHED, status=status, notes=notes, judge_failed=True)
    if not verdict.complete:
        fx.record(step.step_id, decision, ok=False, summary=f"gate rejected: {verdict.feedback}")
    return Applied(AGAIN)
