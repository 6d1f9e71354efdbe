"""The native drive loop: take the run lease, execute steps, journal every unit.

One invocation drives one run. The journal is the source of truth: a unit row is
inserted (status `running`) before anything is dispatched and finished after,
so a crash at any instant leaves either a completed row (reused on re-run, never
redone) or a running/failed row (dispatched again, `attempts` bumped).

Exec units run natively. Units that need a model or an agent and have no
engine are *session units* (D11): the loop drives everything it can, then
parks the run as `awaiting_session` with a brief of the pending work.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from akm.dispatch.exec import ExecRequest, build_exec_context, item_context, run_exec_unit
from akm.dispatch.redact import redact_text, sensitive_values_from
from akm.engine import worktree as worktrees
from akm.engine.budget import DispatchBudget
from akm.engine.cancel import Cancellation
from akm.engine.env_bindings import EnvBindingError, resolve_env_refs
from akm.engine.heartbeat import Heartbeat
from akm.engine.reduce import (
    OutputTooLarge,
    RouteError,
    StepResult,
    UnitOutcome,
    bounded_evidence_json,
    classify_reuse,
    evaluate_route,
    failed_step,
    index_completed_rows,
    journaled_result_json,
    outcome_from_row,
    reduce_step,
    route_targets,
)
from akm.engine.scope import step_outputs_from_evidence
from akm.engine.state import LoadedRun, load_run
from akm.engine.worklist import StepFailure, WorkList, WorkUnit, build_work_list
from akm.errors import AkmError, JournalError, UsageError
from akm.format.schema import validate_instance
from akm.plan.identity import NO_ITEM, attempt_id
from akm.plan.model import Plan, StepPlan
from akm.store import runs as runs_store
from akm.store import units as units_store
from akm.store.db import Database
from akm.store.runs import Step


def host_concurrency_limit() -> int:
    """D6: the host limit defaults to max(2, cpu_count)."""
    return max(2, os.cpu_count() or 2)


@dataclass
class UnitProgress:
    """Reported once per finished dispatched unit (for the CLI's stderr progress line)."""

    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    ok: bool
    failure_reason: str | None
    done: int
    total: int


@dataclass
class DriveOptions:
    work_dir: Path
    project_root: Path
    max_steps: int | None = None
    cancel: Cancellation = field(default_factory=Cancellation)
    on_progress: Callable[[UnitProgress], None] | None = None
    on_warning: Callable[[str], None] | None = None
    heartbeat_interval: float | None = None


@dataclass
class DriveResult:
    run_id: str
    executed: list[dict[str, Any]] = field(default_factory=list)
    steps_processed: int = 0
    done: bool = False
    aborted: bool = False
    abort_reason: str | None = None
    awaiting: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class _PendingFinish:
    """A finished attempt whose row update waits for the same worker's next write.

    Finishing attempt k and inserting attempt k+1 in one transaction halves the
    commits of a fan-out. The window adds nothing to what a crash can lose: the
    next insert follows within microseconds, and a worker's last finish is
    flushed when it runs out of units. A crash inside the window leaves the row
    `running`, so the unit is dispatched again — as for a crash a moment earlier.
    """

    attempt: str
    started_at: str
    outcome: UnitOutcome  # mutated to journal_write_failed if the write fails
    result_json: str | None


class _StepRun:
    """Executes one step's units for one gate loop. Holds the per-step cancellation and budget."""

    def __init__(self, driver: "_Driver", step: StepPlan, loop: int, feedback: dict[str, Any] | None) -> None:
        self.d = driver
        self.step = step
        self.loop = loop
        self.feedback = feedback
        self.event = threading.Event()
        self.env_values: dict[str, str] = {}
        self.sensitive: list[str] = []
        self.done_count = 0
        self.total = 0
        self._ctx_base: dict[str, str] | None = None
        self._count_lock = threading.Lock()
        self._local = threading.local()  # per worker: the attempt whose finish is deferred
        self._parent_env = dict(os.environ)  # one snapshot per step for every unit's environment

    # ------------------------------------------------------------ one attempt
    def _dispatch_attempt(self, unit: WorkUnit, attempt: str) -> UnitOutcome:
        d = self.d
        tmpl = unit.template
        base_dir = str(d.opts.work_dir)
        tree = None
        if tmpl.isolation == "worktree":
            try:
                tree = worktrees.create(base_dir, d.run_id, attempt)
            except (worktrees.WorktreeError, OSError) as exc:
                return UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason="worktree_failed",
                                   error=f"could not create the isolation worktree: {exc}")
            if tree.preserved_leftover:
                d.warn(f"a previous attempt of {attempt} left uncollected work; preserved at {tree.preserved_leftover}")
            base_dir = tree.path
        # This worker's previous attempt is finished in the same transaction as this
        # insert: one commit per unit instead of two (see _PendingFinish).
        pending, self._local.pending = getattr(self._local, "pending", None), None
        insert = dict(run_id=d.run_id, unit_id=attempt, step_id=self.step.step_id, node_id=unit.node_id,
                      parent_unit_id=unit.parent_unit_id, phase=None, runner=unit.runner, engine=unit.engine,
                      model=unit.model, input_hash=unit.input_hash, worktree_path=tree.path if tree else None)
        try:
            with d.db.tx():
                if pending is not None:
                    self._write_finish(pending)
                started_at = units_store.insert_unit(d.db, **insert)
        except Exception:
            started_at = None
            if pending is not None:  # find out which write failed: each alone
                self._flush(pending)
        try:
            if started_at is None:
                started_at = units_store.insert_unit(d.db, **insert)
        except Exception as exc:  # nothing was dispatched; the step decides what to do
            if tree is not None:
                worktrees.cleanup(tree)
            return UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason="dispatch_error",
                               error=f"unit {attempt} could not journal its dispatch row (nothing was dispatched): {exc}")
        d.heartbeat.track(attempt)
        try:
            outcome = self._run_exec(unit, base_dir)
        except Exception as exc:  # the row is in the journal: it must be finished, whatever happened
            outcome = UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason="dispatch_error",
                                  error=f"unit {attempt} failed inside akm before it produced a result: {exc}")
        finally:
            d.heartbeat.untrack(attempt)
        outcome.dispatched = True
        try:
            result_json = journaled_result_json(outcome)
        except (ValueError, TypeError) as exc:
            outcome = UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason="dispatch_error",
                                  error=f"unit {attempt} produced a result that cannot be stored as JSON: {exc}")
            result_json = journaled_result_json(outcome)
        self._local.pending = _PendingFinish(attempt, started_at, outcome, result_json)
        if tree is not None:
            warning = worktrees.cleanup(tree)
            if warning:
                d.warn(warning)
        return outcome

    def _write_finish(self, p: "_PendingFinish") -> None:
        o = p.outcome
        finished = units_store.finish_unit(
            self.d.db, run_id=self.d.run_id, unit_id=p.attempt, started_at=p.started_at,
            status="completed" if o.ok else "failed", result_json=p.result_json, tokens=o.tokens,
            failure_reason=None if o.ok else o.failure_reason, session_id=o.session_id,
        )
        if finished == "superseded":
            self.d.warn(f"unit {p.attempt} was re-dispatched by another driver while it ran; this result was not "
                        "journaled (the newer dispatch owns the row)")

    def _flush(self, p: "_PendingFinish | None" = None) -> None:
        """Finish a deferred attempt now (its own transaction); a failure fails the unit hard."""
        if p is None:
            p, self._local.pending = getattr(self._local, "pending", None), None
        if p is None:
            return
        try:
            self._write_finish(p)
        except Exception as exc:
            o = p.outcome
            state = "completed" if o.ok else f"failed ({o.failure_reason})"
            o.ok, o.failure_reason, o.result, o.has_result, o.text = False, "journal_write_failed", None, False, None
            o.error = f'unit "{p.attempt}" dispatched and {state}, but its result could not be journaled: {exc}'

    def _run_exec(self, unit: WorkUnit, base_dir: str) -> UnitOutcome:
        tmpl = unit.template
        spec = tmpl.exec
        assert spec is not None
        if self._ctx_base is None:
            # Params and inputs are the same for every unit of the step: serialise them once.
            self._ctx_base = build_exec_context(
                run_id=self.d.run_id, step_id=self.step.step_id, unit_id="", params=self.d.loaded.params,
                inputs=dict(unit.inputs) if tmpl.inputs else None,
            )
        ctx = dict(self._ctx_base, AKM_UNIT_ID=unit.unit_id)
        if unit.item is not NO_ITEM:
            ctx.update(item_context(unit.item, unit.index))
        req = ExecRequest(
            command=list(spec.command), base_dir=base_dir, cwd=spec.cwd, pass_env=spec.pass_env,
            inherit_env=bool(spec.inherit_env), env_bindings=self.env_values, context=ctx,
            timeout_ms=spec.timeout_ms, expect_json=tmpl.output_schema is not None,
            sensitive_values=self.sensitive, parent_env=self._parent_env,
        )
        res = run_exec_unit(req, self.event)
        out = UnitOutcome(unit_id=unit.unit_id, **vars(res))
        if out.ok and tmpl.output_schema is not None:
            errors = validate_instance(out.result, tmpl.output_schema)
            if errors:
                raw = res.text
                out = UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason="validation_error",
                                  error=redact_text("; ".join(errors), self.sensitive), text=raw)
        return out

    # ------------------------------------------------------------ one unit
    def run_unit(self, unit: WorkUnit, decision: Any) -> UnitOutcome:
        d = self.d
        if decision.kind == "reuse":
            return outcome_from_row(unit.unit_id, decision.row, unit.template.output_schema is not None)
        if decision.kind == "diverge":
            return UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason="replay_divergence",
                               error=f"replay divergence: unit {decision.attempt_id} is journaled as completed with a "
                                     "different input hash; refusing to re-dispatch it.")
        retry = unit.template.retry
        max_attempts = 1 + (retry.max if retry else 0)
        last: UnitOutcome | None = None
        for k in range(max_attempts):
            if self.event.is_set():
                return last or UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason="aborted",
                                           error="unit was not dispatched because the run was interrupted")
            refusal = d.budget.try_consume()
            if refusal:
                return last or UnitOutcome(unit_id=unit.unit_id, ok=False, failure_reason=refusal,
                                           error=d.budget.exceeded or d.budget.cap_message)
            att = attempt_id(unit.base_id, k)
            outcome = self._dispatch_attempt(unit, att)
            if outcome.tokens:
                d.budget.add_tokens(outcome.tokens)
            with self._count_lock:
                if k == 0:
                    self.done_count += 1
                done = self.done_count
            if d.opts.on_progress is not None:
                d.opts.on_progress(UnitProgress(d.run_id, self.step.step_id, unit.unit_id, att, outcome.ok,
                                                outcome.failure_reason, done, self.total))
            last = outcome
            if outcome.ok or self.event.is_set():
                return outcome
            if not retry or outcome.failure_reason not in retry.on:
                return outcome
        assert last is not None
        return last

    # ------------------------------------------------------------ the step
    def execute(self) -> StepResult | dict[str, Any]:
        """Returns the step result, or a session brief (dict) when session work is pending."""
        d, step = self.d, self.step
        wl = build_work_list(step, run_id=d.run_id, params=d.loaded.params, step_outputs=d.outputs(),
                             engines=d.plan.execution.engines, gate_loop=self.loop, gate_feedback=self.feedback)
        if isinstance(wl, StepFailure):
            return failed_step(wl.reason)
        tmpl = step.unit_template
        assert tmpl is not None
        rows = [vars(r) for r in units_store.get_units(d.db, d.run_id, step.step_id) if r.phase is None]
        completed = index_completed_rows(rows)
        decisions = [classify_reuse(u.base_id, u.input_hash, completed, self.loop) for u in wl.units]
        pending = [u for u, dec in zip(wl.units, decisions) if dec.kind == "dispatch"]
        if pending and any(u.runner == "session" for u in pending):
            return session_brief(step, pending, self.loop)
        if pending:
            if tmpl.env:
                try:
                    self.env_values = resolve_env_refs(tmpl.env, d.opts.project_root)
                except EnvBindingError as exc:
                    return failed_step(f'Step "{step.step_id}" env binding failed: {exc}')
                self.sensitive = sensitive_values_from(self.env_values)
            if tmpl.isolation == "worktree":
                problem = worktrees.preflight(str(d.opts.work_dir))
                if problem:
                    return failed_step(f'Step "{step.step_id}" cannot use isolation: worktree: {problem}')
        self.total = len(pending)
        width = max(1, min(wl.concurrency, d.plan.execution.max_concurrency or host_concurrency_limit(),
                           max(1, len(wl.units))))
        d.opts.cancel.link(self.event)
        d.lease_lost.link(self.event)
        d.budget.set_exceed_hook(self.event.set)
        try:
            outcomes = self._schedule(wl, decisions, width)
        finally:
            d.opts.cancel.unlink(self.event)
            d.lease_lost.unlink(self.event)
        if d.budget.exceeded:
            return failed_step(d.budget.exceeded)
        if d.budget.cap_message:
            return failed_step(d.budget.cap_message)
        diverged = [o.error for o in outcomes if o.failure_reason == "replay_divergence" and o.error]
        if diverged:
            return failed_step(" ".join(diverged))
        unjournaled = [o.error for o in outcomes if o.failure_reason == "journal_write_failed" and o.error]
        if unjournaled:
            return failed_step(" ".join(unjournaled))
        return reduce_step(step, outcomes, is_map=wl.is_map, reducer=wl.reducer, on_error=tmpl.on_error)

    def _schedule(self, wl: WorkList, decisions: list[Any], width: int) -> list[UnitOutcome]:
        results: list[UnitOutcome | None] = [None] * len(wl.units)
        if width <= 1 or len(wl.units) <= 1:
            try:
                for i, (u, dec) in enumerate(zip(wl.units, decisions)):
                    if self.event.is_set() and dec.kind == "dispatch":
                        break
                    results[i] = self.run_unit(u, dec)
            finally:
                self._flush()
        else:
            next_index = iter(range(len(wl.units)))
            claim_lock = threading.Lock()

            def worker() -> None:
                try:
                    work()
                finally:
                    self._flush()

            def work() -> None:
                while True:
                    with claim_lock:
                        i = next(next_index, None)
                    if i is None:
                        return
                    dec = decisions[i]
                    if self.event.is_set() and dec.kind == "dispatch":
                        return
                    try:
                        results[i] = self.run_unit(wl.units[i], dec)
                    except AkmError:
                        raise
                    except Exception as exc:  # a runner bug must not lose the slot silently
                        results[i] = UnitOutcome(unit_id=wl.units[i].unit_id, ok=False, failure_reason="dispatch_error",
                                                 error=f"internal error while running the unit: {exc}")

            with ThreadPoolExecutor(max_workers=width, thread_name_prefix="akm-unit") as pool:
                futures = [pool.submit(worker) for _ in range(width)]
                for f in futures:
                    f.result()
        return [
            r if r is not None else UnitOutcome(unit_id=wl.units[i].unit_id, ok=False, failure_reason="aborted",
                                                error="unit was not dispatched (interrupted)")
            for i, r in enumerate(results)
        ]


