"""What a `workflow run` would do, without doing any of it (`--plan`; spec/engine.md "Preview").

The preview walks the plan as the drive loop would, with the same pure functions — the work list and its
unit identities (`worklist`), the step decision (`finalize.decide_step`), routes and the reducer — but it
journals nothing, runs nothing and asks nobody. Per step it counts the units already done in the run, those
a rewind's history or a `--from` run would restore (same content id and input hash, `engine.reuse`), those
akm would run and those the calling agent would be asked for. A step whose every unit is done or restored
has a known output (reduced from those rows), so the walk goes on through it (through its gate as if
passed, through its route as decided on that output); a step with work to do has an output nobody knows
yet, and so has every step that reads it: their units are counted as not known yet.
"""

from __future__ import annotations

from typing import Any

from akm.engine import gates
from akm.engine.finalize import DONE, RouteBook, decide_step, gate_state, has_criteria
from akm.engine.reduce import RouteError, evaluate_route, route_targets
from akm.engine.scope import step_outputs_from_evidence
from akm.engine.worklist import steps_read
from akm.plan.model import Plan, StepPlan
from akm.record import dataclass, field
from akm.store import rewinds as rewinds_store
from akm.store import units as units_store
from akm.store.journal import Journal


@dataclass
class StepForecast:
    """One step of the preview (see `akm.views.StepPreview` for what each field means)."""

    id: str
    kind: str
    status: str
    runner: str | None = None
    engine: str | None = None
    model: str | None = None
    judge: str | None = None
    units: int | None = None
    done: int = 0
    reused: int = 0
    to_run: int = 0
    for_agent: int = 0
    note: str | None = None


@dataclass
class Forecast:
    steps: list[StepForecast] = field(default_factory=list)
    first: str = ""
    warnings: list[str] = field(default_factory=list)


def _kind(step: StepPlan) -> str:
    if step.root is None:
        return "route"
    return "map" if step.root.kind == "map" else "unit"


def _describe(plan: Plan, step: StepPlan, f: StepForecast) -> None:
    """Who does the step's work: its runner, engine and model, and who judges its gate."""
    from akm.engine.worklist import runner_for

    tmpl = step.unit_template
    if tmpl is not None:
        f.runner = runner_for(tmpl, plan.execution.engines)
        inv = tmpl.invocation
        f.engine = None if tmpl.exec is not None else (inv.engine if inv else None)
        snapshot = plan.execution.engines.get(f.engine) if f.engine else None
        f.model = None if tmpl.exec is not None else ((inv.model if inv else None) or (snapshot or {}).get("model"))
    if step.root is not None and has_criteria(step):
        name, _ = gates.judge_engine(plan, step)
        f.judge = name or "agent"


