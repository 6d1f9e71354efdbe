"""Starting and driving runs: `run_workflow`, `open_run` + a driver, `detach_run`, `wait_run`, and the exit
statuses a front maps a run's outcome to.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from akm import paths
from akm.engine.cancel import Cancellation
from akm.errors import AkmError, UsageError
from akm.record import dataclass
from akm.views import (
    DetachedRun,
    OpenedRun,
    ProgressEvent,
    RunResult,
    RunWarning,
    StepFinished,
    StepStarted,
    UnitActivity,
    UnitFinished,
    WaitResult,
)

if TYPE_CHECKING:
    from akm.api._models import (
        RunRequest,
    )
    from akm.plan.model import Plan
    from akm.store.journal import Journal
    from akm.store.runs import Run
from akm.api._args import _RUN_ID, _duration_ms, _of, _whole_number, _work_dir, parse_duration_ms
from akm.api._request import _arguments
from akm.api._run_ids import is_run_reference, resolve_run_id
from akm.api._targets import _is_file, compile_workflow_file, resolve_workflow_file
from akm.api._views import _open_db, _require_run, _run_view


def run_workflow(
    target: str | RunRequest,
    *,
    param_pairs: list[tuple[str, str | bool]] | None = None,
    params: dict[str, Any] | None = None,
    max_steps: int | str | None = None,
    timeout: int | str | None = None,
    timeout_ms: int | None = None,
    new: bool = False,
    from_run: str | None = None,
    workers: bool = False,
    cancel: Cancellation | None = None,
    on_progress: Callable[[ProgressEvent], None] | None = None,
    on_warning: Callable[[RunWarning], None] | None = None,
    cwd: str | None = None,
) -> RunResult:
    """Start or continue a run and drive it as far as it can go in this invocation.

    A workflow target continues the drivable run of the same workflow (ref and
    project) with the same params — after defaults — if there is one, even when
    the file changed since (its frozen plan runs; a `WORKFLOW_CHANGED` warning
    says so); otherwise, or with `new=True`, a new run starts. `param_pairs`
    are raw command-line flags, `params` typed values; `timeout` takes ms or
    text (`30s`), `timeout_ms` ms. `on_progress` gets a `UnitFinished` per
    finished unit attempt and a `StepFinished` per finished step, from worker
    threads too; `cancel.trip(reason)` stops the drive (the run stays active). `workers`: queue the units
    for `akm worker` processes instead of running them here (akm.engine.remote). `from_run`: start a new run
    of the workflow that reuses the completed units of that run whose identity is unchanged (the result's
    steps say per step how many units were reused).
    """
    from akm.store import events as events_store
    from akm.store import runs as runs_store

    req = _arguments(
        "RunRequest",
        target,
        dict(
            target=target,
            params=params,
            param_flags=param_pairs,
            max_steps=max_steps,
            timeout=timeout if timeout is not None else timeout_ms,
            new=new,
            from_run=from_run,
            cwd=cwd,
            workers=workers,
        ),
        {
            "target": _of(str, "target"),
            "params": _of(dict, "params", True),
            "param_flags": _of(list, "param_flags", True),
            "max_steps": lambda v: None if v is None else _whole_number(v, "max_steps", 0),
            "timeout": lambda v: None if v is None else _duration_ms(v),
            "new": _of(bool, "new"),
            "from_run": _of(str, "from_run", True),
            "cwd": _of(str, "cwd", True),
            "workers": _of(bool, "workers"),
        },
    )
    params, param_pairs, new = req.params, req.param_flags, req.new
    run_target: str = req.target
    step_limit: int | None = req.max_steps
    timeout_ms = req.timeout
    runs_store.lease_ttl_s()  # a bad AKM_LEASE_TTL_S is refused before anything is written (INVALID_ENV)
    work_dir = _work_dir(req.cwd).resolve()
    cancel = cancel or Cancellation()
    started_wall = time.monotonic()
    db = _open_db()
    if req.workers:
        # A coordinator's pass uses several connections at once (its queue writes, its reads of finished rows, its
        # lease renewals): opened in the background now, while the workflow compiles and the engine loads. Opened
        # once its run existed, their handshakes competed with the run's first queue writes; and its queue writes and
        # reads of finished rows are parsed and planned on each meanwhile.
        from akm.store import queue

        db.warm(4, queue.coordinator_primers(db))
    try:
        started_at = db.now()  # task-history stamps are the journal's clock (one clock for every host)
    except BaseException:
        db.close()
        raise
    run_id: str | None = None
    outcome, reason, error_text, exit_code = "error", None, None, None
    warnings: list[RunWarning] = []

    def warn(w: RunWarning) -> None:  # called from worker threads too; list.append is atomic
        warnings.append(w)
        if on_warning is not None:
            on_warning(w)

    try:
        run_id, started, existing = _open(
            db,
            run_target,
            params,
            param_pairs,
            new,
            work_dir,
            warn,
            req.from_run,
            drive_here=lambda: _load_engine(db, req.workers),
        )
        tracing = _tracing(db, run_id, started, work_dir)
        timer = None
        if timeout_ms is not None:
            import threading

            timer = threading.Timer(timeout_ms / 1000.0, cancel.trip, args=("timeout",))
            timer.daemon = True
            timer.start()
        try:
            # Units run at the project root whatever directory the command was typed in, so
            # every invocation of one run executes its steps in the same place.
            root = paths.project_root(work_dir)
            if existing is not None and existing.status == "completed":
                # Re-running a finished run: nothing to drive, and no reason to load the engine or its plan.
                from akm.engine.results import DriveResult

                driven = DriveResult(run_id=run_id, done=True)
            else:
                from akm.engine.drive import DriveOptions, drive_run

                opts = DriveOptions(
                    work_dir=root,
                    project_root=root,
                    max_steps=step_limit,
                    cancel=cancel,
                    on_progress=_progress_relay(on_progress),
                    on_warning=lambda message: warn(RunWarning(code="ENGINE", message=message)),
                    workers=req.workers,
                    trace=tracing[0] if tracing else None,
                )
                driven = drive_run(db, run_id, opts)
        finally:
            if timer is not None:
                timer.cancel()
        if tracing is not None:
            from akm.api._trace import export_ended

            export_ended(
                db, run_id, tracing[1], tracing[2], lambda message: warn(RunWarning(code="TELEMETRY", message=message))
            )
        run = runs_store.require_run(db, run_id)  # a run deleted meanwhile is "not found", not a traceback
        result = RunResult(
            run=_run_view(db, run),
            executed=driven.executed,
            steps_processed=driven.steps_processed,
            done=driven.done,
            aborted=driven.aborted,
            timed_out=driven.abort_reason == "timeout",
            abort_reason=driven.abort_reason,
            started=started,
            warnings=[w.message for w in warnings],
        )
        outcome = run.status
        reason = driven.abort_reason
        exit_code = exit_status_for(result)
        return result
    except AkmError as exc:
        outcome, error_text, exit_code = "error", exc.message, exc.exit_status
        reason = exc.code
        raise
    finally:
        try:
            events_store.record_invocation(
                db,
                run_id=run_id,
                started_at=started_at,
                finished_at=db.now(),
                outcome=outcome,
                duration_ms=int((time.monotonic() - started_wall) * 1000),
                detail={"runId": run_id, "reason": reason, "error": error_text, "exitCode": exit_code},
                engine=None,
            )
        except Exception:
            pass  # history is advisory; never mask the real outcome
        db.close()


def _load_engine(db: Journal, workers: bool) -> None:
    """Import what a drive of a new run loads: the engine; on PostgreSQL its one-statement writes; with workers,
    the queue and the coordinator's runner."""
    import akm.engine.drive  # noqa: F401

    if db.backend == "postgres":
        import akm.store.postgres.hotpath  # noqa: F401
    if workers:
        import akm.engine.remote  # noqa: F401
        import akm.store.queue  # noqa: F401