def session_brief(step: StepPlan, pending: list[WorkUnit], loop: int) -> dict[str, Any]:
    """What the calling agent must do for this step (D11). Reported units land in the same journal."""
    return {
        "kind": "units",
        "stepId": step.step_id,
        "gateLoop": loop,
        "units": [
            {
                "unitId": u.unit_id,
                "attemptId": u.base_id,
                "inputHash": u.input_hash,
                "prompt": u.prompt,
                "outputSchema": u.template.output_schema,
                **({"item": u.item, "itemIndex": u.index} if u.item is not NO_ITEM else {}),
            }
            for u in pending
        ],
    }


class _Driver:
    def __init__(self, db: Database, loaded: LoadedRun, holder: str, opts: DriveOptions, result: DriveResult) -> None:
        self.db = db
        self.loaded = loaded
        self.plan: Plan = loaded.plan
        self.run_id = loaded.run_id
        self.holder = holder
        self.opts = opts
        self.result = result
        self.lease_lost = Cancellation()
        self.heartbeat = Heartbeat(db, self.run_id, holder, self.lease_lost,
                                   **({"interval": opts.heartbeat_interval} if opts.heartbeat_interval else {}))
        used, tokens = units_store.journal_totals(db, self.run_id)
        budget = self.plan.budget
        self.budget = DispatchBudget(used=used, tokens=tokens, max_units=budget.max_units if budget else None,
                                     max_tokens=budget.max_tokens if budget else None)
        self.route_selected: set[str] = set()
        self.route_unselected: dict[str, tuple[str, str | None]] = {}
        self.evidence: dict[str, Any] = {}
        self._warn_lock = threading.Lock()

    def warn(self, message: str) -> None:
        with self._warn_lock:
            self.result.warnings.append(message)
        if self.opts.on_warning is not None:
            self.opts.on_warning(message)

    def outputs(self) -> dict[str, Any]:
        return step_outputs_from_evidence(self.evidence)

    def lost_lease_error(self) -> UsageError:
        run = runs_store.get_run(self.db, self.run_id)
        if run is not None and run.status not in ("active", "awaiting_session"):
            return UsageError(
                f"Run {self.run_id} became {run.status} while this invocation was driving it "
                f"({'abandoned' if run.status == 'failed' else 'changed'} by another command); stopped. "
                "Results of units that finished were kept in the journal.",
                code="RUN_ABANDONED" if run.status == "failed" else "RUN_NOT_ACTIVE",
            )
        lease = runs_store.read_lease(self.db, self.run_id)
        who = f"{lease.holder} (host {lease.host}, pid {lease.pid})" if lease else "(nobody)"
        return UsageError(
            f"This invocation lost its lease on run {self.run_id} (now held by {who}); stopping to avoid racing it.",
            code="LEASE_LOST",
        )

    # -------------------------------------------------------- bookkeeping
    def _load_evidence(self) -> list[Step]:
        steps = runs_store.get_steps(self.db, self.run_id)
        self.evidence = {}
        for s in steps:
            if s.status == "completed" and s.evidence_json:
                try:
                    self.evidence[s.step_id] = json.loads(s.evidence_json)
                except ValueError:
                    self.evidence[s.step_id] = None
        return steps

    def _mark_unselected(self, router: str, selected: str | None, targets: list[str]) -> None:
        for t in targets:
            if t != selected and t not in self.route_unselected:
                self.route_unselected[t] = (router, selected)

    def replay_routes(self, steps: list[Step]) -> None:
        status = {s.step_id: s for s in steps}
        for sp in self.plan.steps:
            if sp.route is None:
                continue
            row = status.get(sp.step_id)
            if row is None:
                continue
            targets = route_targets(sp.route)
            if row.status == "skipped":
                self._mark_unselected(sp.step_id, None, targets)
            elif row.status == "completed":
                ev = self.evidence.get(sp.step_id) or {}
                selected = (ev.get("route") or {}).get("selected") if isinstance(ev, dict) else None
                if not isinstance(selected, str) or selected not in targets:
                    raise UsageError(
                        f"Run {self.run_id}: the journaled route decision of step {sp.step_id} is missing or names "
                        "an undeclared step; refusing to guess which branch to take.",
                        code="CORRUPT_RUN",
                    )
                self.route_selected.add(selected)
                self._mark_unselected(sp.step_id, selected, targets)

    def complete(self, step_id: str, status: str, *, summary: str | None, notes: str | None,
                 evidence: dict[str, Any] | None) -> None:
        evidence_text = None
        if evidence is not None:
            try:
                evidence_text, truncated = bounded_evidence_json(evidence)
            except OutputTooLarge as exc:
                status, summary, notes = "failed", None, f'Step "{step_id}" cannot complete: {exc}.'
                evidence = {"error": notes}
                evidence_text, truncated = bounded_evidence_json(evidence)
                self.result.executed[-1].update(ok=False, summary=notes)
            if truncated:
                self.warn(f"step {step_id}: per-unit evidence exceeded 1 MiB and was stored abridged "
                          "(the step output is kept whole)")
        try:
            runs_store.complete_step(self.db, self.run_id, step_id, status, notes=notes,
                                     evidence_json=evidence_text, summary=summary, lease_holder=self.holder)
        except UsageError as exc:
            if exc.code in ("RUN_NOT_ACTIVE", "LEASE_HELD"):
                raise self.lost_lease_error() from None  # abandoned or taken over meanwhile: say so
            raise
        if status == "completed":
            self.evidence[step_id] = evidence

    # -------------------------------------------------------- main loop
    def run(self) -> None:
        res = self.result
        steps = self._load_evidence()
        self.replay_routes(steps)
        while True:
            if self.lease_lost.tripped:
                raise self.lost_lease_error()
            if self.opts.cancel.tripped:
                res.aborted, res.abort_reason = True, self.opts.cancel.reason
                return
            run = runs_store.get_run(self.db, self.run_id)
            if run is None or run.status != "active" or run.current_step_id is None:
                return
            if self.opts.max_steps is not None and res.steps_processed >= self.opts.max_steps:
                return
            if not runs_store.renew_lease(self.db, self.run_id, self.holder):
                raise self.lost_lease_error()
            step_id = run.current_step_id
            step = self.plan.step(step_id)
            if step is None:
                raise UsageError(f"Run {self.run_id}: current step {step_id} is not present in its frozen plan.",
                                 code="CORRUPT_RUN")
            if step_id in self.route_unselected and step_id not in self.route_selected:
                router, selected = self.route_unselected[step_id]
                if step.route is not None:
                    self._mark_unselected(step_id, None, route_targets(step.route))
                why = (f"route step {router} selected {selected}" if selected
                       else f"route step {router} was itself skipped")
                self.complete(step_id, "skipped", summary=None, notes=f"Skipped: {why}.", evidence=None)
                res.executed.append({"stepId": step_id, "ok": True, "skipped": True, "unitCount": 0,
                                     "failedUnits": 0, "summary": f"skipped ({why})"})
                continue
            if not self.run_step(step):
                return

    def run_step(self, step: StepPlan) -> bool:
        """Execute one step through its loops. Returns False when the drive must stop."""
        res = self.result
        max_loops = max(1, step.gate.max_loops)
        feedback: dict[str, Any] | None = None
        for loop in range(1, max_loops + 1):
            if loop > 1 and not runs_store.renew_lease(self.db, self.run_id, self.holder):
                raise self.lost_lease_error()
            if step.root is None:
                result: StepResult | dict[str, Any] = StepResult(
                    ok=True, evidence={}, summary=f'Step "{step.step_id}" is a route step — no units dispatched.')
            else:
                result = _StepRun(self, step, loop, feedback).execute()
            if self.lease_lost.tripped:
                raise self.lost_lease_error()
            if self.opts.cancel.tripped:
                res.aborted, res.abort_reason = True, self.opts.cancel.reason
                return False
            if isinstance(result, dict):
                self.park(result)
                return False
            res.executed.append({"stepId": step.step_id, "ok": result.ok, "skipped": False,
                                 "unitCount": result.unit_count,
                                 "failedUnits": result.failed_units, "summary": result.summary,
                                 **({"gateLoop": loop} if loop > 1 else {})})
            if not result.ok:
                if result.artifact_schema_failure and loop < max_loops:
                    feedback = {"feedback": result.summary, "missing": []}
                    continue
                self.complete(step.step_id, "failed", summary=None, notes=result.summary, evidence=result.evidence)
                res.steps_processed += 1
                return False
            evidence = dict(result.evidence)
            summary = result.summary
            if step.route is not None:
                scope = dict(self.outputs())
                if step.root is not None:
                    scope[step.step_id] = evidence.get("output")
                try:
                    decision = evaluate_route(step.step_id, step.route, self.loaded.params, scope)
                except RouteError as exc:
                    note = f'Step "{step.step_id}" route failed: {exc}'
                    res.executed[-1].update(ok=False, summary=note)
                    self.complete(step.step_id, "failed", summary=None, notes=note, evidence=evidence)
                    res.steps_processed += 1
                    return False
                evidence["route"] = decision
                self.route_selected.add(decision["selected"])
                self._mark_unselected(step.step_id, decision["selected"], route_targets(step.route))
                if step.root is None:
                    summary = (f"routed on {decision['input']}: value {json.dumps(decision['value'])} "
                               f"selected step {decision['selected']}")
                    res.executed[-1]["summary"] = summary
            if any(c.strip() for c in step.gate.criteria):
                self.park({"kind": "judge", "stepId": step.step_id, "gateLoop": loop,
                           "criteria": step.gate.criteria, "artifact": evidence.get("output"),
                           "summary": summary})
                return False
            self.complete(step.step_id, "completed", summary=summary, notes=None, evidence=evidence)
            res.steps_processed += 1
            return True
        return False

    def park(self, brief: dict[str, Any]) -> None:
        """Stop with `awaiting_session`: the remaining work needs a model, an agent or a judge."""
        runs_store.set_run_status(self.db, self.run_id, "awaiting_session", brief)
        self.result.awaiting = brief


