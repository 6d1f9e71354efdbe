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

This `__init__` is the whole surface: `__all__` lists every public name, and the private modules
behind it each hold one part (`_args` the plain argument rules, a leaf; `_request` a call's arguments from
keywords or a request model; `_views` the journal as run views; `_targets` workflow files and refs;
`_lint`; `_runs` starting, driving and waiting; `_worker` an `akm worker` process; `_inspect` list, status, control, events; `_session` the
session protocol; `_config`; `_setup`; `_models` the pydantic models, loaded on first use; `_detach` the
detached driver process; `_tasks` a front's durable task records). Import names from `akm.api`, never from a private module.

Importing this package stays cheap (no pydantic): the engine, the store, the format and the plan are
imported inside the calls, and of the private modules only `_args` and `_runs` load with it; every other
name is looked up in its module on first use (`_LAZY`), so `workflow run` never loads the session
protocol, setup, config or the run listings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from akm.api._args import (
    INVALID_ARGUMENT,
    MAX_EVENT_LIMIT,
    MAX_TARGET_CHARS,
    MAX_TIMEOUT_MS,
    check_output_format,
    parse_duration_ms,
)
from akm.api._runs import (
    EXIT_AWAITING_SESSION,
    EXIT_MAX_STEPS,
    EXIT_UNDRIVEN,
    EXIT_WAIT_TIMEOUT,
    UNDRIVEN_GRACE_S,
    detach_run,
    exit_status_for,
    open_run,
    run_workflow,
    signal_exit_status,
    wait_exit_status,
    wait_run,
)
from akm.engine.cancel import (
    Cancellation,
)
from akm.views import (
    BudgetPreview,
    DetachedRun,
    EventPage,
    EventView,
    GraphEdge,
    GraphNode,
    LeaseView,
    OpenedRun,
    Page,
    ProgressEvent,
    RewindResult,
    RewindView,
    RunGraph,
    RunList,
    RunPreview,
    RunResult,
    RunView,
    RunWarning,
    StepFinished,
    StepPreview,
    StepStarted,
    StepView,
    UnitActivity,
    UnitFinished,
    UnitView,
    WaitResult,
)

# Where each of the other names lives: loaded on first use, so a command imports only the parts it calls
# (`workflow run` never loads the session protocol, setup, config or the run listings).
_LAZY = {
    "config_get": "akm.api._config",
    "config_list": "akm.api._config",
    "config_paths": "akm.api._config",
    "config_set": "akm.api._config",
    "config_unset": "akm.api._config",
    "DEFAULT_EVENT_LIMIT": "akm.api._inspect",
    "abandon": "akm.api._inspect",
    "describe_workflow": "akm.api._inspect",
    "events": "akm.api._inspect",
    "list_runs": "akm.api._inspect",
    "resume": "akm.api._inspect",
    "rewind": "akm.api._inspect",
    "plan_run": "akm.api._preview",
    "run_graph": "akm.api._inspect",
    "run_report_html": "akm.api._inspect",
    "run_status": "akm.api._inspect",
    "workflow_catalog": "akm.api._inspect",
    "lint": "akm.api._lint",
    "upgrade": "akm.api._lint",
    "default_holder": "akm.api._session",
    "next_brief": "akm.api._session",
    "report_unit": "akm.api._session",
    "setup": "akm.api._setup",
    "setup_current": "akm.api._setup",
    "setup_detect": "akm.api._setup",
    "setup_preflight": "akm.api._setup",
    "setup_preview": "akm.api._setup",
    "setup_recommend": "akm.api._setup",
    "setup_save": "akm.api._setup",
    "setup_verify": "akm.api._setup",
    "compile_workflow_file": "akm.api._targets",
    "normalized_ref": "akm.api._targets",
    "resolve_workflow_file": "akm.api._targets",
    "STALE_AFTER_S": "akm.api._views",
    "TASK_CANCELLED": "akm.api._tasks",
    "TASK_OPENED": "akm.api._tasks",
    "TASK_SETTLED": "akm.api._tasks",
    "TaskRecord": "akm.api._tasks",
    "find_task": "akm.api._tasks",
    "mark_task": "akm.api._tasks",
    "open_task": "akm.api._tasks",
    "WORKER_KINDS": "akm.api._worker",
    "run_worker": "akm.api._worker",
    "trace_export": "akm.api._trace",
    # the rules and types a front checks and builds with, so that a front imports the api alone
    "quoted": "akm.text",
    "dollars": "akm.text",
    "require_utf8": "akm.text",
    "RunArgs": "akm.format.params",
    "split_run_args": "akm.format.params",
    "LintReport": "akm.format.lint",
    "MAX_UNIT_TOKENS": "akm.engine.budget",
    "ENV_NAME_RE": "akm.config",
    "PLATFORMS_WITH_LLM_ENGINE": "akm.config",
    "normalize_chat_endpoint": "akm.config",
    "EngineChoice": "akm.setup.core",
    "SetupIntent": "akm.setup.core",
}

if TYPE_CHECKING:
    from akm.api._config import (
        config_get,
        config_list,
        config_paths,
        config_set,
        config_unset,
    )
    from akm.api._inspect import (
        DEFAULT_EVENT_LIMIT,
        abandon,
        describe_workflow,
        events,
        list_runs,
        resume,
        rewind,
        run_graph,
        run_report_html,
        run_status,
        workflow_catalog,
    )
    from akm.api._lint import (
        lint,
        upgrade,
    )
    from akm.api._models import (
        ApiModel,
        Brief,
        BriefUnit,
        CatalogRequest,
        ClaimView,
        ConfigChange,
        ConfigPaths,
        EventsRequest,
        JudgeBrief,
        LintRequest,
        ListRunsRequest,
        ListRunsToolRequest,
        NextRequest,
        NextToolRequest,
        ReportHint,
        ReportRequest,
        ReportResult,
        ReportToolRequest,
        Request,
        RewindRequest,
        RunIdRequest,
        RunRequest,
        RunToolRequest,
        SetupRequest,
        SetupResult,
        StatusRequest,
        StatusToolRequest,
        StepOutcome,
        UnitContext,
        UpgradeRequest,
        UpgradeResult,
        WaitRequest,
        front_request,
        tool_input_schema,
    )
    from akm.api._preview import (
        plan_run,
    )
    from akm.api._session import (
        default_holder,
        next_brief,
        report_unit,
    )
    from akm.api._setup import (
        setup,
        setup_current,
        setup_detect,
        setup_preflight,
        setup_preview,
        setup_recommend,
        setup_save,
        setup_verify,
    )
    from akm.api._targets import (
        compile_workflow_file,
        normalized_ref,
        resolve_workflow_file,
    )
    from akm.api._tasks import (
        TASK_CANCELLED,
        TASK_OPENED,
        TASK_SETTLED,
        TaskRecord,
        find_task,
        mark_task,
        open_task,
    )
    from akm.api._trace import trace_export
    from akm.api._views import (
        STALE_AFTER_S,
    )
    from akm.api._worker import (
        WORKER_KINDS,
        run_worker,
    )
    from akm.config import ENV_NAME_RE, PLATFORMS_WITH_LLM_ENGINE, normalize_chat_endpoint
    from akm.engine.budget import MAX_UNIT_TOKENS
    from akm.format.lint import LintReport
    from akm.format.params import RunArgs, split_run_args
    from akm.setup.core import EngineChoice, SetupIntent
    from akm.text import dollars, quoted, require_utf8

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
        "ListRunsToolRequest",
        "RunIdRequest",
        "RewindRequest",
        "StatusRequest",
        "StatusToolRequest",
        "Request",
        "ReportRequest",
        "ReportToolRequest",
        "NextRequest",
        "NextToolRequest",
        "SetupRequest",
        "CatalogRequest",
        "EventsRequest",
        "UpgradeResult",
        "WORKER_KINDS",
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
        "WaitRequest",
        "front_request",
        "tool_input_schema",
    }
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # found directly from now on
        return value
    if name in _MODELS:
        from akm.api import _models as api_models

        return getattr(api_models, name)
    raise AttributeError(f"module 'akm.api' has no attribute {name!r}")


