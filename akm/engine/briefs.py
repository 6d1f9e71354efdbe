"""The brief: what the calling agent should do now for a run (read-only; D11-D12).

Its session units (prompt, context, schema, claim, a ready report hint) or a verdict for its gate, computed
with the same pure functions as the native engine, so ids, input hashes and prompts are exactly the
engine's. A typed `Brief`; the api's views give it its JSON.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from akm.engine import gates, reuse
from akm.engine.current_step import (
    CurrentStep,
    decided,
    is_session_judged,
    judge_failed_here,
    live_claim,
    read_current,
)
from akm.engine.finalize import DONE, FAILED, RETRYABLE, StepDecision, UnitState, gate_row_for
from akm.engine.session_types import Brief, BriefUnit, JudgeBrief, ReportHint, UnitAction, UnitContext
from akm.engine.worklist import WorkUnit
from akm.store import rewinds as rewinds_store
from akm.store import runs as runs_store
from akm.store.journal import Journal
from akm.store.runs import Run
from akm.store.status import DRIVABLE_STATUSES, REPORT_LOCK_PREFIX


def brief(db: Journal, run_id: str) -> Brief:
    """What the calling agent should do now for this run. Never writes."""
    return brief_of(db, read_current(db, run_id))


def brief_of(db: Journal, cur: CurrentStep, run: Run | None = None) -> Brief:
    """The brief of a step already read (and decided, or decided here). `run`: the run row as it is now,
    when it changed since the step was read (a report that parked the run)."""
    run = run or cur.loaded.run
    out = Brief(
        run_id=run.id,
        status=run.status,
        done=run.status == "completed",
        active=run.status in DRIVABLE_STATUSES,
        step_id=cur.step.step_id if cur.step else None,
        step_title=cur.step.title if cur.step else None,
    )
    if run.status not in DRIVABLE_STATUSES:
        return _ended(out, run)
    driven = _driven_warning(db, run.id, out)
    out.warnings.extend(_secret_param_warnings(cur.loaded.params))
    d = decided(db, cur)
    if cur.step is None or d is None or cur.gate is None:
        return _engine(out, "akm settles the next step itself: continue the run.")
    _step_fields(out, cur, d)
    if d.kind == "work":
        return _units(db, cur, d, out, driven)
    if d.kind == "judge":
        return _judge(db, cur, d, out)
    return _engine(out, "akm can take the run further itself: continue the run.")


def _driven_warning(db: Journal, run_id: str, out: Brief) -> bool:
    """Whether akm itself drives the run right now (another holder's live lease, not a report's finalize
    lock); then the brief says so and the agent does not run the units."""
    lease = runs_store.read_lease(db, run_id)
    if lease is None or lease.holder.startswith(REPORT_LOCK_PREFIX):
        return False
    out.warnings.append(
        f"akm is driving this run right now (lease holder {lease.holder} until "
        f"{lease.until}); reports are refused until it stops: do not run its units."
    )
    return True


def _step_fields(out: Brief, cur: CurrentStep, d: StepDecision) -> None:
    """What the brief says of the step whatever it asks: instructions, gate loop, units done."""
    assert cur.step is not None and cur.gate is not None
    tmpl = cur.step.unit_template
    out.instructions = tmpl.instructions if tmpl is not None else None
    out.gate_loop = d.loop
    out.max_loops = cur.gate.base + cur.gate.max_loops
    out.gate_feedback = cur.gate.feedback
    if d.states:
        out.unit_count = len(d.states)
        out.done_count = sum(1 for s in d.states if s.status == DONE)


def _ended(out: Brief, run: Run) -> Brief:
    """A run that takes no reports: completed, or stopped (failed, blocked, abandoned)."""
    if run.status == "completed":
        out.kind, out.message = "done", f"Run {run.id} is completed; no work remains."
        return out
    final = run.status == "abandoned"  # abandoning is final: there is no resuming to wait for
    out.kind = "inactive"
    out.message = f"Run {run.id} is {run.status}; it takes no reports" + (
        "; abandoning is final." if final else " until resumed."
    )
    return out


def _engine(out: Brief, message: str) -> Brief:
    out.kind, out.message = "engine", message
    return out


def _units(db: Journal, cur: CurrentStep, d: StepDecision, out: Brief, driven: bool) -> Brief:
    """A step whose units remain: the session units for the agent, unless akm runs them (or restores them)."""
    step = cur.step
    assert step is not None
    session_units = [s for s in d.units if s.unit.runner == "session"]
    if not session_units:
        return _engine(out, "This step's units are run by akm itself: continue the run.")
    if reuse.restorable(db, cur.run_id, cur.loaded.run.reuse_from, cur.loaded.plan, step, d):
        # Units done before with the same inputs (a rewind's history, a `--from` run): akm restores them
        # when the run goes on, so the agent is not asked for work that is already there.
        return _engine(
            out,
            f"Units of step {step.step_id} were done before with the same inputs: continue the run and "
            "akm reuses them (what is left comes back to you).",
        )
    now = db.now()
    again = frozenset(rewinds_store.superseded_content_ids(db, cur.run_id, step.step_id))
    out.units = [_unit_brief(cur, s, now, driven, again) for s in session_units]
    out.kind = "units"
    out.warnings.extend(_silent_claim_warnings(session_units, now))
    todo = sum(1 for u in out.units if u.action != "claimed")
    out.message = (
        f"Step {step.step_id} (gate loop {d.loop}) needs {len(out.units)} unit(s) done by "
        f"you ({todo} unclaimed): do each unit's prompt, then report its result."
    )
    if any(s.unit.template.isolation == "worktree" for s in session_units):
        out.warnings.append(
            "this step declares isolation: worktree; akm cannot isolate work done in your "
            "session — work on a branch or a scratch copy yourself."
        )
    return out


def _judge(db: Journal, cur: CurrentStep, d: StepDecision, out: Brief) -> Brief:
    """A step whose artifact awaits a verdict: the agent's, when no judge engine gives it (or it failed)."""
    step = cur.step
    assert step is not None
    if reuse.restorable_verdict(db, cur.run_id, cur.loaded.run.reuse_from, cur.loaded.plan, step, d):
        return _engine(
            out,
            f"Step {step.step_id}'s artifact was judged before, as it is now: continue the run and akm "
            "reuses that verdict.",
        )
    session_judged = is_session_judged(cur)
    if not session_judged and not judge_failed_here(cur):
        return _engine(out, "akm can take the run further itself: continue the run.")
    out.judge = _judge_brief(cur, d)
    out.kind = "judge"
    out.message = (
        f"Step {step.step_id} produced its artifact (gate loop {d.loop}): judge it against the "
        "criteria and report a verdict {complete, missing, feedback}."
    )
    if not session_judged:
        out.message += " Its judge engine failed on this loop: your verdict stands in for it."
        out.warnings.append(
            f"the judge engine of step {step.step_id} failed on gate loop {d.loop}; report the verdict yourself, "
            "or continue the run to ask the engine again"
        )
    return out


