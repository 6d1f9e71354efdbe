"""Reading and controlling runs that exist: list, status, catalog, graph, the HTML report, resume, abandon,
and the event log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from akm import paths
from akm.errors import UsageError
from akm.text import quoted, whole_number
from akm.views import (
    CatalogEntry,
    EventPage,
    EventView,
    GraphEdge,
    GraphNode,
    RewindResult,
    RunGraph,
    RunList,
    RunView,
    page_of,
)

if TYPE_CHECKING:
    from akm.api._models import (
        EventsRequest,
        ListRunsRequest,
        RewindRequest,
        RunIdRequest,
        StatusRequest,
    )
    from akm.views import Catalog
from akm.api._args import MAX_EVENT_LIMIT, MAX_PAGE, _of, _whole_number, _work_dir
from akm.api._request import _arguments
from akm.api._targets import _checked_target, _is_file, normalized_ref
from akm.api._views import _open_db, _require_run, _run_view, rewind_view

DEFAULT_EVENT_LIMIT = 100


def list_runs(
    request: ListRunsRequest | None = None,
    /,
    *,
    active_only: bool = False,
    ref: str | None = None,
    all_scopes: bool = False,
    cwd: str | None = None,
    offset: int = 0,
    limit: int | None = None,
) -> RunList:
    """Runs of the project of `cwd` (or of every project), newest first; `offset`/`limit` page them (`page`
    says where the page stands and how many runs there are).

    `ref` is a workflow file — resolved against `cwd`, like a run target — or a
    `workflows/<name>` ref.
    """
    from akm.store import runs as runs_store

    req = _arguments(
        "ListRunsRequest",
        request,
        dict(active_only=active_only, ref=ref, all_scopes=all_scopes, cwd=cwd, offset=offset, limit=limit),
        {
            "active_only": _of(bool, "active_only"),
            "ref": _of(str, "ref", True),
            "all_scopes": _of(bool, "all_scopes"),
            "cwd": _of(str, "cwd", True),
            "offset": lambda v: _whole_number(v, "offset", 0),
            "limit": lambda v: None if v is None else _whole_number(v, "limit", 1, MAX_PAGE),
        },
    )
    work_dir = _work_dir(req.cwd)
    ref = req.ref
    if ref is not None:
        _checked_target(ref, "the ref")
        candidate = Path(ref) if os.path.isabs(ref) else work_dir / ref
        if _is_file(candidate, ref):
            ref = os.path.realpath(candidate)
        elif ref.startswith("workflows/"):
            ref = normalized_ref(ref) or ref
    with _open_db(read_only=True) as db:
        if req.all_scopes:
            rows = runs_store.list_runs(db, active_only=req.active_only, ref=ref)
        else:  # this project's runs (on a shared journal: under its portable key, then its path key)
            rows = [
                r
                for key in paths.scope_keys(work_dir, portable=db.shared)
                for r in runs_store.list_runs(db, scope_key=key, active_only=req.active_only, ref=ref)
            ]
            rows.sort(key=lambda r: r.created_at, reverse=True)  # stable: each key's own tie order stays
        page = None
        if req.offset or req.limit is not None:
            rows, page = page_of(rows, req.offset, req.limit)
        return RunList(runs=[_run_view(db, r, with_steps=False) for r in rows], page=page)


def run_status(
    run_id: str | StatusRequest,
    *,
    units: bool = False,
    step: str | None = None,
    offset: int = 0,
    limit: int | None = None,
) -> RunView:
    """Where a run stands: steps with outputs and tallies, the final artifact, and (`units`) every attempt.

    `step` narrows the view to that step (and, with `units`, its attempts): what a front that clips large
    outputs points at to fetch one whole. `offset`/`limit` page the attempts (`units_page` says where the
    page stands and how many there are).
    """
    req = _arguments(
        "StatusRequest",
        run_id,
        {"run_id": run_id, "units": units, "step": step, "offset": offset, "limit": limit},
        {
            "run_id": _of(str, "run_id"),
            "units": _of(bool, "units"),
            "step": _of(str, "step", True),
            "offset": lambda v: _whole_number(v, "offset", 0),
            "limit": lambda v: None if v is None else _whole_number(v, "limit", 1, MAX_PAGE),
        },
    )
    with _open_db(read_only=True) as db:
        view = _run_view(db, _require_run(db, req.run_id), with_units=req.units)
    if req.step is not None:
        _narrow_to_step(view, req.step)
    if view.units is not None and (req.offset or req.limit is not None):
        view.units, view.units_page = page_of(view.units, req.offset, req.limit)
    return view


def _narrow_to_step(view: RunView, step_id: str) -> None:
    """Keep only `step_id` in the view: its step, its rows in the rewinds, its attempts (STEP_NOT_FOUND when
    the run has no such step)."""
    known = [s.id for s in view.steps or []]
    if step_id not in known:
        from akm.codes import Code

        raise UsageError(
            f"Run {view.run_id} has no step {step_id!r}; its steps are {', '.join(known)}.",
            code=Code.STEP_NOT_FOUND,
            details={"argument": "step", "steps": known},
        )
    view.steps = [s for s in view.steps or [] if s.id == step_id]
    for r in view.rewinds or []:
        r.steps = [s for s in r.steps if s.id == step_id]
    if view.units is not None:
        view.units = [u for u in view.units if u.step_id == step_id]


def workflow_catalog(request: Any = None, /, *, cwd: str | None = None) -> Catalog:
    """The workflows the project of `cwd` can run by name (`workflows/<name>`): project first, then the
    user library, each with its description, steps and params (name, type, description, required, default)."""
    from akm.catalog import catalog

    req = _arguments("CatalogRequest", request, {"cwd": cwd}, {"cwd": _of(str, "cwd", True)})
    return catalog(paths.project_root(_work_dir(req.cwd)))


def describe_workflow(target: str, *, cwd: str | None = None) -> CatalogEntry | None:
    """One workflow as the catalog describes it — title, steps, params (name, type, default, description) —
    named as `workflow run` names it: a file or a `workflows/<name>` ref (what `workflow run FILE --help`
    shows); None when `target` names a run instead (a run's params are fixed). Parsing only: no plan, no
    config."""
    from akm.api._args import _RUN_ID
    from akm.api._run_ids import is_run_reference
    from akm.api._targets import resolve_workflow_file
    from akm.catalog import describe

    target = _of(str, "target")(target)
    work_dir = _work_dir(_of(str, "cwd", True)(cwd))
    if _RUN_ID.match(target) or (is_run_reference(target) and not _is_file(work_dir / target, target)):
        return None
    path, ref = resolve_workflow_file(target, work_dir)
    return describe(ref, path, paths.project_root(work_dir))


def run_graph(run_id: str | RunIdRequest) -> RunGraph:
    """A run's steps (kind, status) and control flow, from its verified frozen plan."""
    from akm.engine.state import decode_plan
    from akm.plan.flow import flow_edges

    req = _arguments("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")})
    with _open_db(read_only=True) as db:
        run = _require_run(db, req.run_id)
        plan = decode_plan(run.id, run.plan_json, run.plan_hash)
        view = _run_view(db, run)
    status = {s.id: s.status for s in view.steps or []}
    nodes = [
        GraphNode(
            id=s.step_id,
            status=status.get(s.step_id, "pending"),
            kind="route" if s.route else ("map" if s.root is not None and s.root.kind == "map" else "unit"),
        )
        for s in plan.steps
    ]
    edges = [GraphEdge(source=e.source, target=e.target, label=e.label, certain=e.certain) for e in flow_edges(plan)]
    return RunGraph(run_id=run.id, nodes=nodes, edges=edges)


