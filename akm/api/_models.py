"""The api's pydantic models: request models (validated input) and the session, setup and config results.

Imported only by the calls that need them (and by `akm.api` on first attribute
access, see its `__getattr__`), so the read paths never pay for pydantic. The
run views (`RunView`, `RunList`, ...) are plain dataclasses in `akm.views`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from akm.api._args import MAX_EVENT_LIMIT, MAX_PAGE, _duration_ms, _whole_number
from akm.codes import Code
from akm.engine.budget import MAX_UNIT_TOKENS
from akm.errors import UsageError

# A claim holder's name (a report's `holder`): journaled on the unit row and shown in every brief, so bounded
# like the ids it sits beside; a sub-agent's name is a few dozen characters.
MAX_HOLDER_CHARS = 256


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """Every documented key is present; "nothing" is null, never a missing key."""
        return self.model_dump(mode="json", by_alias=True)


# A boolean argument is a JSON boolean: "yes", 1 or "true" are refused, never read as true.
Flag = Annotated[bool, Strict()]


class Request(ApiModel):
    """A call's arguments: the one rule book of every front (the MCP tools' input schemas are generated from
    these models). Unknown arguments are refused (INVALID_ARGUMENT naming them) instead of being dropped;
    every argument may be spelt in snake_case or camelCase (the briefs' `report` hints are camelCase)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class _Paged(Request):
    """A page of a long list: `offset` items skipped, at most `limit` given (the answer's page has the total)."""

    offset: int = Field(0, description="skip this many items of the list (a page's nextOffset)")
    limit: int | None = Field(None, description="at most this many items (1 to 10000; default: all, or a front's page)")

    @field_validator("offset", mode="before")
    @classmethod
    def _offset(cls, value: Any) -> int:
        return _whole_number(value, "offset", 0)

    @field_validator("limit", mode="before")
    @classmethod
    def _limit(cls, value: Any) -> int | None:
        return None if value is None else _whole_number(value, "limit", 1, MAX_PAGE)


class LintRequest(Request):
    paths: list[str] = Field(min_length=1, description="workflow files, or directories holding them")


class UpgradeRequest(Request):
    path: str = Field(description="a legacy workflow file")
    write: Flag = Field(False, description="rewrite the file in place (only if the result lints clean)")


class _RunArgs(Request):
    """What starts or continues a run, as every front takes it (`RunRequest`, `RunToolRequest`)."""

    target: str = Field(
        description="a workflow file, a workflows/<name> ref, or a run id (whole, its first 6+ characters, or @last)"
    )
    params: dict[str, Any] | None = Field(None, description="typed params (validated against the workflow's)")
    max_steps: int | None = Field(None, description="finish at most this many steps now (0: start, drive nothing)")
    timeout: Union[int, str, None] = Field(None, description="stop driving after this long: ms, or text like 30s / 5m")
    new: Flag = Field(False, description="always start a new run, even if an identical one is active")
    from_run: str | None = Field(
        None,
        description="start a new run of the (edited) workflow that reuses every completed unit of this run whose "
        "identity (step definition and inputs) is unchanged: no process, no model call, no tokens for them",
    )
    cwd: str | None = Field(None, description="the directory the request is made from (default: the process's)")
    workers: Flag = Field(
        False,
        description="coordinate only: queue exec, LLM and agent units for worker processes sharing the "
        "journal, and wait for their results",
    )

    @field_validator("max_steps", mode="before")
    @classmethod
    def _max_steps(cls, value: Any) -> int | None:
        return None if value is None else _whole_number(value, "max_steps", 0)

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> int | None:  # always ms once validated
        return None if value is None else _duration_ms(value)


class RunRequest(_RunArgs):
    """Start or continue a run (see `run_workflow`)."""

    param_flags: list[tuple[str, Union[str, bool]]] | None = Field(
        None, description="raw command-line param flags (name, text or true), coerced by the params' types"
    )


class RunToolRequest(_RunArgs):
    """`workflow_run` over MCP: the run is driven in the background and a call only waits for it."""

    timeout: Union[int, str, None] = Field(
        None,
        description="how long this call waits for the run: ms, or text like 30s / 5m (default: the server's "
        "bound); the run keeps going in the background either way",
    )
    stop: Flag = Field(
        False,
        description="stop this server's background driver of the run (target: its run id); "
        "its running units are stopped, the run stays active and resumable",
    )
    plan: Flag = Field(
        False,
        description="preview only, writing nothing: per step the units reused, to run and for you, engines and "
        "models, budgets, and what the run would do first",
    )


class _RunsOf(Request):
    ref: str | None = Field(
        None, description="only runs of this workflow: a file (relative to cwd) or workflows/<name>"
    )


class ListRunsRequest(_Paged, _RunsOf):
    active_only: Flag = Field(False, description="only runs that can still be driven")
    all_scopes: Flag = Field(False, description="runs of every project, not just cwd's")
    cwd: str | None = Field(None, description="the directory whose project is listed (default: the process's)")


class ListRunsToolRequest(_Paged, _RunsOf):
    """`workflow_list` over MCP: this server's project only."""

    active: Flag = Field(False, description="only runs that can still be driven")


class RunIdRequest(Request):
    run_id: str = Field(description="the run id")


class WaitRequest(RunIdRequest):
    """Wait for a run, whoever drives it, to be no longer active (see `wait_run`)."""

    timeout: Union[int, str, None] = Field(
        None,
        description="how long this call waits: ms, or text like 30s / 5m (default: the server's bound); "
        "the run itself is never changed",
    )

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> int | None:  # always ms once validated
        return None if value is None else _duration_ms(value)


class NextRequest(RunIdRequest):
    unit_id: str | None = Field(
        None, description="only this unit, whole (answers clip large prompts and inputs; this fetches one unclipped)"
    )


class NextToolRequest(NextRequest):
    """`workflow_next` over MCP: a unit fetched whole comes with its prompt in pages when it is too large."""

    prompt_offset: int = Field(0, description="with unit_id: its prompt from this character on (a page's nextOffset)")

    @field_validator("prompt_offset", mode="before")
    @classmethod
    def _prompt_offset(cls, value: Any) -> int:
        return _whole_number(value, "prompt_offset", 0)


class RewindRequest(RunIdRequest):
    """Take a run back to a step (see `rewind`)."""

    to_step: str = Field(description="the step to go back to: it and every later step of the run are reopened")
    redo: Union[Flag, list[str]] = Field(
        False,
        description="false (default): units whose identity is unchanged are reused; true: redo every unit of the "
        "reopened steps; a list of unit ids: redo those (the step's session units are always asked for again)",
    )


class StatusRequest(_Paged, RunIdRequest):
    units: Flag = Field(False, description="include every journaled unit attempt (offset/limit page them)")
    step: str | None = Field(
        None, description="only this step, with its output whole (a run's answers clip large outputs)"
    )


class StatusToolRequest(StatusRequest):
    """`workflow_status` over MCP: the run view, and with format html a self-contained report as well."""

    format: Literal["json", "html"] = Field(
        "json", description="html: also the run's self-contained HTML report, as a resource to read (a link)"
    )
    output_offset: int = Field(
        0,
        description="with step: its output from this character on (a page's nextOffset; an output too large "
        "for one answer comes in pages)",
    )

    @field_validator("output_offset", mode="before")
    @classmethod
    def _output_offset(cls, value: Any) -> int:
        return _whole_number(value, "output_offset", 0)


class ReportToolRequest(Request):
    """Record a session unit's result, a claim (status running) or a gate verdict: `unit_report` over MCP
    (the reporter's directory is the server's)."""

    run_id: str = Field(description="the run id")
    unit_id: str = Field(description="the unitId from the brief (or STEP.gate:lN for a verdict)")
    status: Literal["completed", "failed", "running"] = Field(
        "completed", description="completed | failed | running (claims the unit); a verdict is completed"
    )
    result: Any = Field(None, description="the unit's result: a JSON value matching its outputSchema, or text")
    verdict: dict[str, Any] | None = Field(
        None,
        description='a gate verdict {"complete": bool, "missing": [str], "feedback": str} (the CLI reads '
        "it as JSON text)",
    )
    tokens: int | None = Field(None, ge=0, le=MAX_UNIT_TOKENS, description="tokens spent (counted against the budget)")
    failure_reason: str | None = Field(None, description="why the unit failed (e.g. timeout)")
    rerun: Flag = Field(False, description="replace a result already recorded (do the unit again)")
    expect_step: str | None = Field(None, description="refuse unless the run is still on this step")
    attempt_id: str | None = Field(
        None,
        description="the brief's attemptId: the attempt this report answers "
        "(a report for a closed gate loop is never counted for a "
        "later one)",
    )
    gate_loop: int | None = Field(None, description="the gate loop this report answers (the brief's gateLoop)")
    holder: str | None = Field(
        None, description="claim holder (default: the reporter); give parallel sub-agents their own"
    )

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> int | None:
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_UNIT_TOKENS:
            raise ValueError(f"tokens {value!r}: expected a whole number from 0 to {MAX_UNIT_TOKENS}")
        return value

    @field_validator("gate_loop", mode="before")
    @classmethod
    def _gate_loop(cls, value: Any) -> int | None:
        return None if value is None else _whole_number(value, "gate_loop", 1)

    @field_validator("holder")
    @classmethod
    def _holder(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if len(value) > MAX_HOLDER_CHARS:
            raise ValueError(f"holder is {len(value)} characters long, over the limit of {MAX_HOLDER_CHARS}")
        if not value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("holder must be a name: not empty, no control characters")
        return value


class ReportRequest(ReportToolRequest):
    """Record a session unit's result, a claim (status running) or a gate verdict (see `report_unit`)."""

    cwd: str | None = Field(None, description="the directory the report is made from (default: the process's)")


class SetupRequest(Request):
    yes: Flag = Field(
        False,
        description="detect local model servers and agent CLIs, verify them, and write "
        "an llm and an agent engine where no default is set",
    )
    config: dict[str, Any] | None = Field(
        None,
        description="config to deep-merge (engines, defaults, workflow, "
        "modelAliases); API keys only as ${ENV_NAME} "
        "references, never values",
    )
    probe: Flag = Field(
        False, description="also probe the default LLM engine for json_schema support and record supportsJsonSchema"
    )
    project: Flag = Field(False, description="write the project file (.akm/config.json) instead of the user file")


class CatalogRequest(Request):
    cwd: str | None = Field(None, description="the project directory (default: the process's)")


class EventsRequest(Request):
    run_id: str | None = Field(None, description="only events of this run")
    since: str | None = Field(None, description="@offset:N (a previous nextOffset) or an ISO time")
    limit: int | None = Field(None, description="events per page (default 100, 1 to 10000)")

    @field_validator("limit", mode="before")
    @classmethod
    def _limit(cls, value: Any) -> int | None:
        return None if value is None else _whole_number(value, "limit", 1, MAX_EVENT_LIMIT)


class UpgradeResult(ApiModel):
    path: str
    written: bool
    text: str
    ok: bool
    errors: list[dict[str, Any]] = Field(default_factory=list)


class ReportHint(ApiModel):
    """The exact arguments of the report that would record this unit (each front renders it its own way):
    every key is a `unit_report` argument, so a client may pass the object as it is and add the result."""

    run_id: str
    unit_id: str
    attempt_id: str | None = None
    gate_loop: int | None = None
    expect_step: str | None = None
    status: str = "completed"
    rerun: bool = False


class ClaimView(ApiModel):
    holder: str
    expires_at: str


class UnitContext(ApiModel):
    params: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, Any] = Field(default_factory=dict)
    gate_feedback: dict[str, Any] | None = None
    item: Any = None
    item_index: int | None = None


class BriefUnit(ApiModel):
    unit_id: str
    attempt_id: str
    input_hash: str
    action: str  # do | claimed | rerun | do_not_run
    result_kind: str = "text"  # json | text: what `result` is
    env: list[str] = Field(default_factory=list)  # the unit's env: refs by name (env/<name>; never values)
    env_bindings: list[str] = Field(default_factory=list)  # the variable names those refs bind (never values)
    runner: str
    prompt: str
    output_schema: dict[str, Any] | None = None
    context: UnitContext
    claim: ClaimView | None = None
    last_failure: str | None = None
    report: ReportHint


class JudgeBrief(ApiModel):
    unit_id: str
    criteria: list[str]
    artifact: Any = None
    summary: str
    prompt: str
    verdict_schema: dict[str, Any]
    report: ReportHint


class Brief(ApiModel):
    """What the calling agent should do now (kind: units | judge | engine | done | inactive | none)."""

    run_id: str
    status: str
    done: bool
    active: bool
    kind: str
    step_id: str | None = None
    step_title: str | None = None
    instructions: str | None = None
    gate_loop: int | None = None
    max_loops: int | None = None
    gate_feedback: dict[str, Any] | None = None
    units: list[BriefUnit] = Field(default_factory=list)
    unit_count: int = 0
    done_count: int = 0
    judge: JudgeBrief | None = None
    message: str = ""
    warnings: list[str] = Field(default_factory=list)


class StepOutcome(ApiModel):
    kind: str  # completed | failed | blocked | next_loop | awaiting_verdict
    summary: str | None = None
    gate_loop: int | None = None
    missing: list[str] | None = None
    feedback: str | None = None


class ReportResult(ApiModel):
    run_id: str
    step_id: str
    unit_id: str
    attempt_id: str
    status: str
    recorded: str  # written | idempotent | heartbeat
    gate_loop: int
    claim: ClaimView | None = None
    remaining_units: int | None = None
    step_outcome: StepOutcome | None = None
    run_status: str
    message: str = ""
    # The run's new brief when this report changed what the agent must do next in the same step (its units
    # are done and the gate awaits a verdict; the gate sent the step to its next loop): no extra round trip.
    brief: Brief | None = None
    # The report left the run failed or blocked: what moves it on (the run view's `recovery`).
    recovery: dict[str, Any] | None = None


class SetupResult(ApiModel):
    """What `akm setup` did (or, as a preview, would do): the file, the engines, what can run now."""

    shape: str = "setup"
    schema_version: int = 1
    config_path: str
    written: bool
    dry_run: bool = False
    fields: list[str] = Field(default_factory=list)
    engines: list[dict[str, Any]] = Field(default_factory=list)
    defaults: dict[str, Any] = Field(default_factory=dict)
    judge_engine: str | None = None
    detected: dict[str, Any] | None = None
    verifications: list[dict[str, Any]] = Field(default_factory=list)
    json_schema: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list)
    can_run: list[str] = Field(default_factory=list)
    message: str = ""