def _unit_brief(cur: CurrentStep, state: UnitState, now: str, driven: bool, again: frozenset[str]) -> BriefUnit:
    """`again`: units a rewind superseded: done before, offered as a re-run (the agent reports a new result)."""
    u = state.unit
    tmpl = u.template
    claim = live_claim(state.row, now)
    action = _action(state, claim is not None, driven, again)
    failed = state.status in (RETRYABLE, FAILED) and state.row
    return BriefUnit(
        unit_id=u.unit_id,
        attempt_id=u.base_id,
        input_hash=u.input_hash,
        action=action,
        result_kind="json" if tmpl.output_schema is not None else "text",
        env=list(tmpl.env or []),
        env_bindings=_binding_names(cur, tmpl.env),
        runner=u.runner,
        prompt=u.prompt,
        output_schema=tmpl.output_schema,
        context=_context(cur, u),
        claim=claim,
        last_failure=state.row.get("failure_reason") if failed and state.row else None,
        report=ReportHint(
            run_id=cur.run_id,
            unit_id=u.unit_id,
            attempt_id=u.base_id,
            gate_loop=cur.gate.loop if cur.gate else None,
            expect_step=cur.step.step_id if cur.step else None,
            rerun=action == "rerun",
        ),
    )


def _action(state: UnitState, claimed: bool, driven: bool, again: frozenset[str]) -> UnitAction:
    """do | claimed | rerun | do_not_run: a failed unit (or one a rewind superseded) is a re-run; a unit
    another holder claimed is left to it; nothing is run while akm itself drives the step."""
    if driven:
        return "do_not_run"  # another holder's live lease: akm itself is working on this step right now
    if state.status in (RETRYABLE, FAILED):
        return "rerun"
    if claimed:
        return "claimed"
    if state.row is None and state.unit.unit_id in again:
        return "rerun"
    return "do"


