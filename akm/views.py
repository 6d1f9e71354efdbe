"""The api's typed results on the read paths: small typed records, cheap to import.

`workflow list`, `workflow status` and a re-run of a finished run must start
about as fast as the interpreter itself, so the types they return import
nothing beyond the standard library — no pydantic, and not even `dataclasses`
(creating a dataclass compiles its methods at import time, about half a
millisecond per class). A view declares its fields as annotations with
defaults, like a dataclass; `View` gives it a keyword constructor, equality
and a repr. Every view serialises to the documented camelCase JSON with
`to_json()` — every documented key present, "nothing" as null — and
`model_dump()` gives the snake_case dict. The MCP front derives pydantic
schemas from `fields_of(cls)` for its tools' output schemas.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Union


def to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class _Factory:
    """A default made fresh for every instance (`factory(list)`), like dataclasses' default_factory."""

    __slots__ = ("make",)

    def __init__(self, make: Any) -> None:
        self.make = make


def factory(make: Any) -> Any:
    return _Factory(make)


REQUIRED: Any = object()


def _json(value: Any, camel: bool) -> Any:
    if isinstance(value, View):
        return value._dump(camel)
    if isinstance(value, dict):
        return {k: _json(v, camel) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v, camel) for v in value]
    return value


class View:
    """Base of the api's result records: keyword construction, equality, JSON out in camelCase."""

    _fields: ClassVar[tuple[tuple[str, str, Any], ...]] = ()  # (name, camelName, default or REQUIRED)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        seen: dict[str, tuple[str, str, Any]] = {}
        for klass in reversed(cls.__mro__):
            for name, hint in vars(klass).get("__annotations__", {}).items():
                if name.startswith("_") or "ClassVar" in str(hint):
                    continue
                seen[name] = (name, to_camel(name), vars(klass).get(name, REQUIRED))
        cls._fields = tuple(seen.values())

    def __init__(self, **values: Any) -> None:
        for name, _, default in self._fields:
            if name in values:
                value = values.pop(name)
            elif default is REQUIRED:
                raise TypeError(f"{type(self).__name__}: missing required field {name!r}")
            else:
                value = default.make() if isinstance(default, _Factory) else default
            setattr(self, name, value)
        if values:
            raise TypeError(f"{type(self).__name__}: unknown field(s) {', '.join(sorted(values))}")

    def _dump(self, camel: bool) -> dict[str, Any]:
        return {(key if camel else name): _json(getattr(self, name), camel) for name, key, _ in self._fields}

    def to_json(self) -> dict[str, Any]:
        """Every documented key is present; "nothing" is null, never a missing key."""
        return self._dump(True)

    def model_dump(self) -> dict[str, Any]:
        return self._dump(False)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._dump(False) == other._dump(False)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name, _, _ in self._fields)
        return f"{type(self).__name__}({inner})"


def fields_of(cls: type[View]) -> list[tuple[str, Any]]:
    """(name, default) of a view's fields in order; a default is REQUIRED, a value, or a `_Factory`."""
    return [(name, default) for name, _, default in cls._fields]


class StepView(View):
    id: str
    status: str
    output: Any = None
    summary: str | None = None
    notes: str | None = None
    unit_count: int = 0  # logical units journaled for the step (a retry is not another unit)
    attempts: int = 0  # dispatches: retries, gate loops and re-runs after a crash included
    gate_loops: int = 0  # gate loops run (1 unless the step looped)
    truncated_units: int = 0  # units whose stdout was cut at the capture cap: the output is only a beginning
    # where the step's units go and why, as the plan froze it (akm.plan.engines.step_routes): "engine coder
    # (agent, defaults.agentEngine)", "the calling agent: the step needs a workspace and tools, …"
    runs_on: str | None = None
    reused_units: int = 0  # units restored from an earlier identical one (a rewind's history, a `--from` run)


