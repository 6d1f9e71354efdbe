"""Read the JSON Schemas a workflow declares: `params:` entries and step / unit `output:` schemas.

A schema is checked here, at lint time, for what would otherwise only fail in
the middle of a run: values JSON cannot carry, size, and keywords outside the
supported subset (akm.format.schema). Each problem is anchored at the offending
keyword in the file, with a hint naming the supported way to say the same thing.
"""

from __future__ import annotations

import re
from typing import Any

from akm.format.field_reader import FieldReader, corrected_name, describe
from akm.format.grammar import MAX_PARAMS, MAX_SCHEMA_BYTES, PARAM_NAME_RE


def read_params(ctx: FieldReader, root: dict) -> dict[str, dict]:
    """The declared params whose names and schemas are valid, by name."""
    params: dict[str, dict] = {}
    node = ctx.section(root, "params", hint="write one `name: { type: ..., description: ... }` entry per param")
    if node is None:
        return params
    if len(node) > MAX_PARAMS:
        ctx.error(
            "too_many_entries",
            f'"params" declares {len(node)} params; at most {MAX_PARAMS} are allowed',
            ("params",),
            key=True,
        )
    for name, schema in node.items():
        yp = ("params", name)
        if not PARAM_NAME_RE.match(name):
            fixed = corrected_name(name, PARAM_NAME_RE, r"[^A-Za-z0-9_]", "_", "_")
            ctx.error(
                "invalid_param_name",
                f'Param name "{name}" is invalid: use letters, digits and _ (not starting with a digit)',
                yp,
                key=True,
                hint=f'rename it, e.g. "{fixed}"' if fixed else None,
            )
            continue
        if not isinstance(schema, dict):
            ctx.error(
                "invalid_type",
                f'Param "{name}" must be a JSON-Schema mapping, not {describe(schema)}',
                yp,
                hint="e.g. `{ type: string, description: ... }`",
            )
            continue
        if check_schema(ctx, schema, yp, f'Param "{name}" schema') and _default_fits(ctx, name, schema, yp):
            params[name] = schema
    return params


def _default_fits(ctx: FieldReader, name: str, schema: dict, yp: tuple) -> bool:
    """A param's `default:` is what a run gets when the param is not passed, so it must fit its schema."""
    if "default" not in schema:
        return True
    from akm.format.schema import validate_instance

    problems = validate_instance(schema["default"], schema, root_label=f"params.{name}")
    if problems:
        ctx.error(
            "param_default_invalid",
            f'Param "{name}" default does not fit its own schema: ' + "; ".join(problems),
            yp + ("default",),
            hint="change the default, or the schema, so that a run without this param is valid",
        )
        return False
    return True


def read_output_schema(ctx: FieldReader, value: Any, yp: tuple, what: str, example: str) -> dict | None:
    """An `output:` schema (step or unit level); None when it is not a usable mapping."""
    node = ctx.mapping(value, yp, what, hint=f"give a JSON-Schema mapping, e.g. `{example}`")
    if node is not None and check_schema(ctx, node, yp, what):
        return node
    return None


def check_schema(ctx: FieldReader, schema: dict, yp: tuple, what: str) -> bool:
    """Size, JSON-ability and the supported JSON-Schema subset. True when usable."""
    # Imported here: jsonschema is heavy and the CLI must start without it.
    from akm.format.schema import check_schema_definition

    if not ctx.json_value(schema, yp, what) or not ctx.json_size(schema, yp, what, MAX_SCHEMA_BYTES):
        return False
    ok = True
    for p in check_schema_definition(schema):
        sub = _schema_path(p.path)
        node = _walk(schema, sub)
        keyword = p.keyword
        kpath = yp + sub + ((keyword,) if isinstance(node, dict) and keyword in node else ())
        if p.kind == "unsupported":
            ctx.error(
                "schema_unsupported_keyword", f"{what}: {p.message}", kpath, key=True, hint=_SCHEMA_HINTS.get(keyword)
            )
        else:
            ctx.error("schema_malformed", f"{what} is not a valid JSON Schema: {p.message}", kpath, key=True)
        ok = False
    return ok


_SCHEMA_SEG = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def _schema_path(pointer: Any) -> tuple:
    """`$.properties.name` / `$.anyOf[1]` -> ('properties', 'name') / ('anyOf', 1)."""
    if isinstance(pointer, (list, tuple)):
        return tuple(pointer)
    if not isinstance(pointer, str) or not pointer.startswith("$"):
        return ()
    out: list[Any] = []
    for m in _SCHEMA_SEG.finditer(pointer[1:]):
        out.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
    return tuple(out)


def _walk(value: Any, path: tuple) -> Any:
    """The sub-value at `path`, or None when the path leaves the value."""
    for seg in path:
        if isinstance(seg, int) and isinstance(value, list) and 0 <= seg < len(value):
            value = value[seg]
        elif isinstance(seg, str) and isinstance(value, dict) and seg in value:
            value = value[seg]
        else:
            return None
    return value


# How to say the same thing inside the supported subset, by unsupported keyword.
_SCHEMA_HINTS = {
    "const": "use a one-value enum, e.g. `enum: [x]`",
    "$ref": "inline the referenced schema",
    "$defs": "inline the definitions where they are used",
    "definitions": "inline the definitions where they are used",
    "pattern": "use enum or minLength/maxLength, or state the rule in the ### gate rubric",
    "format": "use enum, or state the rule in the ### gate rubric",
    "if": "express the alternatives with anyOf or oneOf",
    "then": "express the alternatives with anyOf or oneOf",
    "else": "express the alternatives with anyOf or oneOf",
    "patternProperties": "list the properties explicitly",
    "uniqueItems": "drop it, or state the rule in the ### gate rubric",
}