def drive_run(db: Database, run_id: str, opts: DriveOptions) -> DriveResult:
    """Drive `run_id` as far as it can go in this invocation."""
    loaded = load_run(db, run_id)
    result = DriveResult(run_id=run_id)
    if loaded.status == "completed":
        result.done = True
        return result
    if loaded.status not in ("active", "awaiting_session"):
        raise UsageError(
            f"Workflow run {run_id} is {loaded.status} and cannot be executed.",
            code="RUN_NOT_ACTIVE",
            hint=f"Reopen it first with `akm workflow resume {run_id}`.",
        )
    holder = str(uuid.uuid4())
    live = runs_store.acquire_lease(db, run_id, holder)
    if live is not None:
        raise UsageError(
            f"Workflow run {run_id} is being driven by another invocation: lease holder {live.holder} "
            f"(host {live.host}, pid {live.pid}) until {live.until}. A second `akm workflow run` would race it.",
            code="LEASE_HELD",
            hint="Wait for that invocation to finish, or for its lease to expire.",
        )
    driver: _Driver | None = None
    try:
        driver = _Driver(db, loaded, holder, opts, result)
        driver.heartbeat.start()
        if loaded.status == "awaiting_session":
            runs_store.set_run_status(db, run_id, "active", None)
        driver.run()
        final = runs_store.get_run(db, run_id)
        result.done = final is not None and final.status == "completed"
        return result
    finally:
        if driver is not None:
            driver.heartbeat.stop()
        try:
            runs_store.release_lease(db, run_id, holder)
        except JournalError as exc:
            result.warnings.append(f"could not release the run lease: {exc}")