__all__ = [
    "ApiModel",
    "Brief",
    "BudgetPreview",
    "BriefUnit",
    "Cancellation",
    "CatalogRequest",
    "ClaimView",
    "ConfigChange",
    "ConfigPaths",
    "DEFAULT_EVENT_LIMIT",
    "DetachedRun",
    "ENV_NAME_RE",
    "EXIT_AWAITING_SESSION",
    "EXIT_MAX_STEPS",
    "EXIT_UNDRIVEN",
    "EXIT_WAIT_TIMEOUT",
    "EngineChoice",
    "EventPage",
    "EventView",
    "EventsRequest",
    "GraphEdge",
    "GraphNode",
    "INVALID_ARGUMENT",
    "JudgeBrief",
    "LeaseView",
    "LintReport",
    "LintRequest",
    "ListRunsRequest",
    "ListRunsToolRequest",
    "MAX_EVENT_LIMIT",
    "MAX_TARGET_CHARS",
    "MAX_TIMEOUT_MS",
    "MAX_UNIT_TOKENS",
    "NextRequest",
    "NextToolRequest",
    "OpenedRun",
    "PLATFORMS_WITH_LLM_ENGINE",
    "Page",
    "ProgressEvent",
    "ReportHint",
    "ReportRequest",
    "ReportResult",
    "ReportToolRequest",
    "Request",
    "RewindRequest",
    "RewindResult",
    "RewindView",
    "RunGraph",
    "RunArgs",
    "RunIdRequest",
    "RunList",
    "RunPreview",
    "RunRequest",
    "RunResult",
    "RunToolRequest",
    "RunView",
    "RunWarning",
    "STALE_AFTER_S",
    "SetupIntent",
    "SetupRequest",
    "SetupResult",
    "StatusRequest",
    "TASK_CANCELLED",
    "TASK_OPENED",
    "TASK_SETTLED",
    "TaskRecord",
    "StatusToolRequest",
    "StepFinished",
    "StepOutcome",
    "StepPreview",
    "StepStarted",
    "StepView",
    "UNDRIVEN_GRACE_S",
    "UnitContext",
    "UnitActivity",
    "UnitFinished",
    "UnitView",
    "UpgradeRequest",
    "UpgradeResult",
    "WORKER_KINDS",
    "WaitRequest",
    "WaitResult",
    "abandon",
    "check_output_format",
    "compile_workflow_file",
    "config_get",
    "config_list",
    "config_paths",
    "config_set",
    "config_unset",
    "default_holder",
    "describe_workflow",
    "dollars",
    "detach_run",
    "events",
    "exit_status_for",
    "find_task",
    "front_request",
    "lint",
    "list_runs",
    "mark_task",
    "next_brief",
    "normalize_chat_endpoint",
    "normalized_ref",
    "open_run",
    "open_task",
    "parse_duration_ms",
    "plan_run",
    "quoted",
    "report_unit",
    "require_utf8",
    "resolve_workflow_file",
    "resume",
    "rewind",
    "run_graph",
    "run_report_html",
    "run_status",
    "run_worker",
    "run_workflow",
    "setup",
    "setup_current",
    "setup_detect",
    "setup_preflight",
    "setup_preview",
    "setup_recommend",
    "setup_save",
    "setup_verify",
    "signal_exit_status",
    "split_run_args",
    "tool_input_schema",
    "trace_export",
    "upgrade",
    "wait_exit_status",
    "wait_run",
    "workflow_catalog",
]
