"""Read the `steps:` list: each entry's id, kind (unit / map / route), inputs, output and gate.

Steps are read one at a time into `StepDraft`s, which keep what each entry got
right even when another part of it is wrong, so the later checks (route targets,
references, body sections) still run for every step and the author sees all
problems at once. References found along the way are collected as `RefUse`s and
resolved only after the whole list is known (akm.format.cross_step_checks),
because whether `steps.x.output` is valid depends on where `x` is declared.
"""

from __future__ import annotations

from typing import Any, Callable

from akm.format.field_reader import FieldReader, corrected_name, describe
from akm.format.grammar import (
    BRANCH_KEYS,
    GATE_KEYS,
    MAP_KEYS,
    MAX_CONCURRENCY,
    MAX_INPUTS,
    MAX_LOOPS,
    MAX_ROUTE_BRANCHES,
    MAX_STEPS,
    ROUTE_KEYS,
    STEP_ID_RE,
    STEP_KEYS,
    UNIT_KEYS,
)
from akm.format.model import GateSpec, MapSpec, RouteBranch, RouteSpec, UnitBag
from akm.format.read_schemas import read_output_schema
from akm.format.read_unit import read_unit_bag
from akm.format.yaml12 import js_string
from akm.record import dataclass, field


def _under_unit(parent: str) -> Callable[[str, Any], str | None]:
    """Where a unit setting written one level too high goes: a step's (or map's) `on_error`, `retry`,
    `timeout`, `env`… belong to its unit, and the allowed keys alone did not say so."""

    def placed(key: str, value: Any) -> str | None:
        if key not in UNIT_KEYS:
            return None
        shown = value if isinstance(value, (str, int, float)) and not isinstance(value, bool) else "..."
        inner = f"unit: {{ {key}: {shown} }}"
        if parent:
            return f'"{key}" is a setting of the {parent}\'s unit: write `{parent}: {{ ..., {inner} }}`'
        return f'"{key}" is a setting of the step\'s unit: write it under `unit:`, e.g. `{inner}`'

    return placed


@dataclass
class RefUse:
    """A reference found in the frontmatter, kept for the cross-step checks."""

    step_index: int
    position: str  # "inputs[0]", "map.over", "route.input"
    ref: Any  # akm.format.refs.Reference
    ypath: tuple


@dataclass
class StepDraft:
    """What we learned about one step entry while reading it."""

    index: int
    ypath: tuple
    line: int
    end_line: int
    id: str | None  # None when missing/invalid
    label: str
    kind: str = "unit"
    unit: UnitBag | None = None
    map: MapSpec | None = None
    route: RouteSpec | None = None
    route_lines: list[tuple[str, tuple]] = field(default_factory=list)  # (target, ypath)
    inputs: list[str] = field(default_factory=list)
    output: dict | None = None
    has_output: bool = False
    gate: GateSpec | None = None
    has_gate: bool = False


@dataclass
class StepsRead:
    """Everything the later phases need from the step list."""

    drafts: list[StepDraft]
    refs: list[RefUse]
    invalid_ids: set[str]  # ids written but refused (so their ## heading gets a better hint)


def read_steps(ctx: FieldReader, root: dict) -> StepsRead:
    reader = _StepReader(ctx)
    drafts = reader.read_list(root)
    return StepsRead(drafts=drafts, refs=reader.refs, invalid_ids=reader.invalid_ids)


