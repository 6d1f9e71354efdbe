"""The one service surface. The CLI and the MCP server are thin fronts over it.

Every call takes its arguments as keywords or as one request model
(`RunRequest`, `ListRunsRequest`, `StatusRequest`, `RunIdRequest`,
`EventsRequest`, `LintRequest`, `UpgradeRequest`), validates them here — never
in a front — and returns a typed result: a pydantic model, or on the read and
lint paths a plain record (`akm.views`, `akm.format.lint`) that imports no
pydantic (camelCase JSON via `to_json()`). A
front can publish a request model's JSON schema as a tool's input schema.
Anything a user can cause raises an `AkmError` subclass whose message says what
is wrong without naming a front's flags or commands; each front adds its own
hint by error code (`code`, `details`).

No printing here: progress (`UnitFinished`, `StepFinished`) and warnings
(`RunWarning`) go through callbacks, and a `Cancellation` stops a run. The
progress and warning callbacks are called from the engine's worker threads as
well as the calling thread: keep them quick and thread-safe.

Importing this module stays cheap (pydantic and the models below only): the
engine, the store, the format and the plan are imported inside the calls.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from akm import paths
from akm.engine.cancel import Cancellation  # noqa: F401  (an api type: fronts stop runs with it)
from akm.errors import AkmError, NotFoundError, UsageError
from akm.text import quoted, whole_number
from akm.views import (  # noqa: F401  (the read paths' typed results, re-exported)
    DetachedRun,
    EventPage,
    EventView,
    GraphEdge,
    GraphNode,
    LeaseView,
    OpenedRun,
    ProgressEvent,
    RunGraph,
    RunList,
    RunResult,
    RunView,
    RunWarning,
    StepFinished,
    StepStarted,
    StepView,
    UnitFinished,
    UnitView,
    WaitResult,
)

if TYPE_CHECKING:
    from akm.api._models import (  # noqa: F401
        Brief,
        ConfigChange,
        ConfigPaths,
        EventsRequest,
        LintRequest,
        ListRunsRequest,
        ReportResult,
        RunIdRequest,
        RunRequest,
        SetupResult,
        StatusRequest,
        UpgradeRequest,
        UpgradeResult,
    )

# The pydantic models (requests; session, setup and config results) load on first use, so that
# `import akm.api` — and with it `workflow list`, `status` — never imports pydantic.
_MODELS = frozenset(
    {
        "ApiModel",
        "LintRequest",
        "UpgradeRequest",
        "RunRequest",
        "RunToolRequest",
        "ListRunsRequest",
        "RunIdRequest",
        "StatusRequest",
        "StatusToolRequest",
        "Request",
        "ReportRequest",
        "NextRequest",
        "SetupRequest",
        "CatalogRequest",
        "EventsRequest",
        "UpgradeResult",
        "ReportHint",
        "ClaimView",
        "UnitContext",
        "BriefUnit",
        "JudgeBrief",
        "Brief",
        "StepOutcome",
        "ReportResult",
        "SetupResult",
        "ConfigPaths",
        "ConfigChange",
    }
)


def __getattr__(name: str) -> Any:
    if name in _MODELS:
        from akm.api import _models as api_models

        return getattr(api_models, name)
    raise AttributeError(f"module 'akm.api' has no attribute {name!r}")


def _validated(model: str, given: Any, fields: dict[str, Any]) -> Any:
    """The request model `model` validated from `fields` (or `given` when it already is one)."""
    from akm.api import _models as api_models

    return api_models._validated(getattr(api_models, model), given, fields)


def _args(model: str, given: Any, fields: dict[str, Any], checks: dict[str, Callable[[Any], Any]]) -> Any:
    """A call's arguments: the typed request when one is given (pydantic validates it), else `fields`
    checked by the same plain rules the request model applies — so the read paths never import pydantic."""
    if hasattr(type(given), "model_fields"):
        return _validated(model, given, fields)
    out = {}
    for name, value in fields.items():
        check = checks.get(name)
        try:
            out[name] = check(value) if check is not None else value
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{exc}.", code=INVALID_ARGUMENT, details={"argument": name}) from None
    from types import SimpleNamespace

    return SimpleNamespace(**out)


def _of(kind: type, name: str, optional: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise TypeError(f"{name} {value!r}: expected {'nothing or ' if optional else ''}{kind.__name__}")
        return value

    return check


STALE_AFTER_S = 90.0
_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the stable code of a bad argument value, whatever the front


# ------------------------------------------------------------------ arguments


MAX_TIMEOUT_MS = 2_147_483_647  # about 24 days: what a timer can hold everywhere
_DURATION_UNITS = (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000))


def parse_duration_ms(value: str | int) -> int:
    """A positive duration in ms from `500ms`, `30s`, `5m`, `1h` or a bare number of ms (UsageError if not)."""
    try:
        return _duration_ms(value)
    except ValueError as exc:
        raise UsageError(f"{exc}.", code=INVALID_ARGUMENT, details={"argument": "timeout"}) from None


def _duration_ms(value: str | int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"timeout {value!r}: expected a duration like 500ms, 30s or 5m")
    if isinstance(value, int):
        ms = value
    else:
        raw, scale = str(value).strip().lower(), 1
        for suffix, factor in _DURATION_UNITS:
            if raw.endswith(suffix) and raw[: -len(suffix)].isdigit():
                raw, scale = raw[: -len(suffix)], factor
                break
        if not raw.isdigit() or not raw.isascii():
            raise ValueError(f"timeout {value!r}: expected a duration like 500ms, 30s or 5m")
        number = whole_number(raw)
        if number is None:
            raise ValueError(f"timeout {quoted(value)} is too long: at most {MAX_TIMEOUT_MS} ms (about 24 days)")
        ms = number * scale
    if ms <= 0:
        raise ValueError(f"timeout {value!r}: a duration must be longer than zero")
    if ms > MAX_TIMEOUT_MS:
        raise ValueError(f"timeout {value!r} is too long: at most {MAX_TIMEOUT_MS} ms (about 24 days)")
    return ms


def _whole_number(value: Any, name: str, minimum: int, maximum: int | None = None) -> int:
    """An int from an int or its decimal text, within [minimum, maximum]."""
    span = f"from {minimum} to {maximum}" if maximum is not None else f"≥ {minimum}"
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit() and (parsed := whole_number(value)) is not None:
        number = parsed
    else:
        raise ValueError(f"{name} {quoted(value)}: expected a whole number {span}")
    if number < minimum or (maximum is not None and number > maximum):
        raise ValueError(f"{name} {value!r}: expected a whole number {span}")
    return number


def check_output_format(value: str, allowed: tuple[str, ...] = ("text", "json")) -> str:
    """Validate a requested output format against what the command can render."""
    if value not in allowed:
        raise UsageError(
            f"format {value!r}: expected one of {', '.join(allowed)}.",
            code=INVALID_ARGUMENT,
            details={"argument": "format", "allowed": list(allowed)},
        )
    return value


# ------------------------------------------------------------------ lint / upgrade


def lint(paths_: list[str] | LintRequest):
    """Lint files or directories; returns a `LintReport` (see akm.format.lint)."""
    from akm.format.lint import lint_paths

    req = _args("LintRequest", paths_, {"paths": paths_}, {"paths": _path_list})
    report = lint_paths(req.paths)
    if not report.files:
        raise UsageError(
            f"No workflow files found in {', '.join(req.paths)}.",
            code="NO_WORKFLOW_FILES",
            hint="Workflows are *.md files (README.md is skipped); pass a file or a directory holding them.",
        )
    return report


def _path_list(value: Any) -> list[str]:
    """LintRequest's rule for `paths` (a non-empty list of strings), without pydantic."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise TypeError(f"paths {value!r}: expected a list of workflow files or directories")
    if not value:
        raise ValueError("paths: expected at least one workflow file or directory")
    return list(value)