class ConfigPaths(ApiModel):
    """Where config is read from. `project` is the project layer (it may not exist yet)."""

    user: str
    project: str
    user_exists: bool
    project_exists: bool


class ConfigChange(ApiModel):
    """The result of `config set` / `config unset`: the key, its new value in that file, and whether it was written."""

    key: str
    value: Any = None
    file: str
    written: bool
    # keys the file now holds that akm does not know (kept, but they do nothing), each with a "did you mean"
    warnings: list[str] = Field(default_factory=list)


M = TypeVar("M", bound=ApiModel)


def _validated(model: type[M], given: Any, fields: dict[str, Any]) -> M:
    """`given` when it already is the request model, else the model built (and validated) from `fields`.

    A validation failure is a UsageError naming the argument (details.argument, in the api's
    snake_case name), never a pydantic traceback.
    """
    if isinstance(given, model):
        return given
    try:
        return model(**fields)
    except ValidationError as exc:
        problem = exc.errors()[0]
        argument = ".".join(str(p) for p in problem["loc"]) or model.__name__
        cause = (problem.get("ctx") or {}).get("error")
        if cause is not None:
            message = str(cause)
        else:
            shown = repr(problem.get("input"))
            message = f"{argument}: {problem['msg']}" + (f" (got {shown})" if len(shown) <= 80 else "")
        raise UsageError(
            message + ("" if message.endswith(".") else "."), code=Code.INVALID_ARGUMENT, details={"argument": argument}
        ) from None


