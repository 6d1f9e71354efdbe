"""The session protocol: the calling agent does units and judges gates, then reports them (D11-D13).

Two halves:

* `brief(db, run_id)` — read-only. What the current step needs from the agent:
  its session units (prompt, context, schema, claim, a ready report hint) or a
  verdict for its gate. It computes the work list with the same pure
  functions as the native engine, so ids, input hashes and prompts are
  exactly the engine's.
* `report(db, run_id, unit_id, ...)` — records one unit result (or a verdict)
  behind guards that each refuse with a coded error and write nothing, then,
  when that completes the step's work, finishes the step through
  `finalize.decide_step` — the one way a step finishes, shared with the drive
  loop. A report never drives further steps: `workflow run` does that.

Claims (D13): `status: running` claims a unit for its reporter (90 s,
renewed by reporting running again); a live claim of another holder refuses
other reports, and the native engine never dispatches a claimed unit.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from akm.record import dataclass
from pathlib import Path
from typing import Any

from akm.dispatch.redact import redact_text, redact_value, sensitive_values_from
from akm.engine import gates
from akm.engine.budget import MAX_UNIT_TOKENS as MAX_REPORT_TOKENS
from akm.engine.answer import AnswerError, parse_command_json
from akm.engine.finalize import (
    DONE,
    FAILED,
    RETRYABLE,
    GateState,
    StepDecision,
    UnitState,
    Verdict,
    decide_step,
    gate_row_for,
    verdict_from_value,
)
from akm.engine.state import LoadedRun, load_run
from akm.engine.stepctx import (
    Spine,
    finish_step,
    journal_verdict,
    judge_failure,
    judge_with_engine,
    load_gate,
    load_spine,
    step_rows,
)
from akm.errors import UsageError
from akm.format.schema import validate_instance
from akm.plan.identity import NO_ITEM, base_of_attempt
from akm.plan.model import StepPlan
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.db import Database, now_iso
from akm.store.runs import DRIVABLE_STATUSES, holder_is_live

MISSING: Any = object()
REPORT_STATUSES = ("completed", "failed", "running")
# Failure reasons a report may use verbatim (they take part in `retry.on`); anything else is `external:<slug>`.
FAILURE_TAXONOMY = frozenset({
    "timeout", "spawn_failed", "non_zero_exit", "parse_error", "cooldown", "llm_rate_limit", "llm_content_filter",
    "llm_invalid_json", "content_policy_reject", "unsupported_type", "no_change", "aborted",
})
FINALIZE_WAIT_S = 30.0
# The largest result a report may record: what an agent engine's unit can return (its harness's kept stdout,
# `akm.dispatch.agents.MAX_STDOUT_BYTES`). Beyond it a report is refused with a code, before anything is
# parsed or written, instead of growing the journal without bound (or failing inside SQLite).
MAX_RESULT_BYTES = 16 * 1024 * 1024


# ---------------------------------------------------------------- the current step


@dataclass
class _Current:
    loaded: LoadedRun
    spine: Spine
    step: StepPlan | None
    gate: GateState | None = None
    rows: list[dict[str, Any]] | None = None
    gate_rows: list[dict[str, Any]] | None = None
    decision: StepDecision | None = None

    @property
    def run_id(self) -> str:
        return self.loaded.run_id


_WORK_LISTS: dict[tuple[Any, ...], Any] = {}
_WORK_LISTS_LOCK = threading.Lock()
_WORK_LISTS_MAX = 8


def _work_list(cur: _Current) -> Any:
    """The step's work list, remembered per (run, spine, gate state): a long-lived server answering a
    report per unit of a 1000-unit fan-out would otherwise rebuild (and rehash) it for every report."""
    from akm.canonical import canonical_json
    from akm.engine.finalize import work_list_for

    assert cur.step is not None and cur.gate is not None
    key = (cur.run_id, cur.loaded.run.plan_hash, cur.step.step_id, cur.gate.loop, cur.gate.base,
           canonical_json(cur.gate.feedback), tuple((s.step_id, s.status, s.completed_at) for s in cur.spine.steps))
    with _WORK_LISTS_LOCK:
        hit = _WORK_LISTS.get(key)
    if hit is not None:
        return hit
    wl = work_list_for(cur.run_id, cur.step, cur.loaded.params, cur.spine.outputs,
                       cur.loaded.plan.execution.engines, cur.gate)
    with _WORK_LISTS_LOCK:
        if len(_WORK_LISTS) >= _WORK_LISTS_MAX:
            _WORK_LISTS.pop(next(iter(_WORK_LISTS)))
        _WORK_LISTS[key] = wl
    return wl


def _current(db: Database, run_id: str) -> _Current:
    loaded = load_run(db, run_id)
    spine = load_spine(db, run_id, loaded.plan)
    run = loaded.run
    step = loaded.plan.step(run.current_step_id) if run.current_step_id else None
    cur = _Current(loaded, spine, step)
    if step is None or run.status not in DRIVABLE_STATUSES or spine.routes.skip_reason(step) is not None:
        return cur
    cur.rows, cur.gate_rows = step_rows(db, run_id, step.step_id)
    cur.gate = load_gate(db, run_id, step, spine, cur.gate_rows)
    cur.decision = decide_step(run_id=run_id, step=step, params=loaded.params, outputs=spine.outputs,
                               engines=loaded.plan.execution.engines, gate=cur.gate, rows=cur.rows,
                               fail_fast=True, work_list=_work_list(cur) if step.root is not None else None)
    return cur


def _is_session_judged(cur: _Current) -> bool:
    assert cur.step is not None
    return gates.judge_engine(cur.loaded.plan, cur.step)[0] is None


def _live_claim(row: dict[str, Any] | None, now: str) -> dict[str, Any] | None:
    if row is None or row.get("status") != "running":
        return None
    if not holder_is_live(row.get("claim_holder"), row.get("claim_host"), row.get("claim_pid"),
                          row.get("claim_expires_at"), now):
        return None
    return {"holder": row["claim_holder"], "expiresAt": row["claim_expires_at"]}


# ---------------------------------------------------------------- brief (read-only)


def _unit_brief(cur: _Current, state: UnitState, now: str) -> dict[str, Any]:
    u = state.unit
    tmpl = u.template
    claim = _live_claim(state.row, now)
    action = {RETRYABLE: "rerun", FAILED: "rerun"}.get(state.status, "claimed" if claim else "do")
    context: dict[str, Any] = {"params": cur.loaded.params, "inputs": {ref: v for ref, v in u.inputs},
                               "gateFeedback": cur.gate.feedback if cur.gate else None}
    if u.item is not NO_ITEM:
        context["item"] = u.item
        context["itemIndex"] = u.index
    return {
        "unitId": u.unit_id,
        "attemptId": u.base_id,
        "inputHash": u.input_hash,
        "action": action,
        "runner": u.runner,
        "prompt": u.prompt,
        "outputSchema": tmpl.output_schema,
        "context": context,
        "claim": claim,
        "lastFailure": state.row.get("failure_reason") if state.status in (RETRYABLE, FAILED) and state.row else None,
        "report": {"runId": cur.run_id, "unitId": u.unit_id, "expectStep": cur.step.step_id if cur.step else None,
                   "status": "completed", "resultKind": "json" if tmpl.output_schema is not None else "text",
                   "rerun": action == "rerun"},
    }


def _judge_brief(cur: _Current) -> dict[str, Any]:
    step, d = cur.step, cur.decision
    assert step is not None and d is not None
    r = d.result
    summary = gates.artifact_summary(r.unit_count if r else 0, r.failed_units if r else 0, d.artifact)
    unit_id = gate_row_for(step.step_id, d.loop)
    return {
        "unitId": unit_id,
        "criteria": list(step.gate.criteria),
        "artifact": d.artifact,
        "summary": summary,
        "prompt": gates.judge_prompt(step, summary),
        "verdictSchema": gates.VERDICT_SCHEMA,
        "report": {"runId": cur.run_id, "unitId": unit_id, "expectStep": step.step_id, "status": "completed",
                   "resultKind": "verdict", "rerun": False},
    }


def brief(db: Database, run_id: str) -> dict[str, Any]:
    """What the calling agent should do now for this run. Never writes."""
    cur = _current(db, run_id)
    run = cur.loaded.run
    step = cur.step
    out: dict[str, Any] = {
        "runId": run_id, "status": run.status, "done": run.status == "completed",
        "active": run.status in DRIVABLE_STATUSES, "kind": "none", "stepId": step.step_id if step else None,
        "stepTitle": step.title if step else None, "instructions": None, "gateLoop": None, "maxLoops": None,
        "gateFeedback": None, "units": [], "unitCount": 0, "doneCount": 0, "judge": None, "message": "",
        "warnings": [],
    }
    if run.status == "completed":
        out.update(kind="done", message=f"Run {run_id} is completed; no work remains.")
        return out
    if run.status not in DRIVABLE_STATUSES:
        final = run.status == "abandoned"  # abandoning is final: there is no resuming to wait for
        out.update(kind="inactive", message=f"Run {run_id} is {run.status}; it takes no reports"
                                            + ("; abandoning is final." if final else " until resumed."))
        return out
    lease = runs_store.read_lease(db, run_id)
    if lease is not None and not lease.holder.startswith(units_store.REPORT_LOCK_PREFIX):
        out["warnings"].append(f"akm is driving this run right now (lease holder {lease.holder} until "
                               f"{lease.until}); reports are refused until it stops.")
    d = cur.decision
    if step is None or d is None or cur.gate is None:
        out.update(kind="engine", message="akm settles the next step itself: continue the run.")
        return out
    tmpl = step.unit_template
    out.update(instructions=tmpl.instructions if tmpl is not None else None, gateLoop=d.loop,
               maxLoops=cur.gate.base + cur.gate.max_loops, gateFeedback=cur.gate.feedback)
    if d.states:
        out["unitCount"] = len(d.states)
        out["doneCount"] = sum(1 for s in d.states if s.status == DONE)
    now = now_iso()
    if d.kind == "work":
        session_units = [s for s in d.units if s.unit.runner == "session"]
        if not session_units:
            out.update(kind="engine", message="This step's units are run by akm itself: continue the run.")
            return out
        out["units"] = [_unit_brief(cur, s, now) for s in session_units]
        out["kind"] = "units"
        todo = sum(1 for u in out["units"] if u["action"] != "claimed")
        out["message"] = (f"Step {step.step_id} (gate loop {d.loop}) needs {len(out['units'])} unit(s) done by "
                          f"you ({todo} unclaimed): do each unit's prompt, then report its result.")
        if any(s.unit.template.isolation == "worktree" for s in session_units):
            out["warnings"].append("this step declares isolation: worktree; akm cannot isolate work done in your "
                                   "session — work on a branch or a scratch copy yourself.")
        return out
    if d.kind == "judge" and _is_session_judged(cur):
        out["judge"] = _judge_brief(cur)
        out["kind"] = "judge"
        out["message"] = (f"Step {step.step_id} produced its artifact (gate loop {d.loop}): judge it against the "
                          "criteria and report a verdict {complete, missing, feedback}.")
        return out
    out.update(kind="engine", message="akm can take the run further itself: continue the run.")
    return out


# ---------------------------------------------------------------- report


def normalize_failure_reason(reason: str | None, sensitive: list[str]) -> str:
    """Taxonomy reasons verbatim (they drive `retry.on`); anything else `external:<slug>` (spec §3.10)."""
    if reason is None or not reason.strip():
        return "reported_failure"
    if redact_text(reason, sensitive) != reason:
        return "reported_failure"
    text = reason.strip()
    if text in FAILURE_TAXONOMY:
        return text
    slug = re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-")[:48].strip("-")
    return f"external:{slug or 'unknown'}"


def _sensitive_for(cur: _Current, state: UnitState, project_root: Path) -> list[str]:
    refs = state.unit.template.env or []
    if not refs:
        return []
    from akm.engine.env_bindings import EnvBindingError, resolve_env_refs

    try:
        return sensitive_values_from(resolve_env_refs(refs, project_root))
    except EnvBindingError:
        return []


def _prepare_result(state: UnitState, status: str, result: Any, sensitive: list[str]) -> str | None:
    """The unit row's result_json for this report; raises UsageError when a completed result misses its schema."""
    schema = state.unit.template.output_schema
    uid = state.unit.unit_id
    if isinstance(result, str) and len(result) > MAX_RESULT_BYTES:  # at least that many bytes: refuse unparsed
        raise _too_large(uid, len(result))
    if status == "failed":
        if result is MISSING or result is None:
            return None
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        text = redact_text(text, sensitive)
        return json.dumps(text[:2000], ensure_ascii=False) if text.strip() else None
    if schema is not None:
        if result is MISSING or result is None or (isinstance(result, str) and not result.strip()):
            raise UsageError(f"Unit {uid} declares an output schema: a completed report needs a JSON result.",
                             code="RESULT_REQUIRED", details={"outputSchema": schema})
        value = result
        if isinstance(result, str):
            try:
                value = parse_command_json(result)
            except AnswerError as exc:
                # A schema that takes a string takes the text itself: over MCP `result: "Ada"` is already a JSON
                # string, and nobody should have to quote it twice. Anything else must be JSON.
                if validate_instance(result, schema):
                    raise UsageError(f"The result for unit {uid} is not JSON: {redact_text(str(exc), sensitive)}.",
                                     code="RESULT_INVALID") from None
                value = result
        _require_recordable(value, uid)
        errors = validate_instance(value, schema)
        if errors and isinstance(result, str) and value is not result and not validate_instance(result, schema):
            value, errors = result, []  # `"42"` for a string schema is the text 42, not the number
        if errors:
            raise UsageError(
                f"The result for unit {uid} failed validation against its declared output schema: "
                + redact_text("; ".join(errors), sensitive) + ". Nothing was recorded; correct it and report again.",
                code="RESULT_INVALID", details={"errors": [redact_text(e, sensitive) for e in errors],
                                                "outputSchema": schema})
        return json.dumps(redact_value(value, sensitive), ensure_ascii=False, separators=(",", ":"))
    if result is MISSING or result is None:
        return None
    if isinstance(result, str):
        text = redact_text(result, sensitive)
        return json.dumps(text, ensure_ascii=False) if text else None
    _require_recordable(result, uid)
    return json.dumps(redact_value(result, sensitive), ensure_ascii=False, separators=(",", ":"))


