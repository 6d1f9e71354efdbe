"""One way to finish a step: pure decisions from the journal alone.

The native drive loop and a session report (`workflow report`) both ask the
same question — "given what the journal holds for this step, what happens
next?" — and both get the answer from `decide_step`. Nothing here reads a
clock, a file or the database: the callers load the rows (see
`akm.engine.stepctx`) and apply the decision. That is what makes a natively
driven run and a report-driven run of the same plan produce the same unit
graph (tests/test_parity.py), and what lets a crash or a session in the middle
of gate loop 2 resume at loop 2 with its feedback.

Gate loops are journaled, not held in memory: every loop transition is a gate
row `<step>.gate:l<L>` (phase `gate`) whose result is a verdict
`{complete, missing, feedback}`. A judge's rejection and a step artifact that
missed its `output` schema (D5) both journal a rejection; the loop to work on
is 1 + the highest rejected loop. `resume` of a gate-exhausted step (D7) moves
the step's loop base so the budget starts afresh.
"""

from __future__ import annotations

import json
from typing import Any

from akm.engine.reduce import (
    RouteError,
    StepResult,
    UnitOutcome,
    evaluate_route,
    outcome_from_row,
    reduce_step,
    route_targets,
)
from akm.engine.worklist import StepFailure, WorkList, WorkUnit, build_work_list
from akm.errors import UsageError
from akm.plan.identity import base_of_attempt, gate_row_id
from akm.plan.model import Plan, StepPlan
from akm.record import dataclass, field

# ---------------------------------------------------------------- verdicts and gate loops


@dataclass(frozen=True)
class Verdict:
    """A judged (or schema-checked) loop outcome, as journaled in a gate row."""

    complete: bool
    missing: list[str] = field(default_factory=list)
    feedback: str = ""
    reason: str = "judge"  # "judge" | "output_schema"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"complete": self.complete, "missing": list(self.missing)}
        if not self.complete:
            out["feedback"] = self.feedback
        if self.reason != "judge":
            out["reason"] = self.reason
        return out

    def feedback_block(self) -> dict[str, Any]:
        """What the next loop's units are told (and what their input hash includes)."""
        return {"feedback": self.feedback, "missing": list(self.missing)}


DEFAULT_REJECTION_FEEDBACK = "The completion criteria are not yet demonstrated; finish the work and resubmit."


def verdict_from_value(value: Any, *, reason: str = "judge") -> Verdict | None:
    """A verdict object `{complete: bool, missing?: [str], feedback?: str}`, or None when malformed."""
    if not isinstance(value, dict) or not isinstance(value.get("complete"), bool):
        return None
    missing_raw = value.get("missing", [])
    if missing_raw is None:
        missing_raw = []
    if not isinstance(missing_raw, list):
        return None
    missing = [m.strip() for m in missing_raw if isinstance(m, str) and m.strip()]
    feedback = value.get("feedback")
    feedback = feedback.strip() if isinstance(feedback, str) else ""
    if value["complete"]:
        return Verdict(True, missing=[], feedback="", reason=reason)
    return Verdict(
        False,
        missing=missing,
        feedback=feedback or DEFAULT_REJECTION_FEEDBACK,
        reason=str(value.get("reason") or reason),
    )


class CorruptGateRow(UsageError):
    def __init__(self, run_id: str, row_id: str, why: str) -> None:
        from akm.codes import Code

        super().__init__(
            f"Run {run_id}: gate row {row_id} holds {why}; refusing to guess the gate loop.",
            code=Code.CORRUPT_RUN,
        )


def _loop_of(step_id: str, unit_id: str) -> int | None:
    prefix = f"{step_id}.gate:l"
    if not unit_id.startswith(prefix):
        return None
    tail = unit_id[len(prefix) :]
    return int(tail) if tail.isdigit() and tail.isascii() and int(tail) >= 1 else None