def _tracing(db: Any, run_id: str, started: bool, work_dir: Path) -> tuple[Any, int, Any] | None:
    """(the run's trace, the event its export starts after, the settings) when tracing is configured, else
    None — and then nothing of OpenTelemetry is loaded (spec/telemetry.md)."""
    from akm.api._trace import settings_here

    settings = settings_here(work_dir)
    if settings is None:
        return None
    from akm.api._trace import trace_of
    from akm.store import events as events_store

    return trace_of(db, run_id), 0 if started else events_store.last_event_id(db, run_id), settings


def _valid_traceparent(value: str | None) -> str | None:
    if value is None:
        return None
    from akm.telemetry.context import parse_traceparent, traceparent

    parsed = parse_traceparent(value)
    return traceparent(parsed[0], parsed[1]) if parsed is not None else None


def open_run(
    target: str,
    *,
    param_pairs: list[tuple[str, str | bool]] | None = None,
    params: dict[str, Any] | None = None,
    new: bool = False,
    from_run: str | None = None,
    cwd: str | None = None,
    trace_parent: str | None = None,
) -> OpenedRun:
    """Find or start the run `target` names, as `run_workflow` would, and drive nothing.

    A front whose driver outlives its call (the MCP server, `workflow run --detach`) opens the run first, so
    it knows the run id before any unit runs and bad input is refused at once, then drives it by id.
    `trace_parent`: the caller's W3C `traceparent` (an MCP request's `_meta`): a run started now is its child
    in the caller's trace (ignored when it is not a valid traceparent, as W3C says).
    """
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
    db = _open_db()
    try:
        run_id, started, _existing = _open(
            db, req.target, req.params, req.param_flags, req.new, work_dir, warnings.append, req.from_run, trace_parent
        )
        run = _require_run(db, run_id)
        return OpenedRun(run_id=run_id, status=run.status, started=started, warnings=[w.message for w in warnings])
    finally:
        db.close()


