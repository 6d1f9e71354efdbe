"""Loading what a step decision needs from the journal, and the writes that apply it.

`finalize.decide_step` is pure; this module is its IO on both sides, shared by
the native drive loop and the session protocol (`apply.apply_decision` chooses
which of these writes a decision calls for):

* `load_spine` / `step_rows` read the step spine, outputs of earlier steps,
  route decisions and the step's unit and gate rows;
* `journal_verdict` / `judge_failure` make a gate row;
* `finish_step` completes, fails, skips or blocks the step (evidence bounded).
"""

from __future__ import annotations

import json
from typing import Any

from akm.engine.finalize import GateState, RouteBook, Verdict, gate_row_for, gate_state
from akm.engine.reduce import OutputTooLarge, bounded_evidence_json
from akm.engine.scope import step_outputs_from_evidence
from akm.plan.model import Plan, StepPlan
from akm.record import dataclass
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.journal import Journal
from akm.store.runs import Fence, Step


@dataclass
class Spine:
    """The step rows of a run, the outputs they promoted and the route book they imply."""

    steps: list[Step]
    evidence: dict[str, Any]
    routes: RouteBook

    def row(self, step_id: str) -> Step | None:
        return next((s for s in self.steps if s.step_id == step_id), None)

    @property
    def outputs(self) -> dict[str, Any]:
        return step_outputs_from_evidence(self.evidence)


def load_spine(db: Journal, run_id: str, plan: Plan) -> Spine:
    steps = runs_store.get_steps(db, run_id)
    evidence: dict[str, Any] = {}
    for s in steps:
        if s.status == "completed" and s.evidence_json:
            try:
                evidence[s.step_id] = json.loads(s.evidence_json)
            except ValueError:
                evidence[s.step_id] = None
    routes = RouteBook.replay(run_id, plan, {s.step_id: (s.status, evidence.get(s.step_id)) for s in steps})
    return Spine(steps=steps, evidence=evidence, routes=routes)