class UnitView(View):
    unit_id: str
    step_id: str | None
    status: str
    attempts: int
    phase: str = "unit"  # "unit" (a dispatch) or "gate" (a gate's judge row: counted as no unit anywhere)
    failure_reason: str | None = None
    result: Any = None
    tokens: int | None = None
    runner: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    last_checkin_at: str | None = None
    stale: bool | None = None
    worktree_path: str | None = None
    truncated: bool = False  # the output was cut at the capture cap; `result` is its beginning
    host: str | None = None  # the host id the attempt ran on: the driver's, or the worker's that claimed it
    engine: str | None = None  # the engine that ran it (None: the calling agent, or an exec unit)
    session_id: str | None = None  # the agent CLI's own session id (resume it there), once the CLI said it
    superseded_by: str | None = None  # the rewind that superseded this row (kept as history, no longer in force)
    reused_from: dict[str, Any] | None = None  # restored, not run: {runId, unitId, rewindId?} of its source row
    cost: float | None = None  # USD: its usage times its engine's prices (null: unknown, or no model call)


class SpendView(View):
    """What a run has spent over its life (rewound attempts included) against its budget's ceilings."""

    units: int = 0  # dispatches
    tokens: int = 0  # tokens reported
    cost: float = 0.0  # USD of the attempts whose cost is known
    unknown_units: int = 0  # engine attempts that reported no usage (or whose engine has no prices)
    max_units: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    unknown: str = "refuse"  # budget.unknown: what a ceiling does once usage is unknown (refuse | allow)
    text: str = ""  # in words: "$0.0440 of $0.05", "≥ $0.0440, 2 units unknown"


class LeaseView(View):
    holder: str
    host: str | None = None
    pid: int | None = None
    until: str


class RewindView(View):
    """A rewind of a run (spec/engine.md "Rewind and reuse"): what it reopened and the step rows it superseded."""

    rewind_id: str
    seq: int
    to_step: str
    redo: Any = None  # null (units whose identity is unchanged are reused), true (none), or the unit ids redone
    from_status: str
    from_step: str | None = None
    created_at: str
    steps: list[StepView] = factory(list)  # the reopened steps as they were before it (pending ones left out)


class Page(View):
    """Where one page of a long list stands: its first item's `offset`, the `limit` asked for, the `total` of
    the list, and the `next_offset` to ask for the rest (None: this page is the last)."""

    offset: int = 0
    limit: int | None = None
    total: int = 0
    next_offset: int | None = None


def page_of(items: list[Any], offset: int, limit: int | None) -> tuple[list[Any], Page | None]:
    """`items[offset:offset + limit]` and the `Page` that says so — None when that is the whole list."""
    end = len(items) if limit is None else min(len(items), offset + limit)
    if offset == 0 and end == len(items):
        return items, None
    shown = items[offset:end]
    return shown, Page(offset=offset, limit=limit, total=len(items), next_offset=end if end < len(items) else None)


class RunView(View):
    run_id: str
    status: str
    workflow: str
    title: str
    plan_hash: str
    current_step_id: str | None = None
    created_at: str
    updated_at: str
    completed_at: str | None = None
    params: dict[str, Any] | None = factory(dict)  # null: the stored record is damaged
    steps: list[StepView] | None = None
    units: list[UnitView] | None = None
    engine_lease: LeaseView | None = None
    awaiting: dict[str, Any] | None = None
    # The run's final artifact: once completed, the output of its last completed step that has one.
    output: Any = None
    output_step_id: str | None = None
    rewinds: list[RewindView] | None = None  # the run's rewinds, oldest first (with the steps)
    # A failed, blocked or abandoned run: what moves it on, {action: resume | rewind | new_run, stepId, redo,
    # then: run | judge, why} (akm/engine/recovery.py); null for any other run.
    recovery: dict[str, Any] | None = None
    units_page: Page | None = None  # `units` is one page of the run's unit attempts (None: all of them)
    spend: SpendView | None = None  # units, tokens and dollars spent, against the budget (status only)


class RewindResult(View):
    """What `workflow rewind` did, and the run after it."""

    rewind: RewindView
    steps: list[str] = factory(list)  # the steps it reopened, in plan order
    superseded_units: int = 0  # unit and gate rows it moved to the history
    reusable_units: int = 0  # of those, completed units the engine restores when it meets them unchanged
    run: RunView


