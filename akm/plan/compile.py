"""Compile a parsed workflow document into a frozen plan.

Compilation is pure: the same document (and config) always gives the same plan
and therefore the same `plan_hash`. Everything a run will need is decided here
— exec specs with their effective timeouts, map widths, retry and error
policies, schemas, gate criteria — so the engine never re-reads the file.

Engine selection for model/agent units is frozen as an `invocation` naming the
engine that will run it (akm.plan.engines), with the resolved model and
timeout; the engines used are snapshotted into `execution.engines` and the
gate judge into each gated step's `gate.judge`. A unit without an engine is a
session unit (D11). Exec-only workflows freeze exactly the same with or
without config (only `workflow.maxConcurrency` / `defaultMapConcurrency` apply).
"""

from __future__ import annotations

from typing import Any

from akm.format.model import Defaults, Step, UnitBag, WorkflowDocument
from akm.plan.engines import EngineFreezer, tool_need
from akm.plan.model import (
    Budget,
    ExecSpec,
    Execution,
    GatePlan,
    MapNode,
    Plan,
    Retry,
    RoutePlan,
    Source,
    StepPlan,
    UnitNode,
)

DEFAULT_EXEC_TIMEOUT_MS = 600_000
DEFAULT_MAP_CONCURRENCY = 4


def _timeout(bag: UnitBag | None, defaults: Defaults | None, fallback: int | None) -> int | None:
    """The first layer that states a timeout wins (unit, then defaults); `none` is null."""
    if bag is not None and bag.timeout_set:
        return bag.timeout_ms
    if defaults is not None and defaults.timeout_set:
        return defaults.timeout_ms
    return fallback


def _merge_llm(defaults: Defaults | None, bag: UnitBag | None) -> dict[str, Any] | None:
    merged: dict[str, Any] = {}
    for layer in (defaults.llm if defaults else None, bag.llm if bag else None):
        if layer is None:
            continue
        for key, value in layer.authored().items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    if not merged:
        return None
    renames = {
        "max_tokens": "maxTokens",
        "supports_json_schema": "supportsJsonSchema",
        "extra_params": "extraParams",
        "context_length": "contextLength",
        "enable_thinking": "enableThinking",
    }
    return {renames.get(k, k): v for k, v in merged.items()}


def _unit_node(
    doc: WorkflowDocument, step: Step, bag: UnitBag | None, node_id: str, freezer: EngineFreezer
) -> UnitNode:
    defaults = doc.defaults
    instructions = step.instructions.text if step.instructions else ""
    source = (
        Source(path=doc.path, start=step.instructions.start_line, end=step.instructions.end_line)
        if step.instructions
        else None
    )
    exec_spec = None
    invocation = None
    route = None
    if bag is not None and bag.exec is not None:
        e = bag.exec
        exec_spec = ExecSpec(
            command=list(e.command),
            cwd=e.cwd,
            pass_env=list(e.pass_env) or None,
            inherit_env=True if e.inherit_env else None,
            timeout_ms=_timeout(bag, defaults, DEFAULT_EXEC_TIMEOUT_MS),
        )
    else:
        declared = (bag is not None and bag.timeout_set) or (defaults is not None and defaults.timeout_set)
        invocation, route = freezer.unit_invocation(
            where=f'{doc.path}:{step.line}: step "{step.id}"',
            named=(bag.engine if bag and bag.engine else None) or (defaults.engine if defaults else None),
            model=(bag.model if bag and bag.model else None) or (defaults.model if defaults else None),
            # absent unless the file states one: "engine default" and "none" must stay distinct
            declared_timeout=declared,
            timeout_ms=_timeout(bag, defaults, None),
            llm=_merge_llm(defaults, bag),
            unit_llm=bool(bag is not None and bag.llm is not None),
            needs_env=bool(bag is not None and bag.env),
            needs_cwd=bool(bag is not None and bag.isolation == "worktree"),
            needs_tools=tool_need(instructions) is not None,
        )
    on_error = (bag.on_error if bag else None) or (defaults.on_error if defaults else None) or "fail"
    return UnitNode(
        id=node_id,
        instructions=instructions,
        inputs=list(step.inputs) or None,
        invocation=invocation,
        exec=exec_spec,
        output_schema=_unit_schema(step, bag),
        retry=Retry(max=bag.retry.max, on=list(bag.retry.on)) if bag and bag.retry else None,
        on_error=on_error,
        env=list(bag.env) if bag and bag.env else None,
        isolation=(bag.isolation if bag and bag.isolation else "none"),
        source=source,
        route=route,
    )


