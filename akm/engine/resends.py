"""Reports of attempts that are already closed: a resend answered `idempotent`, or a stale report refused.

An agent that lost a call's answer sends the same report again, perhaps after its step finished, its gate
loop was rejected or its run ended. When the journal holds exactly that report the answer is `idempotent`
with the run's current state; a closed attempt holding other content is refused (STALE_REPORT, or
STEP_CLOSED for a finished step). A report is never counted for a later attempt than the one it answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from akm.codes import Code
from akm.dispatch.answer import AnswerError, parse_command_json
from akm.engine.current_step import CurrentStep, work_unit
from akm.engine.finalize import gate_row_for, verdict_from_value
from akm.engine.report_values import normalize_failure_reason, recorded_result, sensitive_values
from akm.engine.session_types import ReportAnswer, ReportStatus, UnitReport
from akm.errors import UsageError
from akm.plan.identity import base_of_attempt, journal_base_id
from akm.plan.model import UnitNode
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.journal import Journal
from akm.store.status import DRIVABLE_STATUSES

# ---------------------------------------------------------------- attempt ids


def asked_attempt(unit_id: str, attempt_id: str | None, gate_loop: int | None) -> str | None:
    """The journal id of the attempt a report says it answers (None: it names none)."""
    if attempt_id is not None:
        return base_of_attempt(attempt_id)
    if gate_loop is not None:
        return journal_base_id(content_id(unit_id), gate_loop)
    if "~l" in base_of_attempt(unit_id):
        return base_of_attempt(unit_id)  # the unit named by its attempt id
    return None


def content_id(unit_id: str) -> str:
    """`X~l3~r1` -> `X`: the unit's content id, whatever attempt of it is named."""
    head, sep, tail = base_of_attempt(unit_id).rpartition("~l")
    return head if sep and tail.isdigit() else base_of_attempt(unit_id)


def _loop_of(base_id: str) -> int:
    head, sep, tail = base_id.rpartition("~l")
    return int(tail) if sep and tail.isdigit() else 1


# ---------------------------------------------------------------- refusals


def stale(cur: CurrentStep, unit_id: str, asked: str, current: str) -> UsageError:
    """STALE_REPORT: the report answers an attempt a gate loop closed."""
    return UsageError(
        f"This report answers attempt {asked} of unit {unit_id}, which is closed (gate loop {_loop_of(asked)}); the "
        f"current attempt is {current} (gate loop {_loop_of(current)}). Nothing was recorded: do the unit again "
        "from the current brief (its context carries the gate's feedback) and report that.",
        code=Code.STALE_REPORT,
        details={"attemptId": asked, "currentAttemptId": current, "stepId": cur.step.step_id if cur.step else None},
    )


def step_closed(cur: CurrentStep, unit_id: str, step_id: str | None) -> UsageError:
    """A report for a unit of a step the run finished: its output is fixed until the run goes back to it."""
    where = f"The run is on step {cur.step.step_id}" if cur.step is not None else f"The run is {cur.loaded.status}"
    return UsageError(
        f"Unit {unit_id} belongs to step {step_id}, which is finished: its output is fixed (later steps were built "
        f"on it) and this report was not recorded. {where}; to change {step_id}'s output, rewind the run to "
        f"step {step_id} (its units are offered again; later steps are redone only where their inputs change).",
        code=Code.STEP_CLOSED,
        details={
            "runId": cur.run_id,
            "stepId": step_id,
            "currentStep": cur.step.step_id if cur.step is not None else None,
        },
    )


# ---------------------------------------------------------------- resends


def resent_report(db: Journal, cur: CurrentStep, req: UnitReport, project_root: Path) -> ReportAnswer | None:
    """The answer to a report of an attempt that is already closed and holds exactly this content, else None.

    Closed: the run no longer takes reports, the unit is not in the current step's work, or the report names
    an earlier gate loop. A report of a unit of the current step that names no attempt answers the current
    one, as the drive loop counts an answer (a loop-2 answer identical to the rejected loop-1 one is not a
    resend); a resend recognised across a gate loop names its attempt (the brief's `report` does). A closed
    attempt holding other content is refused (STALE_REPORT for a rejected loop of the current step; a
    finished step or run keeps its own refusal, in the report's guards).
    """
    cid = content_id(req.unit_id)
    rows = _finished_rows(db, cur.run_id, cid)
    if not rows:
        return None
    current = _current_attempt(cur, cid)
    asked = asked_attempt(req.unit_id, req.attempt_id, req.gate_loop)
    if current is not None and (asked is None or asked == current):
        return None  # the current attempt: the normal path (and write_report's own idempotence)
    closed = rows if asked is None else [r for r in rows if base_of_attempt(r["unit_id"]) == asked]
    if not closed:
        return None
    recorded = _as_recorded(cur, closed[-1]["step_id"], req, cid, project_root)
    if recorded is None:
        return None  # not what was recorded, and not even recordable: the normal path refuses it
    same = next((r for r in reversed(closed) if _row_content(r) == recorded), None)
    if same is None:
        refusal = _other_content(cur, cid, asked, current, closed[-1]["step_id"])
        if refusal is not None:
            raise refusal
        return None  # an ended run: the report's guards say why it is refused
    base = base_of_attempt(same["unit_id"])
    return resend_answer(db, cur, same["step_id"], cid, base, req.status, _loop_of(base))