class _StepReader:
    def __init__(self, ctx: FieldReader) -> None:
        self.ctx = ctx
        self.refs: list[RefUse] = []
        self.invalid_ids: set[str] = set()

    def read_list(self, root: dict) -> list[StepDraft]:
        ctx = self.ctx
        steps = root.get("steps")
        if not isinstance(steps, list) or not steps:
            present = "steps" in root
            ctx.error(
                "steps_required",
                '"steps" is required and must be a list with at least one step'
                + (f"; got {describe(steps)}" if present else ""),
                ("steps",) if present else (),
                line=None if present else 1,
                hint="add `steps:` with entries like `- id: build`, each with a `## build` section in the body",
            )
            return []
        if len(steps) > MAX_STEPS:
            ctx.error(
                "too_many_entries",
                f'"steps" has {len(steps)} entries; at most {MAX_STEPS} are allowed',
                ("steps",),
                key=True,
                hint="split the workflow into several files",
            )
        drafts: list[StepDraft] = []
        first_index: dict[str, int] = {}
        for i, raw in enumerate(steps):
            yp = ("steps", i)
            draft = self.read_step(i, raw, yp)
            if draft is None:
                continue
            if draft.id is not None:
                if draft.id in first_index:
                    first = drafts[first_index[draft.id]]
                    ctx.error(
                        "duplicate_step_id",
                        f'Duplicate step id "{draft.id}" (first declared on line {first.line})',
                        yp + ("id",),
                        hint="step ids must be unique; rename one of them",
                    )
                    draft.id = None
                else:
                    first_index[draft.id] = len(drafts)
            drafts.append(draft)
        return drafts

    def read_step(self, i: int, raw: Any, yp: tuple) -> StepDraft | None:
        ctx = self.ctx
        if not isinstance(raw, dict):
            ctx.error(
                "invalid_type",
                f"Step #{i + 1} must be a mapping with an `id`, not {describe(raw)}",
                yp,
                hint="write `- id: <step-id>`",
            )
            return None
        line = ctx.line(yp)
        step_id = self.read_id(i, raw, yp)
        label = f'Step "{step_id}"' if step_id else f"Step #{i + 1}"
        draft = StepDraft(index=i, ypath=yp, line=line, end_line=ctx.end_line(yp, line), id=step_id, label=label)
        ctx.check_keys(raw, yp, STEP_KEYS, label, placed=_under_unit(""))

        has_map, has_route = "map" in raw, "route" in raw
        if has_map and has_route:
            ctx.error(
                "conflicting_step_kind",
                f'{label} declares both "map" and "route"; a step has at most one of "map" or "route"',
                yp + ("route",),
                key=True,
                hint="split it into a map step followed by a route step",
            )
        if has_route and not has_map:
            draft.kind = "route"
            for k in ("unit", "inputs"):
                if k in raw:
                    ctx.error(
                        "conflicting_step_kind",
                        f'{label} is a route step and cannot declare "{k}"'
                        + (" (a route dispatches no unit)" if k == "unit" else " (a route reads only its route.input)"),
                        yp + (k,),
                        key=True,
                        hint=f'remove "{k}" or move the work into a separate step',
                    )
            draft.route = self.read_route(raw["route"], yp + ("route",), draft)
        elif has_map:
            draft.kind = "map"
            if "unit" in raw:
                ctx.error(
                    "conflicting_step_kind",
                    f'{label} is a map step; its per-item unit belongs at "map.unit", not at the step level',
                    yp + ("unit",),
                    key=True,
                    hint="move the `unit:` block under `map:`",
                )
            draft.map = self.read_map(raw["map"], yp + ("map",), draft)
        else:
            draft.kind = "unit"
            if "unit" in raw:
                draft.unit = read_unit_bag(ctx, raw["unit"], yp + ("unit",), label, "unit")

        if "inputs" in raw and draft.kind != "route":
            self.read_inputs(raw["inputs"], yp + ("inputs",), draft)
        if "output" in raw:
            draft.has_output = True
            draft.output = read_output_schema(
                ctx, raw["output"], yp + ("output",), f"{label}: output", "{ type: object, required: [x] }"
            )
        if "gate" in raw:
            draft.has_gate = True
            draft.gate = self.read_gate(raw["gate"], yp + ("gate",), label)
        return draft

    def read_id(self, i: int, raw: dict, yp: tuple) -> str | None:
        """The step's id, or None (reported) when it is missing or not a valid id."""
        ctx = self.ctx
        if "id" not in raw:
            ctx.error(
                "invalid_step_id",
                f"Step #{i + 1} has no `id`",
                yp,
                hint="add `id: <name>` (letters, digits, _ and -, not starting with a digit)",
            )
            return None
        value = raw["id"]
        if not isinstance(value, str) or not value.strip():
            ctx.error(
                "invalid_step_id",
                f"Step #{i + 1} has an invalid id: it must be a non-empty string, not {describe(value)}",
                yp + ("id",),
            )
            return None
        if not STEP_ID_RE.match(value.strip()):
            self.invalid_ids.add(value.strip())
            fixed = corrected_name(value.strip(), STEP_ID_RE, r"[^A-Za-z0-9_-]", "-", "s")
            ctx.error(
                "invalid_step_id",
                f'Step #{i + 1} has an invalid id "{value}": use letters, digits, _ and - only, '
                "starting with a letter or _",
                yp + ("id",),
                hint=f'e.g. "{fixed}"' if fixed else None,
            )
            return None
        return value.strip()

    def read_gate(self, value: Any, yp: tuple, label: str) -> GateSpec | None:
        ctx = self.ctx
        node = ctx.strict_mapping(
            value,
            yp,
            f"{label}: gate",
            GATE_KEYS,
            hint="write `gate: { max_loops: 3 }`; the rubric goes under `### gate` in the body",
            unknown_hint='"gate" takes only max_loops; write the criteria under a `### gate` heading in the step\'s body section',
        )
        if node is None:
            return None
        loops = None
        if "max_loops" in node:
            loops = ctx.integer(node["max_loops"], yp + ("max_loops",), f"{label}: gate.max_loops", 1, MAX_LOOPS)
        return GateSpec(max_loops=loops)

    def read_inputs(self, value: Any, yp: tuple, draft: StepDraft) -> None:
        what = f"{draft.label}: inputs"
        items = self.ctx.entries(
            value, yp, what, "references", limit=MAX_INPUTS, hint="e.g. `inputs: [steps.build.output]`"
        )
        if items is None:
            return
        seen: set[str] = set()
        for i, item in enumerate(items):
            ref = self.reference(item, yp + (i,), f"{what}[{i}]")
            if ref is None:
                continue
            if ref.text in seen:
                self.ctx.duplicate(what, ref.text, yp + (i,))
                continue
            seen.add(ref.text)
            draft.inputs.append(ref.text)
            self.refs.append(RefUse(draft.index, f"inputs[{i}]", ref, yp + (i,)))

    def reference(self, value: Any, yp: tuple, what: str) -> Any:
        """A parsed `akm.format.refs.Reference`, or None (reported) when the text is not one."""
        from akm.format.refs import ReferenceSyntaxError, parse_reference

        ctx = self.ctx
        if not isinstance(value, str):
            ctx.error(
                "invalid_type",
                f"{what} must be a reference string, not {describe(value)}",
                yp,
                hint="write params.<name> or steps.<id>.output",
            )
            return None
        try:
            return parse_reference(value)
        except ReferenceSyntaxError as exc:
            ctx.error(
                "invalid_reference",
                f"{what}: {exc.message}",
                yp,
                hint="a reference is params.<name> or steps.<id>.output followed by .key or [index] parts",
            )
            return None

    def required_reference(
        self, node: dict, yp: tuple, draft: StepDraft, position: str, purpose: str, hint: str
    ) -> str | None:
        """`map.over` / `route.input`: a reference that must be present; it is recorded for the cross-step checks."""
        block, key = position.split(".")
        if key not in node:
            self.ctx.error("missing_key", f'{draft.label}: {block} needs "{key}": {purpose}', yp, hint=hint)
            return None
        ref = self.reference(node[key], yp + (key,), f"{draft.label}: {position}")
        if ref is None:
            return None
        self.refs.append(RefUse(draft.index, position, ref, yp + (key,)))
        return ref.text

    # ---------------------------------------------------------------------------------- map / route
    def read_map(self, value: Any, yp: tuple, draft: StepDraft) -> MapSpec | None:
        ctx = self.ctx
        label = draft.label
        node = ctx.strict_mapping(
            value,
            yp,
            f"{label}: map",
            MAP_KEYS,
            hint="write `map: { over: params.items, unit: {...} }`",
            placed=_under_unit("map"),
        )
        if node is None:
            return None
        over = self.required_reference(
            node,
            yp,
            draft,
            "map.over",
            "the array to fan out over",
            "e.g. `over: params.files` or `over: steps.plan.output.items`",
        )
        out: dict[str, Any] = {}
        if "concurrency" in node:
            out["concurrency"] = ctx.integer(
                node["concurrency"], yp + ("concurrency",), f"{label}: map.concurrency", 1, MAX_CONCURRENCY
            )
        if "reducer" in node:
            out["reducer"] = ctx.choice(
                node["reducer"], yp + ("reducer",), f"{label}: map.reducer", ("collect", "vote")
            )
        if "unit" in node:
            out["unit"] = read_unit_bag(ctx, node["unit"], yp + ("unit",), label, "map.unit")
        if over is None:
            return None
        return MapSpec(over=over, **{k: v for k, v in out.items() if v is not None})

    def read_route(self, value: Any, yp: tuple, draft: StepDraft) -> RouteSpec | None:
        ctx = self.ctx
        label = draft.label
        node = ctx.strict_mapping(
            value,
            yp,
            f"{label}: route",
            ROUTE_KEYS,
            hint="write `route: { input: <ref>, when: [{ match: x, step: y }], default: z }`",
        )
        if node is None:
            return None
        input_text = self.required_reference(
            node, yp, draft, "route.input", "the value to route on", "e.g. `input: steps.classify.output.kind`"
        )
        branches: list[RouteBranch] = []
        if "when" not in node:
            ctx.error("missing_key", f'{label}: route needs "when": a list of {{ match, step }} branches', yp)
        elif not isinstance(node["when"], list):
            ctx.error(
                "invalid_type",
                f"{label}: route.when must be a list of {{ match, step }} branches, not {describe(node['when'])}",
                yp + ("when",),
            )
        elif not node["when"]:
            ctx.error("invalid_value", f"{label}: route.when must list at least one branch", yp + ("when",))
        else:
            when = node["when"]
            if len(when) > MAX_ROUTE_BRANCHES:
                ctx.error(
                    "too_many_entries",
                    f"{label}: route.when has {len(when)} branches; at most {MAX_ROUTE_BRANCHES} are allowed",
                    yp + ("when",),
                )
            seen: dict[str, int] = {}
            for i, raw in enumerate(when):
                byp = yp + ("when", i)
                branch = self.read_branch(raw, byp, f"{label}: route.when[{i}]")
                if branch is None:
                    continue
                if branch.match in seen:
                    ctx.error(
                        "duplicate_route_match",
                        f'{label} has a duplicate "when" match "{branch.match}" (also branch {seen[branch.match] + 1}); this branch can never be chosen',
                        byp + ("match",),
                        hint="each match value may appear once; remove or change one branch",
                    )
                    continue
                seen[branch.match] = i
                branches.append(branch)
                draft.route_lines.append((branch.step, byp + ("step",)))
        default = None
        if "default" in node:
            default = ctx.text(node["default"], yp + ("default",), f"{label}: route.default")
            if default is not None:
                draft.route_lines.append((default, yp + ("default",)))
        if input_text is None or not branches:
            return None
        return RouteSpec(input=input_text, when=branches, default=default)

    def read_branch(self, raw: Any, yp: tuple, what: str) -> RouteBranch | None:
        ctx = self.ctx
        before = len(ctx.errors)
        node = ctx.strict_mapping(raw, yp, what, BRANCH_KEYS, hint="write `{ match: <value>, step: <step-id> }`")
        if node is None:
            return None
        match = None
        if "match" not in node:
            ctx.error("missing_key", f'{what} needs "match": the value that selects this branch', yp)
        else:
            value = node["match"]
            if isinstance(value, (str, bool, int, float)):
                # Matched against the route input as JavaScript's String(v) writes it (`1.0` -> "1").
                match = js_string(value)
                if match == "":
                    ctx.error(
                        "empty_route_match",
                        f"{what} matches the empty string, which a route input can never usefully be",
                        yp + ("match",),
                        hint="use a non-empty match value, or `default:` for the fallback",
                    )
                    match = None
            else:
                ctx.error(
                    "invalid_type",
                    f"{what}.match must be a string, number or boolean, not {describe(value)}",
                    yp + ("match",),
                )
        step = None
        if "step" not in node:
            ctx.error("missing_key", f'{what} needs "step": the step to run when it matches', yp)
        else:
            step = ctx.text(node["step"], yp + ("step",), f"{what}.step")
        if len(ctx.errors) != before or match is None or step is None:
            return None
        return RouteBranch(match=match, step=step)
