"""`workflow run … --plan`: what a run would do, without writing anything to the journal (or anywhere).

The target resolves as `run_workflow` resolves it (the run a run id names, the drivable run of the same
workflow and params, or a new run — always new with `from_run`), but nothing is created: the journal is
opened for reading only (and not at all when there is none yet), and the forecast is the engine's
(`akm.engine.preview`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from akm import paths
from akm.api._args import _of, _work_dir
from akm.api._request import _arguments
from akm.api._runs import _continue_active, _resolve
from akm.views import BudgetPreview, RunPreview, RunWarning, StepPreview

if TYPE_CHECKING:
    from akm.api._models import RunRequest


def plan_run(
    target: str | RunRequest,
    *,
    params: dict[str, Any] | None = None,
    param_pairs: list[tuple[str, str | bool]] | None = None,
    new: bool = False,
    from_run: str | None = None,
    cwd: str | None = None,
) -> RunPreview:
    """Preview `run_workflow` with these arguments: per step, the units already done, those that would be
    reused (a rewind's history, the `from_run` run), run by akm or asked of the calling agent; each step's
    engine, model and judge; the budget; what would happen first. Writes nothing."""
    req = _arguments(
        "RunRequest",
        target,
        dict(target=target, params=params, param_flags=param_pairs, new=new, from_run=from_run, cwd=cwd),
        {
            "target": _of(str, "target"),
            "params": _of(dict, "params", True),
            "param_flags": _of(list, "param_flags", True),
            "new": _of(bool, "new"),
            "from_run": _of(str, "from_run", True),
            "cwd": _of(str, "cwd", True),
        },
    )
    from akm.engine.preview import forecast
    from akm.engine.state import load_run
    from akm.engine.stepctx import load_spine
    from akm.plan.model import UNIT_HASH_VERSION
    from akm.store import units as units_store

    work_dir = _work_dir(req.cwd).resolve()
    warnings: list[RunWarning] = []
    db = _open_for_reading()
    try:
        t = _resolve(db, req.target, req.params, req.param_flags, req.new, work_dir, warnings.append, req.from_run)
        run = t.existing
        if run is None and t.active is not None and t.wf_path is not None:
            _continue_active(t.active, t.plan, t.wf_path, warnings.append)
            run = t.active
        if run is not None:
            loaded = load_run(db, run.id)
            plan, values, version = loaded.plan, loaded.params, run.hash_version
            spine = load_spine(db, run.id, plan)
            used, tokens = units_store.journal_totals(db, run.id)
            fc = forecast(
                db,
                run_id=run.id,
                plan=plan,
                params=values,
                hash_version=version,
                spine=spine,
                reuse_from=run.reuse_from,
            )
            if run.status == "completed":
                fc.first = "nothing: the run is completed"
            elif run.status == "abandoned":
                fc.first = "nothing: the run was abandoned (a new run can reuse its units: from_run)"
        else:
            plan, values, used, tokens = t.plan, t.values or {}, 0, 0
            fc = forecast(db, run_id=None, plan=plan, params=values, hash_version=UNIT_HASH_VERSION, reuse_from=t.donor)
    finally:
        if db is not None:
            db.close()
    from akm.engine.concurrency import plan_widths
    from akm.plan.engines import step_routes

    routes = {r.step_id: r.text for r in step_routes(plan)}
    steps = [StepPreview(**s.__dict__, runs_on=routes.get(s.id)) for s in fc.steps]
    budget = plan.budget
    out = RunPreview(
        run_id=run.id if run is not None else None,
        from_run=(run.reuse_from if run is not None else t.donor),
        workflow=run.workflow_ref if run is not None else str(t.ref),
        title=plan.title,
        plan_hash=plan.plan_hash(),
        params=values,
        status=run.status if run is not None else None,
        steps=steps,
        reused=sum(s.reused for s in steps),
        to_run=sum(s.to_run for s in steps),
        for_agent=sum(s.for_agent for s in steps),
        budget=BudgetPreview(
            max_units=budget.max_units if budget else None,
            max_tokens=budget.max_tokens if budget else None,
            used_units=used,
            used_tokens=tokens,
            to_run=sum(s.to_run for s in steps),
        ),
        first=fc.first,
        warnings=[w.message for w in warnings] + fc.warnings + [n for n in (w.note() for w in plan_widths(plan)) if n],
    )
    if budget and budget.max_units is not None and used + out.to_run > budget.max_units:
        out.warnings.append(
            f"the budget's max_units ({budget.max_units}) would be passed: {used} dispatched so far and "
            f"{out.to_run} more to run"
        )
    return out


def _open_for_reading() -> Any:
    """The journal for reading only, or None when there is none yet (a preview creates nothing)."""
    from akm.api._views import _configured_journal_url
    from akm.store import journal_url, open_db_read_only, open_journal

    url = journal_url() or _configured_journal_url()
    if url is not None:
        return open_journal(url)
    path = paths.journal_path()
    if not path.is_file():
        return None
    return open_db_read_only(path)