def upgrade(path: str | UpgradeRequest, *, write: bool = False) -> UpgradeResult:
    """Convert a legacy workflow file to the current format (optionally in place)."""
    from akm.format.lint import lint_text
    from akm.format.upgrade import detect_legacy, upgrade_legacy

    req = _validated("UpgradeRequest", path, {"path": path, "write": write})
    path, write = req.path, req.write
    text = _read_workflow_text(Path(path))
    if detect_legacy(text) is None:
        raise UsageError(f"{path} is not in the legacy workflow format; nothing to upgrade.", code="NOT_LEGACY")
    new_text = upgrade_legacy(text)
    report = lint_text(new_text, path)
    errors = [e.model_dump() for e in report.errors]  # a Diagnostic's dump omits its empty fields
    if write:
        if errors:
            raise UsageError(
                f"The upgraded {path} would still have {len(errors)} lint error(s); not written.",
                code="UPGRADE_FAILED",
                details={"errors": errors},
            )
        Path(path).write_text(new_text, encoding="utf-8")
    from akm.api._models import UpgradeResult

    return UpgradeResult(path=path, written=write, text=new_text, ok=not errors, errors=errors)


def _read_workflow_text(path: Path) -> str:
    from akm.text import shown

    where = shown(str(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"Workflow file {where} does not exist.", code="WORKFLOW_NOT_FOUND") from None
    except OSError as exc:
        raise UsageError(f"Cannot read workflow file {where}: {exc.strerror or exc}.", code="UNREADABLE_FILE") from None
    except ValueError as exc:  # an embedded NUL (API callers)
        raise UsageError(f"Cannot read workflow file {where}: {exc}.", code="INVALID_PATH") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where} is not UTF-8 text (byte {exc.start}).", code="UNREADABLE_FILE") from None


# ------------------------------------------------------------------ run models


DEFAULT_EVENT_LIMIT = 100
MAX_EVENT_LIMIT = 10_000


# ------------------------------------------------------------------ helpers


def _open_db(*, read_only: bool = False):
    """The journal. `read_only` (the read commands): when it cannot be opened for writing — a read-only
    directory or mount — it is read as it is instead (`akm.store.db.open_db_read_only`)."""
    from akm.errors import JournalError
    from akm.store import open_db, open_db_read_only

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


def _params_view(run) -> dict[str, Any] | None:
    """The run's params for display; null when the stored record is not a JSON object.

    A damaged row must stay listable (one bad row must not break `workflow list`
    for every run); driving it is refused by `load_run` as CORRUPT_RUN.
    """
    value = _json_or_none(run.params_json) if run.params_json else {}
    return value if isinstance(value, dict) else None