R = TypeVar("R", bound=Request)


def front_request(model: type[R], arguments: dict[str, Any], *, call: str = "") -> R:
    """A front's raw arguments as the request `model` (a tool's one contract), validated.

    Each argument may be spelt as the field name or its camelCase alias, once. An unknown or doubly given
    argument, or a value the model refuses, is INVALID_ARGUMENT naming the argument (with the nearest known
    spelling for an unknown one) — never dropped, never coerced.
    """
    import difflib

    spelled: dict[str, str] = {}
    for name, info in model.model_fields.items():
        spelled[name] = name
        if info.alias and info.alias != name:
            spelled[info.alias] = name
    names = sorted(model.model_fields)
    given: dict[str, Any] = {}
    where = f" of {call}" if call else ""
    for key, value in arguments.items():
        field = spelled.get(key)
        if field is None:
            near = difflib.get_close_matches(key, list(spelled), n=1, cutoff=0.6)
            hint = f" (did you mean {spelled[near[0]]}?)" if near else ""
            raise UsageError(
                f"Unknown argument {key!r}{where}{hint}; its arguments are {', '.join(names)}.",
                code=Code.INVALID_ARGUMENT,
                details={"argument": key, "arguments": names},
            )
        if field in given:
            raise UsageError(
                f"Argument {field}{where} is given twice ({key!r} too).",
                code=Code.INVALID_ARGUMENT,
                details={"argument": key},
            )
        given[field] = value
    return _validated(model, None, given)


def tool_input_schema(model: type[Request]) -> dict[str, Any]:
    """The JSON schema of a front's arguments, generated from its request `model`: snake_case names (the
    camelCase aliases are accepted too), `additionalProperties: false`, no titles."""
    schema = model.model_json_schema(by_alias=False)
    props: dict[str, Any] = schema.get("properties", {})
    for prop in props.values():
        prop.pop("title", None)
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if schema.get("required"):
        out["required"] = list(schema["required"])
    if "$defs" in schema:
        out["$defs"] = schema["$defs"]
    return out
