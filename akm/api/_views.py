"""The journal as the api shows it: opening it (read-only where the directory cannot be written) and
turning its rows into the plain `RunView` records every read and run call returns.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from akm import paths
from akm.errors import AkmError
from akm.views import (
    LeaseView,
    RewindView,
    RunView,
    SpendView,
    StepView,
    UnitView,
)

if TYPE_CHECKING:
    from akm.store.journal import Journal
    from akm.store.runs import Run

STALE_AFTER_S = 90.0


def _open_db(*, read_only: bool = False) -> Journal:
    """The journal. `read_only` (the read commands): when it cannot be opened for writing — a read-only
    directory or mount — it is read as it is instead (`akm.store.open_db_read_only`)."""
    from akm.errors import JournalError
    from akm.store import journal_url, open_db, open_db_read_only, open_journal

    url = journal_url() or _configured_journal_url()
    if url is not None:  # a journal server (AKM_JOURNAL_URL, else config journal.url)
        return open_journal(url)
    path = paths.journal_path()
    try:
        return open_db(path)
    except JournalError as exc:
        if not read_only or exc.code != "JOURNAL_ERROR" or not path.is_file() or _writable(path):
            raise
        try:
            return open_db_read_only(path)
        except JournalError:
            raise exc from None


def _configured_journal_url() -> str | None:
    """Config `journal.url` (the project file over the user file), read raw: opening the journal must not
    cost a validation of the whole config. Absent or empty: None (the SQLite journal)."""
    from akm.config import project_config_path, user_config_path
    from akm.config._files import read_config_file
    from akm.store import server_url

    files = (user_config_path(), project_config_path())  # found once: the project root is a directory walk
    if not any(path.is_file() for path in files):
        return None
    url: object = None
    for path in files:
        data = read_config_file(path) or {}
        section = data.get("journal") if isinstance(data, dict) else None
        if isinstance(section, dict) and "url" in section:
            url = section["url"]
    if url is None or isinstance(url, str):
        return server_url(url or "")
    from akm.codes import Code
    from akm.errors import JournalError

    raise JournalError("config journal.url must be a postgresql:// URL (a string)", code=Code.JOURNAL_URL_INVALID)


def _writable(path: Path) -> bool:
    """Whether the journal and its directory take writes (a read-only mount answers EROFS even to root)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    os.close(fd)
    probe = path.with_name(f".{path.name}.probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        return False
    os.unlink(probe)
    return True


def _json_or_none(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _object_or_none(text: str | None) -> dict[str, Any] | None:
    value = _json_or_none(text)
    return value if isinstance(value, dict) else None


def _params_view(run: Run) -> dict[str, Any] | None:
    """The run's params for display; null when the stored record is not a JSON object.

    A damaged row must stay listable (one bad row must not break `workflow list`
    for every run); driving it is refused by `load_run` as CORRUPT_RUN.
    """
    value = _json_or_none(run.params_json) if run.params_json else {}
    return value if isinstance(value, dict) else None


def _routes(run: Run) -> dict[str, str]:
    """Each step's `runs_on` words from the run's frozen plan ({} for a plan this akm cannot read)."""
    from akm.plan.engines import step_routes
    from akm.plan.model import Plan

    try:
        plan = Plan.model_validate(json.loads(run.plan_json))
        return {r.step_id: r.text for r in step_routes(plan)}
    except Exception:
        return {}  # a damaged plan: status still shows the journal (driving it is refused elsewhere)


def _run_view(db: Journal, run: Run, *, with_steps: bool = True, with_units: bool = False) -> RunView:
    from akm.store import runs as runs_store

    # Only a drivable run has a driver worth naming; an abandoned run's lease columns are forensic.
    lease = runs_store.read_lease(db, run.id) if run.drivable else None
    view = RunView(
        run_id=run.id,
        status=run.status,
        workflow=run.workflow_ref,
        title=run.title,
        plan_hash=run.plan_hash,
        current_step_id=run.current_step_id,
        created_at=run.created_at,
        updated_at=run.updated_at,
        completed_at=run.completed_at,
        params=_params_view(run),
        engine_lease=LeaseView(**lease._asdict()) if lease else None,
        awaiting=_awaiting(db, run) if run.status == "awaiting_session" and with_steps else None,
    )
    if with_steps:
        _fill_steps(db, run, view, lease_held=lease is not None)
    if with_units:
        view.units = _units_view(db, run)
    return view


def _fill_steps(db: Journal, run: Run, view: RunView, *, lease_held: bool) -> None:
    """The run's steps (with the run's output), rewinds, spend and — for a stopped run — the way on."""
    from akm.store import runs as runs_store
    from akm.store import units as units_store

    view.steps = []
    routes = _routes(run)
    tallies = units_store.step_tallies(db, run.id)
    reused = units_store.reused_counts(db, run.id)
    for s in runs_store.get_steps(db, run.id):
        ev = _json_or_none(s.evidence_json)
        output = ev.get("output") if isinstance(ev, dict) else None
        cut = ev.get("truncatedUnits") if isinstance(ev, dict) else None
        status = s.status
        if status == "pending" and lease_held and s.step_id == run.current_step_id:
            status = "running"  # a live driver holds the run and works on this step right now
        tally = tallies.get(s.step_id)
        view.steps.append(
            StepView(
                id=s.step_id,
                status=status,
                output=output,
                summary=s.summary,
                notes=s.notes,
                runs_on=routes.get(s.step_id),
                unit_count=tally.units if tally else 0,
                attempts=tally.attempts if tally else 0,
                gate_loops=tally.gate_loops if tally else 0,
                truncated_units=len(cut) if isinstance(cut, list) else 0,
                reused_units=reused.get(s.step_id, 0),
            )
        )
        if run.status == "completed" and s.status == "completed" and output is not None:
            view.output, view.output_step_id = output, s.step_id
    view.rewinds = _rewinds_view(db, run.id)
    view.spend = _spend_view(db, run)
    if run.status in ("failed", "blocked", "abandoned"):
        from akm.engine.recovery import recovery

        view.recovery = recovery(db, run)


def _units_view(db: Journal, run: Run) -> list[UnitView]:
    """The run's unit rows in force, then the rows rewinds superseded, each marked with its rewind.

    D8: a running unit whose last sign of life (heartbeat, else start) is older than STALE_AFTER_S is stale —
    its driver is probably gone. The engine heartbeats running units, so a long healthy unit is never reported
    stale. Compared on the journal's clock, the one those stamps were written on."""
    from akm.store import rewinds as rewinds_store
    from akm.store import units as units_store

    cutoff = db.now(-STALE_AFTER_S)
    units = [_unit_view(u, cutoff) for u in units_store.get_units(db, run.id)]
    units += [_unit_view(h.unit, cutoff, superseded_by=h.rewind_id) for h in rewinds_store.superseded_units(db, run.id)]
    return units


def _unit_view(u: Any, cutoff: str, superseded_by: str | None = None) -> UnitView:
    return UnitView(
        unit_id=u.unit_id,
        step_id=u.step_id,
        status=u.status,
        attempts=u.attempts,
        phase="gate" if u.phase == "gate" else "unit",
        failure_reason=u.failure_reason,
        result=_json_or_none(u.result_json),
        tokens=u.tokens,
        runner=u.runner,
        started_at=u.started_at,
        finished_at=u.finished_at,
        last_checkin_at=u.last_checkin_at,
        worktree_path=u.worktree_path,
        truncated=bool(u.truncated),
        host=u.host,
        engine=u.engine,
        session_id=u.session_id,
        stale=((u.last_checkin_at or u.started_at) < cutoff)
        if u.status == "running" and u.phase != "gate" and superseded_by is None
        else None,
        superseded_by=superseded_by,
        reused_from=_json_or_none(u.reused_from),
        cost=u.cost,
    )


def spend_words(cost: float, unknown: int, max_cost: float | None) -> str:
    """The dollars in words: `$0.0440 of $0.05`, `≥ $0.0440, 2 units unknown` (a floor when usage is unknown)."""
    from akm.text import dollars

    text = ("≥ " if unknown else "") + dollars(cost)
    if max_cost is not None:
        text += f" of {dollars(max_cost)}"
    if unknown:
        text += f", {unknown} unit{'s' if unknown != 1 else ''} unknown"
    return text


def _spend_view(db: Any, run: Any) -> SpendView | None:
    """The run's spend against its budget (None for a plan this akm cannot read)."""
    from akm.plan.model import Plan
    from akm.store import units as units_store

    try:
        plan = Plan.model_validate(json.loads(run.plan_json))
    except Exception:
        return None
    budget = plan.budget
    s = units_store.journal_spend(db, run.id)
    priced = bool(plan.execution.prices) or bool(budget and budget.max_cost is not None)
    unknown = s.unknown_cost if priced else s.unknown_tokens
    return SpendView(
        units=s.attempts,
        tokens=s.tokens,
        cost=round(s.cost, 9),
        unknown_units=unknown,
        max_units=budget.max_units if budget else None,
        max_tokens=budget.max_tokens if budget else None,
        max_cost=budget.max_cost if budget else None,
        unknown=(budget.unknown or "refuse") if budget else "refuse",
        text=spend_words(s.cost, unknown, budget.max_cost if budget else None)
        if priced
        else f"{s.tokens} tokens" + (f", {unknown} unit{'s' if unknown != 1 else ''} unknown" if unknown else ""),
    )


def _rewinds_view(db: Any, run_id: str) -> list[RewindView]:
    """The run's rewinds, each with the step rows it superseded (as `StepView`s: status, output, notes)."""
    from akm.store import rewinds as rewinds_store

    rewinds = rewinds_store.list_rewinds(db, run_id)
    if not rewinds:
        return []
    steps: dict[str, list[StepView]] = {}
    for h in rewinds_store.superseded_steps(db, run_id):
        ev = _json_or_none(h.step.evidence_json)
        steps.setdefault(h.rewind_id, []).append(
            StepView(
                id=h.step.step_id,
                status=h.step.status,
                output=ev.get("output") if isinstance(ev, dict) else None,
                summary=h.step.summary,
                notes=h.step.notes,
            )
        )
    return [rewind_view(r, steps.get(r.id, [])) for r in rewinds]


def rewind_view(r: Any, steps: list[StepView] | None = None) -> RewindView:
    return RewindView(
        rewind_id=r.id,
        seq=r.seq,
        to_step=r.to_step,
        redo=r.redo,
        from_status=r.from_status,
        from_step=r.from_step,
        created_at=r.created_at,
        steps=steps or [],
    )


def _awaiting(db: Journal, run: Run) -> dict[str, Any] | None:
    """The live brief of a run parked for the calling agent (computed from the journal, never stale)."""
    from akm.api._briefs import brief_json
    from akm.engine import briefs

    try:
        return brief_json(briefs.brief(db, run.id))
    except AkmError:
        return _object_or_none(run.status_detail_json)


def _require_run(db: Journal, run_id: str, cwd: Path | None = None) -> Run:
    """The run a caller names: a whole id, a unique prefix, or `@last` of `cwd`'s project (`_run_ids`)."""
    from akm.api._run_ids import resolve_run_id
    from akm.store import runs as runs_store

    return runs_store.require_run(db, resolve_run_id(db, run_id, cwd))