def _run_view(db, run, *, with_steps: bool = True, with_units: bool = False) -> RunView:
    from akm.store import runs as runs_store
    from akm.store import units as units_store

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
        view.steps = []
        tallies = units_store.step_tallies(db, run.id)
        for s in runs_store.get_steps(db, run.id):
            ev = _json_or_none(s.evidence_json)
            output = ev.get("output") if isinstance(ev, dict) else None
            cut = ev.get("truncatedUnits") if isinstance(ev, dict) else None
            status = s.status
            if status == "pending" and lease is not None and s.step_id == run.current_step_id:
                status = "running"  # a live driver holds the run and works on this step right now
            tally = tallies.get(s.step_id)
            view.steps.append(
                StepView(
                    id=s.step_id,
                    status=status,
                    output=output,
                    summary=s.summary,
                    notes=s.notes,
                    unit_count=tally.units if tally else 0,
                    attempts=tally.attempts if tally else 0,
                    gate_loops=tally.gate_loops if tally else 0,
                    truncated_units=len(cut) if isinstance(cut, list) else 0,
                )
            )
            if run.status == "completed" and s.status == "completed" and output is not None:
                view.output, view.output_step_id = output, s.step_id
    if with_units:
        from akm.store.db import now_iso

        # D8: a running unit whose last sign of life (heartbeat, else start) is older than
        # STALE_AFTER_S is stale — its driver is probably gone. The engine heartbeats
        # running units, so a long healthy unit is never reported stale.
        cutoff = now_iso(-STALE_AFTER_S)
        view.units = [
            UnitView(
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
                stale=((u.last_checkin_at or u.started_at) < cutoff)
                if u.status == "running" and u.phase != "gate"
                else None,
            )
            for u in units_store.get_units(db, run.id)
        ]
    return view


def _awaiting(db, run) -> dict[str, Any] | None:
    """The live brief of a run parked for the calling agent (computed from the journal, never stale)."""
    from akm.engine import session

    try:
        return session.brief(db, run.id)
    except AkmError:
        return _object_or_none(run.status_detail_json)


def _require_run(db, run_id: str):
    from akm.store import runs as runs_store

    return runs_store.require_run(db, run_id)


# ------------------------------------------------------------------ resolve targets


def resolve_workflow_file(target: str, cwd: Path) -> tuple[Path, str]:
    """D4: a file path, or `workflows/<name>` looked up in the project then the user library.

    Returns (file, workflow_ref). A path's ref is its real path, so runs of the same
    file from anywhere in the project share one identity.
    """
    from akm.text import require_utf8, shown

    _checked_target(target, "the workflow target")
    candidate = (cwd / target) if not os.path.isabs(target) else Path(target)
    if _is_file(candidate, target):
        # The real path, not `cwd / target`: a relative target joined to an invocation directory
        # whose name is not UTF-8 ("<bad>/../wf.md") would carry that name into the plan.
        real = os.path.realpath(candidate)
        require_utf8(real, "the workflow file's path")
        return Path(real), real
    if target.startswith("workflows/"):
        ref = normalized_ref(target)
        if ref is None:
            raise UsageError(f"Invalid workflow ref {shown(target)}.", code="INVALID_REF")
        name = ref[len("workflows/") :]
        import platformdirs

        roots = [
            paths.project_root(cwd) / ".akm" / "workflows",
            Path(platformdirs.user_data_dir("akm", appauthor=False)) / "workflows",
        ]
        for root in roots:
            f = root / f"{name}.md"
            if _is_file(f, target):
                require_utf8(str(f), "the workflow file's path")
                return f, f"workflows/{name}"
        raise NotFoundError(
            f"Workflow {shown(target)} not found.",
            code="WORKFLOW_NOT_FOUND",
            hint="Looked in " + " and ".join(str(r) for r in roots) + ".",
        )
    raise NotFoundError(
        f"{shown(target)} is not a workflow file, a workflows/<name> ref or a run id.",
        code="WORKFLOW_NOT_FOUND",
    )


# A path or ref longer than this is refused before it reaches the filesystem (PATH_MAX is 4096 on Linux).
MAX_TARGET_CHARS = 4096


def _work_dir(cwd: str | None) -> Path:
    """The directory a call works in: `cwd` (an MCP argument, an api caller's) or the process's. A NUL
    byte, an over-long path or text that is not UTF-8 is INVALID_PATH here, not a ValueError or OSError
    from deep inside path resolution."""
    if not cwd:
        return Path(os.getcwd())
    from akm.text import require_utf8, shown

    require_utf8(cwd, "cwd")
    if "\0" in cwd:
        raise UsageError(f"cwd {shown(cwd)} contains a NUL character, which no path can hold.", code="INVALID_PATH")
    if len(cwd) > MAX_TARGET_CHARS:
        raise UsageError(
            f"cwd is {len(cwd)} characters long, over the {MAX_TARGET_CHARS}-character limit for a path: {shown(cwd)}",
            code="INVALID_PATH",
        )
    return Path(cwd)