class StepPreview(View):
    """One step of a `--plan` preview: who would do its work and how much of it is already there."""

    id: str
    kind: str  # unit | map | route
    # completed / skipped (journaled), reused (every unit restored, nothing runs), completes (nothing left but
    # finishing it), to_do (units to run or to ask for), to_judge (its gate needs a verdict), unknown (it reads
    # an output not produced yet), fails / blocked (what the run would stop at), not_reached (after that)
    status: str
    runner: str | None = None  # exec | llm | agent | session (the calling agent)
    engine: str | None = None
    model: str | None = None
    judge: str | None = None  # the gate's judge engine, "agent" (the calling agent), or null (no gate)
    units: int | None = None  # null: not known until the steps it reads have run
    done: int = 0  # already journaled in this run
    reused: int = 0  # restored from a rewind's history or the `--from` run: nothing runs for them
    to_run: int = 0  # akm would run them (exec, llm, agent)
    for_agent: int = 0  # the calling agent would be asked for them
    runs_on: str | None = None  # where its units go and why, as the plan froze it ("engine coder (agent, …)")
    note: str | None = None


class BudgetPreview(View):
    max_units: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None  # USD (budget.max_cost)
    daily_cost_limit: float | None = None  # USD the project's runs may spend per UTC day (config limits)
    used_units: int = 0  # dispatches the run has made so far (its whole life, rewound ones included)
    used_tokens: int = 0
    used_cost: float = 0.0  # USD the run has spent so far (attempts whose cost is known)
    unknown_units: int = 0  # attempts whose usage is unknown
    spent_today: float | None = None  # USD the project's runs spent today (UTC), with a daily limit
    to_run: int = 0  # dispatches the known steps would add (retries, gate loops and unknown steps not counted)


class RunPreview(View):
    """`workflow run … --plan`: what the run would do, computed without writing anything anywhere."""

    run_id: str | None = None  # the run it would continue; null: it would start a new run
    from_run: str | None = None  # the run a new run would reuse completed units of
    workflow: str
    title: str
    plan_hash: str
    params: dict[str, Any] = factory(dict)
    status: str | None = None  # the continued run's status
    steps: list[StepPreview] = factory(list)
    reused: int = 0
    to_run: int = 0
    for_agent: int = 0
    budget: BudgetPreview
    first: str  # what the run would do first, in words
    warnings: list[str] = factory(list)


class StepCount(View):
    """How far a background driver got in one step: units finished (ok or failed) of the units it dispatched."""

    step_id: str
    done: int = 0
    total: int = 0
    failed: int = 0
    status: str | None = None  # the step's final status once the driver finished it


class RunResult(View):
    run: RunView
    executed: list[dict[str, Any]] = factory(list)
    steps_processed: int = 0
    done: bool = False
    aborted: bool = False
    timed_out: bool = False
    abort_reason: str | None = None
    started: bool = False
    warnings: list[str] = factory(list)
    # Set by long-lived fronts whose driver outlives the call (the MCP server): a driver is still working on
    # the run after this answer, and how far it got in each step it reached.
    driving: bool = False
    progress: list[StepCount] | None = None


class OpenedRun(View):
    """The run a `workflow run` target names, found or started (see `api.open_run`); nothing driven yet."""

    run_id: str
    status: str
    started: bool = False
    warnings: list[str] = factory(list)


class DetachedRun(View):
    """A run whose driver was started in the background (`workflow run --detach`)."""

    run_id: str
    status: str
    started: bool = False  # the run was started by this call (not continued)
    pid: int | None = None  # the detached driver's process; null when the run needed no driving
    log: str | None = None  # the driver's log file
    warnings: list[str] = factory(list)


class WaitResult(View):
    """What `wait_run` saw: the run once it was no longer active, or when the wait gave up."""

    run: RunView
    timed_out: bool = False  # the wait's timeout expired with the run still active
    undriven: bool = False  # the run is active but no live driver has held its lease for a while


# What a `RunWarning` can say: not errors, so not `akm.codes.Code` members (a front advises on each).
WarningCode = Literal["WORKFLOW_CHANGED", "LINT", "CONFIG_KEY", "ENGINE", "SECRET_REDACTED", "TELEMETRY"]


