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
  `finalize.decide_step` and `apply.apply_decision` — the one way a step
  finishes, shared with the drive loop. A report never drives further steps: `workflow run` does that.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from akm.dispatch.answer import AnswerError, parse_command_json
from akm.dispatch.redact import redact_text, redact_value, sensitive_values_from
from akm.engine import gates, reuse
from akm.engine.apply import AGAIN, PARKED, apply_decision, pass_failed
from akm.engine.budget import MAX_UNIT_TOKENS as MAX_REPORT_TOKENS
from akm.engine.finalize import (
    DIVERGED,
    DONE,
    FAILED,
    PENDING,
    RETRYABLE,
    RUNNING,
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
    load_gate,
    load_spine,
    step_rows,
)
from akm.errors import AkmError, UsageError
from akm.format.schema import validate_instance
from akm.plan.identity import NO_ITEM, base_of_attempt, journal_base_id
from akm.plan.model import StepPlan
from akm.record import dataclass
from akm.store import rewinds as rewinds_store
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.db import Database
from akm.store.report_guards import replay_diverged
from akm.store.runs import DRIVABLE_STATUSES, holder_is_live

MISSING: Any = object()
REPORT_STATUSES = ("completed", "failed", "running")
# Failure reasons a report may use verbatim (they take part in `retry.on`); anything else is `external:<slug>`.
FAILURE_TAXONOMY = frozenset(
    {
        "timeout",
        "spawn_failed",
        "non_zero_exit",
        "parse_error",
        "cooldown",
        "llm_rate_limit",
        "llm_content_filter",
        "llm_invalid_json",
        "content_policy_reject",
        "unsupported_type",
        "no_change",
        "aborted",
    }
)
FINALIZE_WAIT_S = 30.0
# The largest result a report may record: what an agent engine's unit can return (its harness's kept stdout,
# `akm.dispatch.agents.MAX_STDOUT_BYTES`). Beyond it a report is refused with a code, before anything is
# parsed or written, instead of growing the journal without bound (or failing inside SQLite).
MAX_RESULT_BYTES = 16 * 1024 * 1024
# The most a unit's journal row holds (spec/engine.md: `result_json` ≤ 1 MiB, what an exec unit keeps): a
# report whose recorded result is larger is refused, not stored whole (a refusal writes nothing).
MAX_RECORDED_RESULT_BYTES = 1024 * 1024


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
    key = (
        cur.run_id,
        cur.loaded.run.plan_hash,
        cur.loaded.run.hash_version,
        cur.step.step_id,
        cur.gate.loop,
        cur.gate.base,
        canonical_json(cur.gate.feedback),
        tuple((s.step_id, s.status, s.completed_at) for s in cur.spine.steps),
    )
    with _WORK_LISTS_LOCK:
        hit = _WORK_LISTS.get(key)
    if hit is not None:
        return hit
    wl = work_list_for(
        cur.run_id,
        cur.step,
        cur.loaded.params,
        cur.spine.outputs,
        cur.loaded.plan.execution.engines,
        cur.gate,
        cur.loaded.run.hash_version,
    )
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
    cur.decision = decide_step(
        run_id=run_id,
        step=step,
        params=loaded.params,
        outputs=spine.outputs,
        engines=loaded.plan.execution.engines,
        gate=cur.gate,
        rows=cur.rows,
        fail_fast=True,
        work_list=_work_list(cur) if step.root is not None else None,
        hash_version=run.hash_version,
    )
    return cur


def _is_session_judged(cur: _Current) -> bool:
    """The step's gate has no judge engine: the calling agent gives the verdict."""
    assert cur.step is not None
    return gates.judge_engine(cur.loaded.plan, cur.step)[0] is None


def _judge_failed_here(cur: _Current) -> bool:
    """The step's judge engine failed on the loop now to judge (its gate row is finished `failed`: no verdict,
    the step was blocked and the run resumed since): the calling agent may give the verdict instead, so a
    judge engine that keeps failing (an answer that is not JSON) never leaves the run without a way on."""
    d = cur.decision
    if cur.step is None or d is None or d.kind != "judge":
        return False
    row_id = gate_row_for(cur.step.step_id, d.loop)
    return any(r["unit_id"] == row_id and r.get("status") == "failed" for r in cur.gate_rows or [])


def _live_claim(row: dict[str, Any] | None, now: str) -> dict[str, Any] | None:
    if row is None or row.get("status") != "running":
        return None
    if not holder_is_live(
        row.get("claim_holder"), row.get("claim_host"), row.get("claim_pid"), row.get("claim_expires_at"), now
    ):
        return None
    return {"holder": row["claim_holder"], "expiresAt": row["claim_expires_at"]}


# ---------------------------------------------------------------- brief (read-only)