@dataclass
class GateState:
    """Where a step stands in its gate loops, derived from its gate rows."""

    loop: int  # the loop to work on now (absolute, 1-based)
    base: int  # loops consumed before the last resume (D7 fresh budget)
    max_loops: int
    feedback: dict[str, Any] | None  # the previous loop's rejection, for this loop's units
    passed: bool  # a journaled verdict already passed `loop`
    last_rejection: Verdict | None

    @property
    def exhausted(self) -> bool:
        return self.loop > self.base + self.max_loops

    @property
    def loops_left_after(self) -> int:
        """How many more loops may follow the current one."""
        return self.base + self.max_loops - self.loop


def gate_state(run_id: str, step: StepPlan, gate_rows: list[dict[str, Any]], base: int = 0) -> GateState:
    """§1.4: loop = 1 + highest rejected loop; the previous rejection is this loop's feedback."""
    rejected: dict[int, Verdict] = {}
    passed: set[int] = set()
    for row in gate_rows:
        loop = _loop_of(step.step_id, row["unit_id"])
        if loop is None:
            continue
        raw = row.get("result_json")
        if raw is None or row.get("status") != "completed":
            continue  # in flight, or a judge that failed (no verdict): not a loop outcome
        try:
            value = json.loads(raw)
        except ValueError:
            raise CorruptGateRow(run_id, row["unit_id"], "a verdict that is not JSON") from None
        verdict = verdict_from_value(value)
        if verdict is None:
            raise CorruptGateRow(run_id, row["unit_id"], "a verdict without a boolean `complete`")
        if verdict.complete:
            passed.add(loop)
        else:
            rejected[loop] = verdict
    loop = max([base, *rejected]) + 1 if rejected else max(1, base + 1)
    last = rejected.get(loop - 1)
    return GateState(
        loop=loop,
        base=base,
        max_loops=max(1, step.gate.max_loops),
        feedback=last.feedback_block() if last else None,
        passed=loop in passed,
        last_rejection=rejected[max(rejected)] if rejected else None,
    )


def gate_row_for(step_id: str, loop: int) -> str:
    return gate_row_id(step_id, loop)


def has_criteria(step: StepPlan) -> bool:
    return any(c.strip() for c in step.gate.criteria)


# ---------------------------------------------------------------- routes


class RouteBook:
    """Which route targets are selected or skipped, replayed from the spine (spec §5.3)."""

    def __init__(self) -> None:
        self.selected: set[str] = set()
        self.unselected: dict[str, tuple[str, str | None]] = {}

    def mark(self, router: str, selected: str | None, targets: list[str]) -> None:
        for t in targets:
            if t != selected and t not in self.unselected:
                self.unselected[t] = (router, selected)
        if selected is not None:
            self.selected.add(selected)

    @classmethod
    def replay(cls, run_id: str, plan: Plan, spine: dict[str, tuple[str, Any]]) -> "RouteBook":
        """`spine` maps step id -> (status, evidence)."""
        book = cls()
        for sp in plan.steps:
            if sp.route is None or sp.step_id not in spine:
                continue
            status, evidence = spine[sp.step_id]
            targets = route_targets(sp.route)
            if status == "skipped":
                book.mark(sp.step_id, None, targets)
            elif status == "completed":
                decision = (evidence or {}).get("route") if isinstance(evidence, dict) else None
                selected = decision.get("selected") if isinstance(decision, dict) else None
                if not isinstance(selected, str) or selected not in targets:
                    from akm.codes import Code

                    raise UsageError(
                        f"Run {run_id}: the journaled route decision of step {sp.step_id} is missing or names "
                        "an undeclared step; refusing to guess which branch to take.",
                        code=Code.CORRUPT_RUN,
                    )
                book.mark(sp.step_id, selected, targets)
        return book

    def skip_reason(self, step: StepPlan) -> str | None:
        """Why `step` is skipped (an unselected route target), or None when it runs."""
        if step.step_id not in self.unselected or step.step_id in self.selected:
            return None
        router, selected = self.unselected[step.step_id]
        return f"route step {router} selected {selected}" if selected else f"route step {router} was itself skipped"

    def skip(self, step: StepPlan) -> None:
        """Record that `step` was skipped (a skipped router cascades to its targets)."""
        if step.route is not None:
            self.mark(step.step_id, None, route_targets(step.route))