def normalized_ref(target: str) -> str | None:
    """`workflows/<name>` with `.` and empty segments and a trailing `.md` dropped (`workflows/./s`,
    `workflows//s.md` and `workflows/s` are one ref, so one identity for `which run`); None when `target`
    is no such ref or names nothing (`workflows/`, a `..` segment)."""
    if not target.startswith("workflows/"):
        return None
    name = target[len("workflows/") :]
    if name.endswith(".md"):
        name = name[:-3]
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "workflows/" + "/".join(parts)


def _checked_target(target: str, what: str) -> None:
    from akm.text import require_utf8, shown

    require_utf8(target, what)
    if len(target) > MAX_TARGET_CHARS:
        raise UsageError(
            f"{what[0].upper() + what[1:]} is {len(target)} characters long, over the "
            f"{MAX_TARGET_CHARS}-character limit for a path or ref: {shown(target)}",
            code="INVALID_PATH",
        )
    if "\0" in target:
        raise UsageError(
            f"{what[0].upper() + what[1:]} {shown(target)} contains a NUL character, which no path can hold.",
            code="INVALID_PATH",
        )


def _is_file(path: Path, target: str) -> bool:
    """`path.is_file()`, but a path the OS cannot even look up is a usage error, not a crash."""
    from akm.text import shown

    try:
        return path.is_file()
    except OSError as exc:  # ENAMETOOLONG (a component over 255 bytes), EACCES on a parent, ...
        raise UsageError(
            f"Cannot look up the workflow {shown(target)}: {exc.strerror or exc}.", code="INVALID_PATH"
        ) from None


def compile_workflow_file(path: Path, *, cwd: Path | None = None):
    """Parse + lint + compile a workflow file to a frozen plan, or raise with every problem listed.

    Engines are frozen from the config of the project `cwd` is in (none read when no config file exists).
    """
    from akm.config import load_config_if_any
    from akm.format.parse import parse_workflow
    from akm.plan.compile import compile_plan

    text = _read_workflow_text(path)
    parsed = parse_workflow(text, str(path))
    if parsed.errors or parsed.document is None:
        lines = [f"{path}:{e.line}: {e.message} [{e.code}]" for e in parsed.errors]
        raise UsageError(
            f"Workflow {path} has {len(parsed.errors)} error(s):\n" + "\n".join(lines),
            code="WORKFLOW_INVALID",
            details={"path": str(path)},
        )
    warnings = [
        RunWarning(
            code="LINT",
            message=f"{path}:{w.line}: {w.message} [{w.code}]",
            details={"path": str(path), "line": w.line, "lintCode": w.code},
        )
        for w in parsed.warnings
    ]
    config = load_config_if_any(cwd)
    return compile_plan(parsed.document, title=path.stem, config=config), warnings


# ------------------------------------------------------------------ run