def _unit_schema(step: Step, bag: UnitBag | None) -> dict[str, Any] | None:
    """D5: on a solo step, a step-level `output:` schema applies to its unit too."""
    if bag is not None and bag.output is not None:
        return bag.output
    if step.kind == "unit":
        return step.output
    return None


def compile_step(
    doc: WorkflowDocument,
    step: Step,
    freezer: EngineFreezer | None = None,
    default_map_concurrency: int = DEFAULT_MAP_CONCURRENCY,
) -> StepPlan:
    freezer = freezer or EngineFreezer(None)
    rubric = step.gate_rubric.text if step.gate_rubric and step.gate_rubric.text.strip() else None
    gate = GatePlan(
        id=f"{step.id}.gate",
        step_id=step.id,
        criteria=[rubric] if rubric else [],
        max_loops=(step.gate.max_loops if step.gate and step.gate.max_loops else 1),
        judge=freezer.judge_invocation() if rubric else None,
    )
    root: UnitNode | MapNode | None = None
    route = None
    if step.kind == "route":
        assert step.route is not None
        route = RoutePlan(
            input=step.route.input,
            when={b.match: b.step for b in step.route.when},
            default_step_id=step.route.default,
        )
    elif step.kind == "map":
        assert step.map is not None
        template = _unit_node(doc, step, step.map.unit, f"{step.id}.unit", freezer)
        root = MapNode(
            id=f"{step.id}.map",
            over=step.map.over,
            template=template,
            concurrency=step.map.concurrency or default_map_concurrency,
            reducer=step.map.reducer,
            source=template.source,
        )
    else:
        root = _unit_node(doc, step, step.unit, step.id, freezer)
    return StepPlan(
        step_id=step.id,
        title=step.id,
        sequence_index=step.sequence_index,
        root=root,
        route=route,
        output_schema=step.output,
        gate=gate,
    )


def compile_plan(doc: WorkflowDocument, *, title: str, max_concurrency: int | None = None, config: Any = None) -> Plan:
    """Freeze `doc` against `config` (an `akm.config.LoadedConfig`, or None: no config file).

    `max_concurrency` overrides config `workflow.maxConcurrency` (D6). Raises
    ConfigError when a step names an engine the config lacks or one that cannot
    run it.
    """
    budget = None
    b = doc.budget
    if b is not None and (b.max_units or b.max_tokens or b.max_cost or b.unknown):
        budget = Budget(max_units=b.max_units, max_tokens=b.max_tokens, max_cost=b.max_cost, unknown=b.unknown)
    params = list(doc.params) or None
    freezer = EngineFreezer(config)
    settings = config.config.workflow if config is not None else None
    if max_concurrency is None and settings is not None:
        max_concurrency = settings.max_concurrency
    map_width = (settings.default_map_concurrency if settings is not None else None) or DEFAULT_MAP_CONCURRENCY
    steps = [compile_step(doc, s, freezer, map_width) for s in doc.steps]
    return Plan(
        title=title,
        params=params,
        param_schemas=dict(doc.params) if params else None,
        budget=budget,
        execution=Execution(
            max_concurrency=max_concurrency,
            engines=dict(sorted(freezer.snapshots.items())),
            prices=freezer.prices() or None,
            daily_cost_limit=_daily_cost_limit(config),
        ),
        steps=steps,
    )


def _daily_cost_limit(config: Any) -> float | None:
    """Config `limits.maxCostPerDay`, frozen with the plan (a run never re-reads config)."""
    limits = getattr(config.config, "limits", None) if config is not None else None
    return getattr(limits, "max_cost_per_day", None) if limits is not None else None