def detach_run(
    target: str,
    *,
    param_pairs: list[tuple[str, str | bool]] | None = None,
    params: dict[str, Any] | None = None,
    max_steps: int | str | None = None,
    timeout: int | str | None = None,
    new: bool = False,
    from_run: str | None = None,
    cwd: str | None = None,
    workers: bool = False,
) -> DetachedRun:
    """Open the run `target` names (errors are raised here, before anything runs) and start its driver as a
    background process that logs under the data directory; returns at once with the run id.

    A run that is not drivable (completed, failed, blocked, abandoned) gets no driver (`pid` null).
    """
    from akm.api import _detach as detach

    steps = None if max_steps is None else _whole_number(max_steps, "max_steps", 0)
    timeout_ms = None if timeout is None else parse_duration_ms(timeout)
    opened = open_run(target, param_pairs=param_pairs, params=params, new=new, from_run=from_run, cwd=cwd)
    from akm.store.status import DRIVABLE_STATUSES

    if opened.status not in DRIVABLE_STATUSES:
        return DetachedRun(run_id=opened.run_id, status=opened.status, started=opened.started, warnings=opened.warnings)
    extra = (
        ([f"--max-steps={steps}"] if steps is not None else [])
        + ([f"--timeout={timeout_ms}ms"] if timeout_ms is not None else [])
        + (["--workers"] if workers else [])
    )
    pid, log = detach.spawn_driver(opened.run_id, cwd=_work_dir(cwd).resolve(), extra=extra)
    return DetachedRun(
        run_id=opened.run_id,
        status=opened.status,
        started=opened.started,
        pid=pid,
        log=str(log),
        warnings=opened.warnings,
    )


# How long `wait_run` lets a run stay active with no live driver before it says so (a driver that was just
# started needs a moment to take the lease; one that died leaves the run active for good).
UNDRIVEN_GRACE_S = 10.0


def wait_run(
    run_id: str,
    *,
    timeout: int | str | None = None,
    cancel: Cancellation | None = None,
    undriven_after_s: float = UNDRIVEN_GRACE_S,
) -> WaitResult:
    """Block until the run is no longer `active` (completed, failed, blocked, awaiting the session, abandoned).

    Polls the journal (every 0.1 s at first, then up to every second): it works whoever drives the run — a
    detached driver, another shell, an MCP server. Gives up when `timeout` (ms or text like `30s`) expires
    (`timed_out`), when `cancel` trips, or when no live driver has held the run's lease for `undriven_after_s`
    seconds (`undriven`: a driver that died leaves the run active until something drives it again).
    """
    from akm.store import runs as runs_store

    timeout_ms = None if timeout is None else parse_duration_ms(timeout)
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
    cancel = cancel or Cancellation()
    db = _open_db()
    try:
        delay, undriven_since = 0.1, None
        import threading

        nap = threading.Event()
        cancel.link(nap)
        try:
            run_id = _require_run(db, run_id).id
            while True:
                run = _require_run(db, run_id)
                if run.status != "active":
                    return WaitResult(run=_run_view(db, run))
                now = time.monotonic()
                if runs_store.read_lease(db, run_id) is None:
                    undriven_since = now if undriven_since is None else undriven_since
                    if now - undriven_since >= undriven_after_s:
                        return WaitResult(run=_run_view(db, run), undriven=True)
                else:
                    undriven_since = None
                if deadline is not None and now >= deadline:
                    return WaitResult(run=_run_view(db, run), timed_out=True)
                if cancel.tripped:
                    return WaitResult(run=_run_view(db, run), timed_out=True)
                step = delay if deadline is None else max(0.0, min(delay, deadline - now))
                nap.wait(step)
                delay = min(1.0, delay * 1.5)
        finally:
            cancel.unlink(nap)
    finally:
        db.close()


