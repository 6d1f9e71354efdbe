"""The session protocol's results as the fronts see them: the engine's typed records in camelCase JSON.

The engine answers with `akm.engine.session_types` records; these views are the one place their JSON keys
are written. A plain dict each (no pydantic): the run view's `awaiting` brief is built on the read path.
`_session` validates them into the api's models (`Brief`, `ReportResult`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from akm.engine.session_types import (
        Brief,
        BriefUnit,
        Claim,
        JudgeBrief,
        ReportAnswer,
        ReportHint,
        StepOutcome,
        UnitContext,
    )


def brief_json(b: Brief, units: list[BriefUnit] | None = None) -> dict[str, Any]:
    """A brief (with `units` instead of its own, when given: a brief narrowed to one unit)."""
    return {
        "runId": b.run_id,
        "status": b.status,
        "done": b.done,
        "active": b.active,
        "kind": b.kind,
        "stepId": b.step_id,
        "stepTitle": b.step_title,
        "instructions": b.instructions,
        "gateLoop": b.gate_loop,
        "maxLoops": b.max_loops,
        "gateFeedback": b.gate_feedback,
        "units": [_unit_json(u) for u in (b.units if units is None else units)],
        "unitCount": b.unit_count,
        "doneCount": b.done_count,
        "judge": _judge_json(b.judge) if b.judge is not None else None,
        "message": b.message,
        "warnings": list(b.warnings),
    }


def _unit_json(u: BriefUnit) -> dict[str, Any]:
    return {
        "unitId": u.unit_id,
        "attemptId": u.attempt_id,
        "inputHash": u.input_hash,
        "action": u.action,
        "resultKind": u.result_kind,
        "env": u.env,
        "envBindings": u.env_bindings,
        "runner": u.runner,
        "prompt": u.prompt,
        "outputSchema": u.output_schema,
        "context": _context_json(u.context),
        "claim": _claim_json(u.claim),
        "lastFailure": u.last_failure,
        "report": _hint_json(u.report),
    }


def _context_json(c: UnitContext) -> dict[str, Any]:
    """A unit's context; a fan-out's unit adds its item and index (a solo unit has neither key)."""
    out: dict[str, Any] = {"params": c.params, "inputs": c.inputs, "gateFeedback": c.gate_feedback}
    if c.fan_out:
        out["item"] = c.item
        out["itemIndex"] = c.item_index
    return out


def _judge_json(j: JudgeBrief) -> dict[str, Any]:
    return {
        "unitId": j.unit_id,
        "criteria": j.criteria,
        "artifact": j.artifact,
        "summary": j.summary,
        "prompt": j.prompt,
        "verdictSchema": j.verdict_schema,
        "report": _hint_json(j.report),
    }


def _hint_json(h: ReportHint) -> dict[str, Any]:
    return {
        "runId": h.run_id,
        "unitId": h.unit_id,
        "attemptId": h.attempt_id,
        "gateLoop": h.gate_loop,
        "expectStep": h.expect_step,
        "status": h.status,
        "rerun": h.rerun,
    }


def _claim_json(c: Claim | None) -> dict[str, Any] | None:
    return {"holder": c.holder, "expiresAt": c.expires_at} if c is not None else None


def _outcome_json(o: StepOutcome | None) -> dict[str, Any] | None:
    if o is None:
        return None
    return {"kind": o.kind, "summary": o.summary, "gateLoop": o.gate_loop, "missing": o.missing, "feedback": o.feedback}


def report_json(a: ReportAnswer) -> dict[str, Any]:
    """A report's answer."""
    return {
        "runId": a.run_id,
        "stepId": a.step_id,
        "unitId": a.unit_id,
        "attemptId": a.attempt_id,
        "status": a.status,
        "recorded": a.recorded,
        "gateLoop": a.gate_loop,
        "claim": _claim_json(a.claim),
        "remainingUnits": a.remaining_units,
        "stepOutcome": _outcome_json(a.step_outcome),
        "runStatus": a.run_status,
        "message": a.message,
        "brief": brief_json(a.brief) if a.brief is not None else None,
    }
