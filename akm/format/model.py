"""The parsed workflow document: what `parse_workflow` hands to the plan compiler.

These models describe an authored file after validation, still in the file's
own vocabulary (snake_case keys, references as written, durations already in
milliseconds). They hold no config and resolve nothing: engines, models and
defaults are merged later, at freeze. A document only exists when the file had
no errors, so every field here can be trusted by the compiler without
re-checking.

Line numbers are 1-based file lines and exist for diagnostics and for the
plan's `source` spans.

They are plain records (`akm.views.View`: keyword construction that refuses
unknown fields, equality, `model_dump()`), not pydantic models: the parser
builds them from values it already checked, and `akm workflow lint` must not
pay pydantic's import (about a third of a cold zipapp start) to hold them.
"""

from __future__ import annotations

from typing import Any, Literal

from akm.views import View, factory

StepKind = Literal["unit", "map", "route"]

# The only failure reasons `retry.on` accepts (order as documented in spec/workflow-format.md).
RETRYABLE_REASONS: tuple[str, ...] = (
    "timeout",
    "spawn_failed",
    "non_zero_exit",
    "parse_error",
    "cooldown",
    "llm_rate_limit",
    "llm_http_error",
    "llm_bad_response",
    "llm_network_error",
    "llm_content_filter",
    "agent_error",
    "llm_invalid_json",
    "content_policy_reject",
    "unsupported_type",
    "no_change",
    "aborted",
)


class TextBlock(View):
    """Body text, byte-exact except for dropped blank edge lines and CRLF -> LF.

    `start_line`..`end_line` is the untrimmed span: for instructions, the line
    after the `## id` heading to the line before `### gate` (or section end).
    """

    text: str
    start_line: int
    end_line: int


class ExecSpec(View):
    """A command run directly (argv, never a shell). `pass_env` empty = none passed."""

    command: list[str]
    cwd: str | None = None
    pass_env: list[str] = factory(list)
    inherit_env: bool = False


class RetrySpec(View):
    """Re-dispatch a failed unit up to `max` more times while its reason is in `on`."""

    max: int
    on: list[str]


class LlmOptions(View):
    """LLM invocation tuning (only meaningful for LLM engines; merged at freeze)."""

    temperature: float | None = None
    max_tokens: int | None = None
    supports_json_schema: bool | None = None
    extra_params: dict[str, Any] | None = None
    context_length: int | None = None
    enable_thinking: bool | None = None

    def authored(self) -> dict[str, Any]:
        """Only the keys the author wrote (what freeze merges)."""
        return {name: value for name, value in self.model_dump().items() if value is not None}


class UnitBag(View):
    """How one unit is dispatched: `unit:` on a unit step or `map.unit:` on a map step.

    `timeout_set` distinguishes "no timeout written" (False; freeze falls back to
    defaults/engine) from `timeout: none` (True with `timeout_ms=None`: unbounded).
    `env=None` / `isolation=None` / `on_error=None` mean "not written".
    """

    engine: str | None = None
    model: str | None = None
    llm: LlmOptions | None = None
    timeout_set: bool = False
    timeout_ms: int | None = None
    retry: RetrySpec | None = None
    on_error: Literal["fail", "continue"] | None = None
    output: dict[str, Any] | None = None
    env: list[str] | None = None
    isolation: Literal["none", "worktree"] | None = None
    exec: ExecSpec | None = None


class Defaults(View):
    """Document-wide dispatch defaults (`defaults:`); same timeout convention as UnitBag."""

    engine: str | None = None
    model: str | None = None
    timeout_set: bool = False
    timeout_ms: int | None = None
    on_error: Literal["fail", "continue"] | None = None
    llm: LlmOptions | None = None


class Budget(View):
    """Run-lifetime ceilings; at least one is set when the block exists."""

    max_tokens: int | None = None
    max_units: int | None = None
    max_cost: float | None = None  # USD, counted with the engines' prices (config)
    unknown: str | None = None  # refuse (default) | allow: what a ceiling does once a unit's usage is unknown


class MapSpec(View):
    """Fan-out: one unit per item of the array `over` resolves to.

    `concurrency=None` means "not written" (freeze applies the default width).
    """

    over: str
    concurrency: int | None = None
    reducer: Literal["collect", "vote"] = "collect"
    unit: UnitBag | None = None


class RouteBranch(View):
    """`match` is the JS string form of the authored value (`true` -> "true", `1.0` -> "1")."""

    match: str
    step: str


class RouteSpec(View):
    """Pick one later step by the value `input` resolves to; others are skipped."""

    input: str
    when: list[RouteBranch]
    default: str | None = None


class GateSpec(View):
    """Present when the step has a frontmatter `gate:` or a non-empty `### gate` rubric."""

    max_loops: int | None = None


class Step(View):
    """One declared step. Exactly one of unit/map/route semantics, per `kind`.

    A `unit` step may have `unit=None` (a bare `- id: x` uses the defaults).
    `line`..`end_line` is the frontmatter span of the step's mapping;
    `section_line` the line of its `## id` heading (None for a route step
    without a section).
    """

    id: str
    sequence_index: int
    line: int
    end_line: int
    kind: StepKind
    unit: UnitBag | None = None
    map: MapSpec | None = None
    route: RouteSpec | None = None
    inputs: list[str] = factory(list)
    output: dict[str, Any] | None = None
    gate: GateSpec | None = None
    instructions: TextBlock | None = None
    gate_rubric: TextBlock | None = None
    section_line: int | None = None


class WorkflowDocument(View):
    """A workflow file that parsed and passed every lint rule.

    `params` keeps declaration order; `params_declared` tells an absent
    `params:` block from an empty one. `title` is the first `# heading` of the
    preamble, if any. `envelope` keeps the remaining validated asset metadata
    (`type`, `xrefs`, `generated`, ...) verbatim.
    """

    path: str
    title: str | None = None
    description: str | None = None
    tags: list[str] = factory(list)
    when_to_use: str | None = None
    status: Literal["draft", "stable", "deprecated"] | None = None
    updated: str | None = None
    envelope: dict[str, Any] = factory(dict)
    params: dict[str, dict[str, Any]] = factory(dict)
    params_declared: bool = False
    defaults: Defaults | None = None
    budget: Budget | None = None
    steps: list[Step]
    preamble: TextBlock | None = None
    line_count: int

    def step(self, step_id: str) -> Step | None:
        return next((s for s in self.steps if s.id == step_id), None)