# ---------------------------------------------------------------- units from the journal


PENDING, RUNNING, DONE, FAILED, RETRYABLE, DIVERGED = "pending", "running", "done", "failed", "retryable", "diverged"


@dataclass
class UnitState:
    """One unit of the current loop and what the journal says about it (spec §1.5)."""

    unit: WorkUnit
    status: str  # one of the constants above
    row: dict[str, Any] | None = None  # best attempt row (completed, else the latest)
    diverged_from: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in (DONE, FAILED)


def _family_index(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    index: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        unit_id = row["unit_id"]
        # Most rows are a first attempt (no `~r`): their id is their family's, with no parsing.
        family = base_of_attempt(unit_id) if "~r" in unit_id else unit_id
        group = index.get(family)
        if group is None:
            index[family] = [row]
        else:
            group.append(row)
    return index


def retry_index(row_id: str) -> int:
    """k of an attempt id `…~r<k>` (0 for the first attempt)."""
    head, sep, tail = row_id.rpartition("~r")
    return int(tail) if sep and tail.isdigit() and tail.isascii() else 0


def unit_states(wl: WorkList, rows: list[dict[str, Any]], gate_loop: int) -> list[UnitState]:
    """Classify each unit of the work list against its journaled attempt rows."""
    index = _family_index(rows)
    states: list[UnitState] = []
    for u in wl.units:
        family = index.get(u.base_id)
        if family is not None and len(family) == 1:  # the common case: one attempt, completed
            only = family[0]
            if only.get("status") == "completed" and only.get("input_hash") == u.input_hash:
                states.append(UnitState(u, DONE, only))  # what the general rule finds first, found directly
                continue
        states.append(unit_state(u, family, gate_loop))
    return states


def unit_state(u: WorkUnit, family: list[dict[str, Any]] | None, gate_loop: int) -> UnitState:
    """Classify one unit against its attempt rows of this gate loop (`family`: `u.base_id` and its retries,
    in journal order; None or empty: never dispatched)."""
    if not family:
        return UnitState(u, PENDING)
    completed = _completed_state(u, family, gate_loop)
    if completed is not None:
        return completed
    live = [r for r in family if r.get("input_hash") in (None, u.input_hash)]
    if not live:
        return UnitState(u, PENDING)
    latest = max(live, key=lambda r: retry_index(r["unit_id"]))
    if latest.get("status") in ("running", "queued"):  # queued: waiting for a worker (phase 2), in flight
        return UnitState(u, RUNNING, latest)
    return UnitState(u, RETRYABLE if _may_retry(u, live, latest) else FAILED, latest)


def _completed_state(u: WorkUnit, family: list[dict[str, Any]], gate_loop: int) -> UnitState | None:
    """DONE when an attempt completed with the unit's input hash; DIVERGED when one completed with another in
    loop 1 (a replay divergence); None when no attempt completed."""
    completed = [r for r in family if r.get("status") == "completed"]
    same = next((r for r in completed if r.get("input_hash") == u.input_hash), None)
    if same is not None:
        return UnitState(u, DONE, same)
    if completed and gate_loop <= 1:
        return UnitState(u, DIVERGED, completed[0], diverged_from=completed[0]["unit_id"])
    return None


def _may_retry(u: WorkUnit, live: list[dict[str, Any]], latest: dict[str, Any]) -> bool:
    """A failed unit may run again: its `retry.on` names the failure and attempts are left, or resuming the
    run reopened it."""
    retry = u.template.retry
    tried = sum(int(r.get("attempts") or 1) for r in live)
    eligible = retry is not None and latest.get("failure_reason") in retry.on and tried < 1 + retry.max
    return eligible or bool(latest.get("reopened"))


def outcome_of(state: UnitState) -> UnitOutcome:
    """The reduction input for a terminal (or, natively, settled) unit."""
    if state.row is None:
        return UnitOutcome(
            unit_id=state.unit.unit_id,
            ok=False,
            failure_reason="aborted",
            error="unit was not dispatched (interrupted)",
        )
    return outcome_from_row(state.unit.unit_id, state.row, state.unit.template.output_schema is not None)


# ---------------------------------------------------------------- the decision


@dataclass
class StepDecision:
    """What happens next to the current step.

    kind:
      work     -- units still need doing (`units`: the ones not yet terminal)
      retry    -- journal `verdict` (a rejection) for `loop`; the next loop re-runs the step
      judge    -- the artifact awaits a verdict for `loop` (`artifact`, `summary` for the judge)
      complete -- the step completes (`evidence`, `summary`)
      fail     -- the step fails (`notes`, `evidence`)
      block    -- the step is blocked (`notes`, `detail` for the run: D7 or a failed judge)
    """

    kind: str
    loop: int = 1
    units: list[UnitState] = field(default_factory=list)
    states: list[UnitState] = field(default_factory=list)
    work_list: WorkList | None = None
    result: StepResult | None = None
    verdict: Verdict | None = None
    evidence: dict[str, Any] | None = None
    summary: str | None = None
    notes: str | None = None
    detail: dict[str, Any] | None = None
    route: dict[str, Any] | None = None
    artifact: Any = None


def work_list_for(
    run_id: str,
    step: StepPlan,
    params: dict[str, Any],
    outputs: dict[str, Any],
    engines: dict[str, dict[str, Any]],
    gate: GateState,
    hash_version: int,
) -> WorkList | StepFailure:
    return build_work_list(
        step,
        run_id=run_id,
        params=params,
        step_outputs=outputs,
        engines=engines,
        gate_loop=gate.loop,
        gate_feedback=gate.feedback,
        hash_version=hash_version,
    )


def exhausted_decision(step: StepPlan, gate: GateState) -> StepDecision:
    """D7: the last allowed loop was rejected — block the run with the judge's words."""
    last = gate.last_rejection or Verdict(False, feedback=DEFAULT_REJECTION_FEEDBACK)
    loops = gate.max_loops
    notes = f'Step "{step.step_id}" was rejected in its last allowed gate loop ({loops} of {loops}): {last.feedback}'
    if last.missing:
        notes += " Missing: " + "; ".join(last.missing) + "."
    return StepDecision(
        "block",
        loop=gate.loop,
        notes=notes,
        detail={
            "kind": "gate_exhausted",
            "stepId": step.step_id,
            "maxLoops": loops,
            "missing": list(last.missing),
            "feedback": last.feedback,
        },
    )


def decide_step(
    *,
    run_id: str,
    step: StepPlan,
    params: dict[str, Any],
    outputs: dict[str, Any],
    engines: dict[str, dict[str, Any]],
    gate: GateState,
    rows: list[dict[str, Any]],
    native_kinds: frozenset[str] = frozenset(),
    settled: bool = False,
    fail_fast: bool = False,
    work_list: WorkList | StepFailure | None = None,
    hash_version: int,
) -> StepDecision:
    """Decide the current step's next move from its journal rows.

    Which units are still outstanding depends on who does them. Units of a kind in
    `native_kinds` (the kinds the native driver dispatches itself) are outstanding
    until done when the driver has not yet run a pass in this loop — so a new
    invocation (after `resume`) tries failed ones again — and, once it has
    (`settled=True`), only while they have no finished row: failed attempts were
    already retried in the pass. Any other unit (a session unit, or every unit for
    a report) is outstanding until it completed or failed without retry
    eligibility. `fail_fast` finalizes a step as soon as a unit that is not
    tolerated (`on_error: fail`) has failed for good; units still outstanding are
    reduced as `not_run`. `work_list` may carry the step's work list for this gate
    state when the caller already has it (it is a pure function of the plan,
    params, earlier outputs and the gate state).
    """
    if gate.exhausted:
        return exhausted_decision(step, gate)
    if step.root is None:
        result = StepResult(
            ok=True, evidence={}, summary=f'Step "{step.step_id}" is a route step — no units dispatched.'
        )
        return _after_result(run_id, step, params, outputs, gate, result, [])
    wl = (
        work_list
        if work_list is not None
        else work_list_for(run_id, step, params, outputs, engines, gate, hash_version)
    )
    if isinstance(wl, StepFailure):
        return StepDecision("fail", loop=gate.loop, notes=wl.reason, evidence={"error": wl.reason})
    states = unit_states(wl, rows, gate.loop)
    diverged = _divergence(states, wl, gate)
    if diverged is not None:
        return diverged

    def is_outstanding(s: UnitState) -> bool:
        if s.unit.runner in native_kinds:
            return s.status in (PENDING, RUNNING) if settled else s.status != DONE
        return not s.terminal

    outstanding = [s for s in states if is_outstanding(s)]
    if outstanding and not (fail_fast and _failed_for_good(step, states)):
        return StepDecision("work", loop=gate.loop, units=outstanding, states=states, work_list=wl)
    tmpl = step.unit_template
    assert tmpl is not None
    # Fail fast: once a unit that is not tolerated failed for good, the step's verdict is fixed; units
    # still outstanding are reduced as `not_run` (both surfaces stop giving out work at that point).
    outcomes = [
        UnitOutcome(unit_id=s.unit.unit_id, ok=False, failure_reason="not_run") if is_outstanding(s) else outcome_of(s)
        for s in states
    ]
    result = reduce_step(step, outcomes, is_map=wl.is_map, reducer=wl.reducer, on_error=tmpl.on_error)
    return _after_result(run_id, step, params, outputs, gate, result, states, wl)


def _failed_for_good(step: StepPlan, states: list[UnitState]) -> bool:
    """Whether a unit that is not tolerated (`on_error: fail`) has failed with no retry left: the step's verdict
    is then fixed (what `fail_fast` acts on)."""
    tmpl = step.unit_template
    return tmpl is not None and tmpl.on_error == "fail" and any(s.status == FAILED for s in states)


def _divergence(states: list[UnitState], wl: WorkList, gate: GateState) -> StepDecision | None:
    """A failing decision when a unit is journaled as completed with another input hash than its plan gives
    (a replay that diverged: it is never dispatched again); None otherwise."""
    diverged = [s for s in states if s.status == DIVERGED]
    if not diverged:
        return None
    reason = " ".join(
        f"replay divergence: unit {s.diverged_from} is journaled as completed with a different input hash; "
        "refusing to re-dispatch it."
        for s in diverged
    )
    return StepDecision("fail", loop=gate.loop, notes=reason, evidence={"error": reason}, states=states, work_list=wl)


def _after_result(
    run_id: str,
    step: StepPlan,
    params: dict[str, Any],
    outputs: dict[str, Any],
    gate: GateState,
    result: StepResult,
    states: list[UnitState],
    wl: WorkList | None = None,
) -> StepDecision:
    common: dict[str, Any] = dict(loop=gate.loop, states=states, work_list=wl, result=result)
    if not result.ok:
        if result.artifact_schema_failure and gate.loops_left_after > 0:
            return StepDecision(
                "retry", verdict=Verdict(False, feedback=result.summary, reason="output_schema"), **common
            )
        return StepDecision("fail", notes=result.summary, evidence=result.evidence, **common)
    evidence = dict(result.evidence)
    summary = result.summary
    route = None
    if step.route is not None:
        scope = dict(outputs)
        if step.root is not None:
            scope[step.step_id] = evidence.get("output")
        try:
            route = evaluate_route(step.step_id, step.route, params, scope)
        except RouteError as exc:
            note = f'Step "{step.step_id}" route failed: {exc}'
            return StepDecision("fail", notes=note, evidence=evidence, **common)
        evidence["route"] = route
        if step.root is None:
            summary = (
                f"routed on {route['input']}: value {json.dumps(route['value'])} selected step {route['selected']}"
            )
    if step.root is not None and has_criteria(step) and not gate.passed:
        return StepDecision(
            "judge", evidence=evidence, summary=summary, route=route, artifact=evidence.get("output"), **common
        )
    return StepDecision("complete", evidence=evidence, summary=summary, route=route, **common)