def _other_content(
    cur: CurrentStep, cid: str, asked: str | None, current: str | None, step_id: str | None
) -> UsageError | None:
    """The refusal of a report naming a closed attempt that holds other content: STALE_REPORT for an earlier
    loop of a unit of the current work, STEP_CLOSED for a unit of a finished step; None for an ended run."""
    if current is not None and asked is not None:
        return stale(cur, cid, asked, current)
    if cur.loaded.run.status in DRIVABLE_STATUSES and cur.step is not None and step_id != cur.step.step_id:
        return step_closed(cur, cid, step_id)
    return None


def _finished_rows(db: Journal, run_id: str, cid: str) -> list[dict[str, Any]]:
    """The unit's attempts, of every step and loop, that finished (completed or failed), oldest first."""
    return [r for r in units_store.family_rows(db, run_id, cid) if r["status"] in ("completed", "failed")]


def _current_attempt(cur: CurrentStep, cid: str) -> str | None:
    """The journal base id of the unit's current attempt when it is in the current work of a drivable run."""
    if cur.loaded.run.status not in DRIVABLE_STATUSES:
        return None
    unit = work_unit(cur, cid)
    return unit.base_id if unit is not None and unit.unit_id == cid else None


def _row_content(row: dict[str, Any]) -> tuple[str, str | None, str | None]:
    return row["status"], row["result_json"], row["failure_reason"] or None


def _as_recorded(
    cur: CurrentStep, step_id: str | None, req: UnitReport, cid: str, project_root: Path
) -> tuple[str, str | None, str | None] | None:
    """(status, result_json, failure reason) as a row of `step_id` would hold this report; None when it could
    not be recorded there at all."""
    template = _template_of(cur, step_id)
    if template is None:
        return None
    try:
        sensitive = sensitive_values(template, project_root)
        result_json = recorded_result(cid, template, req.status, req.result, sensitive)
        reason = normalize_failure_reason(req.failure_reason, sensitive) if req.status == "failed" else None
    except UsageError:
        return None
    return req.status, result_json, reason or None


def _template_of(cur: CurrentStep, step_id: str | None) -> UnitNode | None:
    step = cur.loaded.plan.step(step_id) if step_id else None
    return step.unit_template if step is not None else None


def resent_verdict(db: Journal, cur: CurrentStep, req: UnitReport) -> ReportAnswer | None:
    """The answer to a verdict resent for a gate loop that already has exactly this verdict, else None
    (a different verdict for a closed loop is STALE_REPORT)."""
    step_id, _, loop_text = req.unit_id.partition(".gate:l")
    if not loop_text:
        if req.gate_loop is None or not req.unit_id.endswith(".gate"):
            return None
        step_id, loop_text = req.unit_id[: -len(".gate")], str(req.gate_loop)
    if not loop_text.isdigit():
        return None
    row_id = gate_row_for(step_id, int(loop_text))
    row = units_store.get_unit(db, cur.run_id, row_id)
    if row is None or row.phase != "gate" or row.status != "completed":
        return None
    parsed = _verdict_of(req.verdict)
    if parsed is None:
        return None
    recorded = json.loads(row.result_json) if row.result_json else None
    if recorded != parsed:
        raise UsageError(
            f"Gate loop {loop_text} of step {step_id} already has a verdict ({row.result_json}); a different one "
            "for it is never counted for a later loop. Nothing was recorded: fetch the current brief.",
            code=Code.STALE_REPORT,
            details={"unitId": row_id, "recorded": recorded},
        )
    return resend_answer(db, cur, step_id, row_id, row_id, "completed", int(loop_text))


def _verdict_of(value: Any) -> dict[str, Any] | None:
    """The verdict a report carries, as its gate row would hold it (None: not a readable verdict)."""
    if isinstance(value, str):
        try:
            value = parse_command_json(value)
        except AnswerError:
            return None
    parsed = verdict_from_value(value)
    return parsed.to_json() if parsed is not None else None


def resend_answer(
    db: Journal, cur: CurrentStep, step_id: str, unit_id: str, attempt: str, status: ReportStatus, loop: int
) -> ReportAnswer:
    """`idempotent`: the journal already holds this report; nothing changed, and the answer says where the
    run is now."""
    run = runs_store.require_run(db, cur.run_id)
    where = (
        f"the run is {run.status}"
        if run.status not in DRIVABLE_STATUSES
        else f"the run is {run.status} on step {run.current_step_id}"
    )
    return ReportAnswer(
        run_id=cur.run_id,
        step_id=step_id,
        unit_id=unit_id,
        attempt_id=attempt,
        status=status,
        recorded="idempotent",
        gate_loop=loop,
        run_status=run.status,
        message=f"Already recorded: {unit_id} (gate loop {loop}) holds exactly this; nothing changed — {where}.",
    )
