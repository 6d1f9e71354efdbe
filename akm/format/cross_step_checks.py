"""Rules that span steps, checked once the whole step list has been read.

A step may only read what exists before it runs: outputs of steps declared
earlier and declared params. Routes only jump forward, so a run never loops
except through a gate's bounded `max_loops`. The upstream tool found these
problems while compiling or freezing a run; we report them at lint time
(spec/decisions.md D10), anchored at the reference or target that breaks the rule.
"""

from __future__ import annotations

import json
from typing import Any

from akm.format.field_reader import FieldReader, suggest
from akm.format.read_steps import RefUse, StepDraft


def first_positions(drafts: list[StepDraft]) -> dict[str, int]:
    """Step id -> sequence index of the first step declaring it."""
    positions: dict[str, int] = {}
    for d in drafts:
        if d.id is not None and d.id not in positions:
            positions[d.id] = d.index
    return positions


def check_routes(ctx: FieldReader, drafts: list[StepDraft]) -> None:
    """Route targets must exist and come after the routing step (routes never loop)."""
    index = first_positions(drafts)
    for d in drafts:
        for target, yp in d.route_lines:
            if target not in index:
                ctx.error(
                    "route_target_unknown",
                    f'{d.label} routes to unknown step "{target}"',
                    yp,
                    hint=f"{suggest(target, list(index))}route targets must be step ids declared after this step",
                )
            elif target == d.id:
                ctx.error(
                    "route_target_self",
                    f"{d.label} must not route to itself",
                    yp,
                    hint="use a gate with max_loops to repeat a step",
                )
            elif index[target] < d.index:
                ctx.error(
                    "route_backward",
                    f'{d.label} routes backward to "{target}", which is declared before it',
                    yp,
                    hint="routes only go forward; repeat work with a gate (max_loops) instead of a loop",
                )


def check_references(
    ctx: FieldReader,
    drafts: list[StepDraft],
    refs: list[RefUse],
    params: dict[str, dict],
    params_declared: bool,
    root: dict,
) -> None:
    """Every reference names a declared param or an earlier step; `map.over` must be able to be an array.

    `params` holds only the params whose schemas were valid; a reference to a
    declared but invalid param is not reported again (its declaration already is).
    """
    raw_params = _raw_params(root)
    position_of = first_positions(drafts)
    by_index = {d.index: d for d in drafts}
    for use in refs:
        d = by_index[use.step_index]
        ref = use.ref
        where = f"{d.label}: {use.position} ({ref.text})"
        if ref.root == "params":
            if use.position.startswith("inputs"):
                ctx.error(
                    "param_as_input",
                    f"{where} names a param, not a step output; params are attached to every unit already",
                    use.ypath,
                    hint="remove it from inputs",
                )
                continue
            if not params_declared:
                ctx.error(
                    "unknown_param_reference",
                    f'{where} references param "{ref.name}", but the workflow declares no params',
                    use.ypath,
                    hint=f"declare it: `params: {{ {ref.name}: {{ type: ... }} }}`",
                )
            elif ref.name not in params and ref.name not in raw_params:
                ctx.error(
                    "unknown_param_reference",
                    f'{where} references a param not declared in "params:"',
                    use.ypath,
                    hint=f"{suggest(ref.name, list(raw_params))}declare it under params: or fix the name",
                )
            elif use.position == "map.over":
                _check_over_array(ctx, where, use, params.get(ref.name), [])
            continue
        if ref.name not in position_of:
            ctx.error(
                "unknown_step_reference",
                f'{where} cannot be resolved: "{ref.name}" is not a step in this workflow',
                use.ypath,
                hint=f"{suggest(ref.name, list(position_of))}reference an earlier step's id",
            )
        elif position_of[ref.name] >= d.index:
            what = "is this step itself" if ref.name == d.id else "comes after this step"
            ctx.error(
                "forward_reference",
                f'{where} cannot be resolved: step "{ref.name}" does not come before this step (it {what})',
                use.ypath,
                hint="steps can only use outputs of steps declared earlier; reorder the steps",
            )
        elif use.position in ("map.over", "route.input"):
            target = by_index[position_of[ref.name]]
            if _check_declared_fields(ctx, where, use, target, list(ref.path)) and use.position == "map.over":
                _check_over_array(ctx, where, use, target.output, list(ref.path))


def warn_untyped(ctx: FieldReader, drafts: list[StepDraft]) -> None:
    """A unit or map step without an `output:` schema is allowed, but later steps cannot rely on its shape."""
    for d in drafts:
        if d.id is not None and d.kind in ("unit", "map") and not d.has_output:
            ctx.warn(
                "missing_output_schema",
                f'Step "{d.id}" declares no "output:" schema, so its artifact is untyped',
                d.line,
                hint="add `output: { type: ... }` so later steps and gates can rely on its shape",
            )


def _check_declared_fields(ctx: FieldReader, where: str, use: RefUse, target: StepDraft, path: list) -> bool:
    """Warn when the path names a field the upstream step's `output:` schema does not declare; True when it does
    (or when the schema says nothing either way: untyped steps already warn `missing_output_schema`).

    Why a warning: a unit's result that matches `{type: object}` but holds `order` where a later step reads
    `ordered` passes every gate and then fails the step that reads it, with every unit before it done. The
    schema is where that is caught before anything runs: declare the field (and require it) upstream.
    """
    schema: Any = target.output
    for i, seg in enumerate(path):
        if not isinstance(schema, dict):
            return True
        if isinstance(seg, int):
            schema = schema.get("items")
            continue
        props = schema.get("properties")
        declared = schema.get("type")
        is_object = declared == "object" or (isinstance(declared, list) and "object" in declared)
        if isinstance(props, dict) and seg in props:
            schema = props[seg]
            continue
        extra = schema.get("additionalProperties")
        if (not is_object and not isinstance(props, dict)) or isinstance(extra, dict):
            return True  # not an object schema (its own checks say so), or one that types any extra field
        shown = ".".join(str(p) for p in path[: i + 1])
        known = sorted(props) if isinstance(props, dict) else []
        ctx.warn(
            "undeclared_output_field",
            f'{where} reads field "{seg}" of step "{target.id}", whose output schema does not declare it'
            + (f" (it declares {', '.join(known)})" if known else " (it declares no properties)"),
            ctx.line(use.ypath),
            hint=f"{suggest(str(seg), known)}declare it in step {target.id}'s output, e.g. "
            f"`output: {{ type: object, required: [{seg}], properties: {{ {seg}: {{ ... }} }} }}`, so a result "
            f"without `{shown}` is refused when it is reported, not when this step runs",
        )
        return False
    return True


def _check_over_array(ctx: FieldReader, where: str, use: RefUse, schema: Any, path: list) -> None:
    """`over` must resolve to an array; refuse when the declared schema rules that out."""
    for seg in path:
        if not isinstance(schema, dict):
            return
        if isinstance(seg, int):
            schema = schema.get("items")
        else:
            props = schema.get("properties")
            schema = props.get(seg) if isinstance(props, dict) else None
    if not isinstance(schema, dict) or "type" not in schema:
        return
    declared = schema["type"]
    types = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else None
    if types is None or "array" in types:
        return
    ctx.error(
        "over_not_array",
        f"{where} must resolve to an array, but its schema declares type {json.dumps(declared)}",
        use.ypath,
        hint="fan out over a list (type: array), e.g. a param declared `{ type: array }`",
    )


def _raw_params(root: dict) -> dict:
    """`params:` as written, so a reference to a declared-but-invalid param is not reported twice."""
    p = root.get("params")
    return p if isinstance(p, dict) else {}
