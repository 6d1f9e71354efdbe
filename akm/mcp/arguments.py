"""A call's arguments as the JSON the client sent, before its request model validates them.

Two rules no model can state: a value of the wrong JSON type is refused rather than converted (pydantic would
read `"5"` as 5), and an object or array argument sent as JSON text (the MCP Inspector sends every argument as
a string) is read as the JSON it holds — for every tool alike, and only into an object or an array.
"""

from __future__ import annotations

import json
from typing import Any


def _types_of(prop: Any) -> set[str]:
    """The JSON types a property's schema takes (its `type`, or those of its `anyOf`)."""
    if not isinstance(prop, dict):
        return set()
    kinds = [prop.get("type")] + [a.get("type") for a in prop.get("anyOf", []) if isinstance(a, dict)]
    return {t for t in kinds if isinstance(t, str)}


def parse_json_strings(arguments: dict[str, Any], schema: Any) -> dict[str, Any]:
    """`arguments` with each string given for an object or array argument (one that takes no string) read as
    the JSON it holds — when that is an object or array the argument takes; anything else stays as sent (and
    is refused by the model, naming the argument). A scalar is never read out of a string."""
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    out = dict(arguments)
    for key, value in arguments.items():
        allowed = _types_of(props.get(key))
        if not isinstance(value, str) or "string" in allowed or not allowed & {"object", "array"}:
            continue
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if (isinstance(parsed, dict) and "object" in allowed) or (isinstance(parsed, list) and "array" in allowed):
            out[key] = parsed
    return out


_JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    dict: "object",
    list: "array",
    type(None): "null",
}


def uncoerced(arguments: dict[str, Any], schema: Any) -> list[str]:
    """Arguments whose JSON type the tool's schema does not take, where pydantic would coerce them
    (`"tokens": "5"` read as 5, `"rerun": "yes"` or `1` as true, `true` as the integer 1): an agent that
    sends the wrong type should hear so, not have its value reinterpreted."""
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    problems = []
    for key, value in arguments.items():
        prop = props.get(key)
        if not isinstance(prop, dict):
            continue
        allowed = _types_of(prop)
        if not allowed or not allowed <= {"integer", "number", "boolean", "null"}:
            continue  # strings, objects, arrays and untyped values are taken as they come
        got = _JSON_TYPES.get(type(value), "a value")
        fits = (
            got in allowed
            or (got == "integer" and "number" in allowed)
            or (got == "number" and "integer" in allowed and float(value).is_integer())
        )
        if not fits:
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
            problems.append(
                f"{key}: expected {' or '.join(sorted(allowed))}, got {got} {shown} (no conversion from other types)"
            )
    return problems
