"""The session protocol (D11-D13): the brief of the work the calling agent does, and its reports."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from akm import paths
from akm.errors import UsageError

if TYPE_CHECKING:
    from akm.api._models import (
        Brief,
        ReportResult,
    )
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


def next_brief(run_id: str, *, unit_id: str | None = None) -> Brief:
    """What the calling agent should do now for a run (read-only); `unit_id`: only that unit of it."""
    from akm.engine import session

    req = _validated("NextRequest", None, {"run_id": run_id, "unit_id": unit_id})
    with _open_db(read_only=True) as db:
        run_id = _require_run(db, req.run_id).id
        from akm.api._models import Brief

        out = session.brief(db, run_id)
    if req.unit_id is not None:
        units = [u for u in out["units"] if req.unit_id in (u["unitId"], u["attemptId"])]
        if not units:
            raise UsageError(
                f"Unit {req.unit_id} is not outstanding in run {run_id} (step {out['stepId']}); "
                f"outstanding: {', '.join(u['unitId'] for u in out['units']) or '(none)'}.",
                code="UNKNOWN_UNIT",
                details={"argument": "unit_id"},
            )
        out["units"] = units
    return Brief.model_validate(out)


def _run_project_root(run, cwd: Path, *, portable: bool) -> Path:
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
    run_id: str,
    unit_id: str,
    *,
    status: str = "completed",
    result: Any = None,
    has_result: bool = False,
    verdict: Any = None,
    has_verdict: bool = False,
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

    `attempt_id` (the brief's) or `gate_loop` say which attempt the report answers: a report for an
    attempt a gate already closed is never counted for a later loop (idempotent when it is what was
    recorded, else STALE_REPORT). The same report resent after its step or run moved on is idempotent.
    """
    from akm.engine import session

    req = _validated(
        "ReportRequest",
        None,
        dict(
            run_id=run_id,
            unit_id=unit_id,
            status=status,
            tokens=tokens,
            failure_reason=failure_reason,
            expect_step=expect_step,
            rerun=rerun,
            attempt_id=attempt_id,
            gate_loop=gate_loop,
            holder=holder,
            cwd=cwd,
        ),
    )
    with _open_db() as db:
        run = _require_run(db, req.run_id, _work_dir(req.cwd))
        root = _run_project_root(run, _work_dir(req.cwd), portable=db.shared)
        from akm.api._models import ReportResult

        answer = ReportResult.model_validate(
            session.report(
                db,
                run.id,
                req.unit_id,
                status=req.status,
                result=result if has_result else session.MISSING,
                verdict=verdict if has_verdict else session.MISSING,
                tokens=req.tokens,
                failure_reason=req.failure_reason,
                expect_step=req.expect_step,
                rerun=req.rerun,
                attempt_id=req.attempt_id,
                gate_loop=req.gate_loop,
                holder=req.holder or default_holder(),
                project_root=root,
            )
        )
        if answer.run_status in ("failed", "blocked"):
            from akm.engine.recovery import recovery

            answer.recovery = recovery(db, _require_run(db, req.run_id))
        return answer
