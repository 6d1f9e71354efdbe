"""A run's trace: exported when tracing is configured (`export_ended`), or written from the journal after
the fact (`trace_export`, `akm trace export RUN`, `workflow status RUN --format otlp-json`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from akm.telemetry.settings import TraceSettings, trace_settings

if TYPE_CHECKING:
    from akm.telemetry.context import RunTrace
    from akm.telemetry.journal_spans import Segment, SpanRecord


def settings_here(cwd: Any = None) -> TraceSettings | None:
    """Tracing settings for a command run in `cwd`: OTEL_* first, then config `telemetry` (files read only
    when the environment does not decide)."""
    import os

    from_env = trace_settings(None)
    if from_env is not None:
        return from_env
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in ("1", "true"):
        return None
    from akm.config import load_config_if_any

    try:
        loaded = load_config_if_any(cwd)
    except Exception:  # noqa: BLE001 - a config problem is said by the run itself, not by tracing
        return None
    return trace_settings(getattr(loaded.config, "telemetry", None)) if loaded is not None else None


def trace_of(db: Any, run_id: str) -> RunTrace:
    from akm.store import events as events_store
    from akm.telemetry.context import run_trace

    started = events_store.first_event(db, "workflow_started", run_id)
    return run_trace(run_id, started.metadata if started is not None else None)


def _journal(db: Any, run_id: str) -> tuple[RunTrace, list[Segment], list[SpanRecord]]:
    from akm.store import events as events_store
    from akm.store import rewinds as rewinds_store
    from akm.store import runs as runs_store
    from akm.store import units as units_store
    from akm.telemetry.journal_spans import UnitFacts, segments

    run = runs_store.require_run(db, run_id)
    evs, _ = events_store.list_events(db, run_id=run_id)
    facts: dict[str, UnitFacts] = {}
    rows = [s.unit for s in rewinds_store.superseded_units(db, run_id)] + units_store.get_units(db, run_id)
    for u in rows:
        facts[u.unit_id] = UnitFacts(u.runner, u.engine, u.model, u.node_id, u.phase, u.result_json)
    try:
        plan = json.loads(run.plan_json)
    except ValueError:
        plan = {}
    trace = trace_of(db, run_id)
    notes = {s.step_id: (s.status, s.notes) for s in runs_store.get_steps(db, run_id)}
    done, still_open = segments(trace, run, evs, facts, plan if isinstance(plan, dict) else {}, notes)
    return trace, done, still_open


def export_ended(
    db: Any, run_id: str, after_event_id: int, settings: TraceSettings, warn: Callable[[str], None]
) -> None:
    """Export the segments of the run that ended after `after_event_id` (what this invocation finished)."""
    from akm.dispatch.otlp_export import export

    try:
        trace, done, _ = _journal(db, run_id)
    except Exception as exc:  # noqa: BLE001 - tracing never fails a run
        warn(f"the trace of run {run_id} could not be read from the journal ({exc}); nothing exported")
        return
    spans = [s for seg in done if seg.end_event_id > after_event_id for s in seg.spans]
    export(settings, trace.trace_id, spans, warn)


def begin(db: Any, run_id: str, cwd: Any = None) -> tuple[TraceSettings, int] | None:
    """Before a call that may end a run (a session report, an abandon): the settings and where the run's
    journal stands, when tracing is on (None: off — nothing more is read)."""
    settings = settings_here(cwd)
    if settings is None:
        return None
    from akm.store import events as events_store

    return settings, events_store.last_event_id(db, run_id)


def finish(db: Any, run_id: str, began: tuple[TraceSettings, int] | None, warn: Callable[[str], None]) -> None:
    """After it: export what it ended (see `begin`); a failure is `warn`ed, never raised."""
    if began is not None:
        export_ended(db, run_id, began[1], began[0], warn)


def trace_export(run_id: str) -> dict[str, Any]:
    """The run's trace as OTLP/JSON (an `ExportTraceServiceRequest`), from the journal: every ended stretch
    of the run (a run still going adds the steps and units finished so far under no root yet)."""
    from akm.api._views import _open_db, _require_run
    from akm.telemetry.otlp import otlp_json, resource

    with _open_db() as db:
        run = _require_run(db, run_id)
        trace, done, still_open = _journal(db, run.id)
    settings = trace_settings(None)
    spans = [s for seg in done for s in seg.spans] + [s for s in still_open if s.end]
    return otlp_json(
        trace.trace_id,
        spans,
        resource(settings.service_name if settings else "akm", settings.resource_attributes if settings else None),
    )