def _too_large(uid: str, size: int) -> UsageError:
    return UsageError(f"The result for unit {uid} is too large: a report holds at most {MAX_RESULT_BYTES} bytes "
                      "(16 MiB). Write a large output to a file and report its path instead.",
                      code="RESULT_TOO_LARGE", details={"bytes": size, "maxBytes": MAX_RESULT_BYTES})


def _require_recordable(value: Any, uid: str) -> None:
    """A structured result (MCP callers send JSON values, not text) is held to what a text answer
    is: finite numbers, at most MAX_ANSWER_DEPTH levels (what `status` can show)."""
    from akm.engine.answer import recordable_problem

    problem = recordable_problem(value)
    if problem is not None:
        raise UsageError(f"The result for unit {uid} cannot be recorded as JSON: {problem}. Nothing was recorded.",
                         code="RESULT_INVALID")


def _refuse_unit(cur: _Current, unit_id: str) -> UsageError:
    d = cur.decision
    valid = [s.unit.unit_id for s in (d.states if d else [])]
    step_id = cur.step.step_id if cur.step else None
    return UsageError(
        f"Unit {unit_id} does not belong to the current work of run {cur.run_id} (step {step_id}, gate loop "
        f"{d.loop if d else '-'}). Units of this step: {', '.join(valid) or '(none)'}.",
        code="UNKNOWN_UNIT", details={"stepId": step_id, "units": valid},
    )