# Exit status of `workflow wait` when its --timeout expires with the run still active (GNU timeout's).
EXIT_WAIT_TIMEOUT = 124

# Exit status of `workflow wait` when the run is active but nothing drives it.
EXIT_UNDRIVEN = 5


def wait_exit_status(result: WaitResult) -> int:
    """`workflow run`'s exit status for the state the run reached; 124 on timeout, 5 when nothing drives it."""
    if result.timed_out:
        return EXIT_WAIT_TIMEOUT
    if result.undriven:
        return EXIT_UNDRIVEN
    if result.run.status == "abandoned":
        from akm.errors import EXIT_FAILED

        return EXIT_FAILED
    return exit_status_for(RunResult(run=result.run))


@dataclass
class _Target:
    """What a `workflow run` target resolves to, before anything is written: an existing run (a run id), or
    a workflow (its compiled plan and params) with the drivable run it would continue and the run a new one
    would reuse (`from_run`)."""

    existing: Any = None  # the run a run id names
    wf_path: Path | None = None
    ref: str | None = None
    plan: Any = None
    values: dict[str, Any] | None = None
    scope: str | None = None
    active: Any = None  # the drivable run of the same workflow and params that would be continued
    donor: str | None = None  # `from_run`: the run a new run reuses completed units of


def _resolve(
    db: Any,
    target: str,
    params: dict[str, Any] | None,
    param_pairs: list[Any] | None,
    new: bool,
    work_dir: Path,
    warn: Callable[[RunWarning], None],
    from_run: str | None = None,
    *,
    start_guard: bool = False,
) -> _Target:
    """Which run `target` names, read-only (`db` None: there is no journal yet). `start_guard`: start the
    units' guardian early (a run is about to be driven)."""
    existing = _named_run(db, target, work_dir)
    donor = _donor(db, from_run, existing is not None, warn) if from_run is not None else None
    if existing is not None:
        _refuse_workflow_arguments(target, params, param_pairs, new)
        return _Target(existing=existing)
    wf_path, ref = resolve_workflow_file(target, work_dir)
    plan, lint_warnings = compile_workflow_file(wf_path, cwd=work_dir)
    if start_guard:
        _start_guardian(plan)
    for w in lint_warnings:
        warn(w)
    from akm.format.params import check_params, coerce_params

    schemas = plan.param_schemas or {}
    values = coerce_params(param_pairs, schemas) if param_pairs else check_params(dict(params or {}), schemas)
    from akm.engine.secret_inputs import scrub_run_inputs

    # known secrets never enter the journal as params or in the frozen plan (spec/engine.md "Secrets")
    plan, values, notes = scrub_run_inputs(plan, values, paths.project_root(work_dir))
    for note in notes:
        warn(RunWarning(code="SECRET_REDACTED", message=note))
    scopes = paths.scope_keys(work_dir, portable=db is not None and db.shared)
    active = None if new or donor is not None or db is None else _find_active(db, ref, scopes, values)
    return _Target(None, wf_path, ref, plan, values, scopes[0], active, donor)


def _start_guardian(plan: Plan) -> None:
    """Start the units' guardian when the plan has command units. It is an interpreter of its own that every
    unit's spawn needs: started now, its start-up overlaps the engine's (one core is idle here) instead of the
    units'."""
    if any(s.unit_template is not None and s.unit_template.is_exec for s in plan.steps):
        from akm.dispatch import guard

        guard.token()


