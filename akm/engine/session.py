"""The session protocol: the calling agent does units and judges gates, then reports them (D11-D13).

Two halves:

* `brief(db, run_id)` (`briefs.py`) — read-only. What the current step needs from the agent: its session
  units or a verdict for its gate, as a typed `Brief`.
* `report(db, UnitReport(...), project_root=...)` — records one unit result, a claim or a verdict behind
  guards that each refuse with a coded error and write nothing, then, when that completes the step's work,
  finishes the step (`report_finish.settle`: the step decided once, after the write, and applied through
  `apply.apply_decision` — the one way a step finishes, shared with the drive loop). Before its write a
  report reads only what its guards need: the gate, the work list and its own unit's rows. A report never
  drives further steps: `workflow run` does that.

Claims (D13): `status: running` claims a unit for its reporter (90 s, renewed by reporting running again); a
live claim of another holder refuses other reports, and the native engine never dispatches a claimed unit.
The request and the results are the typed records of `session_types`; the api's views give them their JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from akm.codes import Code
from akm.dispatch.answer import AnswerError, parse_command_json
from akm.dispatch.redact import redact_text, redact_value
from akm.engine import gates
from akm.engine.briefs import brief, brief_of
from akm.engine.budget import MAX_UNIT_TOKENS as MAX_REPORT_TOKENS
from akm.engine.current_step import (
    CurrentStep,
    all_states,
    decided,
    read_current,
    takes_verdict,
    unit_state,
    work_unit,
    work_unit_ids,
)
from akm.engine.finalize import DIVERGED, Verdict, gate_row_for, verdict_from_value
from akm.engine.report_finish import Settled, settle, settle_written, unreported
from akm.engine.report_values import (
    MAX_RESULT_BYTES,
    normalize_failure_reason,
    recorded_result,
    require_recordable_size,
    sensitive_values,
)
from akm.engine.resends import asked_attempt, content_id, resent_report, resent_verdict, stale, step_closed
from akm.engine.session_types import (
    REPORT_STATUSES,
    Brief,
    Claim,
    Recorded,
    ReportAnswer,
    ReportStatus,
    StepOutcome,
    UnitReport,
)
from akm.engine.stepctx import journal_verdict
from akm.engine.worklist import WorkUnit
from akm.errors import UsageError
from akm.plan.identity import base_of_attempt
from akm.record import dataclass
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.journal import Journal
from akm.store.report_guards import replay_diverged
from akm.store.runs import Run
from akm.store.status import DRIVABLE_STATUSES


def report(db: Journal, req: UnitReport, *, project_root: Path, registry: Any = None) -> ReportAnswer:
    """Record one report and finish the step when its work is complete.

    A report answers one attempt: the brief's `attempt_id` (or `gate_loop`) names it, else the unit's current
    one. A report resent for an attempt that is already closed — its step finished, its gate loop rejected,
    the run ended — is answered `idempotent` with the run's current state when it is what the journal holds
    (an agent retrying a call whose answer it lost), and refused otherwise; it is never counted for a
    later attempt. `project_root`: the run's project (its env files redact the report; its judge runs there).
    """
    _check_arguments(req)
    cur = read_current(db, req.run_id, rows=False)
    answered = _resent(db, cur, req, project_root)
    if answered is not None:
        return answered
    _check_reportable(cur, req)
    if req.is_verdict:
        return _report_verdict(db, cur, req, project_root, registry)
    return _report_unit(db, cur, req, project_root, registry)


def _check_arguments(req: UnitReport) -> None:
    """The arguments every caller is held to (the api's request model checks them too, with the same words)."""
    if req.status not in REPORT_STATUSES:
        raise UsageError(
            f"Report status {req.status!r} is not one of {', '.join(REPORT_STATUSES)}.", code=Code.INVALID_ARGUMENT
        )
    tokens = req.tokens
    if tokens is not None and (
        not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= MAX_REPORT_TOKENS
    ):
        raise UsageError(
            f"tokens must be a whole number from 0 to {MAX_REPORT_TOKENS}.",
            code=Code.INVALID_ARGUMENT,
            details={"argument": "tokens"},
        )


def _resent(db: Journal, cur: CurrentStep, req: UnitReport, project_root: Path) -> ReportAnswer | None:
    """The answer to a resend of a closed attempt (see `resends`); a re-run or a claim is never one."""
    if req.is_new_work:
        return None
    if req.is_verdict:
        return resent_verdict(db, cur, req)
    return resent_report(db, cur, req, project_root)


def _check_reportable(cur: CurrentStep, req: UnitReport) -> None:
    """The run takes reports, has a current step, and it is the one the report expects."""
    run = cur.loaded.run
    if run.status not in DRIVABLE_STATUSES:
        raise UsageError(
            f"Run {cur.run_id} is {run.status}; it no longer takes reports.",
            code=Code.RUN_NOT_ACTIVE,
            details={"runId": cur.run_id, "status": run.status},
        )
    if cur.step is None:
        raise UsageError(f"Run {cur.run_id} has no current step.", code=Code.RUN_NOT_ACTIVE)
    expect = req.expect_step
    if expect is not None and expect != cur.step.step_id:
        done = cur.spine.row(expect)
        if done is not None and done.status == "completed":
            raise step_closed(cur, content_id(req.unit_id), expect)  # what to do is a rewind to that step
        raise UsageError(
            f"Run {cur.run_id} is now on step {cur.step.step_id}, not {expect}; fetch the current brief and "
            "report against it.",
            code=Code.STEP_MISMATCH,
            details={"currentStep": cur.step.step_id},
        )


# ---------------------------------------------------------------- a unit's result or claim


def _report_unit(db: Journal, cur: CurrentStep, req: UnitReport, project_root: Path, registry: Any) -> ReportAnswer:
    """A unit's result or claim: checked against the unit, written behind the store's guards (one
    `ReportedAttempt`), then — a result — the step settled once after the write."""
    step = cur.step
    assert step is not None
    u = _reportable_unit(db, cur, req)
    sensitive = sensitive_values(u.template, project_root)
    result_json = (
        None if req.status == "running" else recorded_result(u.unit_id, u.template, req.status, req.result, sensitive)
    )
    require_recordable_size(u.unit_id, result_json)
    budget = cur.loaded.plan.budget
    attempt = units_store.NewAttempt(
        cur.run_id, u.base_id, step.step_id, u.node_id, u.parent_unit_id, u.runner, u.engine, u.model, u.input_hash
    )
    reported = units_store.ReportedAttempt(
        attempt,
        req.status,
        result_json,
        req.tokens,
        normalize_failure_reason(req.failure_reason, sensitive) if req.status == "failed" else None,
        redact_text(req.holder, sensitive),
        req.rerun,
        max_units=budget.max_units if budget else None,
        max_tokens=budget.max_tokens if budget else None,
        max_cost=budget.max_cost if budget else None,
        allow_unknown=bool(budget and budget.unknown == "allow"),
    )
    try:
        write = units_store.write_report(db, reported)
    except UsageError as exc:
        if exc.code != Code.BUDGET_EXCEEDED:
            raise
        raise _budget_fails_the_step(db, cur.run_id, step.step_id, exc, project_root, registry) from None
    claim = Claim(write.claim.holder, write.claim.until) if write.claim else None
    assert cur.gate is not None
    if req.status == "running":
        return ReportAnswer(
            run_id=cur.run_id,
            step_id=step.step_id,
            unit_id=u.unit_id,
            attempt_id=u.base_id,
            status=req.status,
            recorded=write.recorded,
            gate_loop=cur.gate.loop,
            claim=claim,
            run_status=cur.loaded.run.status,
            remaining_units=unreported(all_states(db, cur), claimed=u.base_id),
            message=f"Unit {u.unit_id} is claimed by {claim.holder if claim else req.holder} until "
            f"{claim.expires_at if claim else '?'}; report running again to keep it, then report its result.",
        )
    settled = settle_written(
        db, cur.run_id, project_root, registry, budget_message=write.tokens_crossed, prior=cur.loaded
    )
    return _written(
        db,
        settled,
        _Recorded(cur.run_id, step.step_id, u.unit_id, u.base_id, req.status, write.recorded, cur.gate.loop, claim),
    )


def _reportable_unit(db: Journal, cur: CurrentStep, req: UnitReport) -> WorkUnit:
    """The unit of the current work the report names, checked against its own attempt rows: not diverged,
    the attempt it answers is the current one, and it is not a command unit (akm runs those)."""
    assert cur.step is not None
    u = work_unit(cur, base_of_attempt(req.unit_id))
    if u is None:
        raise _refuse_unit(db, cur, req.unit_id)
    state = unit_state(db, cur, u)
    if state.status == DIVERGED:
        raise replay_diverged(cur.run_id, state.diverged_from or u.unit_id, "completed", u.input_hash, cur.step.step_id)
    asked = asked_attempt(u.unit_id, req.attempt_id, req.gate_loop)
    if asked is not None and asked != u.base_id:
        raise stale(cur, u.unit_id, asked, u.base_id)
    if u.runner == "exec":
        raise UsageError(
            f"Unit {req.unit_id} is a command unit: akm runs it itself (continue the run); it cannot be reported.",
            code=Code.UNIT_NOT_REPORTABLE,
        )
    return u


def _refuse_unit(db: Journal, cur: CurrentStep, unit_id: str) -> UsageError:
    """UNKNOWN_UNIT, or STEP_CLOSED for a unit of a step the run already finished (a rewind reopens it)."""
    rows = units_store.family_rows(db, cur.run_id, content_id(unit_id))
    finished = [r["step_id"] for r in rows if r["step_id"] and (cur.step is None or r["step_id"] != cur.step.step_id)]
    if finished:
        return step_closed(cur, content_id(unit_id), finished[-1])
    valid = work_unit_ids(cur)
    step_id = cur.step.step_id if cur.step else None
    return UsageError(
        f"Unit {unit_id} does not belong to the current work of run {cur.run_id} (step {step_id}, gate loop "
        f"{cur.gate.loop if cur.gate else '-'}). Units of this step: {', '.join(valid) or '(none)'}.",
        code=Code.UNKNOWN_UNIT,
        details={"stepId": step_id, "units": valid},
    )


def _budget_fails_the_step(
    db: Journal, run_id: str, step_id: str, exc: UsageError, project_root: Path, registry: Any
) -> UsageError:
    """A budget ceiling ends the run as it does natively: the report is not recorded, the step and the run
    fail (a run left awaiting the agent would offer the unit forever). Returns the error to raise."""
    reason = exc.message.rstrip(".")
    settle(db, run_id, project_root, registry, budget_message=reason)
    fresh = runs_store.require_run(db, run_id)
    return UsageError(
        f"{exc.message} The report was not recorded; step {step_id} and the run are now {fresh.status}.",
        code=Code.BUDGET_EXCEEDED,
        details={"runId": run_id, "stepId": step_id, "runStatus": fresh.status},
    )


# ---------------------------------------------------------------- a gate verdict


def _report_verdict(db: Journal, cur: CurrentStep, req: UnitReport, project_root: Path, registry: Any) -> ReportAnswer:
    """A gate verdict: the step is decided before the write (is a verdict awaited, on which artifact?) and
    settled after it (what the verdict made of the step), as the drive loop decides again after a verdict."""
    step = cur.step
    assert step is not None
    parsed = _verdict(req, project_root)
    d = decided(db, cur)
    if d is None or d.kind != "judge" or not takes_verdict(cur):
        raise UsageError(
            f"Step {step.step_id} of run {cur.run_id} is not waiting for a verdict from you.",
            code=Code.NOT_AWAITING_VERDICT,
        )
    expected = gate_row_for(step.step_id, d.loop)
    if req.unit_id not in (expected, f"{step.step_id}.gate"):
        raise UsageError(
            f"The current gate verdict of step {step.step_id} is {expected}, not {req.unit_id}.",
            code=Code.UNKNOWN_UNIT,
            details={"expected": expected},
        )
    with db.tx():
        units_store.guard_session_write(db, cur.run_id)
        identity = gates.verdict_identity(cur.loaded.plan, step, d.result, d.artifact)
        journal_verdict(db, cur.run_id, step, d.loop, parsed, runner="session", identity=identity)
    settled = settle_written(db, cur.run_id, project_root, registry, prior=cur.loaded)
    return _written(
        db, settled, _Recorded(cur.run_id, step.step_id, expected, expected, "completed", "written", d.loop)
    )


def _verdict(req: UnitReport, project_root: Path) -> Verdict:
    """The report's verdict, parsed (JSON text too) and redacted; VERDICT_REQUIRED, VERDICT_INVALID."""
    verdict = req.verdict
    if verdict is None:
        raise UsageError(
            f"{req.unit_id} is a gate verdict: report it with a verdict {{complete, missing, feedback}}.",
            code=Code.VERDICT_REQUIRED,
        )
    if isinstance(verdict, str):
        try:
            verdict = parse_command_json(verdict)
        except AnswerError as exc:
            raise UsageError(f"The verdict is not JSON: {exc}.", code=Code.VERDICT_INVALID) from None
    from akm.engine.env_bindings import project_sensitive_values

    parsed = verdict_from_value(redact_value(verdict, project_sensitive_values(project_root)))
    if parsed is None:
        raise UsageError(
            'A verdict is an object {"complete": boolean, "missing": [string], "feedback": string}.',
            code=Code.VERDICT_INVALID,
        )
    if req.status != "completed":
        raise UsageError("A verdict is reported with status completed.", code=Code.INVALID_ARGUMENT)
    return parsed


# ---------------------------------------------------------------- the answer


@dataclass(frozen=True)
class _Recorded:
    """The attempt a report recorded (or found recorded), as its answer names it."""

    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    status: ReportStatus
    recorded: Recorded
    gate_loop: int
    claim: Claim | None = None


def _written(db: Journal, settled: Settled, rec: _Recorded) -> ReportAnswer:
    """The answer to a report that was recorded: what it did to the step and the run."""
    fresh = runs_store.require_run(db, rec.run_id)
    return ReportAnswer(
        run_id=rec.run_id,
        step_id=rec.step_id,
        unit_id=rec.unit_id,
        attempt_id=rec.attempt_id,
        status=rec.status,
        recorded=rec.recorded,
        gate_loop=rec.gate_loop,
        claim=rec.claim,
        run_status=fresh.status,
        remaining_units=settled.remaining_units,
        step_outcome=settled.step_outcome,
        message=_run_message(settled.message, fresh),
        brief=_brief_after(db, settled, fresh),
    )


def _brief_after(db: Journal, settled: Settled, run: Run) -> Brief | None:
    """The new brief when a report changed the agent's work within the step (a verdict is now awaited, or
    the gate opened the next loop), so that the agent needs no `next` call; else None. Built from the step
    as the report last decided it: nothing is decided again for it."""
    outcome: StepOutcome | None = settled.step_outcome
    if outcome is None or outcome.kind not in ("awaiting_verdict", "next_loop") or settled.current is None:
        return None
    return brief_of(db, settled.current, run)


def _run_message(message: str, run: Run) -> str:
    """A report's message, saying so when the report finished the whole run."""
    if run.status == "completed":
        return (
            f"{message.split(':')[0]}; run {run.id} is completed."
            if message.startswith("Step ")
            else f"Run {run.id} is completed."
        )
    return message


__all__ = [
    "MAX_RESULT_BYTES",
    "Brief",
    "ReportAnswer",
    "UnitReport",
    "brief",
    "normalize_failure_reason",
    "report",
]