def step_rows(db: Journal, run_id: str, step_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(dispatch rows, gate rows) of one step, as plain dicts in journal order."""
    units: list[dict[str, Any]] = []
    gates: list[dict[str, Any]] = []
    for r in units_store.unit_rows(db, run_id, step_id):
        (gates if r["phase"] == "gate" else units).append(r)
    return units, gates


def load_gate(
    db: Journal, run_id: str, step: StepPlan, spine: Spine, gate_rows: list[dict[str, Any]] | None = None
) -> GateState:
    if gate_rows is None:
        gate_rows = step_rows(db, run_id, step.step_id)[1]
    row = spine.row(step.step_id)
    return gate_state(run_id, step, gate_rows, row.gate_loop_base if row else 0)


# ---------------------------------------------------------------- writes


def journal_verdict(
    db: Journal,
    run_id: str,
    step: StepPlan,
    loop: int,
    verdict: Verdict,
    *,
    runner: str,
    engine: str | None = None,
    model: str | None = None,
    fence: Fence | None = None,
    identity: str | None = None,
) -> None:
    """A gate row `<step>.gate:l<loop>` carrying the verdict (a rejection advances the loop). `identity`: the
    verdict's (`gates.verdict_identity`), kept as the row's input hash so an identical question is not asked
    again."""
    row_id = gate_row_for(step.step_id, loop)
    started = units_store.insert_unit(
        db,
        run_id=run_id,
        unit_id=row_id,
        step_id=step.step_id,
        node_id=step.gate.id,
        phase="gate",
        runner=runner,
        engine=engine,
        model=model,
        input_hash=identity,
        fence=fence,
    )
    units_store.finish_unit(
        db,
        run_id=run_id,
        unit_id=row_id,
        started_at=started,
        status="completed",
        result_json=json.dumps(verdict.to_json(), ensure_ascii=False, separators=(",", ":")),
        fence=fence,
    )


def begin_judging(
    db: Journal,
    run_id: str,
    step: StepPlan,
    loop: int,
    *,
    runner: str,
    engine: str | None,
    model: str | None,
    fence: Fence | None = None,
    identity: str | None = None,
) -> str:
    """Insert the gate row before a judge runs (so a crash mid-judgement is visible); returns its stamp."""
    return units_store.insert_unit(
        db,
        run_id=run_id,
        unit_id=gate_row_for(step.step_id, loop),
        step_id=step.step_id,
        node_id=step.gate.id,
        phase="gate",
        runner=runner,
        engine=engine,
        model=model,
        input_hash=identity,
        fence=fence,
    )


def finish_judging(
    db: Journal,
    run_id: str,
    step: StepPlan,
    loop: int,
    started_at: str,
    verdict: Verdict | None,
    *,
    error: str | None = None,
    tokens: int | None = None,
    fence: Fence | None = None,
) -> None:
    """Finish the gate row: a verdict, or (fail-closed) a failed judge with no verdict."""
    row_id = gate_row_for(step.step_id, loop)
    if verdict is not None:
        units_store.finish_unit(
            db,
            run_id=run_id,
            unit_id=row_id,
            started_at=started_at,
            status="completed",
            result_json=json.dumps(verdict.to_json(), ensure_ascii=False, separators=(",", ":")),
            tokens=tokens,
            fence=fence,
        )
    else:
        units_store.finish_unit(
            db,
            run_id=run_id,
            unit_id=row_id,
            started_at=started_at,
            status="failed",
            result_json=json.dumps(error, ensure_ascii=False) if error else None,
            failure_reason="dispatch_error",
            tokens=tokens,
            fence=fence,
        )


def finish_step(
    db: Journal,
    run_id: str,
    step_id: str,
    status: str,
    *,
    summary: str | None,
    notes: str | None,
    evidence: dict[str, Any] | None,
    lease_holder: str | None,
    status_detail: dict[str, Any] | None = None,
    fence: Fence | None = None,
) -> tuple[str, str | None, list[str]]:
    """Complete the step through the store's one spine advance. Returns (status, notes, warnings).

    An artifact too large to journal fails the step instead of storing it truncated.
    """
    warnings: list[str] = []
    evidence_text = None
    if evidence is not None:
        try:
            evidence_text, truncated = bounded_evidence_json(evidence)
        except OutputTooLarge as exc:
            status, summary, notes = "failed", None, f'Step "{step_id}" cannot complete: {exc}.'
            evidence_text, truncated = bounded_evidence_json({"error": notes})
        if truncated:
            warnings.append(
                f"step {step_id}: per-unit evidence exceeded 1 MiB and was stored abridged "
                "(the step output is kept whole)"
            )
    runs_store.complete_step(
        db,
        run_id,
        step_id,
        status,
        notes=notes,
        evidence_json=evidence_text,
        summary=summary,
        lease_holder=lease_holder,
        status_detail=status_detail,
        fence=fence,
    )
    return status, notes, warnings


def judge_with_engine(
    db: Journal,
    run_id: str,
    plan: Plan,
    step: StepPlan,
    loop: int,
    *,
    result: Any,
    artifact: Any,
    dispatcher: Any,
    cwd: str,
    cancel: Any,
    fence: Fence | None = None,
) -> tuple[Verdict | None, str | None]:
    """Ask the step's frozen judge engine for this loop's verdict and journal it as the gate row.

    The one judge call of the drive loop and of a report. Returns (verdict, None), or (None, why) when the
    judge failed or answered something that is not a verdict (fail-closed; the row is finished `failed`).
    """
    from pathlib import Path

    from akm.dispatch.base import UnitRequest
    from akm.engine import gates
    from akm.engine.env_bindings import project_sensitive_values

    name, snapshot = gates.judge_engine(plan, step)
    kind: str | None = (snapshot or {}).get("kind")
    judge = step.gate.judge
    model = (judge.model if judge else None) or (snapshot or {}).get("model")
    identity = gates.verdict_identity(plan, step, result, artifact)
    started = begin_judging(
        db, run_id, step, loop, runner=kind or "judge", engine=name, model=model, fence=fence, identity=identity
    )
    verdict: Verdict | None
    error: str | None
    tokens: int | None
    if dispatcher is None:
        verdict, error, tokens = None, f"no dispatcher for the judge engine {name!r} ({kind})", None
    else:
        summary = gates.artifact_summary(
            result.unit_count if result else 0, result.failed_units if result else 0, artifact
        )
        request = UnitRequest(
            run_id=run_id,
            step_id=step.step_id,
            unit_id=step.gate.id,
            attempt_id=gate_row_for(step.step_id, loop),
            kind=kind or "",  # a dispatcher exists only for an engine snapshot that names its kind
            cwd=cwd,
            prompt=gates.judge_prompt(step, summary),
            system_prompt=gates.JUDGE_SYSTEM_PROMPT,
            output_schema=gates.VERDICT_SCHEMA,
            timeout_ms=judge.timeout_ms if judge else None,
            engine_name=name,
            engine=snapshot,
            model=model,
            sensitive_values=project_sensitive_values(Path(cwd)),
        )
        verdict, error, tokens = gates.run_engine_judge(dispatcher, request, cancel)
    finish_judging(db, run_id, step, loop, started, verdict, error=error, tokens=tokens, fence=fence)
    return verdict, error


def judge_failure(step: StepPlan, error: str | None) -> tuple[str, dict[str, Any]]:
    """(notes, run status detail) of a step blocked because its judge failed (fail-closed, no loop consumed)."""
    notes = (
        f'Step "{step.step_id}" could not be judged ({error}); gates are fail-closed, so the step is blocked. '
        "No gate loop was consumed: resuming the run judges it again."
    )
    return notes, {"kind": "judge_failed", "stepId": step.step_id, "error": error}