def _named_run(db: Journal | None, target: str, work_dir: Path) -> Run | None:
    """The journaled run `target` names — a whole run id, `@last`, or the first characters of a run id that
    no file has as its name — or None (a workflow, or no journal yet)."""
    from akm.store import runs as runs_store

    if db is None:
        return None
    existing = runs_store.get_run(db, target) if _RUN_ID.match(target) else None
    if existing is None and is_run_reference(target) and not _is_file(work_dir / target, target):
        existing = runs_store.get_run(db, resolve_run_id(db, target, work_dir))
    return existing


def _refuse_workflow_arguments(
    target: str, params: dict[str, Any] | None, param_pairs: list[Any] | None, new: bool
) -> None:
    """Params and `new` start a run from a workflow: refused with a run id."""
    from akm.codes import Code

    if param_pairs or params:
        raise UsageError(
            "Params can only be given when starting a run from a workflow, not with a run id.",
            code=Code.PARAMS_ON_EXISTING_RUN,
        )
    if new:
        raise UsageError(
            f"{target} is a run id; a new run starts from a workflow file or ref.", code=Code.NEW_RUN_NEEDS_WORKFLOW
        )


def _open(
    db: Journal,
    target: str,
    params: dict[str, Any] | None,
    param_pairs: list[Any] | None,
    new: bool,
    work_dir: Path,
    warn: Callable[[RunWarning], None],
    from_run: str | None = None,
    trace_parent: str | None = None,
    *,
    drive_here: Callable[[], None] | None = None,
) -> tuple[str, bool, Any]:
    """Which run `target` names: an existing run id, the drivable run of the same workflow and params, or a
    new run (created here; always with `from_run`, reusing that run's completed units). Returns (run id,
    whether it was started now, the existing run for a run id). `drive_here`: this process drives the run
    next, and this loads what the drive needs (`_load_engine`): a new run is created only once it is loaded —
    driven from the moment it exists, not left active and without a driver while Python loads the engine
    (~0.1 s)."""
    from akm.store import runs as runs_store

    t = _resolve(db, target, params, param_pairs, new, work_dir, warn, from_run, start_guard=True)
    if t.existing is not None:
        return t.existing.id, False, t.existing
    assert t.wf_path is not None and t.ref is not None and t.values is not None and t.scope is not None
    if t.active is not None:
        return _continue_active(t.active, t.plan, t.wf_path, warn), False, None
    from akm.canonical import sha256_hex
    from akm.ids import uuid4
    from akm.plan.model import UNIT_HASH_VERSION

    run_id = uuid4()
    plan_json = t.plan.canonical()
    if drive_here is not None:
        drive_here()
    try:
        runs_store.create_run(
            db,
            run_id=run_id,
            workflow_ref=t.ref,
            workflow_path=str(t.wf_path),
            title=t.plan.title,
            scope_key=t.scope,
            params=t.values,
            plan_json=plan_json,
            plan_hash=sha256_hex(plan_json),  # = plan.plan_hash(), without dumping the plan again
            hash_version=UNIT_HASH_VERSION,
            step_ids=[s.step_id for s in t.plan.steps],
            join_identical=not new and t.donor is None,
            reuse_from=t.donor,
            trace_parent=_valid_traceparent(trace_parent),
        )
    except UsageError as exc:
        # Lost a start race to an identical invocation (same workflow, same params):
        # continue its run rather than start a twin.
        winner = runs_store.get_run(db, exc.details.get("runId", "")) if exc.code == "RUN_ALREADY_ACTIVE" else None
        if winner is None:
            raise
        return _continue_active(winner, t.plan, t.wf_path, warn), False, None
    return run_id, True, None


def _donor(db: Any, from_run: str, target_is_run: bool, warn: Callable[[RunWarning], None]) -> str:
    """The run a `from_run` start reuses: it must exist; the target must be a workflow (a new run starts)."""
    from akm.errors import NotFoundError
    from akm.plan.model import UNIT_HASH_VERSION

    if target_is_run:
        from akm.codes import Code

        raise UsageError(
            "from_run starts a new run of a workflow (its edited file): pass the workflow file or "
            "workflows/<name> as the target, not a run id.",
            code=Code.NEW_RUN_NEEDS_WORKFLOW,
            details={"argument": "target", "fromRun": from_run},
        )
    if db is None:  # no journal yet: no run at all
        from akm.codes import Code

        raise NotFoundError(
            f"No workflow run with id {from_run}.", code=Code.RUN_NOT_FOUND, details={"runId": from_run}
        )
    source = _require_run(db, from_run)
    if source.hash_version != UNIT_HASH_VERSION:
        warn(
            RunWarning(
                code="ENGINE",
                message=f"run {source.id} identifies its units the older way (hash version {source.hash_version}); "
                "none of them can be reused by a new run.",
                details={"runId": source.id},
            )
        )
    return str(source.id)