def run_report_html(run_id: str | RunIdRequest) -> str:
    """A run as one self-contained HTML page (`akm.report.html`): its status with every unit, its step
    graph, the timeline of its unit attempts from the journal events, and its budget."""
    from akm.engine.state import decode_plan
    from akm.report.html import render_report

    req = _arguments("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")})
    with _open_db() as db:
        run = _require_run(db, req.run_id)  # resolved once: `@last` must not move between the reads below
        plan = decode_plan(run.id, run.plan_json, run.plan_hash)
    view = run_status(run.id, units=True)
    graph = run_graph(run.id)
    budget = (
        {"maxUnits": plan.budget.max_units, "maxTokens": plan.budget.max_tokens, "maxCost": plan.budget.max_cost}
        if plan.budget
        else None
    )
    evs: list[dict[str, Any]] = []
    since = "@offset:0"
    while True:
        page = events(run_id=run.id, since=since, limit=MAX_EVENT_LIMIT)
        evs.extend(e.to_json() for e in page.events)
        if not page.has_more:
            break
        since = f"@offset:{page.next_offset}"
    return render_report(view.to_json(), graph.to_json(), evs, budget)


def resume(run_id: str | RunIdRequest) -> RunView:
    """Reopen a failed or blocked run (its current step becomes pending again)."""
    return _control(
        _arguments("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")}).run_id, "resume_run"
    )


def abandon(run_id: str | RunIdRequest) -> RunView:
    """Give up on a run, at once and for good: it becomes `abandoned` (final; never resumed).

    No unit of it starts after this returns; a driver working on it stops its
    in-flight units within about a second and exits with RUN_ABANDONED.
    """
    return _control(
        _arguments("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")}).run_id, "abandon_run"
    )


