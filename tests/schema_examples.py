"""A schema-valid example value for a JSON Schema of akm's supported subset (test helper).

`seed` varies strings and numbers so fan-out items generated from one schema stay distinct.
"""

from __future__ import annotations

from typing import Any


def example(schema: dict[str, Any] | None, seed: int = 0) -> Any:
    if not schema:
        return f"value {seed}"
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][seed % len(schema["enum"])]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "string":
        text = f"example text {seed}"
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if len(text) < low:
            text = text + "x" * (low - len(text))
        if high is not None and len(text) > high:
            text = text[:high] if high >= 1 else ""
        return text
    if kind in ("integer", "number"):
        value = max(schema.get("minimum", 1), seed + 1)
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        return int(value) if kind == "integer" else float(value) + 0.5 * (value < schema.get("maximum", value + 1))
    if kind == "boolean":
        return seed % 2 == 0
    if kind == "null":
        return None
    if kind == "array":
        n = max(schema.get("minItems", 0), 2)
        if "maxItems" in schema:
            n = min(n, schema["maxItems"])
        return [example(schema.get("items"), seed * 10 + i) for i in range(n)]
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: example(sub, seed) for name, sub in props.items()}
    raise ValueError(f"no example for schema {schema!r}")