def _find_active(db: Any, ref: str, scopes: tuple[str, ...], values: dict[str, Any]) -> Any:
    """The drivable run to continue: under the project's first key, then its path key (shared journal: runs from before)."""
    from akm.store import runs as runs_store

    for key in scopes:
        active = runs_store.find_active_run(db, ref, key, values)
        if active is not None:
            return active
    return None


def _progress_relay(on_progress: Callable[[ProgressEvent], None] | None) -> Callable[[Any], None] | None:
    """The engine reports plain dataclasses; fronts get the api's typed events."""
    if on_progress is None:
        return None
    from akm.engine.progress import PassStarted, StepProgress
    from akm.engine.progress import UnitActivity as EngineActivity

    def relay(p: Any) -> None:
        if isinstance(p, EngineActivity):
            a = p.activity
            on_progress(
                UnitActivity(
                    run_id=p.run_id,
                    step_id=p.step_id,
                    unit_id=p.unit_id,
                    attempt_id=p.attempt_id,
                    turns=int(a.get("turns") or 0),
                    tool_calls=int(a.get("toolCalls") or 0),
                    tool=a.get("tool"),
                    retries=int(a.get("retries") or 0),
                    retry_status=a.get("retryStatus"),
                    session_id=a.get("sessionId"),
                    elapsed_s=round(p.elapsed_s, 1),
                )
            )
        elif isinstance(p, StepProgress):
            on_progress(StepFinished(run_id=p.run_id, step_id=p.step_id, status=p.status, summary=p.summary))
        elif isinstance(p, PassStarted):
            on_progress(StepStarted(run_id=p.run_id, step_id=p.step_id, total=p.total, width=p.width, note=p.note))
        else:
            on_progress(
                UnitFinished(
                    run_id=p.run_id,
                    step_id=p.step_id,
                    unit_id=p.unit_id,
                    attempt_id=p.attempt_id,
                    ok=p.ok,
                    failure_reason=p.failure_reason,
                    done=p.done,
                    total=p.total,
                )
            )

    return relay


def _continue_active(active: Run, plan: Plan, wf_path: Path, warn: Callable[[RunWarning], None]) -> str:
    """Continue a drivable run of this workflow with these params — with the plan it froze."""
    if active.plan_hash != plan.plan_hash():
        warn(
            RunWarning(
                code="WORKFLOW_CHANGED",
                message=f"{wf_path} (or the engine config) changed since run {active.id} started; continuing that "
                "run with the plan it froze (a new run would use the edited file).",
                details={"runId": active.id, "path": str(wf_path)},
            )
        )
    return active.id


# Exit statuses of `workflow run` (documented in spec/engine.md).
EXIT_AWAITING_SESSION = 3

EXIT_MAX_STEPS = 4


def exit_status_for(result: RunResult) -> int:
    """0 completed; 1 failed, blocked or aborted; 3 awaiting the session; 4 stopped at --max-steps."""
    from akm.errors import EXIT_FAILED, EXIT_OK

    status = result.run.status
    if status == "completed":
        return EXIT_OK
    if status in ("failed", "blocked"):
        return EXIT_FAILED
    if status == "awaiting_session":
        return EXIT_AWAITING_SESSION
    if result.aborted:
        return signal_exit_status(result.abort_reason, EXIT_FAILED)
    return EXIT_MAX_STEPS


def signal_exit_status(reason: str | None, default: int) -> int:
    from akm.errors import EXIT_SIGHUP, EXIT_SIGINT, EXIT_SIGTERM

    return {"sigint": EXIT_SIGINT, "sigterm": EXIT_SIGTERM, "sighup": EXIT_SIGHUP}.get(reason or "", default)
