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
    walk = _Walk(db, run_id, plan, params, hash_version, spine, reuse_from)
    for step in plan.steps:
        walk.step(step)
    if not walk.out.first:
        walk.out.first = "nothing runs: every remaining unit is reused; the run completes"
    return walk.out


class _Walk:
    """The preview's walk through the plan, step by step, carrying what the drive loop would know: the
    evidence of the steps whose output is known, the routes taken, the steps whose output is not known yet,
    and the first step that stops the run."""

    def __init__(
        self,
        db: Journal | None,
        run_id: str | None,
        plan: Plan,
        params: dict[str, Any],
        hash_version: int,
        spine: Any,
        reuse_from: str | None,
    ) -> None:
        self.db, self.run_id, self.plan, self.params = db, run_id, plan, params
        self.hash_version, self.reuse_from = hash_version, reuse_from
        self.out = Forecast()
        self.steps_by_id = {s.step_id: s for s in (spine.steps if spine is not None else [])}
        self.evidence: dict[str, Any] = dict(spine.evidence) if spine is not None else {}
        self.routes = spine.routes if spine is not None else RouteBook()
        self.unknown: set[str] = set()
        self.stopped: str | None = None
        self.has_history = db is not None and run_id is not None and rewinds_store.has_donors(db, run_id, None)
        self.tallies = units_store.step_tallies(db, run_id) if db is not None and run_id is not None else {}

    def step(self, step: StepPlan) -> None:
        f = StepForecast(id=step.step_id, kind=_kind(step), status="pending")
        _describe(self.plan, step, f)
        self.out.steps.append(f)
        row = self.steps_by_id.get(step.step_id)
        if self._settled_without_deciding(step, f, row):
            return
        decision, again = self._decision(step, row)
        _count_units(step, f, decision.states, again)
        if not self._stops_or_works(step, f, decision):
            self._known_output(step, f, decision)

    def _settled_without_deciding(self, step: StepPlan, f: StepForecast, row: Any) -> bool:
        """Settle `f` from what is known before any decision — the journal's finished or stopped step, a step
        past the stop, a route that skips it, an input not known yet — and say whether it did."""
        if row is not None and row.status in ("completed", "skipped"):
            f.status = row.status
            tally = self.tallies.get(step.step_id)
            f.units = f.done = tally.units if tally is not None else 0
            return True
        if self.stopped is not None:
            f.status, f.note = "not_reached", self.stopped
            return True
        if row is not None and row.status in ("failed", "blocked"):
            f.status, f.note = row.status, (row.notes or "").strip() or None
            self.stopped = f"step {step.step_id} is {row.status}: resume or rewind the run first"
            self.out.first = self.out.first or self.stopped
            return True
        why = self.routes.skip_reason(step)
        if why is not None:
            self.routes.skip(step)
            f.status, f.note = "skipped", f"skipped: {why}"
            return True
        waits = sorted(steps_read(step) & self.unknown)
        if waits:
            self.unknown.add(step.step_id)
            f.status, f.note = "unknown", f"its units are known once {', '.join(waits)} ran"
            if step.route is not None:
                self.routes.mark(step.step_id, None, [])  # its branch is not known either
                for target in route_targets(step.route):
                    self.unknown.add(target)
            return True
        return False

    def _decision(self, step: StepPlan, row: Any) -> tuple[Any, set[str]]:
        """The drive loop's decision for the step, with the units a rewind's history or `--from` run would
        restore counted as done; and the ids of those restored units."""
        from akm.engine.stepctx import step_rows

        db, run_id = self.db, self.run_id
        outputs = step_outputs_from_evidence(self.evidence)
        rows, gate_rows = step_rows(db, run_id, step.step_id) if db is not None and run_id is not None else ([], [])
        gate = gate_state(run_id or "-", step, gate_rows, row.gate_loop_base if row is not None else 0)

        def decide(with_rows: list[dict[str, Any]]) -> Any:
            return decide_step(
                run_id=run_id or "-",
                step=step,
                params=self.params,
                outputs=outputs,
                engines=self.plan.execution.engines,
                gate=gate,
                rows=with_rows,
                hash_version=self.hash_version,
            )

        decision = decide(rows)
        restored: list[dict[str, Any]] = []
        if decision.kind == "work" and db is not None and (self.has_history or self.reuse_from):
            restored = _restorable_rows(db, run_id, self.plan, step, decision, self.reuse_from)
            if restored:
                decision = decide(rows + restored)
        return decision, {r["unit_id"] for r in restored}

    def _stops_or_works(self, step: StepPlan, f: StepForecast, decision: Any) -> bool:
        """Settle a step whose output is not known after this run: work to do, a failure, a block, a retry."""
        first = self.out.first
        if decision.kind == "work":
            self.unknown.add(step.step_id)
            f.status = "to_do"
            self.out.first = first or _first_work(step, f)
        elif decision.kind == "fail":
            f.status, f.note = "fails", decision.notes
            self.stopped = f"step {step.step_id} would fail"
            self.out.first = first or f"step {step.step_id} would fail: {decision.notes}"
        elif decision.kind == "block":
            f.status, f.note = "blocked", decision.notes
            self.stopped = f"step {step.step_id} would be blocked"
            self.out.first = first or f"step {step.step_id} would be blocked: {decision.notes}"
        elif decision.kind == "retry":
            self.unknown.add(step.step_id)
            f.status, f.note = "to_do", "its output misses the step's output schema: its units run again"
            self.out.first = first or f"run step {step.step_id} again (gate loop {decision.loop + 1})"
        else:
            return False
        return True

    def _known_output(self, step: StepPlan, f: StepForecast, decision: Any) -> None:
        """A step that completes or is judged: its output is known (a judge is assumed to pass it), so the walk
        goes on through it and through its route."""
        ev = dict(decision.evidence or {})
        if decision.kind == "judge" and self._verdict_kept(step, decision):
            f.status = "reused" if f.reused else "completes"
            f.note = "its verdict on this same artifact is reused"
        elif decision.kind == "judge":
            f.status = "to_judge"
            f.note = f"judged by {'you' if f.judge == 'agent' else f.judge} (the preview assumes it passes)"
            self.out.first = self.out.first or (
                f"ask you for a verdict on step {step.step_id}"
                if f.judge == "agent"
                else f"ask {f.judge} to judge step {step.step_id}"
            )
        else:
            f.status = "reused" if f.reused else "completes"
        self.evidence[step.step_id] = ev
        if step.route is not None:
            self._route(step, f, ev)

    def _verdict_kept(self, step: StepPlan, decision: Any) -> bool:
        """Whether a verdict journaled on this same artifact (in this run's history or the `--from` run) is
        reused instead of asking again."""
        return (
            self.db is not None
            and (self.has_history or bool(self.reuse_from))
            and _verdict_restorable(self.db, self.run_id, self.reuse_from, self.plan, step, decision)
        )

    def _route(self, step: StepPlan, f: StepForecast, ev: dict[str, Any]) -> None:
        assert step.route is not None
        try:
            route = ev.get("route") or evaluate_route(
                step.step_id, step.route, self.params, step_outputs_from_evidence(self.evidence)
            )
            self.routes.mark(step.step_id, route.get("selected"), route_targets(step.route))
            f.note = (f.note + "; " if f.note else "") + f"routes to {route.get('selected')}"
        except RouteError as exc:
            f.status, f.note = "fails", str(exc)
            self.stopped = f"step {step.step_id} would fail"


def _count_units(step: StepPlan, f: StepForecast, states: list[Any], again: set[str]) -> None:
    """Count the step's units: done in the run, restored (`again`), for the calling agent, to run."""
    f.units = len(states) if states or step.root is not None else 0
    for s in states:
        if s.status == DONE:
            if s.row is not None and s.row.get("unit_id") in again:
                f.reused += 1
            else:
                f.done += 1
        elif s.unit.runner == "session":
            f.for_agent += 1
        else:
            f.to_run += 1


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