def _check_reportable(cur: _Current, expect_step: str | None) -> None:
    run = cur.loaded.run
    if run.status not in DRIVABLE_STATUSES:
        raise UsageError(f"Run {cur.run_id} is {run.status}; it no longer takes reports.", code="RUN_NOT_ACTIVE",
                         details={"runId": cur.run_id, "status": run.status})
    if cur.step is None:
        raise UsageError(f"Run {cur.run_id} has no current step.", code="RUN_NOT_ACTIVE")
    if expect_step is not None and expect_step != cur.step.step_id:
        raise UsageError(
            f"Run {cur.run_id} is now on step {cur.step.step_id}, not {expect_step}; fetch the current brief and "
            "report against it.", code="STEP_MISMATCH", details={"currentStep": cur.step.step_id},
        )


def report(
    db: Database,
    run_id: str,
    unit_id: str,
    *,
    status: str,
    result: Any = MISSING,
    verdict: Any = MISSING,
    tokens: int | None = None,
    failure_reason: str | None = None,
    expect_step: str | None = None,
    rerun: bool = False,
    holder: str,
    project_root: Path,
    registry: Any = None,
) -> dict[str, Any]:
    """Record one report and finish the step when its work is complete. Returns the report result."""
    if status not in REPORT_STATUSES:
        raise UsageError(f"Report status {status!r} is not one of {', '.join(REPORT_STATUSES)}.",
                         code="INVALID_ARGUMENT")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)
                               or not 0 <= tokens <= MAX_REPORT_TOKENS):
        raise UsageError(f"tokens must be a whole number from 0 to {MAX_REPORT_TOKENS}.", code="INVALID_ARGUMENT",
                         details={"argument": "tokens"})
    cur = _current(db, run_id)
    _check_reportable(cur, expect_step)
    assert cur.step is not None
    if ".gate:l" in unit_id or unit_id == f"{cur.step.step_id}.gate" or verdict is not MISSING:
        return _report_verdict(db, cur, unit_id, status, verdict, holder, project_root, registry)
    d = cur.decision
    if d is None:
        raise _refuse_unit(cur, unit_id)
    wanted = base_of_attempt(unit_id)
    state = next((s for s in d.states if wanted in (s.unit.unit_id, s.unit.base_id)), None)
    if state is None:
        raise _refuse_unit(cur, unit_id)
    if state.unit.runner == "exec":
        raise UsageError(f"Unit {unit_id} is a command unit: akm runs it itself (continue the run); it cannot "
                         "be reported.", code="UNIT_NOT_REPORTABLE")
    sensitive = _sensitive_for(cur, state, project_root)
    result_json = None if status == "running" else _prepare_result(state, status, result, sensitive)
    if result_json is not None and len(result_json) > MAX_RESULT_BYTES // 4:  # cheap: only big ones are measured
        size = len(result_json.encode("utf-8", "surrogatepass"))
        if size > MAX_RESULT_BYTES:
            raise _too_large(state.unit.unit_id, size)
    reason = normalize_failure_reason(failure_reason, sensitive) if status == "failed" else None
    u = state.unit
    budget = cur.loaded.plan.budget
    write = units_store.write_report(
        db, run_id=run_id, unit_id=u.base_id, step_id=cur.step.step_id, node_id=u.node_id,
        parent_unit_id=u.parent_unit_id, runner="session" if u.runner == "session" else u.runner, engine=u.engine,
        model=u.model, input_hash=u.input_hash, status=status, result_json=result_json, tokens=tokens,
        failure_reason=reason, holder=redact_text(holder, sensitive), rerun=rerun,
        max_units=budget.max_units if budget else None, max_tokens=budget.max_tokens if budget else None,
    )
    out: dict[str, Any] = {
        "runId": run_id, "stepId": cur.step.step_id, "unitId": u.unit_id, "attemptId": u.base_id,
        "status": status, "recorded": write.recorded, "gateLoop": d.loop,
        "claim": ({"holder": write.claim.holder, "expiresAt": write.claim.until} if write.claim else None),
        "remainingUnits": None, "stepOutcome": None, "runStatus": cur.loaded.run.status, "message": "",
    }
    if status == "running":
        out["remainingUnits"] = sum(1 for s in d.states if not s.terminal)
        out["message"] = (f"Unit {u.unit_id} is claimed by {write.claim.holder if write.claim else holder} until "
                          f"{out['claim']['expiresAt'] if out['claim'] else '?'}; report running again to keep it, "
                          "then report its result.")
        return out
    outcome = _finalize(db, run_id, project_root, registry,
                        budget_message=write.tokens_crossed)
    fresh = runs_store.require_run(db, run_id)
    out.update(stepOutcome=outcome.get("stepOutcome"), remainingUnits=outcome.get("remainingUnits", 0),
               runStatus=fresh.status, message=outcome.get("message", ""))
    return out