def _unit_brief(
    cur: _Current, state: UnitState, now: str, driven: bool = False, again: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """`again`: units a rewind superseded: done before, offered as a re-run (the agent reports a new result)."""
    u = state.unit
    tmpl = u.template
    claim = _live_claim(state.row, now)
    action = {RETRYABLE: "rerun", FAILED: "rerun"}.get(state.status, "claimed" if claim else "do")
    if action == "do" and state.row is None and u.unit_id in again:
        action = "rerun"
    if driven:
        action = "do_not_run"  # another holder's live lease: akm itself is working on this step right now
    context: dict[str, Any] = {
        "params": cur.loaded.params,
        "inputs": {ref: v for ref, v in u.inputs},
        "gateFeedback": cur.gate.feedback if cur.gate else None,
    }
    if u.item is not NO_ITEM:
        context["item"] = u.item
        context["itemIndex"] = u.index
    return {
        "unitId": u.unit_id,
        "attemptId": u.base_id,
        "inputHash": u.input_hash,
        "action": action,
        "resultKind": "json" if tmpl.output_schema is not None else "text",
        "env": list(tmpl.env or []),
        "envBindings": _binding_names(cur, tmpl.env),
        "runner": u.runner,
        "prompt": u.prompt,
        "outputSchema": tmpl.output_schema,
        "context": context,
        "claim": claim,
        "lastFailure": state.row.get("failure_reason") if state.status in (RETRYABLE, FAILED) and state.row else None,
        "report": {
            "runId": cur.run_id,
            "unitId": u.unit_id,
            "attemptId": u.base_id,
            "gateLoop": cur.gate.loop if cur.gate else None,
            "expectStep": cur.step.step_id if cur.step else None,
            "status": "completed",
            "rerun": action == "rerun",
        },
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
        "report": {
            "runId": cur.run_id,
            "unitId": unit_id,
            "attemptId": None,
            "gateLoop": d.loop,
            "expectStep": step.step_id,
            "status": "completed",
            "rerun": False,
        },
    }


def brief(db: Database, run_id: str) -> dict[str, Any]:
    """What the calling agent should do now for this run. Never writes."""
    cur = _current(db, run_id)
    run = cur.loaded.run
    step = cur.step
    out: dict[str, Any] = {
        "runId": run_id,
        "status": run.status,
        "done": run.status == "completed",
        "active": run.status in DRIVABLE_STATUSES,
        "kind": "none",
        "stepId": step.step_id if step else None,
        "stepTitle": step.title if step else None,
        "instructions": None,
        "gateLoop": None,
        "maxLoops": None,
        "gateFeedback": None,
        "units": [],
        "unitCount": 0,
        "doneCount": 0,
        "judge": None,
        "message": "",
        "warnings": [],
    }
    if run.status == "completed":
        out.update(kind="done", message=f"Run {run_id} is completed; no work remains.")
        return out
    if run.status not in DRIVABLE_STATUSES:
        final = run.status == "abandoned"  # abandoning is final: there is no resuming to wait for
        out.update(
            kind="inactive",
            message=f"Run {run_id} is {run.status}; it takes no reports"
            + ("; abandoning is final." if final else " until resumed."),
        )
        return out
    lease = runs_store.read_lease(db, run_id)
    driven = lease is not None and not lease.holder.startswith(units_store.REPORT_LOCK_PREFIX)
    if driven:
        out["warnings"].append(
            f"akm is driving this run right now (lease holder {lease.holder} until "
            f"{lease.until}); reports are refused until it stops: do not run its units."
        )
    out["warnings"].extend(_secret_param_warnings(cur.loaded.params))
    d = cur.decision
    if step is None or d is None or cur.gate is None:
        out.update(kind="engine", message="akm settles the next step itself: continue the run.")
        return out
    tmpl = step.unit_template
    out.update(
        instructions=tmpl.instructions if tmpl is not None else None,
        gateLoop=d.loop,
        maxLoops=cur.gate.base + cur.gate.max_loops,
        gateFeedback=cur.gate.feedback,
    )
    if d.states:
        out["unitCount"] = len(d.states)
        out["doneCount"] = sum(1 for s in d.states if s.status == DONE)
    now = db.now()
    if d.kind == "work":
        session_units = [s for s in d.units if s.unit.runner == "session"]
        if not session_units:
            out.update(kind="engine", message="This step's units are run by akm itself: continue the run.")
            return out
        if reuse.restorable(db, run_id, run.reuse_from, cur.loaded.plan, step, d):
            # Units done before with the same inputs (a rewind's history, a `--from` run): akm restores them
            # when the run goes on, so the agent is not asked for work that is already there.
            out.update(
                kind="engine",
                message=f"Units of step {step.step_id} were done before with the same inputs: continue the run and "
                "akm reuses them (what is left comes back to you).",
            )
            return out
        again = frozenset(rewinds_store.superseded_content_ids(db, run_id, step.step_id))
        out["units"] = [_unit_brief(cur, s, now, driven, again) for s in session_units]
        out["kind"] = "units"
        out["warnings"].extend(_silent_claim_warnings(session_units, now))
        todo = sum(1 for u in out["units"] if u["action"] != "claimed")
        out["message"] = (
            f"Step {step.step_id} (gate loop {d.loop}) needs {len(out['units'])} unit(s) done by "
            f"you ({todo} unclaimed): do each unit's prompt, then report its result."
        )
        if any(s.unit.template.isolation == "worktree" for s in session_units):
            out["warnings"].append(
                "this step declares isolation: worktree; akm cannot isolate work done in your "
                "session — work on a branch or a scratch copy yourself."
            )
        return out
    if d.kind == "judge" and reuse.restorable_verdict(db, run_id, run.reuse_from, cur.loaded.plan, step, d):
        out.update(
            kind="engine",
            message=f"Step {step.step_id}'s artifact was judged before, as it is now: continue the run and akm "
            "reuses that verdict.",
        )
        return out
    if d.kind == "judge" and (_is_session_judged(cur) or _judge_failed_here(cur)):
        out["judge"] = _judge_brief(cur)
        out["kind"] = "judge"
        out["message"] = (
            f"Step {step.step_id} produced its artifact (gate loop {d.loop}): judge it against the "
            "criteria and report a verdict {complete, missing, feedback}."
        )
        if not _is_session_judged(cur):
            out["message"] += " Its judge engine failed on this loop: your verdict stands in for it."
            out["warnings"].append(
                f"the judge engine of step {step.step_id} failed on gate loop {d.loop}; report the verdict yourself, "
                "or continue the run to ask the engine again"
            )
        return out
    out.update(kind="engine", message="akm can take the run further itself: continue the run.")
    return out


_SECRET_NAME = re.compile(r"(api[_-]?key|token|secret|passw(or)?d|credential|private[_-]?key|auth)", re.I)


def _binding_names(cur: _Current, refs: list[str] | None) -> list[str]:
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
        if _live_claim(row, now) is None:
            out.append(
                f"unit {s.unit.unit_id} was claimed by {row['claim_holder']}, which has gone silent (its "
                f"claim expired at {row.get('claim_expires_at')} with no result): take the unit over."
            )
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
    return _sensitive_of(state.unit.template, project_root)


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
            raise UsageError(
                f"Unit {uid} declares an output schema: a completed report needs a JSON result.",
                code="RESULT_REQUIRED",
                details={"outputSchema": schema},
            )
        value = result
        if isinstance(result, str):
            try:
                value = parse_command_json(result)
            except AnswerError as exc:
                # A schema that takes a string takes the text itself: over MCP `result: "Ada"` is already a JSON
                # string, and nobody should have to quote it twice. Anything else must be JSON.
                if validate_instance(result, schema):
                    raise UsageError(
                        f"The result for unit {uid} is not JSON: {redact_text(str(exc), sensitive)}.",
                        code="RESULT_INVALID",
                    ) from None
                value = result
        _require_recordable(value, uid)
        errors = validate_instance(value, schema)
        if errors and isinstance(result, str) and value is not result and not validate_instance(result, schema):
            value, errors = result, []  # `"42"` for a string schema is the text 42, not the number
        if errors:
            raise UsageError(
                f"The result for unit {uid} failed validation against its declared output schema: "
                + redact_text("; ".join(errors), sensitive)
                + ". Nothing was recorded; correct it and report again.",
                code="RESULT_INVALID",
                details={"errors": [redact_text(e, sensitive) for e in errors], "outputSchema": schema},
            )
        return json.dumps(redact_value(value, sensitive), ensure_ascii=False, separators=(",", ":"))
    if result is MISSING or result is None:
        return None
    if isinstance(result, str):
        text = redact_text(result, sensitive)
        return json.dumps(text, ensure_ascii=False) if text else None
    _require_recordable(result, uid)
    return json.dumps(redact_value(result, sensitive), ensure_ascii=False, separators=(",", ":"))


def _too_large(uid: str, size: int, *, recorded: bool = False) -> UsageError:
    """RESULT_TOO_LARGE: the report's text passes 16 MiB (refused unread), or the JSON the journal would hold
    passes the 1 MiB a unit's row holds."""
    if recorded:
        bound, limit = MAX_RECORDED_RESULT_BYTES, "the journal holds at most 1048576 bytes (1 MiB) of a unit's result"
    else:
        bound, limit = MAX_RESULT_BYTES, "a report's text may be at most 16777216 bytes (16 MiB)"
    return UsageError(
        f"The result for unit {uid} is too large: {size} bytes, and {limit}. Nothing was recorded; "
        "write a large output to a file and report its path instead.",
        code="RESULT_TOO_LARGE",
        details={"bytes": size, "maxBytes": bound},
    )


def _require_recordable(value: Any, uid: str) -> None:
    """A structured result (MCP callers send JSON values, not text) is held to what a text answer
    is: finite numbers, at most MAX_ANSWER_DEPTH levels (what `status` can show)."""
    from akm.dispatch.answer import recordable_problem

    problem = recordable_problem(value)
    if problem is not None:
        raise UsageError(
            f"The result for unit {uid} cannot be recorded as JSON: {problem}. Nothing was recorded.",
            code="RESULT_INVALID",
        )


def _step_closed(cur: _Current, unit_id: str, step_id: str) -> UsageError:
    """A report for a unit of a step the run finished: its output is fixed until the run goes back to it."""
    where = f"The run is on step {cur.step.step_id}" if cur.step is not None else f"The run is {cur.loaded.status}"
    return UsageError(
        f"Unit {unit_id} belongs to step {step_id}, which is finished: its output is fixed (later steps were built "
        f"on it) and this report was not recorded. {where}; to change {step_id}'s output, rewind the run to "
        f"step {step_id} (its units are offered again; later steps are redone only where their inputs change).",
        code="STEP_CLOSED",
        details={
            "runId": cur.run_id,
            "stepId": step_id,
            "currentStep": cur.step.step_id if cur.step is not None else None,
        },
    )


def _refuse_unit(cur: _Current, unit_id: str, db: Database | None = None) -> UsageError:
    """UNKNOWN_UNIT, or STEP_CLOSED for a unit of a step the run already finished (a rewind reopens it)."""
    if db is not None:
        rows = units_store.family_rows(db, cur.run_id, _content_id(unit_id))
        finished = [
            r["step_id"] for r in rows if r["step_id"] and (cur.step is None or r["step_id"] != cur.step.step_id)
        ]
        if finished:
            return _step_closed(cur, _content_id(unit_id), finished[-1])
    d = cur.decision
    valid = [s.unit.unit_id for s in (d.states if d else [])]
    step_id = cur.step.step_id if cur.step else None
    return UsageError(
        f"Unit {unit_id} does not belong to the current work of run {cur.run_id} (step {step_id}, gate loop "
        f"{d.loop if d else '-'}). Units of this step: {', '.join(valid) or '(none)'}.",
        code="UNKNOWN_UNIT",
        details={"stepId": step_id, "units": valid},
    )


def _check_reportable(cur: _Current, expect_step: str | None, unit_id: str | None = None) -> None:
    run = cur.loaded.run
    if run.status not in DRIVABLE_STATUSES:
        raise UsageError(
            f"Run {cur.run_id} is {run.status}; it no longer takes reports.",
            code="RUN_NOT_ACTIVE",
            details={"runId": cur.run_id, "status": run.status},
        )
    if cur.step is None:
        raise UsageError(f"Run {cur.run_id} has no current step.", code="RUN_NOT_ACTIVE")
    if expect_step is not None and expect_step != cur.step.step_id:
        done = cur.spine.row(expect_step)
        if unit_id is not None and done is not None and done.status == "completed":
            raise _step_closed(cur, _content_id(unit_id), expect_step)  # what to do is a rewind to that step
        raise UsageError(
            f"Run {cur.run_id} is now on step {cur.step.step_id}, not {expect_step}; fetch the current brief and "
            "report against it.",
            code="STEP_MISMATCH",
            details={"currentStep": cur.step.step_id},
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
    attempt_id: str | None = None,
    gate_loop: int | None = None,
    holder: str,
    project_root: Path,
    registry: Any = None,
) -> dict[str, Any]:
    """Record one report and finish the step when its work is complete. Returns the report result.

    A report answers one attempt: the brief's `attempt_id` (or `gate_loop`) names it, else the unit's current
    one. A report resent for an attempt that is already closed — its step finished, its gate loop rejected,
    the run ended — is answered `idempotent` with the run's current state when it is what the journal holds
    (an agent retrying a call whose answer it lost), and refused otherwise; it is never counted for a
    later attempt.
    """
    if status not in REPORT_STATUSES:
        raise UsageError(
            f"Report status {status!r} is not one of {', '.join(REPORT_STATUSES)}.", code="INVALID_ARGUMENT"
        )
    if tokens is not None and (
        not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 <= tokens <= MAX_REPORT_TOKENS
    ):
        raise UsageError(
            f"tokens must be a whole number from 0 to {MAX_REPORT_TOKENS}.",
            code="INVALID_ARGUMENT",
            details={"argument": "tokens"},
        )
    cur = _current(db, run_id)
    is_verdict = ".gate:l" in unit_id or unit_id.endswith(".gate") or verdict is not MISSING
    if rerun or status == "running":
        answered = None  # a re-run or a claim is new work, never a resend
    elif is_verdict:
        answered = _resent_verdict(db, cur, unit_id, verdict, gate_loop)
    else:
        answered = _resent_report(db, cur, unit_id, status, result, failure_reason, attempt_id, gate_loop, project_root)
    if answered is not None:
        return answered
    _check_reportable(cur, expect_step, unit_id)
    assert cur.step is not None
    if is_verdict:
        return _report_verdict(db, cur, unit_id, status, verdict, holder, project_root, registry)
    d = cur.decision
    if d is None:
        raise _refuse_unit(cur, unit_id, db)
    wanted = base_of_attempt(unit_id)
    state = next((s for s in d.states if wanted in (s.unit.unit_id, s.unit.base_id)), None)
    if state is None:
        raise _refuse_unit(cur, unit_id, db)
    if state.status == DIVERGED:
        raise replay_diverged(
            run_id, state.diverged_from or state.unit.unit_id, "completed", state.unit.input_hash, cur.step.step_id
        )
    asked = _asked_attempt(state.unit.unit_id, attempt_id, gate_loop)
    if asked is not None and asked != state.unit.base_id:
        raise _stale(cur, state.unit.unit_id, asked, state.unit.base_id)
    if state.unit.runner == "exec":
        raise UsageError(
            f"Unit {unit_id} is a command unit: akm runs it itself (continue the run); it cannot be reported.",
            code="UNIT_NOT_REPORTABLE",
        )
    sensitive = _sensitive_for(cur, state, project_root)
    result_json = None if status == "running" else _prepare_result(state, status, result, sensitive)
    if result_json is not None and len(result_json) > MAX_RECORDED_RESULT_BYTES // 4:  # cheap: only big ones
        size = len(result_json.encode("utf-8", "surrogatepass"))
        if size > MAX_RECORDED_RESULT_BYTES:
            raise _too_large(state.unit.unit_id, size, recorded=True)
    reason = normalize_failure_reason(failure_reason, sensitive) if status == "failed" else None
    u = state.unit
    budget = cur.loaded.plan.budget
    try:
        write = units_store.write_report(
            db,
            run_id=run_id,
            unit_id=u.base_id,
            step_id=cur.step.step_id,
            node_id=u.node_id,
            parent_unit_id=u.parent_unit_id,
            runner="session" if u.runner == "session" else u.runner,
            engine=u.engine,
            model=u.model,
            input_hash=u.input_hash,
            status=status,
            result_json=result_json,
            tokens=tokens,
            failure_reason=reason,
            holder=redact_text(holder, sensitive),
            rerun=rerun,
            max_units=budget.max_units if budget else None,
            max_tokens=budget.max_tokens if budget else None,
            max_cost=budget.max_cost if budget else None,
            allow_unknown=bool(budget and budget.unknown == "allow"),
        )
    except UsageError as exc:
        if exc.code != "BUDGET_EXCEEDED":
            raise
        raise _budget_fails_the_step(db, run_id, cur.step.step_id, exc, project_root, registry) from None
    out: dict[str, Any] = {
        "runId": run_id,
        "stepId": cur.step.step_id,
        "unitId": u.unit_id,
        "attemptId": u.base_id,
        "status": status,
        "recorded": write.recorded,
        "gateLoop": d.loop,
        "claim": ({"holder": write.claim.holder, "expiresAt": write.claim.until} if write.claim else None),
        "remainingUnits": None,
        "stepOutcome": None,
        "runStatus": cur.loaded.run.status,
        "message": "",
    }
    if status == "running":
        out["remainingUnits"] = _unreported(d.states, claimed=u.base_id)
        out["message"] = (
            f"Unit {u.unit_id} is claimed by {write.claim.holder if write.claim else holder} until "
            f"{out['claim']['expiresAt'] if out['claim'] else '?'}; report running again to keep it, "
            "then report its result."
        )
        return out
    outcome = _finalize_written(db, run_id, project_root, registry, budget_message=write.tokens_crossed)
    fresh = runs_store.require_run(db, run_id)
    out.update(
        stepOutcome=outcome.get("stepOutcome"),
        remainingUnits=outcome.get("remainingUnits", 0),
        runStatus=fresh.status,
        message=_run_message(outcome.get("message", ""), fresh),
    )
    out["brief"] = _brief_after(db, run_id, out["stepOutcome"])
    return out


def _unreported(states: list[UnitState], claimed: str | None = None) -> int:
    """`remainingUnits`: the units of the step with no result yet — never reported, or only claimed (and the
    unit being claimed now). A failure that `retry.on` lets be re-run is reported: it keeps the step open
    and the brief offers it as `rerun`, but it is not counted here (as upstream)."""
    return sum(1 for s in states if s.status in (PENDING, RUNNING) or s.unit.base_id == claimed)


def _budget_fails_the_step(
    db: Database, run_id: str, step_id: str, exc: UsageError, project_root: Path, registry: Any
) -> UsageError:
    """A budget ceiling ends the run as it does natively: the report is not recorded, the step and the run
    fail (a run left awaiting the agent would offer the unit forever). Returns the error to raise."""
    reason = exc.message.rstrip(".")
    _finalize(db, run_id, project_root, registry, budget_message=reason)
    fresh = runs_store.require_run(db, run_id)
    return UsageError(
        f"{exc.message} The report was not recorded; step {step_id} and the run are now {fresh.status}.",
        code="BUDGET_EXCEEDED",
        details={"runId": run_id, "stepId": step_id, "runStatus": fresh.status},
    )


def _brief_after(db: Database, run_id: str, step_outcome: dict[str, Any] | None) -> dict[str, Any] | None:
    """The new brief when a report changed the agent's work within the step (a verdict is now awaited, or
    the gate opened the next loop), so that the agent needs no `next` call; else None."""
    if not step_outcome or step_outcome.get("kind") not in ("awaiting_verdict", "next_loop"):
        return None
    return brief(db, run_id)


def _run_message(message: str, run: Any) -> str:
    """A report's message, saying so when the report finished the whole run."""
    if run.status == "completed":
        return (
            f"{message.split(':')[0]}; run {run.id} is completed."
            if message.startswith("Step ")
            else f"Run {run.id} is completed."
        )
    return message


# ---------------------------------------------------------------- resends and stale reports


def _asked_attempt(unit_id: str, attempt_id: str | None, gate_loop: int | None) -> str | None:
    """The journal id of the attempt a report says it answers (None: it names none)."""
    if attempt_id is not None:
        return base_of_attempt(attempt_id)
    if gate_loop is not None:
        return journal_base_id(_content_id(unit_id), gate_loop)
    if "~l" in base_of_attempt(unit_id):
        return base_of_attempt(unit_id)  # the unit named by its attempt id
    return None


def _content_id(unit_id: str) -> str:
    """`X~l3~r1` -> `X`: the unit's content id, whatever attempt of it is named."""
    head, sep, tail = base_of_attempt(unit_id).rpartition("~l")
    return head if sep and tail.isdigit() else base_of_attempt(unit_id)


def _loop_of(base_id: str) -> int:
    head, sep, tail = base_id.rpartition("~l")
    return int(tail) if sep and tail.isdigit() else 1


def _stale(cur: _Current, unit_id: str, asked: str, current: str) -> UsageError:
    return UsageError(
        f"This report answers attempt {asked} of unit {unit_id}, which is closed (gate loop {_loop_of(asked)}); the "
        f"current attempt is {current} (gate loop {_loop_of(current)}). Nothing was recorded: do the unit again "
        "from the current brief (its context carries the gate's feedback) and report that.",
        code="STALE_REPORT",
        details={"attemptId": asked, "currentAttemptId": current, "stepId": cur.step.step_id if cur.step else None},
    )


def _resent_report(
    db: Database,
    cur: _Current,
    unit_id: str,
    status: str,
    result: Any,
    failure_reason: str | None,
    attempt_id: str | None,
    gate_loop: int | None,
    project_root: Path,
) -> dict[str, Any] | None:
    """The answer to a report of an attempt that is already closed and holds exactly this content, else None.

    Closed: the run no longer takes reports, the unit is not in the current step's work, or the report names
    an earlier gate loop. A report of a unit of the current step that names no attempt answers the current
    one, as the drive loop counts an answer (issue 39: a loop-2 answer identical to the rejected loop-1 one
    was taken for a resend, and the run never went on); a resend recognised across a gate loop names its
    attempt (the brief's `report` does). A closed attempt holding other content is refused (STALE_REPORT for
    a rejected loop of the current step; a finished step or run keeps its own refusal, below).
    """
    content_id = _content_id(unit_id)
    rows = [r for r in units_store.family_rows(db, cur.run_id, content_id) if r["status"] in ("completed", "failed")]
    if not rows:
        return None
    d = cur.decision
    state = None
    if d is not None and cur.loaded.run.status in DRIVABLE_STATUSES:
        state = next((s for s in d.states if s.unit.unit_id == content_id), None)
    asked = _asked_attempt(unit_id, attempt_id, gate_loop)
    if state is not None:
        if asked is None or asked == state.unit.base_id:
            return None  # the current attempt: the normal path (and write_report's own idempotence)
        closed = [r for r in rows if base_of_attempt(r["unit_id"]) == asked]  # an earlier loop it names
    else:
        closed = [r for r in rows if asked is None or base_of_attempt(r["unit_id"]) == asked]
    if not closed:
        return None
    template = _template_of(cur, closed[-1]["step_id"])
    if template is None:
        return None
    try:
        sensitive = _sensitive_of(template, project_root)
        result_json = _prepare_result(_Recorded(content_id, template), status, result, sensitive)
        reason = normalize_failure_reason(failure_reason, sensitive) if status == "failed" else None
    except UsageError:
        return None  # not what was recorded, and not even recordable: the normal path refuses it
    same = next(
        (
            r
            for r in reversed(closed)
            if r["status"] == status
            and r["result_json"] == result_json
            and (r["failure_reason"] or None) == (reason or None)
        ),
        None,
    )
    if same is None:
        if state is not None:
            assert asked is not None
            raise _stale(cur, content_id, asked, state.unit.base_id)
        step_id = closed[-1]["step_id"]
        if cur.loaded.run.status in DRIVABLE_STATUSES and cur.step is not None and step_id != cur.step.step_id:
            raise _step_closed(cur, content_id, step_id)
        return None  # an ended run: the guards below say why it is refused
    return _resend_answer(
        db,
        cur,
        same["step_id"],
        content_id,
        base_of_attempt(same["unit_id"]),
        status,
        _loop_of(base_of_attempt(same["unit_id"])),
    )


@dataclass
class _Recorded:
    """What `_prepare_result` needs of a unit: its id and template."""

    unit_id: str
    template: Any

    @property
    def unit(self) -> "_Recorded":
        return self


def _template_of(cur: _Current, step_id: str | None) -> Any:
    step = cur.loaded.plan.step(step_id) if step_id else None
    return step.unit_template if step is not None else None


def _sensitive_of(template: Any, project_root: Path) -> list[str]:
    """The template's own `env:` values and those of every env file the project can see (spec/engine.md)."""
    from akm.engine.env_bindings import EnvBindingError, project_sensitive_values, resolve_env_refs

    visible = project_sensitive_values(project_root)
    refs = template.env or []
    if not refs:
        return visible
    try:
        return sensitive_values_from(resolve_env_refs(refs, project_root)) + visible
    except EnvBindingError:
        return visible


def _resent_verdict(
    db: Database, cur: _Current, unit_id: str, verdict: Any, gate_loop: int | None
) -> dict[str, Any] | None:
    """The answer to a verdict resent for a gate loop that already has exactly this verdict, else None
    (a different verdict for a closed loop is STALE_REPORT)."""
    step_id, _, loop_text = unit_id.partition(".gate:l")
    if not loop_text:
        if gate_loop is None or not unit_id.endswith(".gate"):
            return None
        step_id, loop_text = unit_id[: -len(".gate")], str(gate_loop)
    if not loop_text.isdigit():
        return None
    row_id = gate_row_for(step_id, int(loop_text))
    row = units_store.get_unit(db, cur.run_id, row_id)
    if row is None or row.phase != "gate" or row.status != "completed":
        return None
    value = verdict
    if isinstance(value, str):
        try:
            value = parse_command_json(value)
        except AnswerError:
            return None
    parsed = verdict_from_value(value)
    if parsed is None:
        return None
    recorded = json.loads(row.result_json) if row.result_json else None
    if recorded != parsed.to_json():
        raise UsageError(
            f"Gate loop {loop_text} of step {step_id} already has a verdict ({row.result_json}); a different one "
            "for it is never counted for a later loop. Nothing was recorded: fetch the current brief.",
            code="STALE_REPORT",
            details={"unitId": row_id, "recorded": recorded},
        )
    return _resend_answer(db, cur, step_id, row_id, row_id, "completed", int(loop_text))


def _resend_answer(
    db: Database, cur: _Current, step_id: str, unit_id: str, attempt: str, status: str, loop: int
) -> dict[str, Any]:
    run = runs_store.require_run(db, cur.run_id)
    where = (
        f"the run is {run.status}"
        if run.status not in DRIVABLE_STATUSES
        else f"the run is {run.status} on step {run.current_step_id}"
    )
    return {
        "runId": cur.run_id,
        "stepId": step_id,
        "unitId": unit_id,
        "attemptId": attempt,
        "status": status,
        "recorded": "idempotent",
        "gateLoop": loop,
        "claim": None,
        "remainingUnits": None,
        "stepOutcome": None,
        "runStatus": run.status,
        "message": f"Already recorded: {unit_id} (gate loop {loop}) holds exactly this; nothing changed — {where}.",
    }


def _report_verdict(
    db: Database, cur: _Current, unit_id: str, status: str, verdict: Any, holder: str, project_root: Path, registry: Any
) -> dict[str, Any]:
    step, d = cur.step, cur.decision
    assert step is not None
    if verdict is MISSING:
        raise UsageError(
            f"{unit_id} is a gate verdict: report it with a verdict {{complete, missing, feedback}}.",
            code="VERDICT_REQUIRED",
        )
    if isinstance(verdict, str):
        try:
            verdict = parse_command_json(verdict)
        except AnswerError as exc:
            raise UsageError(f"The verdict is not JSON: {exc}.", code="VERDICT_INVALID") from None
    from akm.engine.env_bindings import project_sensitive_values

    parsed = verdict_from_value(redact_value(verdict, project_sensitive_values(project_root)))
    if parsed is None:
        raise UsageError(
            'A verdict is an object {"complete": boolean, "missing": [string], "feedback": string}.',
            code="VERDICT_INVALID",
        )
    if status != "completed":
        raise UsageError("A verdict is reported with status completed.", code="INVALID_ARGUMENT")
    if d is None or d.kind != "judge" or not (_is_session_judged(cur) or _judge_failed_here(cur)):
        raise UsageError(
            f"Step {step.step_id} of run {cur.run_id} is not waiting for a verdict from you.",
            code="NOT_AWAITING_VERDICT",
        )
    expected = gate_row_for(step.step_id, d.loop)
    if unit_id not in (expected, f"{step.step_id}.gate"):
        raise UsageError(
            f"The current gate verdict of step {step.step_id} is {expected}, not {unit_id}.",
            code="UNKNOWN_UNIT",
            details={"expected": expected},
        )
    with db.tx():
        units_store.guard_session_write(db, cur.run_id)
        identity = gates.verdict_identity(cur.loaded.plan, step, d.result, d.artifact)
        journal_verdict(db, cur.run_id, step, d.loop, parsed, runner="session", identity=identity)
    outcome = _finalize_written(db, cur.run_id, project_root, registry)
    fresh = runs_store.require_run(db, cur.run_id)
    return {
        "runId": cur.run_id,
        "stepId": step.step_id,
        "unitId": expected,
        "attemptId": expected,
        "status": "completed",
        "recorded": "written",
        "gateLoop": d.loop,
        "claim": None,
        "remainingUnits": outcome.get("remainingUnits", 0),
        "stepOutcome": outcome.get("stepOutcome"),
        "runStatus": fresh.status,
        "message": _run_message(outcome.get("message", ""), fresh),
        "brief": _brief_after(db, cur.run_id, outcome.get("stepOutcome")),
    }


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


def _finalize_written(
    db: Database, run_id: str, project_root: Path, registry: Any, budget_message: str | None = None
) -> dict[str, Any]:
    """`_finalize` after the report's write committed. The write stands whatever happens next: a run
    abandoned (or otherwise stopped) between the write and the step's finish is answered as written —
    the step is simply not finished — never as a refusal (issue 23 item 1: 8 reports raced an abandon,
    were answered RUN_ABANDONED and were committed all the same)."""
    try:
        return _finalize(db, run_id, project_root, registry, budget_message=budget_message)
    except AkmError as exc:
        if exc.code not in ("RUN_ABANDONED", "RUN_NOT_ACTIVE", "RUN_NOT_FOUND"):
            raise
        run = runs_store.get_run(db, run_id)
        now = run.status if run is not None else "gone"
        return {
            "message": f"Recorded. The run is {now} now (it stopped after this report was written), so its "
            "step was not finished."
        }


def _finalize(
    db: Database, run_id: str, project_root: Path, registry: Any, budget_message: str | None = None
) -> dict[str, Any]:
    """Apply `decide_step` to the current step until it needs more work or finishes."""
    lock = _acquire_finalize_lock(db, run_id)
    if lock is None:
        return {"message": "Recorded. Another driver is finishing this step."}
    try:
        restored_loop: int | None = None
        for _ in range(1000):  # each pass journals a verdict or finishes the step; bounded by max_loops
            cur = _current(db, run_id)
            step, d = cur.step, cur.decision
            if step is None or d is None:
                return {"message": "Recorded.", "remainingUnits": 0}
            if d.kind == "work" and restored_loop != d.loop and budget_message is None:
                # A new gate loop's units a rewind superseded with the same identity: restored, as the drive
                # loop restores them (the same graph either way).
                restored_loop = d.loop
                if reuse.restore(db, cur.loaded, step, d):
                    continue
            fx = _ReportEffects(db, cur, lock, project_root, registry)
            if budget_message is not None:
                apply_decision(fx, step, pass_failed(d, budget_message))
                return {
                    "stepOutcome": {"kind": "failed", "summary": budget_message},
                    "remainingUnits": 0,
                    "message": f"Step {step.step_id} failed: {budget_message}.",
                }
            applied = apply_decision(fx, step, d)
            if applied.next == AGAIN:
                continue
            if d.kind == "work":
                left = _unreported(d.units)
                rerunnable = len(d.units) - left
                assert cur.gate is not None
                prior_loop = cur.gate.loop > 1 and d.loop == cur.gate.loop and cur.gate.feedback is not None
                if prior_loop and all(s.row is None for s in d.states):
                    assert cur.gate.feedback is not None
                    return {
                        "stepOutcome": {
                            "kind": "next_loop",
                            "gateLoop": d.loop,
                            "feedback": cur.gate.feedback["feedback"],
                            "missing": cur.gate.feedback["missing"],
                        },
                        "remainingUnits": left,
                        "message": f"Step {step.step_id} goes to gate loop {d.loop}: redo its units with the "
                        "feedback (the brief is in this answer).",
                    }
                parts = [f"{left} unit(s) of step {step.step_id} still need a report"] if left else []
                if rerunnable:
                    parts.append(
                        f"{rerunnable} failed unit(s) of step {step.step_id} may be re-run (their retry.on lists "
                        "the reason): do them again and report with rerun"
                    )
                message = "Recorded. " + "; ".join(parts) + "."
                return {"remainingUnits": left, "message": message}
            if applied.next == PARKED:  # the gate awaits the agent's verdict
                return {
                    "stepOutcome": {"kind": "awaiting_verdict", "gateLoop": d.loop},
                    "remainingUnits": 0,
                    "message": f"Step {step.step_id}'s units are done; its gate needs your verdict "
                    "(the judge brief is in this answer).",
                }
            if applied.judge_failed:
                return {
                    "stepOutcome": {"kind": "blocked", "summary": (applied.notes or "").strip() or None},  # as stored
                    "remainingUnits": 0,
                    "message": f"Step {step.step_id} is blocked: its judge failed.",
                }
            status, notes = applied.status, applied.notes
            assert status is not None
            kind = {"completed": "completed", "failed": "failed", "blocked": "blocked"}[status]
            outcome: dict[str, Any] = {"kind": kind, "summary": d.summary if status == "completed" else notes}
            if d.detail:
                outcome.update(missing=d.detail.get("missing"), feedback=d.detail.get("feedback"))
            message = {
                "completed": f"Step {step.step_id} completed: continue the run to go on.",
                "failed": f"Step {step.step_id} failed: {notes}",
                "blocked": f"Step {step.step_id} is blocked: {notes}",
            }[status]
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


class _ReportEffects:
    """`apply.Effects` for a report finishing its step under the finalize lock: unfenced writes, no
    bookkeeping, a judge nobody cancels."""

    park_without_judge_dispatcher = False  # the plan names a judge engine: without its dispatcher it fails
    fence: runs_store.Fence | None = None  # a report holds the finalize lock, not a driver's fence

    def __init__(self, db: Database, cur: _Current, lock: str, project_root: Path, registry: Any) -> None:
        self.db = db
        self.run_id = cur.run_id
        self.plan = cur.loaded.plan
        self.cwd = str(project_root)
        self.lock = lock
        self.registry = registry

    def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def dispatcher_for(self, kind: str) -> Any:
        if self.registry is None:
            from akm.dispatch.registry import default_registry

            self.registry = default_registry()
        return self.registry.get(kind)

    @contextmanager
    def judging(self) -> Iterator[threading.Event]:
        yield threading.Event()

    def interrupted(self) -> bool:
        return False

    def record(self, step_id: str, decision: StepDecision, *, ok: bool, summary: str | None = None) -> None:
        return None  # a report answers with the step's outcome instead

    def park(self, brief: dict[str, Any]) -> None:
        _park(self.db, self.run_id, brief)

    def finish(
        self,
        step_id: str,
        status: str,
        *,
        summary: str | None,
        notes: str | None,
        evidence: dict[str, Any] | None,
        detail: dict[str, Any] | None,
        judge_failed: bool,
    ) -> tuple[str, str | None]:
        holder: str | None = self.lock
        if judge_failed:
            # A failed judge finishes the step as whoever holds the lease when it returns (a judge call may
            # outlast the finalize lock); kept as it was, see spec/engine.md §4.
            lease = runs_store.read_lease(self.db, self.run_id)
            holder = lease.holder if lease else None
        status, notes, _ = finish_step(
            self.db,
            self.run_id,
            step_id,
            status,
            summary=summary,
            notes=notes,
            evidence=evidence,
            lease_holder=holder,
            status_detail=detail,
        )
        return status, notes


__all__ = ["brief", "report", "normalize_failure_reason", "MISSING", "Verdict"]