def rewind(run_id: str | RewindRequest, to_step: str | None = None, *, redo: bool | list[str] = False) -> RewindResult:
    """Take a run back to `to_step`: it and every later step are reopened, in one journal transaction.

    Nothing is deleted: the rows it supersedes stay in the journal, marked with the rewind. Units whose
    identity (content id and input hash) is unchanged when the engine meets them again are restored from
    them instead of run, unless `redo` says otherwise (True: none; a list of unit ids: all but those); the
    session units of `to_step` are asked for again. A completed, failed, blocked or active run can be
    rewound (not an abandoned one, nor one a live driver holds).
    """
    req = _arguments(
        "RewindRequest",
        run_id,
        {"run_id": run_id, "to_step": to_step, "redo": redo},
        {"run_id": _of(str, "run_id"), "to_step": _of(str, "to_step"), "redo": _redo},
    )
    from akm.engine.rewind import rewind as rewind_run
    from akm.store import runs as runs_store

    with _open_db() as db:
        rid: str = _require_run(db, req.run_id).id  # a prefix or `@last` names the run: the rest uses its id
        done = rewind_run(db, rid, req.to_step, redo=req.redo)
        run = _run_view(db, runs_store.require_run(db, rid))
        this = next((r for r in run.rewinds or [] if r.rewind_id == done.rewind.id), None)
        return RewindResult(
            rewind=this or rewind_view(done.rewind),
            steps=done.steps,
            superseded_units=done.superseded_units,
            reusable_units=done.reusable_units,
            run=run,
        )


def _redo(value: Any) -> bool | list[str]:
    if isinstance(value, bool):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    raise TypeError(f"redo {value!r}: expected true, false or a list of unit ids")


def _control(run_id: str, action: str) -> RunView:
    from akm.store import runs as runs_store

    with _open_db() as db:
        run_id = _require_run(db, run_id).id
        if action != "abandon_run":
            return _run_view(db, getattr(runs_store, action)(db, run_id))
        from akm.api import _trace

        tracing = _trace.begin(db, run_id)
        view = _run_view(db, getattr(runs_store, action)(db, run_id))
        _trace.finish(db, run_id, tracing, lambda message: None)
        return view


def _iso_timestamp(text: str) -> str:
    """An ISO-8601 time for `--since`, normalised to the journal's fixed-width UTC form."""
    from datetime import datetime, timezone

    from akm.store.clock import format_iso

    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        from akm.codes import Code

        raise UsageError(
            f"since {text!r}: expected @offset:N (a previous nextOffset) or an ISO time like 2026-11-30T12:00:00Z.",
            code=Code.INVALID_ARGUMENT,
            details={"argument": "since"},
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return format_iso(moment.astimezone(timezone.utc))


def events(
    request: EventsRequest | None = None,
    /,
    *,
    run_id: str | None = None,
    since: str | None = None,
    limit: int | None = None,
) -> EventPage:
    """Journal events after an `@offset:N` cursor (or since an ISO time), at most `limit`
    (default 100, at most 10 000) per page; `has_more` says whether to ask again from `next_offset`."""
    from akm.store import events as events_store

    req = _arguments(
        "EventsRequest",
        request,
        dict(run_id=run_id, since=since, limit=limit),
        {
            "run_id": _of(str, "run_id", True),
            "since": _of(str, "since", True),
            "limit": lambda v: None if v is None else _whole_number(v, "limit", 1, MAX_EVENT_LIMIT),
        },
    )
    run_id, since = req.run_id, req.since
    limit = DEFAULT_EVENT_LIMIT if req.limit is None else req.limit

    offset, since_ts = 0, None
    if since is not None:
        if since.startswith("@offset:"):
            raw = since[len("@offset:") :]
            number = whole_number(raw) if raw.isdigit() else None
            if number is None or number > 2**63 - 1:
                from akm.codes import Code

                raise UsageError(
                    f"since {quoted(since)}: the offset must be a whole number (a previous nextOffset).",
                    code=Code.INVALID_ARGUMENT,
                    details={"argument": "since"},
                )
            offset = number
        else:
            since_ts = _iso_timestamp(since)
    with _open_db(read_only=True) as db:
        if run_id is not None:
            run_id = _require_run(db, run_id).id
        evs, next_offset = events_store.list_events(db, run_id, offset, limit + 1, since_ts=since_ts)
        has_more = len(evs) > limit
        if has_more:
            evs = evs[:limit]
            next_offset = evs[-1].id
        return EventPage(
            run=run_id,
            since_offset=offset,
            next_offset=next_offset,
            has_more=has_more,
            events=[
                EventView(id=e.id, ts=e.ts, event_type=e.event_type, run_id=e.run_id, metadata=e.metadata) for e in evs
            ],
        )
