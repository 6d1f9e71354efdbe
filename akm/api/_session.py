"""The session protocol (D11-D13): the brief of the work the calling agent does, and its reports."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from akm import paths
from akm.codes import Code
from akm.errors import UsageError

if TYPE_CHECKING:
    from akm.api._models import Brief, NextRequest, ReportRequest, ReportResult
    from akm.store.runs import Run
from akm.api._args import _work_dir
from akm.api._request import _validated
from akm.api._views import _open_db, _require_run


def default_holder() -> str:
    """Who a report claims units as when the caller names nobody: this user on this host."""
    import getpass

    from akm.store.runs import hostname

    try:
        user = getpass.getuser()
    except Exception:
        user = "user"
    return f"cli:{user}@{hostname()}"


def next_brief(run_id: str | NextRequest, *, unit_id: str | None = None) -> Brief:
    """What the calling agent should do now for a run (read-only); `unit_id`: only that unit of it."""
    from akm.api._briefs import brief_json
    from akm.api._models import Brief
    from akm.engine import briefs

    req = _validated("NextRequest", run_id, {"run_id": run_id, "unit_id": unit_id})
    with _open_db(read_only=True) as db:
        b = briefs.brief(db, _require_run(db, req.run_id).id)
    units = None
    if req.unit_id is not None:
        units = [u for u in b.units if req.unit_id in (u.unit_id, u.attempt_id)]
        if not units:
            raise UsageError(
                f"Unit {req.unit_id} is not outstanding in run {b.run_id} (step {b.step_id}); "
                f"outstanding: {', '.join(u.unit_id for u in b.units) or '(none)'}.",
                code=Code.UNKNOWN_UNIT,
                details={"argument": "unit_id"},
            )
    return Brief.model_validate(brief_json(b, units))


def _run_project_root(run: Run, cwd: Path, *, portable: bool) -> Path:
    """The project a run belongs to, for a report: where its `env:` files (redaction) and its judge live.

    Normally the reporter's own project. A report made from elsewhere — an MCP server whose client passed
    `cwd` to `workflow_run`, a shell in another checkout — finds the run's project from its workflow file,
    checked against the run's scope, so secrets are still redacted with the run's own env files. On a
    shared journal (`portable`) a portable scope (a git remote) matches every clone: the checkout the run
    was started in, when it is on this machine, still wins over another clone of the same repository.
    """
    root = paths.project_root(cwd)
    if not run.workflow_path or run.scope_key == paths.path_key(root):
        return root
    candidate = paths.project_root(Path(run.workflow_path).parent)
    if candidate != root and candidate.is_dir() and run.scope_key in paths.scope_keys(candidate, portable=portable):
        return candidate
    return root


def report_unit(
    run_id: str | ReportRequest,
    unit_id: str | None = None,
    *,
    status: str = "completed",
    result: Any = None,
    verdict: Any = None,
    tokens: int | None = None,
    failure_reason: str | None = None,
    expect_step: str | None = None,
    rerun: bool = False,
    attempt_id: str | None = None,
    gate_loop: int | None = None,
    holder: str | None = None,
    cwd: str | None = None,
) -> ReportResult:
    """Record a session unit's result (or a gate verdict) and finish the step when its work is done.

    One request: a `ReportRequest` (what the MCP tool validated), or its fields as keywords. `result` None:
    no result; `verdict` None: none (a gate unit id still makes the report a verdict). Given as keywords,
    the verdict may be any value or JSON text (the CLI reads it as text): the engine parses and checks it,
    with its own codes (VERDICT_INVALID). `attempt_id` (the brief's) or `gate_loop` say which attempt the
    report answers: a report for an attempt a gate already closed is never counted for a later loop
    (idempotent when it is what was recorded, else STALE_REPORT). The same report resent after its step or
    run moved on is idempotent.
    """
    from akm.api._briefs import report_json
    from akm.api._models import ReportResult
    from akm.engine import session

    fields = dict(
        run_id=run_id,
        unit_id=unit_id,
        status=status,
        result=result,
        tokens=tokens,
        failure_reason=failure_reason,
        expect_step=expect_step,
        rerun=rerun,
        attempt_id=attempt_id,
        gate_loop=gate_loop,
        holder=holder,
        cwd=cwd,
    )
    req: ReportRequest = _validated("ReportRequest", run_id, fields)
    with _open_db() as db:
        run = _require_run(db, req.run_id, _work_dir(req.cwd))
        root = _run_project_root(run, _work_dir(req.cwd), portable=db.shared)
        unit_report = session.UnitReport(
            run_id=run.id,
            unit_id=req.unit_id,
            holder=req.holder or default_holder(),
            status=req.status,
            result=req.result,
            verdict=verdict if isinstance(run_id, str) else req.verdict,
            tokens=req.tokens,
            failure_reason=req.failure_reason,
            expect_step=req.expect_step,
            rerun=req.rerun,
            attempt_id=req.attempt_id,
            gate_loop=req.gate_loop,
        )
        from akm.api import _trace

        tracing = _trace.begin(db, run.id, _work_dir(req.cwd))
        answer = ReportResult.model_validate(report_json(session.report(db, unit_report, project_root=root)))
        if answer.run_status in ("completed", "failed", "blocked"):
            _trace.finish(db, run.id, tracing, lambda message: None)  # no warning channel here: dropped quietly
        if answer.run_status in ("failed", "blocked"):
            from akm.engine.recovery import recovery

            answer.recovery = recovery(db, _require_run(db, req.run_id))
        return answer