def forecast(
    db: Journal | None,
    *,
    run_id: str | None,
    plan: Plan,
    params: dict[str, Any],
    hash_version: int,
    spine: Any = None,
    reuse_from: str | None = None,
) -> Forecast:
    """The preview of driving `plan` from where the run `run_id` stands (None: a new run, nothing journaled yet;
    `reuse_from`: the run whose completed units it restores). `spine`: the run's `stepctx.Spine`."""
    from akm.engine.stepctx import step_rows

    out = Forecast()
    steps_by_id = {s.step_id: s for s in (spine.steps if spine is not None else [])}
    evidence: dict[str, Any] = dict(spine.evidence) if spine is not None else {}
    routes = spine.routes if spine is not None else RouteBook()
    unknown: set[str] = set()
    stopped: str | None = None
    has_history = db is not None and run_id is not None and rewinds_store.has_donors(db, run_id, None)
    tallies = units_store.step_tallies(db, run_id) if db is not None and run_id is not None else {}
    for step in plan.steps:
        f = StepForecast(id=step.step_id, kind=_kind(step), status="pending")
        _describe(plan, step, f)
        out.steps.append(f)
        row = steps_by_id.get(step.step_id)
        if row is not None and row.status in ("completed", "skipped"):
            f.status = row.status
            tally = tallies.get(step.step_id)
            f.units = f.done = tally.units if tally is not None else 0
            continue
        if stopped is not None:
            f.status, f.note = "not_reached", stopped
            continue
        if row is not None and row.status in ("failed", "blocked"):
            f.status, f.note = row.status, (row.notes or "").strip() or None
            stopped = f"step {step.step_id} is {row.status}: resume or rewind the run first"
            out.first = out.first or stopped
            continue
        why = routes.skip_reason(step)
        if why is not None:
            routes.skip(step)
            f.status, f.note = "skipped", f"skipped: {why}"
            continue
        waits = sorted(steps_read(step) & unknown)
        if waits:
            unknown.add(step.step_id)
            f.status, f.note = "unknown", f"its units are known once {', '.join(waits)} ran"
            if step.route is not None:
                routes.mark(step.step_id, None, [])  # its branch is not known either
                for target in route_targets(step.route):
                    unknown.add(target)
            continue
        outputs = step_outputs_from_evidence(evidence)
        rows, gate_rows = step_rows(db, run_id, step.step_id) if db is not None and run_id is not None else ([], [])
        gate = gate_state(run_id or "-", step, gate_rows, row.gate_loop_base if row is not None else 0)
        decision = decide_step(
            run_id=run_id or "-",
            step=step,
            params=params,
            outputs=outputs,
            engines=plan.execution.engines,
            gate=gate,
            rows=rows,
            hash_version=hash_version,
        )
        restored: list[dict[str, Any]] = []
        if decision.kind == "work" and db is not None and (has_history or reuse_from):
            restored = _restorable_rows(db, run_id, plan, step, decision, reuse_from)
            if restored:
                decision = decide_step(
                    run_id=run_id or "-",
                    step=step,
                    params=params,
                    outputs=outputs,
                    engines=plan.execution.engines,
                    gate=gate,
                    rows=rows + restored,
                    hash_version=hash_version,
                )
        again = {r["unit_id"] for r in restored}
        f.units = len(decision.states) if decision.states or step.root is not None else 0
        for s in decision.states:
            if s.status == DONE:
                if s.row is not None and s.row.get("unit_id") in again:
                    f.reused += 1
                else:
                    f.done += 1
            elif s.unit.runner == "session":
                f.for_agent += 1
            else:
                f.to_run += 1
        if decision.kind == "work":
            unknown.add(step.step_id)
            f.status = "to_do"
            out.first = out.first or _first_work(step, f)
            continue
        if decision.kind == "fail":
            f.status, f.note = "fails", decision.notes
            stopped = f"step {step.step_id} would fail"
            out.first = out.first or f"step {step.step_id} would fail: {decision.notes}"
            continue
        if decision.kind == "block":
            f.status, f.note = "blocked", decision.notes
            stopped = f"step {step.step_id} would be blocked"
            out.first = out.first or f"step {step.step_id} would be blocked: {decision.notes}"
            continue
        if decision.kind == "retry":
            unknown.add(step.step_id)
            f.status, f.note = "to_do", "its output misses the step's output schema: its units run again"
            out.first = out.first or f"run step {step.step_id} again (gate loop {decision.loop + 1})"
            continue
        # complete, or judge: the output is known (a judge is assumed to pass it)
        ev = dict(decision.evidence or {})
        verdict_kept = (
            decision.kind == "judge"
            and db is not None
            and (has_history or bool(reuse_from))
            and _verdict_restorable(db, run_id, reuse_from, plan, step, decision)
        )
        if verdict_kept:
            f.status = "reused" if f.reused else "completes"
            f.note = "its verdict on this same artifact is reused"
        elif decision.kind == "judge":
            f.status = "to_judge"
            f.note = f"judged by {'you' if f.judge == 'agent' else f.judge} (the preview assumes it passes)"
            out.first = out.first or (
                f"ask you for a verdict on step {step.step_id}"
                if f.judge == "agent"
                else f"ask {f.judge} to judge step {step.step_id}"
            )
        else:
            f.status = "reused" if f.reused else "completes"
        evidence[step.step_id] = ev
        if step.route is not None:
            try:
                route = ev.get("route") or evaluate_route(
                    step.step_id, step.route, params, step_outputs_from_evidence(evidence)
                )
                routes.mark(step.step_id, route.get("selected"), route_targets(step.route))
                f.note = (f.note + "; " if f.note else "") + f"routes to {route.get('selected')}"
            except RouteError as exc:
                f.status, f.note = "fails", str(exc)
                stopped = f"step {step.step_id} would fail"
    if not out.first:
        out.first = "nothing runs: every remaining unit is reused; the run completes"
    return out


def _first_work(step: StepPlan, f: StepForecast) -> str:
    parts = []
    if f.to_run:
        who = f"on {f.engine}" + (f" ({f.model})" if f.model else "") if f.engine else f"as {f.runner} commands"
        parts.append(f"run {f.to_run} unit(s) of step {step.step_id} {who}")
    if f.for_agent:
        parts.append(f"ask you for {f.for_agent} unit(s) of step {step.step_id}")
    return " and ".join(parts) or f"step {step.step_id}"


def _restorable_rows(
    db: Journal, run_id: str | None, plan: Plan, step: StepPlan, decision: Any, reuse_from: str | None
) -> list[dict[str, Any]]:
    """Journal-shaped rows for the pending units a driver would restore (`engine.reuse`), written nowhere."""
    from akm.engine.reuse import restorable

    return [
        {
            "unit_id": a.unit_id,
            "phase": None,
            "status": "completed",
            "input_hash": a.input_hash,
            "result_json": a.candidate.result_json,
            "tokens": None,
            "failure_reason": None,
            "session_id": None,
            "truncated": a.candidate.truncated,
            "attempts": 0,
            "reopened": 0,
            "queued_at": None,
        }
        for a in restorable(db, run_id or "", reuse_from, plan, step, decision)
    ]


def _verdict_restorable(
    db: Journal, run_id: str | None, reuse_from: str | None, plan: Plan, step: StepPlan, decision: Any
) -> bool:
    from akm.engine.reuse import restorable_verdict

    return restorable_verdict(db, run_id or "", reuse_from, plan, step, decision) is not None