def _report_verdict(db: Database, cur: _Current, unit_id: str, status: str, verdict: Any, holder: str,
                    project_root: Path, registry: Any) -> dict[str, Any]:
    step, d = cur.step, cur.decision
    assert step is not None
    if verdict is MISSING:
        raise UsageError(f"{unit_id} is a gate verdict: report it with a verdict {{complete, missing, feedback}}.",
                         code="VERDICT_REQUIRED")
    if isinstance(verdict, str):
        try:
            verdict = parse_command_json(verdict)
        except AnswerError as exc:
            raise UsageError(f"The verdict is not JSON: {exc}.", code="VERDICT_INVALID") from None
    parsed = verdict_from_value(verdict)
    if parsed is None:
        raise UsageError('A verdict is an object {"complete": boolean, "missing": [string], "feedback": string}.',
                         code="VERDICT_INVALID")
    if status != "completed":
        raise UsageError("A verdict is reported with status completed.", code="INVALID_ARGUMENT")
    if d is None or d.kind != "judge" or not _is_session_judged(cur):
        raise UsageError(f"Step {step.step_id} of run {cur.run_id} is not waiting for a verdict from you.",
                         code="NOT_AWAITING_VERDICT")
    expected = gate_row_for(step.step_id, d.loop)
    if unit_id not in (expected, f"{step.step_id}.gate"):
        raise UsageError(f"The current gate verdict of step {step.step_id} is {expected}, not {unit_id}.",
                         code="UNKNOWN_UNIT", details={"expected": expected})
    with db.tx():
        units_store.guard_session_write(db, cur.run_id)
        journal_verdict(db, cur.run_id, step, d.loop, parsed, runner="session")
    outcome = _finalize(db, cur.run_id, project_root, registry)
    fresh = runs_store.require_run(db, cur.run_id)
    return {"runId": cur.run_id, "stepId": step.step_id, "unitId": expected, "attemptId": expected,
            "status": "completed", "recorded": "written", "gateLoop": d.loop, "claim": None,
            "remainingUnits": outcome.get("remainingUnits", 0), "stepOutcome": outcome.get("stepOutcome"),
            "runStatus": fresh.status, "message": outcome.get("message", "")}