class RunWarning(View):
    """Something a user must know about a run that is not an error (handed to `on_warning` as it happens).

    `code` lets each front add its own advice: `WORKFLOW_CHANGED` (details:
    `runId`, `path`) — the file was edited since the continued run froze its
    plan; `LINT` (details: `path`, `line`, `lintCode`) — a lint warning of the
    workflow file; `CONFIG_KEY` (details: `file`) — a config key akm does not know (kept, but it does
    nothing), with the key it most likely means; `ENGINE` — anything the driver reports while it runs;
    `TELEMETRY` — the run's trace could not be exported (spans dropped);
    `SECRET_REDACTED` — a param or the workflow held the value of a known secret, stored and run as
    `[REDACTED]` (spec/engine.md "Secrets").
    """

    code: WarningCode
    message: str
    details: dict[str, Any] = factory(dict)


class UnitFinished(View):
    """Progress: one dispatched unit attempt finished (called from the worker thread that ran it)."""

    kind: Literal["unit"] = "unit"
    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    ok: bool
    failure_reason: str | None = None
    done: int  # units of this step finished so far in this invocation
    total: int  # units of this step dispatched in this invocation


class UnitActivity(View):
    """Progress: a running agent unit's CLI did something — a turn, a tool call, a retry of its model API —
    as its own output stream said (called from the thread running the unit, as it happens)."""

    kind: Literal["unit_activity"] = "unit_activity"
    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    turns: int = 0
    tool_calls: int = 0
    tool: str | None = None  # the last tool it called
    retries: int = 0  # failed model calls it retried
    retry_status: int | None = None  # the HTTP status of the last one
    session_id: str | None = None  # the CLI's own session id, once it said it
    elapsed_s: float = 0.0


class StepStarted(View):
    """Progress: the driver starts dispatching `total` units of a step (its units, or a gate loop's re-dos)."""

    kind: Literal["step_started"] = "step_started"
    run_id: str
    step_id: str
    total: int
    width: int | None = None  # units at once (akm.engine.concurrency)
    note: str | None = None  # why fewer than the step declares (a loopback engine's default of 1, …)


class StepFinished(View):
    """Progress: a step reached its final status (completed, failed or skipped) in this invocation."""

    kind: Literal["step"] = "step"
    run_id: str
    step_id: str
    status: str
    summary: str | None = None


class GraphNode(View):
    id: str
    kind: Literal["unit", "map", "route"]
    status: str


class GraphEdge(View):
    source: str
    target: str
    label: str | None = None  # a route branch's match value, or "default"
    certain: bool = True  # False: the target runs only when a route selects it


class RunGraph(View):
    """A run's steps and control flow (route targets are alternatives, drawn as branches)."""

    run_id: str
    nodes: list[GraphNode]
    edges: list[GraphEdge]


class RunList(View):
    runs: list[RunView]
    page: Page | None = None  # `runs` is one page of them (None: all of them)


class CatalogParam(View):
    """One param a workflow takes. `required`: it declares no default (a run without it has no value)."""

    name: str
    type: str | None = None
    description: str | None = None
    required: bool = False
    default: Any = None


class CatalogStep(View):
    id: str
    kind: str  # unit | map | route
    gated: bool = False


class CatalogEntry(View):
    """A workflow a project can run: `workflow_run(target=ref, params=...)`."""

    ref: str  # workflows/<name>
    path: str
    source: str  # project | user (a `workflows/<name>`), or file (`describe_workflow` of a file path)
    title: str | None = None
    description: str | None = None
    when_to_use: str | None = None
    steps: list[CatalogStep] = factory(list)
    params: list[CatalogParam] = factory(list)
    problems: list[str] = factory(list)  # lint errors: the workflow cannot run until they are fixed


class Catalog(View):
    workflows: list[CatalogEntry]
    roots: list[str] = factory(list)  # where it looked, in lookup order (the project shadows the user library)


class EventView(View):
    id: int
    ts: str
    event_type: str
    run_id: str | None = None
    metadata: dict[str, Any] = factory(dict)


class EventPage(View):
    run: str | None = None
    since_offset: int
    next_offset: int
    has_more: bool = False  # more events are waiting after next_offset (the page was full)
    events: list[EventView]


ProgressEvent = Union[UnitFinished, StepFinished, StepStarted, UnitActivity]
