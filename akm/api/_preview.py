"""`workflow run … --plan`: what a run would do, without writing anything to the journal (or anywhere).

The target resolves as `run_workflow` resolves it (the run a run id names, the drivable run of the same
workflow and params, or a new run — always new with `from_run`), but nothing is created: the journal is
opened for reading only (and not at all when there is none yet), and the forecast is the engine's
(`akm.engine.preview`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from akm import paths
from akm.api._args import _of, _work_dir
from akm.api._request import _arguments
from akm.api._runs import _continue_active, _resolve, _Target
from akm.views import BudgetPreview, RunPreview, RunWarning, StepPreview

if TYPE_CHECKING:
    from akm.api._models import RunRequest
    from akm.engine.preview import Forecast
    from akm.plan.model import Plan
    from akm.store.journal import Journal
    from akm.store.runs import Run
    from akm.store.units import Spend


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
    work_dir = _work_dir(req.cwd).resolve()
    warnings: list[RunWarning] = []
    db = _open_for_reading()
    try:
        t = _resolve(db, req.target, req.params, req.param_flags, req.new, work_dir, warnings.append, req.from_run)
        run, (plan, values, spend, fc) = _forecast_target(db, t, warnings.append)
        today = _spent_today(db, plan, run.scope_key if run is not None else t.scope)
    finally:
        if db is not None:
            db.close()
    from akm.plan.engines import step_routes

    routes = {r.step_id: r.text for r in step_routes(plan)}
    steps = [StepPreview(**s.__dict__, runs_on=routes.get(s.id)) for s in fc.steps]
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
        budget=_budget_preview(plan, spend, today, to_run=sum(s.to_run for s in steps)),
        first=fc.first,
        warnings=[w.message for w in warnings] + fc.warnings + _width_notes(plan),
    )
    passed = _max_units_passed(plan, spend.attempts, out.to_run)
    if passed is not None:
        out.warnings.append(passed)
    return out


def _max_units_passed(plan: Plan, dispatched: int, to_run: int) -> str | None:
    """The warning that running the rest would pass the budget's max_units, or None."""
    budget = plan.budget
    if budget and budget.max_units is not None and dispatched + to_run > budget.max_units:
        return (
            f"the budget's max_units ({budget.max_units}) would be passed: {dispatched} dispatched so far and "
            f"{to_run} more to run"
        )
    return None


def _width_notes(plan: Plan) -> list[str]:
    """What the plan's step widths say worth noting (a width the engine will lower, say)."""
    from akm.engine.concurrency import plan_widths

    return [n for n in (w.note() for w in plan_widths(plan)) if n]


def _forecast_target(
    db: Journal, t: _Target, warn: Callable[[RunWarning], None]
) -> tuple[Run | None, tuple[Plan, dict[str, Any], Spend, Forecast]]:
    """The run the preview is of (an existing one, or the active run a new start would continue; None for a
    new run) and its (plan, params, spend so far, forecast)."""
    from akm.engine.preview import forecast
    from akm.plan.model import UNIT_HASH_VERSION
    from akm.store import units as units_store

    run = t.existing
    if run is None and t.active is not None and t.wf_path is not None:
        _continue_active(t.active, t.plan, t.wf_path, warn)
        run = t.active
    if run is not None:
        return run, _run_forecast(db, run)
    plan, values, spend = t.plan, t.values or {}, units_store.Spend(0, 0, 0.0, 0, 0)
    fc = forecast(db, run_id=None, plan=plan, params=values, hash_version=UNIT_HASH_VERSION, reuse_from=t.donor)
    return None, (plan, values, spend, fc)


def _spent_today(db: Journal | None, plan: Plan, scope: str | None) -> float | None:
    """The project's spend since the start of the day, when the plan has a daily cost limit (else None)."""
    if plan.execution.daily_cost_limit is None:
        return None
    from akm.engine.spend import day_start
    from akm.store import units as units_store

    return units_store.project_spend_since(db, scope, day_start(db.now())) if db and scope else 0.0


def _run_forecast(db: Journal, run: Run) -> tuple[Plan, dict[str, Any], Spend, Forecast]:
    """(plan, params, spend so far, forecast) of an existing run, driven on from where it stands; a completed
    or abandoned run has nothing first."""
    from akm.engine.preview import forecast
    from akm.engine.state import load_run
    from akm.engine.stepctx import load_spine
    from akm.store import units as units_store

    loaded = load_run(db, run.id)
    plan, values, version = loaded.plan, loaded.params, run.hash_version
    spine = load_spine(db, run.id, plan)
    spend = units_store.journal_spend(db, run.id)
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
    return plan, values, spend, fc


def _budget_preview(plan: Plan, spend: Spend, today: float | None, *, to_run: int) -> BudgetPreview:
    """The preview's budget: the plan's ceilings, what the run used so far, today's project spend."""
    budget = plan.budget
    return BudgetPreview(
        max_units=budget.max_units if budget else None,
        max_tokens=budget.max_tokens if budget else None,
        max_cost=budget.max_cost if budget else None,
        daily_cost_limit=plan.execution.daily_cost_limit,
        used_units=spend.attempts,
        used_tokens=spend.tokens,
        used_cost=round(spend.cost, 9),
        unknown_units=spend.unknown_cost if plan.execution.prices else spend.unknown_tokens,
        spent_today=today,
        to_run=to_run,
    )


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