# ---------------------------------------------------------------- finishing the step


def _acquire_finalize_lock(db: Database, run_id: str) -> str | None:
    """The run lease, held briefly by this report while it finishes the step; waits for another report's."""
    holder = f"{units_store.REPORT_LOCK_PREFIX}{uuid.uuid4()}"
    deadline = time.monotonic() + FINALIZE_WAIT_S
    delay = 0.01
    while True:
        live = runs_store.acquire_lease(db, run_id, holder)
        if live is None:
            return holder
        if not live.holder.startswith(units_store.REPORT_LOCK_PREFIX) or time.monotonic() > deadline:
            return None  # the engine took over (it finishes the step itself), or a stuck reporter
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _finalize(db: Database, run_id: str, project_root: Path, registry: Any,
              budget_message: str | None = None) -> dict[str, Any]:
    """Apply `decide_step` to the current step until it needs more work or finishes."""
    lock = _acquire_finalize_lock(db, run_id)
    if lock is None:
        return {"message": "Recorded. Another driver is finishing this step."}
    try:
        for _ in range(1000):  # each pass journals a verdict or finishes the step; bounded by max_loops
            cur = _current(db, run_id)
            step, d = cur.step, cur.decision
            if step is None or d is None:
                return {"message": "Recorded.", "remainingUnits": 0}
            if budget_message is not None:
                finish_step(db, run_id, step.step_id, "failed", summary=None, notes=budget_message,
                            evidence={"error": budget_message}, lease_holder=lock)
                return {"stepOutcome": {"kind": "failed", "summary": budget_message}, "remainingUnits": 0,
                        "message": f"Step {step.step_id} failed: {budget_message}."}
            if d.kind == "work":
                left = len(d.units)
                _park(db, run_id, {"kind": "units", "stepId": step.step_id, "gateLoop": d.loop})
                prior_loop = cur.gate.loop > 1 and d.loop == cur.gate.loop and cur.gate.feedback is not None
                if prior_loop and all(s.row is None for s in d.states):
                    return {"stepOutcome": {"kind": "next_loop", "gateLoop": d.loop,
                                            "feedback": cur.gate.feedback["feedback"],
                                            "missing": cur.gate.feedback["missing"]},
                            "remainingUnits": left,
                            "message": f"Step {step.step_id} goes to gate loop {d.loop}: fetch the brief again and "
                                       "redo its units with the feedback."}
                return {"remainingUnits": left,
                        "message": f"Recorded. {left} unit(s) of step {step.step_id} still need a report."}
            if d.kind == "retry":
                assert d.verdict is not None
                journal_verdict(db, run_id, step, d.loop, d.verdict, runner="schema")
                continue
            if d.kind == "judge":
                if _is_session_judged(cur):
                    _park(db, run_id, {"kind": "judge", "stepId": step.step_id, "gateLoop": d.loop})
                    return {"stepOutcome": {"kind": "awaiting_verdict", "gateLoop": d.loop}, "remainingUnits": 0,
                            "message": f"Step {step.step_id}'s units are done; its gate needs your verdict "
                                       "(fetch the brief)."}
                if not _engine_judge(db, cur, d, project_root, registry):
                    fresh = runs_store.get_step(db, run_id, step.step_id)
                    return {"stepOutcome": {"kind": "blocked", "summary": fresh.notes if fresh else None},
                            "remainingUnits": 0, "message": f"Step {step.step_id} is blocked: its judge failed."}
                continue
            status = {"complete": "completed", "fail": "failed", "block": "blocked"}[d.kind]
            notes = d.notes if status != "completed" else None
            status, notes, _ = finish_step(db, run_id, step.step_id, status,
                                           summary=d.summary if status == "completed" else None, notes=notes,
                                           evidence=d.evidence, lease_holder=lock,
                                           status_detail=d.detail if status == "blocked" else None)
            kind = {"completed": "completed", "failed": "failed", "blocked": "blocked"}[status]
            outcome: dict[str, Any] = {"kind": kind, "summary": d.summary if status == "completed" else notes}
            if d.detail:
                outcome.update(missing=d.detail.get("missing"), feedback=d.detail.get("feedback"))
            message = {"completed": f"Step {step.step_id} completed: continue the run to go on.",
                       "failed": f"Step {step.step_id} failed: {notes}",
                       "blocked": f"Step {step.step_id} is blocked: {notes}"}[status]
            return {"stepOutcome": outcome, "remainingUnits": 0, "message": message}
        raise UsageError(f"Run {run_id}: finishing step did not converge.", code="INTERNAL_LOOP")
    finally:
        runs_store.release_lease(db, run_id, lock)