def run_workflow(
    target: str | RunRequest,
    *,
    param_pairs: list[tuple[str, str | bool]] | None = None,
    params: dict[str, Any] | None = None,
    max_steps: int | str | None = None,
    timeout: int | str | None = None,
    timeout_ms: int | None = None,
    new: bool = False,
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
    threads too; `cancel.trip(reason)` stops the drive (the run stays active).
    """
    from akm.store import events as events_store
    from akm.store import runs as runs_store
    from akm.store.db import now_iso

    req = _args(
        "RunRequest",
        target,
        dict(
            target=target,
            params=params,
            param_flags=param_pairs,
            max_steps=max_steps,
            timeout=timeout if timeout is not None else timeout_ms,
            new=new,
            cwd=cwd,
        ),
        {
            "target": _of(str, "target"),
            "params": _of(dict, "params", True),
            "param_flags": _of(list, "param_flags", True),
            "max_steps": lambda v: None if v is None else _whole_number(v, "max_steps", 0),
            "timeout": lambda v: None if v is None else _duration_ms(v),
            "new": _of(bool, "new"),
            "cwd": _of(str, "cwd", True),
        },
    )
    target, params, param_pairs, max_steps, new = req.target, req.params, req.param_flags, req.max_steps, req.new
    timeout_ms = req.timeout
    runs_store.lease_ttl_s()  # a bad AKM_LEASE_TTL_S is refused before anything is written (INVALID_ENV)
    work_dir = _work_dir(req.cwd).resolve()
    cancel = cancel or Cancellation()
    started_wall = time.monotonic()
    started_at = now_iso()
    db = _open_db()
    run_id: str | None = None
    outcome, reason, error_text, exit_code = "error", None, None, None
    warnings: list[RunWarning] = []

    def warn(w: RunWarning) -> None:  # called from worker threads too; list.append is atomic
        warnings.append(w)
        if on_warning is not None:
            on_warning(w)

    try:
        run_id, started, existing = _open(db, target, params, param_pairs, new, work_dir, warn)
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
                    max_steps=max_steps,
                    cancel=cancel,
                    on_progress=_progress_relay(on_progress),
                    on_warning=lambda message: warn(RunWarning(code="ENGINE", message=message)),
                )
                driven = drive_run(db, run_id, opts)
        finally:
            if timer is not None:
                timer.cancel()
        run = runs_store.get_run(db, run_id)
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
                finished_at=now_iso(),
                outcome=outcome,
                duration_ms=int((time.monotonic() - started_wall) * 1000),
                detail={"runId": run_id, "reason": reason, "error": error_text, "exitCode": exit_code},
                engine=None,
            )
        except Exception:
            pass  # history is advisory; never mask the real outcome
        db.close()


def open_run(
    target: str,
    *,
    param_pairs: list[tuple[str, str | bool]] | None = None,
    params: dict[str, Any] | None = None,
    new: bool = False,
    cwd: str | None = None,
) -> OpenedRun:
    """Find or start the run `target` names, as `run_workflow` would, and drive nothing.

    A front whose driver outlives its call (the MCP server, `workflow run --detach`) opens the run first, so
    it knows the run id before any unit runs and bad input is refused at once, then drives it by id.
    """
    req = _args(
        "RunRequest",
        target,
        dict(target=target, params=params, param_flags=param_pairs, new=new, cwd=cwd),
        {
            "target": _of(str, "target"),
            "params": _of(dict, "params", True),
            "param_flags": _of(list, "param_flags", True),
            "new": _of(bool, "new"),
            "cwd": _of(str, "cwd", True),
        },
    )
    work_dir = _work_dir(req.cwd).resolve()
    warnings: list[RunWarning] = []
    db = _open_db()
    try:
        run_id, started, _existing = _open(
            db, req.target, req.params, req.param_flags, req.new, work_dir, warnings.append
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
    cwd: str | None = None,
) -> DetachedRun:
    """Open the run `target` names (errors are raised here, before anything runs) and start its driver as a
    background process that logs under the data directory; returns at once with the run id.

    A run that is not drivable (completed, failed, blocked, abandoned) gets no driver (`pid` null).
    """
    from akm.api import _detach as detach

    steps = None if max_steps is None else _whole_number(max_steps, "max_steps", 0)
    timeout_ms = None if timeout is None else parse_duration_ms(timeout)
    opened = open_run(target, param_pairs=param_pairs, params=params, new=new, cwd=cwd)
    from akm.store.status import DRIVABLE_STATUSES

    if opened.status not in DRIVABLE_STATUSES:
        return DetachedRun(run_id=opened.run_id, status=opened.status, started=opened.started, warnings=opened.warnings)
    extra = ([f"--max-steps={steps}"] if steps is not None else []) + (
        [f"--timeout={timeout_ms}ms"] if timeout_ms is not None else []
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


def _open(
    db,
    target: str,
    params: dict[str, Any] | None,
    param_pairs: list[Any] | None,
    new: bool,
    work_dir: Path,
    warn: Callable[[RunWarning], None],
) -> tuple[str, bool, Any]:
    """Which run `target` names: an existing run id, the drivable run of the same workflow and params, or a
    new run (created here). Returns (run id, whether it was started now, the existing run for a run id)."""
    from akm.store import runs as runs_store

    started = False
    existing = runs_store.get_run(db, target) if _RUN_ID.match(target) else None
    if existing is not None:
        if param_pairs or params:
            raise UsageError(
                "Params can only be given when starting a run from a workflow, not with a run id.",
                code="PARAMS_ON_EXISTING_RUN",
            )
        if new:
            raise UsageError(
                f"{target} is a run id; a new run starts from a workflow file or ref.", code="NEW_RUN_NEEDS_WORKFLOW"
            )
        run_id = existing.id
    else:
        wf_path, ref = resolve_workflow_file(target, work_dir)
        plan, lint_warnings = compile_workflow_file(wf_path, cwd=work_dir)
        for w in lint_warnings:
            warn(w)
        from akm.format.params import check_params, coerce_params

        schemas = plan.param_schemas or {}
        values = coerce_params(param_pairs, schemas) if param_pairs else check_params(dict(params or {}), schemas)
        scope = paths.scope_key(work_dir)
        active = None if new else runs_store.find_active_run(db, ref, scope, values)
        if active is not None:
            run_id = _continue_active(active, plan, wf_path, warn)
        else:
            from akm.ids import uuid4
            from akm.plan.model import UNIT_HASH_VERSION

            run_id = uuid4()
            try:
                runs_store.create_run(
                    db,
                    run_id=run_id,
                    workflow_ref=ref,
                    workflow_path=str(wf_path),
                    title=plan.title,
                    scope_key=scope,
                    params=values,
                    plan_json=plan.canonical(),
                    plan_hash=plan.plan_hash(),
                    hash_version=UNIT_HASH_VERSION,
                    step_ids=[s.step_id for s in plan.steps],
                    join_identical=not new,
                )
                started = True
            except UsageError as exc:
                # Lost a start race to an identical invocation (same workflow, same params):
                # continue its run rather than start a twin.
                winner = (
                    runs_store.get_run(db, exc.details.get("runId", "")) if exc.code == "RUN_ALREADY_ACTIVE" else None
                )
                if winner is None:
                    raise
                run_id = _continue_active(winner, plan, wf_path, warn)
    return run_id, started, existing


def _progress_relay(on_progress: Callable[[ProgressEvent], None] | None) -> Callable[[Any], None] | None:
    """The engine reports plain dataclasses; fronts get the api's typed events."""
    if on_progress is None:
        return None
    from akm.engine.progress import PassStarted, StepProgress

    def relay(p: Any) -> None:
        if isinstance(p, StepProgress):
            on_progress(StepFinished(run_id=p.run_id, step_id=p.step_id, status=p.status, summary=p.summary))
        elif isinstance(p, PassStarted):
            on_progress(StepStarted(run_id=p.run_id, step_id=p.step_id, total=p.total))
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


def _continue_active(active, plan, wf_path: Path, warn: Callable[[RunWarning], None]) -> str:
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


# ------------------------------------------------------------------ inspect / control


def list_runs(
    request: ListRunsRequest | None = None,
    /,
    *,
    active_only: bool = False,
    ref: str | None = None,
    all_scopes: bool = False,
    cwd: str | None = None,
) -> RunList:
    """Runs of the project of `cwd` (or of every project), newest first.

    `ref` is a workflow file — resolved against `cwd`, like a run target — or a
    `workflows/<name>` ref.
    """
    from akm.store import runs as runs_store

    req = _args(
        "ListRunsRequest",
        request,
        dict(active_only=active_only, ref=ref, all_scopes=all_scopes, cwd=cwd),
        {
            "active_only": _of(bool, "active_only"),
            "ref": _of(str, "ref", True),
            "all_scopes": _of(bool, "all_scopes"),
            "cwd": _of(str, "cwd", True),
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
        scope = None if req.all_scopes else paths.scope_key(work_dir)
        rows = runs_store.list_runs(db, scope_key=scope, active_only=req.active_only, ref=ref)
        return RunList(runs=[_run_view(db, r, with_steps=False) for r in rows])


def run_status(run_id: str | StatusRequest, *, units: bool = False, step: str | None = None) -> RunView:
    """Where a run stands: steps with outputs and tallies, the final artifact, and (`units`) every attempt.

    `step` narrows the view to that step (and, with `units`, its attempts): what a front that clips large
    outputs points at to fetch one whole.
    """
    req = _args(
        "StatusRequest",
        run_id,
        {"run_id": run_id, "units": units, "step": step},
        {"run_id": _of(str, "run_id"), "units": _of(bool, "units"), "step": _of(str, "step", True)},
    )
    with _open_db(read_only=True) as db:
        view = _run_view(db, _require_run(db, req.run_id), with_units=req.units)
    if req.step is not None:
        known = [s.id for s in view.steps or []]
        if req.step not in known:
            raise UsageError(
                f"Run {view.run_id} has no step {req.step!r}; its steps are {', '.join(known)}.",
                code="STEP_NOT_FOUND",
                details={"argument": "step", "steps": known},
            )
        view.steps = [s for s in view.steps or [] if s.id == req.step]
        if view.units is not None:
            view.units = [u for u in view.units if u.step_id == req.step]
    return view


def workflow_catalog(request: Any = None, /, *, cwd: str | None = None):
    """The workflows the project of `cwd` can run by name (`workflows/<name>`): project first, then the
    user library, each with its description, steps and params (name, type, description, required, default)."""
    from akm.catalog import catalog

    req = _args("CatalogRequest", request, {"cwd": cwd}, {"cwd": _of(str, "cwd", True)})
    return catalog(paths.project_root(_work_dir(req.cwd)))


def run_graph(run_id: str | RunIdRequest) -> RunGraph:
    """A run's steps (kind, status) and control flow, from its verified frozen plan."""
    from akm.engine.state import decode_plan
    from akm.plan.flow import flow_edges

    req = _args("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")})
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

    req = _args("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")})
    view = run_status(req.run_id, units=True)
    graph = run_graph(req.run_id)
    with _open_db() as db:
        run = _require_run(db, req.run_id)
        plan = decode_plan(run.id, run.plan_json, run.plan_hash)
    budget = {"maxUnits": plan.budget.max_units, "maxTokens": plan.budget.max_tokens} if plan.budget else None
    evs: list[dict[str, Any]] = []
    since = "@offset:0"
    while True:
        page = events(run_id=req.run_id, since=since, limit=MAX_EVENT_LIMIT)
        evs.extend(e.to_json() for e in page.events)
        if not page.has_more:
            break
        since = f"@offset:{page.next_offset}"
    return render_report(view.to_json(), graph.to_json(), evs, budget)