def _context(cur: CurrentStep, u: WorkUnit) -> UnitContext:
    return UnitContext(
        params=cur.loaded.params,
        inputs={ref: v for ref, v in u.inputs},
        gate_feedback=cur.gate.feedback if cur.gate else None,
        fan_out=u.is_fan_out,
        item=u.item if u.is_fan_out else None,
        item_index=u.index if u.is_fan_out else None,
    )


def _judge_brief(cur: CurrentStep, d: StepDecision) -> JudgeBrief:
    step = cur.step
    assert step is not None
    r = d.result
    summary = gates.artifact_summary(r.unit_count if r else 0, r.failed_units if r else 0, d.artifact)
    unit_id = gate_row_for(step.step_id, d.loop)
    return JudgeBrief(
        unit_id=unit_id,
        criteria=list(step.gate.criteria),
        artifact=d.artifact,
        summary=summary,
        prompt=gates.judge_prompt(step, summary),
        verdict_schema=gates.VERDICT_SCHEMA,
        report=ReportHint(
            run_id=cur.run_id, unit_id=unit_id, attempt_id=None, gate_loop=d.loop, expect_step=step.step_id
        ),
    )


_SECRET_NAME = re.compile(r"(api[_-]?key|token|secret|passw(or)?d|credential|private[_-]?key|auth)", re.I)


def _binding_names(cur: CurrentStep, refs: list[str] | None) -> list[str]:
    """The variable names a unit's `env:` refs bind (its env files, read here; never their values) — what the
    agent doing the unit must have in its own environment. The refs themselves are the unit's `env`; a ref
    whose file is missing or unreadable here binds no name."""
    if not refs:
        return []
    from akm import paths
    from akm.engine.env_bindings import EnvBindingError, resolve_env_refs

    run = cur.loaded.run
    root = paths.project_root(Path(run.workflow_path).parent) if run.workflow_path else Path.cwd()
    names: set[str] = set()
    for ref in refs:
        try:
            names.update(resolve_env_refs([ref], root))
        except EnvBindingError:
            continue
    return sorted(names)


def _secret_param_warnings(params: dict[str, Any]) -> list[str]:
    """Params are journaled and shown in every brief and prompt: a credential-looking one is named."""
    names = [n for n in params if _SECRET_NAME.search(n)]
    if not names:
        return []
    return [
        f"param(s) {', '.join(names)} look like credentials: params are not secret (they are journaled and "
        "sent in every prompt); pass secrets through a unit's env: bindings instead."
    ]


def _silent_claim_warnings(states: list[UnitState], now: str) -> list[str]:
    """A unit claimed by a holder whose claim expired without a result: that holder has gone silent."""
    out = []
    for s in states:
        row = s.row
        if row is None or row.get("status") != "running" or not row.get("claim_holder"):
            continue
        if live_claim(row, now) is None:
            out.append(
                f"unit {s.unit.unit_id} was claimed by {row['claim_holder']}, which has gone silent (its "
                f"claim expired at {row.get('claim_expires_at')} with no result): take the unit over."
            )
    return out