def _park(db: Database, run_id: str, stub: dict[str, Any]) -> None:
    """Mark the run as waiting for the agent (a no-op when it already says exactly that)."""
    run = runs_store.get_run(db, run_id)
    if run is None or run.status not in DRIVABLE_STATUSES:
        return
    if run.status == "awaiting_session" and run.status_detail == stub:
        return
    runs_store.set_run_status(db, run_id, "awaiting_session", stub)


def _engine_judge(db: Database, cur: _Current, d: StepDecision, project_root: Path, registry: Any) -> bool:
    """Run the step's engine judge from a report (the same call the drive loop makes). False = blocked."""
    step = cur.step
    assert step is not None
    if registry is None:
        from akm.dispatch.registry import default_registry

        registry = default_registry()
    kind = (gates.judge_engine(cur.loaded.plan, step)[1] or {}).get("kind")
    verdict, error = judge_with_engine(db, cur.run_id, cur.loaded.plan, step, d.loop, result=d.result,
                                       artifact=d.artifact, dispatcher=registry.get(kind) if kind else None,
                                       cwd=str(project_root), cancel=threading.Event())
    if verdict is not None:
        return True
    lock = runs_store.read_lease(db, cur.run_id)
    notes, detail = judge_failure(step, error)
    finish_step(db, cur.run_id, step.step_id, "blocked", summary=None, notes=notes, evidence=d.evidence,
                lease_holder=lock.holder if lock else None, status_detail=detail)
    return False


__all__ = ["brief", "report", "normalize_failure_reason", "MISSING", "Verdict"]
