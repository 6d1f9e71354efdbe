"""What moves a stopped run on: the one remedy that works in its state.

A failed or blocked run used to be told "fix the cause, then resume and run" whatever the cause — a remedy
that cannot work when the cause is a result a step was built on (resuming re-runs the step on the same
inputs and fails the same way), or a unit result that is complete but wrong (resuming reuses it). This
module reads the journal and says what does work, as data the fronts phrase in their own terms:

* `resume` — the step has units that failed (a resume runs them again, and offers the calling agent's own
  again), a judge that failed (after a resume the agent may give the verdict itself, or akm asks the judge
  engine again), or an exhausted gate (a resume gives it a fresh loop budget);
* `rewind` — the step cannot even be built from an earlier step's output (go back to that step and correct
  it), or every unit of it completed and the step failed on their results (go back to it: its units are done
  again — `redo` for units akm runs itself);
* `new_run` — what needs a change is the workflow (its commands, its budget, its params): edit it and start a
  new run from it that reuses every unit whose identity did not change (`from_run`); also for an abandoned
  run, which is final.

Nothing here writes; `recovery` is computed from the journal each time a view is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from akm.engine.finalize import DIVERGED, FAILED, RETRYABLE, decide_step, unit_states, work_list_for
from akm.engine.worklist import StepFailure, steps_read
from akm.errors import AkmError
from akm.store.journal import Journal
from akm.store.runs import Run

if TYPE_CHECKING:
    from akm.engine.finalize import UnitState
    from akm.plan.model import Plan


def recovery(db: Journal, run: Run) -> dict[str, Any] | None:
    """`{action, stepId, redo, then, why}` for a failed, blocked or abandoned run; None for any other."""
    if run.status == "abandoned":
        return _new_run(run, "abandoning is final; a new run of the workflow reuses this run's completed units")
    if run.status not in ("failed", "blocked") or run.current_step_id is None:
        return None
    step_id = run.current_step_id
    detail = run.status_detail or {}
    if run.status == "blocked":
        if detail.get("kind") == "judge_failed":
            return _remedy(
                "resume",
                step_id,
                then="judge",
                why=f"the judge of step {step_id} failed; after a resume you can give the verdict yourself (or "
                "continue the run to ask its judge engine again)",
            )
        return _remedy(
            "resume",
            step_id,
            why=f"a resume gives step {step_id}'s gate a fresh loop budget: its units are done again with the "
            "judge's feedback",
        )
    try:
        remedy = _after_failure(db, run, step_id)
    except AkmError:  # a damaged run: nothing but a new one moves on
        return _new_run(run, "the run's journal rows are damaged; a new run of the workflow starts over")
    return _new_run(run, remedy["why"]) if remedy["action"] == "new_run" else remedy


def _after_failure(db: Journal, run: Run, step_id: str) -> dict[str, Any]:
    from akm.engine.state import load_run
    from akm.engine.stepctx import load_gate, load_spine, step_rows

    loaded = load_run(db, run.id)
    plan = loaded.plan
    step = plan.step(step_id)
    assert step is not None
    if _budget_spent(db, run, plan):
        return _remedy(
            "new_run",
            None,
            why="the run's budget is spent (a rewind gives none back): raise it in the workflow and start a new "
            "run from it; completed units are reused",
        )
    spine = load_spine(db, run.id, plan)
    rows, gate_rows = step_rows(db, run.id, step_id)
    gate = load_gate(db, run.id, step, spine, gate_rows)
    if step.root is None:  # a route step failed on its input
        return _from_inputs(plan, step, f"step {step_id}'s route could not be decided", loaded.params, spine.outputs)
    wl = work_list_for(run.id, step, loaded.params, spine.outputs, plan.execution.engines, gate, run.hash_version)
    if isinstance(wl, StepFailure):
        return _from_inputs(plan, step, wl.reason, loaded.params, spine.outputs)
    states = unit_states(wl, rows, gate.loop)
    if any(s.status == DIVERGED for s in states):
        return _remedy("rewind", step_id, redo=True, why=f"step {step_id}'s journal diverged from its plan")
    failed = [s for s in states if s.status in (FAILED, RETRYABLE)]
    if failed:
        return _after_failed_units(step_id, failed)
    decision = decide_step(
        run_id=run.id,
        step=step,
        params=loaded.params,
        outputs=spine.outputs,
        engines=plan.execution.engines,
        gate=gate,
        rows=rows,
        work_list=wl,
        hash_version=run.hash_version,
    )
    runner = states[0].unit.runner if states else "session"
    if decision.kind == "fail" and runner == "exec":
        return _remedy(
            "new_run",
            None,
            why=f"the commands of step {step_id} completed but the step failed on their output "
            f"({(decision.notes or '').strip()[:200]}); fix the workflow and start a new run from it",
        )
    return _remedy(
        "rewind",
        step_id,
        redo=runner != "session",
        why=f"the units of step {step_id} completed but the step failed on their results; go back to it and do "
        "them again",
    )


def _budget_spent(db: Journal, run: Run, plan: Plan) -> bool:
    """Whether the run has used up its unit or token ceiling (a rewind gives none back)."""
    from akm.store import units as units_store

    budget = plan.budget
    if budget is None or (budget.max_units is None and budget.max_tokens is None):
        return False
    used, tokens = units_store.journal_totals(db, run.id)
    return (budget.max_units is not None and used >= budget.max_units) or (
        budget.max_tokens is not None and tokens >= budget.max_tokens
    )


def _after_failed_units(step_id: str, failed: list[UnitState]) -> dict[str, Any]:
    """The way on from a step with failed units: a new run when commands printed what the step cannot take
    (running them again prints the same), else a resume that runs them again."""
    reasons = sorted({str((s.row or {}).get("failure_reason") or "failed") for s in failed})
    if all(s.unit.runner == "exec" for s in failed) and set(reasons) <= _OUTPUT_REFUSED:
        return _remedy(
            "new_run",
            None,
            why=f"the commands of step {step_id} ran but their output does not fit the workflow "
            f"({', '.join(reasons)}); the same command prints the same again: fix the workflow (the command or "
            "the schema) and start a new run from it",
        )
    return _remedy(
        "resume",
        step_id,
        why=f"{len(failed)} unit(s) of step {step_id} failed ({', '.join(reasons)}); a resume runs them again "
        "(yours are offered to you again), completed ones are kept",
    )


# Failures of a command that ran to its end but printed what the step cannot take: running it again changes
# nothing, the workflow must change.
_OUTPUT_REFUSED = frozenset({"parse_error", "validation_error", "exec_output_limit"})


def _from_inputs(plan: Any, step: Any, reason: str, params: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    """A step that cannot be built from what it reads: go back to the step whose output it cannot use, or
    change the workflow (its params) when what it cannot use is a param."""
    source = _failing_source(step, params, outputs)
    if source is None:
        order = [s.step_id for s in plan.steps if s.step_id in steps_read(step)]
        source = order[-1] if order else None
    if source is None or source == "params":
        return _remedy("new_run", None, why=f"{reason}; it reads no step's output: change the workflow or its params")
    return _remedy(
        "rewind",
        source,
        why=f"{reason}; go back to step {source} and correct the output step {step.step_id} is built from",
    )


def _failing_source(step: Any, params: dict[str, Any], outputs: dict[str, Any]) -> str | None:
    """The step (or "params") whose value the step cannot use: the first of its fan-out list, its inputs and its
    route input that does not resolve (or, for the list, is not a list of distinct items)."""
    from akm.engine.scope import resolve
    from akm.format.refs import ReferenceResolutionError, ReferenceSyntaxError

    for ref, is_list in _references(step):
        owner = ref.split(".")[1] if ref.startswith("steps.") else "params"
        try:
            value = resolve(ref, params, outputs)
        except (ReferenceResolutionError, ReferenceSyntaxError):
            return owner
        if is_list and not _distinct_items(value):
            return owner
    return None


def _references(step: Any) -> list[tuple[str, bool]]:
    """The references a step reads, in the order they are checked: its fan-out list (flagged), its inputs,
    its route input."""
    refs: list[tuple[str, bool]] = []
    if step.root is not None and step.root.kind == "map":
        refs.append((step.root.over, True))
    refs += [(r, False) for r in ((step.unit_template.inputs if step.unit_template else None) or [])]
    if step.route is not None:
        refs.append((step.route.input, False))
    return refs


def _distinct_items(value: Any) -> bool:
    """Whether a fan-out value is a list of distinct, non-null items (compared as canonical JSON)."""
    from akm.canonical import CanonicalError, canonical_json

    if not isinstance(value, list) or any(item is None for item in value):
        return False
    try:
        return len({canonical_json(item) for item in value}) == len(value)
    except CanonicalError:
        return False


def _remedy(action: str, step_id: str | None, *, why: str, redo: bool = False, then: str = "run") -> dict[str, Any]:
    return {"action": action, "stepId": step_id, "redo": redo, "then": then, "why": why}


def _new_run(run: Run, why: str) -> dict[str, Any]:
    """A new run of the run's workflow (`workflow`: its ref or file) with its params, reusing its units."""
    try:
        params: Any = run.params
    except AkmError:
        params = None
    return {**_remedy("new_run", None, why=why), "workflow": run.workflow_ref, "params": params, "fromRun": run.id}
