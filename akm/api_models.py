"""The api's pydantic models: request models (validated input) and the session, setup and config results.

Imported only by the calls that need them (and by `akm.api` on first attribute
access, see its `__getattr__`), so the read paths never pay for pydantic. The
run views (`RunView`, `RunList`, ...) are plain dataclasses in `akm.views`.
"""

from __future__ import annotations

from typing import Any, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from akm.api import INVALID_ARGUMENT, MAX_EVENT_LIMIT, _duration_ms, _whole_number
from akm.errors import UsageError


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """Every documented key is present; "nothing" is null, never a missing key."""
        return self.model_dump(mode="json", by_alias=True)


class LintRequest(ApiModel):
    paths: list[str] = Field(min_length=1, description="workflow files, or directories holding them")


class UpgradeRequest(ApiModel):
    path: str = Field(description="a legacy workflow file")
    write: bool = Field(False, description="rewrite the file in place (only if the result lints clean)")


class RunRequest(ApiModel):
    """Start or continue a run (see `run_workflow`)."""

    target: str = Field(description="a workflow file, a workflows/<name> ref, or a run id")
    params: dict[str, Any] | None = Field(None, description="typed params (validated against the workflow's)")
    param_flags: list[tuple[str, Union[str, bool]]] | None = Field(
        None, description="raw command-line param flags (name, text or true), coerced by the params' types")
    max_steps: int | None = Field(None, description="finish at most this many steps now (0: start, drive nothing)")
    timeout: Union[int, str, None] = Field(None, description="stop driving after this long: ms, or text like 30s / 5m")
    new: bool = Field(False, description="always start a new run, even if an identical one is active")
    cwd: str | None = Field(None, description="the directory the request is made from (default: the process's)")

    @field_validator("max_steps", mode="before")
    @classmethod
    def _max_steps(cls, value: Any) -> int | None:
        return None if value is None else _whole_number(value, "max_steps", 0)

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> int | None:  # always ms once validated
        return None if value is None else _duration_ms(value)


class ListRunsRequest(ApiModel):
    active_only: bool = Field(False, description="only runs that can still be driven")
    ref: str | None = Field(None, description="only runs of this workflow: a file (relative to cwd) or workflows/<name>")
    all_scopes: bool = Field(False, description="runs of every project, not just cwd's")
    cwd: str | None = Field(None, description="the directory whose project is listed (default: the process's)")


class RunIdRequest(ApiModel):
    run_id: str


class StatusRequest(RunIdRequest):
    units: bool = Field(False, description="include every journaled unit attempt")


class EventsRequest(ApiModel):
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
    """The exact arguments of the report that would record this unit (each front renders it its own way)."""

    run_id: str
    unit_id: str
    expect_step: str | None = None
    status: str = "completed"
    result_kind: str  # json | text | verdict
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
    action: str  # do | claimed | rerun
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
        message = str(cause) if cause is not None else f"{argument}: {problem['msg']}"
        raise UsageError(message + ("" if message.endswith(".") else "."),
                         code=INVALID_ARGUMENT, details={"argument": argument}) from None