def resume(run_id: str | RunIdRequest) -> RunView:
    """Reopen a failed or blocked run (its current step becomes pending again)."""
    return _control(
        _args("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")}).run_id, "resume_run"
    )


def abandon(run_id: str | RunIdRequest) -> RunView:
    """Give up on a run, at once and for good: it becomes `abandoned` (final; never resumed).

    No unit of it starts after this returns; a driver working on it stops its
    in-flight units within about a second and exits with RUN_ABANDONED.
    """
    return _control(
        _args("RunIdRequest", run_id, {"run_id": run_id}, {"run_id": _of(str, "run_id")}).run_id, "abandon_run"
    )


def _control(run_id: str, action: str) -> RunView:
    from akm.store import runs as runs_store

    with _open_db() as db:
        _require_run(db, run_id)
        return _run_view(db, getattr(runs_store, action)(db, run_id))


def _iso_timestamp(text: str) -> str:
    """An ISO-8601 time for `--since`, normalised to the journal's fixed-width UTC form."""
    from datetime import datetime, timezone

    from akm.store.db import format_iso

    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"since {text!r}: expected @offset:N (a previous nextOffset) or an ISO time like 2026-11-30T12:00:00Z.",
            code=INVALID_ARGUMENT,
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

    req = _args(
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
                raise UsageError(
                    f"since {quoted(since)}: the offset must be a whole number (a previous nextOffset).",
                    code=INVALID_ARGUMENT,
                    details={"argument": "since"},
                )
            offset = number
        else:
            since_ts = _iso_timestamp(since)
    with _open_db(read_only=True) as db:
        if run_id is not None:
            _require_run(db, run_id)
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


# ------------------------------------------------------------------ the session protocol (D11-D13)


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
        _require_run(db, req.run_id)
        from akm.api._models import Brief

        out = session.brief(db, req.run_id)
    if req.unit_id is not None:
        units = [u for u in out["units"] if req.unit_id in (u["unitId"], u["attemptId"])]
        if not units:
            raise UsageError(
                f"Unit {req.unit_id} is not outstanding in run {req.run_id} (step {out['stepId']}); "
                f"outstanding: {', '.join(u['unitId'] for u in out['units']) or '(none)'}.",
                code="UNKNOWN_UNIT",
                details={"argument": "unit_id"},
            )
        out["units"] = units
    return Brief.model_validate(out)


def _run_project_root(run, cwd: Path) -> Path:
    """The project a run belongs to, for a report: where its `env:` files (redaction) and its judge live.

    Normally the reporter's own project. A report made from elsewhere — an MCP server whose client passed
    `cwd` to `workflow_run`, a shell in another checkout — finds the run's project from its workflow file,
    checked against the run's scope, so secrets are still redacted with the run's own env files.
    """
    root = paths.project_root(cwd)
    if paths.scope_key(root) == run.scope_key or not run.workflow_path:
        return root
    candidate = paths.project_root(Path(run.workflow_path).parent)
    return candidate if paths.scope_key(candidate) == run.scope_key else root


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
        run = _require_run(db, req.run_id)
        root = _run_project_root(run, _work_dir(req.cwd))
        from akm.api._models import ReportResult

        return ReportResult.model_validate(
            session.report(
                db,
                req.run_id,
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


# ------------------------------------------------------------------ setup status


# ================================================================== setup (`akm setup`, MCP `setup`)
# Setup issue: thin wrappers over akm.setup. The wizard (akm/setup/wizard.py) is the CLI's interactive
# front; it calls setup_detect / setup_recommend / setup_verify / setup_save below.


def _setup_result(outcome: Any) -> SetupResult:
    from akm.api._models import SetupResult

    return SetupResult(
        config_path=outcome.config_path,
        written=outcome.written,
        dry_run=outcome.dry_run,
        fields=outcome.fields,
        engines=[a.to_json() for a in outcome.actions],
        defaults=outcome.defaults,
        judge_engine=outcome.judge_engine,
        detected=outcome.detection.to_json() if outcome.detection is not None else None,
        verifications=[v.to_json() for v in outcome.verifications],
        json_schema=outcome.json_schema.to_json() if outcome.json_schema is not None else None,
        warnings=outcome.warnings,
        can_run=outcome.can_run,
        message=outcome.message,
    )


def setup(
    *,
    yes: bool = False,
    config: Any = None,
    from_file: str | None = None,
    probe: bool = False,
    project: bool = False,
    cwd: str | None = None,
    dry_run: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> SetupResult:
    """Non-interactive setup: detect + verify + write engines (`yes`), apply a config blob (`config` object or
    `from_file`), record json_schema support (`probe`). `dry_run` computes everything and writes nothing."""
    from akm.errors import ConfigError
    from akm.setup import core

    if config is not None and from_file is not None:
        raise UsageError("Give the setup config inline or as a file, not both.", code="INVALID_ARGUMENT")
    base = Path(cwd) if cwd else Path.cwd()
    blob = core.read_blob_file(from_file, base) if from_file is not None else config
    if from_file is not None and not isinstance(blob, dict):
        raise ConfigError(
            f"Setup config {from_file} must hold one JSON object at the top.",
            code="INVALID_CONFIG_FILE",
            details={"file": from_file},
        )
    outcome = core.run(
        yes=yes, blob=blob, probe=probe, project=project, cwd=cwd, dry_run=dry_run, on_warning=on_warning
    )
    return _setup_result(outcome)


def setup_preflight(*, cwd: str | None = None) -> None:
    """Raise (ConfigError, file untouched) when the existing config is invalid: setup cannot run on it."""
    from akm.setup import core

    core.preflight(cwd)


def setup_detect(*, cwd: str | None = None):
    """What this machine has (servers, agent CLIs, harness configs, key variable names). Read-only."""
    from akm.setup.detect import detect

    return detect(cwd=Path(cwd) if cwd else None)


def setup_recommend(
    detection: Any, *, cwd: str | None = None, project: bool = False, on_warning: Callable[[str], None] | None = None
):
    """What `--yes` would write given `detection` (verifies the chosen server)."""
    from akm.setup import core

    merged, _ = core.effective_after(core.SetupIntent(judge="keep"), cwd, project)
    return core.recommend(detection, merged, warn=on_warning)


def setup_current(*, cwd: str | None = None) -> dict[str, Any]:
    """The effective config as setup sees it (both layers merged), apiKey values never included."""
    from akm.setup import core

    merged, _ = core.effective_after(core.SetupIntent(judge="keep"), cwd, False)
    return _public_config(merged)


def setup_preview(intent: Any, *, cwd: str | None = None, project: bool = False) -> list[str]:
    """What could run if `intent` were saved (nothing written)."""
    from akm.setup import core

    merged, _ = core.effective_after(intent, cwd, project)
    return core.can_run(merged)


def setup_verify(endpoint: str, model: str, api_key_env: str | None = None):
    """One 1-token chat request against an endpoint (key read from `$api_key_env` for the header only)."""
    from akm.setup.verify import verify_endpoint

    return verify_endpoint(endpoint, model, api_key_env)


def setup_save(
    intent: Any,
    *,
    cwd: str | None = None,
    project: bool = False,
    probe: bool = True,
    on_warning: Callable[[str], None] | None = None,
) -> SetupResult:
    """Write the wizard's choices (one locked atomic save). `probe`: best-effort json_schema probe first."""
    from akm.setup import core

    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        if on_warning is not None:
            on_warning(message)

    core.validate_intent(intent, cwd, project)
    probe_result = None
    merged, planned = core.effective_after(intent, cwd, project)
    if probe and any(a.kind == "llm" and a.action == "added" for a in planned.actions):
        # only an engine setup adds is probed: a user's own engine is never retuned
        probe_result = core.probe_default_llm(merged)
        if probe_result is not None and probe_result.supported is not None:
            intent.json_schema = probe_result.supported
        elif probe_result is not None:
            warn(f"Could not probe engine {probe_result.engine} for json_schema support: {probe_result.reason}")
    target, file_obj, written, applied = core.save(intent, cwd=cwd, project=project)
    merged, _ = core.effective_after(core.SetupIntent(judge="keep"), cwd, project)
    from akm.api._models import SetupResult

    return SetupResult(
        config_path=str(target),
        written=written,
        fields=list(file_obj or {}),
        engines=[a.to_json() for a in applied.actions],
        defaults=dict(merged.get("defaults") or {}),
        judge_engine=(merged.get("workflow") or {}).get("judgeEngine"),
        json_schema=probe_result.to_json() if probe_result is not None else None,
        warnings=warnings,
        can_run=core.can_run(merged),
        message=f"Wrote {target}." if written else f"{target} already says this; nothing was written.",
    )


# ================================================================== config (`akm config …`)
# Engines issue: thin wrappers over akm.config / akm.config_keys. Kept in one section.


def config_paths(*, cwd: str | None = None) -> ConfigPaths:
    """The user and project config paths (works even when a file is broken)."""
    from akm import config as cfg
    from akm.api._models import ConfigPaths

    user, project = cfg.user_config_path(), cfg.project_config_path(cwd)
    return ConfigPaths(
        user=str(user), project=str(project), user_exists=user.is_file(), project_exists=project.is_file()
    )


def _public_config(data: Any) -> Any:
    """Defence in depth: drop any `apiKey` that is not a `${NAME}` reference before showing config."""
    from akm.config import env_ref_name

    if isinstance(data, dict):
        return {k: _public_config(v) for k, v in data.items() if not (k == "apiKey" and env_ref_name(v) is None)}
    if isinstance(data, list):
        return [_public_config(v) for v in data]
    return data


def config_list(*, cwd: str | None = None) -> dict[str, Any]:
    """The effective config: the user file deep-merged under the project file (validated)."""
    from akm import config as cfg

    return _public_config(cfg.load_config(cwd).merged)


def config_get(key: str, *, cwd: str | None = None) -> Any:
    """The effective value at a dotted key, or None when unset."""
    from akm import config as cfg
    from akm.config import keys as config_keys

    config_keys.leaf_kind(key)  # an unknown key is a usage error even when the config is broken
    return _public_config(config_keys.get_value(cfg.load_config(cwd).merged, key))


def config_set(key: str, raw_value: str, *, project: bool = False, cwd: str | None = None) -> ConfigChange:
    """Set a key in the user (or project) file; the string is coerced to the key's type.

    Objects deep-merge into an existing object at that key; arrays replace. The
    whole config must stay valid or nothing is written (ConfigError, exit 78).
    """
    from akm import config as cfg
    from akm.config import keys as config_keys

    value, unset = config_keys.coerce(key, raw_value)
    if unset:
        return config_unset(key, project=project, cwd=cwd)
    new, written = cfg.update_config_file(
        lambda data: config_keys.set_value(data, key, value), project=project, cwd=cwd
    )
    target = cfg.project_config_path(cwd) if project else cfg.user_config_path()
    from akm.api._models import ConfigChange

    return ConfigChange(
        key=key, value=_public_config(config_keys.get_value(new, key)), file=str(target), written=written
    )


def config_unset(key: str, *, project: bool = False, cwd: str | None = None) -> ConfigChange:
    """Remove a key from the user (or project) file; emptied parents are pruned. No file: nothing happens."""
    from akm import config as cfg
    from akm.api._models import ConfigChange
    from akm.config import keys as config_keys

    config_keys.leaf_kind(key)
    target = cfg.project_config_path(cwd) if project else cfg.user_config_path()
    if not target.is_file():
        return ConfigChange(key=key, value=None, file=str(target), written=False)
    _, written = cfg.update_config_file(lambda data: config_keys.unset_value(data, key), project=project, cwd=cwd)
    return ConfigChange(key=key, value=None, file=str(target), written=written)
