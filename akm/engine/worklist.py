"""The pure work list: which units a step consists of, and their identities.

Shared by the native drive loop and the session protocol so both produce the
same unit graph for the same plan (spec/architecture.md). No clock, no IO, no store: the
inputs are the frozen step, the run params and the outputs of earlier steps.
A problem that concerns the whole step (an `over` that is not a list, a
duplicate fan-out item, an input that does not resolve) is returned as a
`StepFailure` and nothing is dispatched.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from akm.canonical import CanonicalError, canonical_json
from akm.engine.prompt import build_unit_prompt, json_or_null
from akm.engine.scope import resolve
from akm.format.refs import ReferenceResolutionError, ReferenceSyntaxError
from akm.plan.identity import NO_ITEM, UnitHasher, item_unit_id, journal_base_id, solo_unit_id
from akm.plan.model import MapNode, StepPlan, UnitNode
from akm.record import dataclass, field

MAX_FAN_OUT = 10_000


@dataclass
class WorkUnit:
    unit_id: str  # content id, what evidence reports
    base_id: str  # journal id of attempt 0 for this gate loop
    node_id: str
    parent_unit_id: str | None
    index: int
    item: Any  # NO_ITEM for solo units
    template: UnitNode
    runner: str  # "exec" | "llm" | "agent" | "session"
    engine: str | None
    model: str | None
    timeout_ms: int | None
    inputs: list[tuple[str, Any]]
    input_hash: str
    # What the prompt says besides this unit's id and item: one dict shared by every unit of the step.
    prompt_args: dict[str, Any] = field(repr=False, default_factory=dict)
    item_json: str = "null"  # canonical JSON of `item` (computed once, for identity; exec units pass it on)

    @property
    def is_fan_out(self) -> bool:
        return self.item is not NO_ITEM

    @cached_property
    def prompt(self) -> str:
        """Built on demand: exec units never need it, and a large fan-out would pay for every one."""
        fan_out = self.item is not NO_ITEM
        return build_unit_prompt(
            **self.prompt_args,
            unit_id=self.unit_id,
            item=self.item if fan_out else None,
            item_index=self.index if fan_out else None,
        )


@dataclass
class WorkList:
    units: list[WorkUnit]
    is_map: bool
    concurrency: int
    reducer: str
    inputs: list[tuple[str, Any]] = field(default_factory=list)


@dataclass
class StepFailure:
    reason: str


def _describe_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def steps_read(step: StepPlan) -> set[str]:
    """The ids of the earlier steps whose output `step` reads: its inputs, its fan-out's list, its route's input."""
    refs: list[str] = list((step.unit_template.inputs if step.unit_template else None) or [])
    if isinstance(step.root, MapNode):
        refs.append(step.root.over)
    if step.route is not None:
        refs.append(step.route.input)
    out = set()
    for ref in refs:
        parts = ref.split(".")
        if len(parts) >= 2 and parts[0] == "steps":
            out.add(parts[1])
    return out


def runner_for(template: UnitNode, engines: dict[str, dict[str, Any]] | None = None) -> str:
    """exec units always run natively; a unit frozen onto an engine runs on that engine's kind
    (`llm` / `agent`, from the plan's snapshot); anything else waits for the calling agent (D11)."""
    if template.exec is not None:
        return "exec"
    invocation = template.invocation
    snapshot = (engines or {}).get(invocation.engine) if invocation is not None and invocation.engine else None
    if snapshot is not None and snapshot.get("kind") in ("llm", "agent"):
        return str(snapshot["kind"])
    return "session"


def build_work_list(
    step: StepPlan,
    *,
    run_id: str,
    params: dict[str, Any],
    step_outputs: dict[str, Any],
    engines: dict[str, dict[str, Any]] | None = None,
    gate_loop: int = 1,
    gate_feedback: dict[str, Any] | None = None,
    hash_version: int,
) -> WorkList | StepFailure:
    """`hash_version`: the run's (`runs.hash_version`): a run keeps the input hash preimage it was created
    with, so its journaled units stay reusable (akm/plan/identity.py `preimage_version`)."""
    engines = engines or {}
    template = step.unit_template
    if template is None:
        return StepFailure(f'Step "{step.step_id}" has no unit to run.')

    inputs: list[tuple[str, Any]] = []
    for ref in template.inputs or []:
        try:
            inputs.append((ref, resolve(ref, params, step_outputs)))
        except (ReferenceResolutionError, ReferenceSyntaxError) as exc:
            return StepFailure(f'Step "{step.step_id}" declared input "{ref}" failed to resolve: {exc}')

    root = step.root
    if isinstance(root, MapNode):
        fanned = _fan_out_entries(step, root, params, step_outputs)
        if isinstance(fanned, StepFailure):
            return fanned
        entries = fanned
        concurrency, reducer, is_map = root.concurrency, root.reducer, True
    else:
        entries = [(0, NO_ITEM, "null")]
        concurrency, reducer, is_map = 1, "collect", False

    try:
        return _units(
            step,
            template,
            entries,
            run_id=run_id,
            params=params,
            inputs=inputs,
            engines=engines,
            gate_loop=gate_loop,
            gate_feedback=gate_feedback,
            hash_version=hash_version,
            concurrency=concurrency,
            reducer=reducer,
            is_map=is_map,
        )
    except CanonicalError as exc:
        return StepFailure(f'Step "{step.step_id}" cannot identify its units: {exc}.')


def _fan_out_entries(
    step: StepPlan, root: MapNode, params: dict[str, Any], step_outputs: dict[str, Any]
) -> list[tuple[int, Any, str]] | StepFailure:
    """(index, item, canonical key) per item of the step's fan-out list; or why the list cannot be fanned out
    (it does not resolve, is not an array, is too long, holds a null, an unidentifiable or a duplicate item)."""
    try:
        items = resolve(root.over, params, step_outputs)
    except (ReferenceResolutionError, ReferenceSyntaxError) as exc:
        return StepFailure(f'Step "{step.step_id}" fan-out "over" ({root.over}) failed to resolve: {exc}')
    if not isinstance(items, list):
        return StepFailure(
            f'Step "{step.step_id}" fan-out "over" ({root.over}) resolved to {_describe_type(items)}, not an array.'
        )
    if len(items) > MAX_FAN_OUT:
        return StepFailure(f'Step "{step.step_id}" fan-out has {len(items)} items; the limit is {MAX_FAN_OUT}.')
    seen: dict[str, int] = {}
    for i, it in enumerate(items):
        if it is None:
            return StepFailure(f'Step "{step.step_id}" fan-out list has a null item (index {i}).')
        try:
            key = canonical_json(it)
        except CanonicalError as exc:
            return StepFailure(f'Step "{step.step_id}" fan-out item {i} cannot be identified: a value {exc}.')
        if key in seen:
            preview = key if len(key) <= 200 else key[:200] + "…"
            return StepFailure(
                f'Step "{step.step_id}" fan-out list has duplicate items (indices {seen[key]} and {i}): '
                f"{preview}. Unit ids are derived from item content, so items must be distinct."
            )
        seen[key] = i
    return [(i, it, key) for it, (key, i) in zip(items, seen.items(), strict=False)]


def _units(
    step: StepPlan,
    template: UnitNode,
    entries: list[tuple[int, Any, str]],
    *,
    run_id: str,
    params: dict[str, Any],
    inputs: list[tuple[str, Any]],
    engines: dict[str, dict[str, Any]],
    gate_loop: int,
    gate_feedback: dict[str, Any] | None,
    hash_version: int,
    concurrency: int,
    reducer: str,
    is_map: bool,
) -> WorkList:
    """Every unit's record. Per unit only its id, journal id and input hash are computed (a fan-out of
    thousands builds this before its first dispatch); what all units share is computed once."""
    runner = runner_for(template, engines)
    invocation = template.invocation
    engine_name = invocation.engine if invocation else None
    dispatch_snapshot = engines.get(engine_name) if engine_name else None
    timeout_ms = template.exec.timeout_ms if template.exec else (invocation.timeout_ms if invocation else None)

    hasher = UnitHasher(
        template=template,
        params=params,
        inputs=inputs,
        dispatch=dispatch_snapshot,
        gate_feedback=gate_feedback,
        units=len(entries),
        hash_version=hash_version,
    )
    prompt_args = dict(
        run_id=run_id,
        step_id=step.step_id,
        params=params,
        instructions=template.instructions,
        inputs=inputs,
        gate_feedback=gate_feedback,
        schema=template.output_schema,
        params_json=None if runner == "exec" else json_or_null(params),  # exec units hardly read their prompt
    )
    node_id = template.id
    parent_unit_id = f"{step.step_id}.map" if is_map else None
    engine = None if template.exec else engine_name
    model = None if template.exec else (invocation.model if invocation else None)
    unit_hash = hasher.hash
    units: list[WorkUnit] = []
    for index, item, item_json in entries:  # item_json: the item's canonical JSON, computed once
        unit_id = item_unit_id(node_id, item, item_json) if item is not NO_ITEM else solo_unit_id(step.step_id)
        base_id = journal_base_id(unit_id, gate_loop)
        input_hash = unit_hash(item, item_json)
        # Positional, each argument the local of its field's name: keywords cost twice as much per unit.
        units.append(
            WorkUnit(
                unit_id,
                base_id,
                node_id,
                parent_unit_id,
                index,
                item,
                template,
                runner,
                engine,
                model,
                timeout_ms,
                inputs,
                input_hash,
                prompt_args,
                item_json,
            )
        )
    return WorkList(units=units, is_map=is_map, concurrency=concurrency, reducer=reducer, inputs=inputs)
