"""The frozen plan: everything a run needs, nothing it must re-read.

A plan is compiled from a workflow document once, at run start, and stored with
the run as canonical JSON plus its SHA-256 (`plan_hash`). The engine executes
only the stored plan, so editing the workflow file or config never changes a
run in flight. The JSON shape (camelCase keys, `irVersion: 3`) is documented in
spec/workflow-format.md; decoding is strict (unknown keys are refused) so a
tampered plan is caught instead of half-understood.

Absent vs null matters in a few places (`timeoutMs: null` means "unbounded",
while a missing optional key means "not declared"). Models therefore drop None
values when dumped, except for the fields listed in `_keep_none`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_serializer
from pydantic.alias_generators import to_camel

from akm.canonical import canonical_json, sha256_hex

IR_VERSION = 3
UNIT_HASH_VERSION = 4

OnError = Literal["fail", "continue"]
Isolation = Literal["none", "worktree"]
Reducer = Literal["collect", "vote"]


class PlanModel(BaseModel):
    """Base: camelCase aliases, strict keys, immutable, None dropped on dump."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )
    _keep_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: Any) -> dict[str, Any]:
        """Drop None, except `_keep_none` fields that were explicitly set (`null` means something there)."""
        data = handler(self)
        keep: set[str] = set()
        for name in self.model_fields_set & self._keep_none:
            keep.add(name)
            keep.add(type(self).model_fields[name].alias or name)
        return {k: v for k, v in data.items() if v is not None or k in keep}


class Source(PlanModel):
    path: str
    start: int
    end: int


class Retry(PlanModel):
    max: int = Field(ge=0, le=100)
    on: list[str] = Field(min_length=1)


class ExecSpec(PlanModel):
    """An argv command run without a shell (spec/workflow-format.md, exec units)."""

    _keep_none = frozenset({"timeout_ms"})
    command: list[str] = Field(min_length=1, max_length=64)
    cwd: str | None = None
    pass_env: list[str] | None = None
    inherit_env: Literal[True] | None = None
    timeout_ms: int | None = Field(default=None, ge=1, le=2_147_483_647)


class Invocation(PlanModel):
    """How a non-exec unit is dispatched. `engine: null` = a session unit (D11).

    `timeoutMs` absent = not declared (the engine's default applies); `null` =
    declared `none` (unbounded).
    """

    _keep_none = frozenset({"engine", "model", "timeout_ms"})
    engine: str | None = None
    model: str | None = None
    timeout_ms: int | None = Field(default=None, ge=1, le=2_147_483_647)
    llm: dict[str, Any] | None = None


class UnitNode(PlanModel):
    kind: Literal["unit"] = "unit"
    id: str
    instructions: str
    templating: Literal["verbatim"] = "verbatim"
    inputs: list[str] | None = None
    invocation: Invocation | None = None
    exec: ExecSpec | None = None
    output_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    retry: Retry | None = None
    on_error: OnError = "fail"
    env: list[str] | None = None
    isolation: Isolation = "none"
    source: Source | None = None

    @property
    def is_exec(self) -> bool:
        return self.exec is not None


class MapNode(PlanModel):
    kind: Literal["map"] = "map"
    id: str
    over: str
    template: UnitNode
    concurrency: int = Field(ge=1, le=64)
    reducer: Reducer = "collect"
    source: Source | None = None


class RoutePlan(PlanModel):
    input: str
    when: dict[str, str]
    default_step_id: str | None = None


class GatePlan(PlanModel):
    _keep_none = frozenset({"judge"})
    kind: Literal["gate"] = "gate"
    id: str
    step_id: str
    criteria: list[str] = Field(default_factory=list)
    max_loops: int = Field(default=1, ge=1, le=100)
    judge: Invocation | None = None


RootNode = Annotated[Union[UnitNode, MapNode], Field(discriminator="kind")]


class StepPlan(PlanModel):
    step_id: str
    title: str
    sequence_index: int
    root: RootNode | None = None
    route: RoutePlan | None = None
    output_schema: dict[str, Any] | None = None
    gate: GatePlan

    @property
    def unit_template(self) -> UnitNode | None:
        """The unit every work item of this step runs (solo root or map template)."""
        if isinstance(self.root, MapNode):
            return self.root.template
        return self.root


class Budget(PlanModel):
    max_tokens: int | None = Field(default=None, ge=1)
    max_units: int | None = Field(default=None, ge=1, le=10_000)


class Execution(PlanModel):
    """Run-wide dispatch settings. `maxConcurrency` absent = use the host limit (D6)."""

    max_concurrency: int | None = Field(default=None, ge=1, le=64)
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)


class Plan(PlanModel):
    ir_version: Literal[3] = IR_VERSION
    title: str
    params: list[str] | None = None
    param_schemas: dict[str, dict[str, Any]] | None = None
    budget: Budget | None = None
    execution: Execution = Field(default_factory=Execution)
    steps: list[StepPlan] = Field(min_length=1, max_length=256)

    def to_json_obj(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def canonical(self) -> str:
        return canonical_json(self.to_json_obj())

    def plan_hash(self) -> str:
        return sha256_hex(self.canonical())

    def step(self, step_id: str) -> StepPlan | None:
        for s in self.steps:
            if s.step_id == step_id:
                return s
        return None
