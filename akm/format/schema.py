"""The JSON-Schema subset akm understands: an authoring check and a bounded runtime validator.

Why a subset: schemas travel into prompts, journals and plan hashes, and every keyword we accept must
behave identically at lint time, in the engine and in the session brief. So authors get a hard lint
error for a keyword we would otherwise silently ignore (`pattern`, `$ref`, ...), and the runtime
validator only ever evaluates the supported keywords (`jsonschema`'s Draft 2020-12 implementations,
restricted to that set), with JavaScript-like typing: `2.0` is an integer, `true` is not a number.

Both entry points are total: `check_schema_definition` never raises on any JSON-ish value, and
`validate_instance` never recurses without bound — a schema nested deeper than `MAX_SCHEMA_DEPTH`, a
malformed schema or an evaluation that exceeds `MAX_VISITS` keyword visits is reported as an error,
never as "valid".
"""

from __future__ import annotations

import contextvars
import json
import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Literal

from akm.record import dataclass

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

MAX_SCHEMA_DEPTH = 64
MAX_VISITS = 100_000
# Authoring check walks at most this many nodes (YAML aliases can make a small file a huge tree).
MAX_CHECK_NODES = 100_000

TYPE_NAMES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})

SUPPORTED_KEYWORDS: frozenset[str] = frozenset(
    {
        "type",
        "enum",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
    }
)

# Recognised JSON-Schema keywords we deliberately do not implement: using one is a lint error,
# because silently ignoring it would let invalid data through.
UNSUPPORTED_KEYWORDS: frozenset[str] = frozenset(
    {
        "$ref",
        "$defs",
        "definitions",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "if",
        "then",
        "else",
        "const",
        "pattern",
        "format",
        "patternProperties",
        "propertyNames",
        "additionalItems",
        "prefixItems",
        "contains",
        "minContains",
        "maxContains",
        "uniqueItems",
        "multipleOf",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minProperties",
        "maxProperties",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)

_COMBINATORS = ("allOf", "anyOf", "oneOf")
_COUNT_KEYWORDS = ("minItems", "maxItems", "minLength", "maxLength")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")

SchemaPath = tuple[str | int, ...]


@dataclass
class SchemaProblem:
    """One authoring problem. `path` locates the schema node, `keyword` the offending key in it."""

    path: SchemaPath
    keyword: str
    message: str
    kind: Literal["unsupported", "malformed"]


# --------------------------------------------------------------------------------------------
# Authoring check
# --------------------------------------------------------------------------------------------


def _where(path: SchemaPath) -> str:
    if not path:
        return "the schema root"
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _is_int(value: Any) -> bool:
    """JS-style integer test: bools are not numbers; 2.0 counts as the integer 2."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value) and value.is_integer()


def _is_finite_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _value_depth_exceeds(value: Any, limit: int) -> bool:
    """True when a plain JSON value nests deeper than `limit` (iterative; safe on cycles)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        seen += 1
        if seen > MAX_CHECK_NODES:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
    return False


def check_schema_definition(schema: Any) -> list[SchemaProblem]:
    """Return every unsupported or malformed keyword in an authored schema (empty list = fine).

    Annotation keywords (`title`, `description`, `default`, `examples`, `$schema`, `$id`, ...)
    and unknown keywords (e.g. `x-owner`) pass. Recursion follows `properties.*`, `items`, the
    combinator branches and `not`, to at most `MAX_SCHEMA_DEPTH` levels.
    """
    problems: list[SchemaProblem] = []

    def bad(path: SchemaPath, keyword: str, message: str) -> None:
        problems.append(SchemaProblem(path, keyword, message, "malformed"))

    if not isinstance(schema, dict):
        bad((), "", f"schema must be a mapping, got {_json_type(schema)}")
        return problems

    stack: list[tuple[dict, SchemaPath, int]] = [(schema, (), 0)]
    visited = 0
    while stack:
        node, path, depth = stack.pop()
        visited += 1
        if visited > MAX_CHECK_NODES:
            bad((), "", f"schema is too large (more than {MAX_CHECK_NODES} sub-schemas)")
            break
        if depth > MAX_SCHEMA_DEPTH:
            bad(path, "", f"schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
            continue
        children: list[tuple[dict, SchemaPath]] = []
        for key, value in node.items():
            if not isinstance(key, str):
                bad(path, str(key), f"schema keys must be strings, got {key!r}")
                continue
            _check_keyword(node, key, value, path, problems, children)
        # Reverse so problems come out in document order (stack is LIFO).
        for child, child_path in reversed(children):
            stack.append((child, child_path, depth + 1))
    return problems


def _check_keyword(
    node: dict,
    key: str,
    value: Any,
    path: SchemaPath,
    problems: list[SchemaProblem],
    children: list[tuple[dict, SchemaPath]],
) -> None:
    # Messages do not repeat the location: `path` carries it and callers render it.
    def bad(message: str) -> None:
        problems.append(SchemaProblem(path, key, message, "malformed"))

    def unsupported(message: str) -> None:
        problems.append(SchemaProblem(path, key, message, "unsupported"))

    if key in UNSUPPORTED_KEYWORDS:
        unsupported(f'JSON-Schema keyword "{key}" is not supported by akm')
    elif key == "properties":
        _check_properties(value, path, bad, children)
    elif key == "items":
        _check_items(value, path, bad, unsupported, children)
    elif key == "additionalProperties":
        if isinstance(value, dict):
            unsupported('"additionalProperties" must be true or false; a schema here is not supported')
        elif not isinstance(value, bool):
            bad('"additionalProperties" must be true or false')
    elif key in _COMBINATORS or key == "not":
        _check_subschemas(key, value, path, bad, children)
    else:
        problem = _value_problem(key, value)
        if problem is not None:
            bad(problem)
    # Anything else is an annotation or an extension keyword: allowed, never evaluated.


def _value_problem(key: str, value: Any) -> str | None:
    """What is wrong with the value of a keyword that holds no schema (`type`, `enum`, `required`, the
    counts and the bounds); None when it is right or `key` is an annotation."""
    if key == "type":
        return _type_problem(value)
    if key == "enum":
        return _enum_problem(value)
    if key == "required":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return '"required" must be a list of property names (strings)'
    elif key in _COUNT_KEYWORDS:
        if not _is_int(value) or value < 0:
            return f'"{key}" must be a non-negative integer'
    elif key in ("minimum", "maximum"):
        if not _is_finite_number(value):
            return f'"{key}" must be a finite number'
    return None


def _check_items(
    value: Any,
    path: SchemaPath,
    bad: Callable[[str], None],
    unsupported: Callable[[str], None],
    children: list[tuple[dict, SchemaPath]],
) -> None:
    """`items`: one schema mapping, checked as a child (the tuple form is not supported)."""
    if isinstance(value, dict):
        children.append((value, path + ("items",)))
    elif isinstance(value, list):
        unsupported('tuple-form "items" (a list of schemas) is not supported; use one schema mapping')
    else:
        bad('"items" must be a schema mapping')


def _check_subschemas(
    key: str, value: Any, path: SchemaPath, bad: Callable[[str], None], children: list[tuple[dict, SchemaPath]]
) -> None:
    """`allOf`/`anyOf`/`oneOf` (a non-empty list of schema mappings) and `not` (one): each a child."""
    if key == "not":
        if not isinstance(value, dict):
            bad('"not" must be a schema mapping')
        else:
            children.append((value, path + ("not",)))
    elif not isinstance(value, list) or not value or not all(isinstance(b, dict) for b in value):
        bad(f'"{key}" must be a non-empty list of schema mappings')
    else:
        for i, branch in enumerate(value):
            children.append((branch, path + (key, i)))


def _type_problem(value: Any) -> str | None:
    """What is wrong with a `type` keyword's value (a type name or a non-empty list of distinct ones)."""
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(n, str) for n in names):
        return '"type" must be a type name or a non-empty list of type names'
    unknown = [n for n in names if n not in TYPE_NAMES]
    if unknown:
        return f'"type" names unknown type "{unknown[0]}"; use one of ' + ", ".join(sorted(TYPE_NAMES))
    if len(set(names)) != len(names):
        return '"type" lists the same type more than once'
    return None


def _enum_problem(value: Any) -> str | None:
    """What is wrong with an `enum` keyword's value (a non-empty list, nested no deeper than a schema may be)."""
    if not isinstance(value, list) or not value:
        return '"enum" must be a non-empty list'
    if _value_depth_exceeds(value, MAX_SCHEMA_DEPTH):
        return f'"enum" values nest deeper than {MAX_SCHEMA_DEPTH} levels'
    return None


def _check_properties(
    value: Any, path: SchemaPath, bad: Callable[[str], None], children: list[tuple[dict, SchemaPath]]
) -> None:
    """A `properties` mapping: each entry a schema, checked in turn as a child."""
    if not isinstance(value, dict):
        bad('"properties" must be a mapping of property name to schema')
        return
    for prop, sub in value.items():
        if not isinstance(sub, dict):
            bad(f'"properties" entry "{prop}" must be a schema mapping')
        else:
            children.append((sub, path + ("properties", str(prop))))


# --------------------------------------------------------------------------------------------
# Runtime validation
# --------------------------------------------------------------------------------------------

_budget: contextvars.ContextVar[list[int]] = contextvars.ContextVar("akm_schema_budget")


class _BudgetExceeded(Exception):
    """Raised inside keyword functions when one validation uses more than MAX_VISITS visits."""


def _counted(fn: Any) -> Any:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        counter = _budget.get(None)
        if counter is not None:
            counter[0] += 1
            if counter[0] > MAX_VISITS:
                raise _BudgetExceeded
        result = fn(validator, value, instance, schema)
        if result is not None:
            yield from result

    return keyword


def _required(validator: Any, required: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """Like Draft 2020-12 `required`, but keeps the property name for our message."""
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    for prop in required:
        if prop not in instance:
            yield ValidationError(f'missing required property "{prop}"')


_VALIDATOR: Any = None


def _subset_validator() -> Any:
    """The validator class for the supported subset, built on first use: importing jsonschema costs
    more than a whole `workflow list`, and most commands never validate anything."""
    global _VALIDATOR
    if _VALIDATOR is None:
        from jsonschema import Draft202012Validator, validators

        library = Draft202012Validator.VALIDATORS
        keywords = {name: _counted(library[name]) for name in SUPPORTED_KEYWORDS if name != "required"}
        keywords["required"] = _counted(_required)
        # Only the supported keywords exist for this validator: `$ref`, `pattern`, `format`, ... are inert
        # at run time (lint already refused them), and nothing can trigger reference retrieval.
        _VALIDATOR = validators.create(
            meta_schema=Draft202012Validator.META_SCHEMA,
            validators=keywords,
            type_checker=Draft202012Validator.TYPE_CHECKER,
        )
    return _VALIDATOR


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if math.isfinite(value) and value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def preview(value: Any, limit: int = 80) -> str:
    """A short, bounded JSON rendering of a value for messages (never walks a huge value)."""
    out: list[str] = []
    size = 0

    def emit(s: str) -> bool:
        nonlocal size
        out.append(s)
        size += len(s)
        return size <= limit

    def walk(v: Any, depth: int) -> bool:
        if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) < 1e21:
            return emit(str(int(v)))
        if v is None or isinstance(v, (bool, int, float, str)):
            try:
                return emit(json.dumps(v, ensure_ascii=False))
            except ValueError:
                return emit(str(v))
        if depth >= 4:
            return emit("…")
        if isinstance(v, dict):
            if not emit("{"):
                return False
            for i, (k, item) in enumerate(v.items()):
                if (i and not emit(",")) or not emit(json.dumps(str(k), ensure_ascii=False) + ":"):
                    return False
                if not walk(item, depth + 1):
                    return False
            return emit("}")
        if isinstance(v, (list, tuple)):
            if not emit("["):
                return False
            for i, item in enumerate(v):
                if (i and not emit(",")) or not walk(item, depth + 1):
                    return False
            return emit("]")
        return emit(repr(v))

    if walk(value, 0):
        return "".join(out)
    return "".join(out)[:limit] + "…"


def render_path(root_label: str, path: Any) -> str:
    """`$`, `$.key`, `$[3]`; keys that are not identifiers use `["odd key"]`."""
    parts = [root_label]
    for seg in path:
        if isinstance(seg, int):
            parts.append(f"[{seg}]")
        elif isinstance(seg, str) and _IDENT_RE.match(seg):
            parts.append(f".{seg}")
        else:
            parts.append("[" + json.dumps(str(seg), ensure_ascii=False) + "]")
    return "".join(parts)


def _num(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value)


def _messages(error: ValidationError, root_label: str) -> list[str]:
    """Our wording for one library error (a list: one error may name several properties)."""
    kw, want, inst = error.validator, error.validator_value, error.instance
    if kw == "type":
        names = want if isinstance(want, list) else [want]
        return [f"expected type {' or '.join(names)}, got {_json_type(inst)}"]
    if kw == "enum":
        return [f"value {preview(inst)} is not one of {preview(want, 200)}"]
    if kw == "required":
        return [error.message]
    if kw == "additionalProperties":
        props = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extras = [k for k in inst if k not in props] if isinstance(inst, dict) else []
        return [f'unexpected property "{k}" (additionalProperties: false)' for k in extras] or [error.message]
    if kw == "minimum":
        return [f"{_num(inst)} is below minimum {_num(want)}"]
    if kw == "maximum":
        return [f"{_num(inst)} is above maximum {_num(want)}"]
    if kw == "minLength":
        return [f"string is shorter than minLength {_num(want)} (length {len(inst)})"]
    if kw == "maxLength":
        return [f"string is longer than maxLength {_num(want)} (length {len(inst)})"]
    if kw == "minItems":
        return [f"array has fewer than minItems {_num(want)} items (has {len(inst)})"]
    if kw == "maxItems":
        return [f"array has more than maxItems {_num(want)} items (has {len(inst)})"]
    if kw in ("anyOf", "oneOf"):
        if kw == "oneOf" and not error.context:
            return ["matches more than one schema in oneOf (exactly one must match)"]
        return [f"does not match any schema in {kw}{_branch_summary(error, root_label)}"]
    if kw == "not":
        return ['must not match the schema in "not"']
    return [error.message]


def _branch_summary(error: ValidationError, root_label: str) -> str:
    """Up to three branches' first errors, so the author sees why each alternative failed."""
    firsts: dict[int, ValidationError] = {}
    for sub in error.context or ():
        branch = sub.relative_schema_path[0] if sub.relative_schema_path else 0
        if isinstance(branch, int) and branch not in firsts:
            firsts[branch] = sub
    parts = []
    for branch in sorted(firsts)[:3]:
        sub = firsts[branch]
        msg = _messages(sub, root_label)[0]
        parts.append(f"branch {branch + 1}: {render_path(root_label, sub.absolute_path)}: {msg}")
    return f" ({'; '.join(parts)})" if parts else ""


class _Undecided(Exception):
    """The quick check met something it does not decide exactly as the library would: ask the library."""


def _is_a(value: Any, name: str) -> bool:
    """Draft 2020-12's type checker as the subset validator uses it (2.0 is an integer, true no number)."""
    if name == "string":
        return isinstance(value, str)
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float))
    raise _Undecided


def _same(one: Any, two: Any) -> bool:
    """The library's `enum` equality: 1 == 1.0, but true is not 1; lists and objects compared deeply."""
    if isinstance(one, str) or isinstance(two, str):
        return one == two
    if isinstance(one, (list, dict)) or isinstance(two, (list, dict)):
        return _same_container(one, two)
    if isinstance(one, bool) or isinstance(two, bool):
        return type(one) is type(two) and one == two
    return one == two


def _same_container(one: Any, two: Any) -> bool:
    """`_same` when either side is a list or an object: a container never equals a scalar, nor a list an object."""
    if isinstance(one, list) and isinstance(two, list):
        return len(one) == len(two) and all(_same(a, b) for a, b in zip(one, two, strict=False))
    if isinstance(one, dict) and isinstance(two, dict):
        return one.keys() == two.keys() and all(_same(one[k], two[k]) for k in one)
    return False


def _conforms(value: Any, schema: dict, visits: list[int]) -> bool:
    """Does `value` satisfy `schema`? The supported keywords only, with the library's semantics."""
    for key, want in schema.items():
        if key not in SUPPORTED_KEYWORDS:
            continue
        visits[0] += 1
        if visits[0] > MAX_VISITS // 2:  # well inside the library's budget: near it, let the library say
            raise _Undecided
        holds = _KEYWORD_HOLDS.get(key)
        if holds is None:  # pragma: no cover - every supported keyword has its check below
            raise _Undecided
        if not holds(value, want, schema, visits):
            return False
    return True


# Each supported keyword's check, `(value, the keyword's value, the whole schema, visits) -> holds`: a keyword
# about another type than the value's holds (as in the library), and `_Undecided` leaves it to the library.


def _type_holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    names = want if isinstance(want, list) else [want]
    return any(_is_a(value, n) for n in names)


def _enum_holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    return any(_same(v, value) for v in want)


def _properties_hold(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    if isinstance(value, dict):
        for prop, sub in want.items():
            if prop in value and not _conforms(value[prop], sub, visits):
                return False
    return True


def _required_holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    return not (isinstance(value, dict) and any(prop not in value for prop in want))


def _items_hold(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    if "prefixItems" in schema or not isinstance(want, dict):
        raise _Undecided
    return not isinstance(value, list) or all(_conforms(v, want, visits) for v in value)


def _additional_properties_hold(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    if "patternProperties" in schema or not isinstance(want, bool):
        raise _Undecided
    if want is False and isinstance(value, dict):
        props = schema.get("properties", {})
        return not any(k not in props for k in value)
    return True


def _bound_holds(key: str) -> Callable[[Any, Any, dict, list[int]], bool]:
    """The check of a size or value bound: `minItems` … `maximum`, on the type it is about."""
    kind = "array" if key.endswith("Items") else "string" if key.endswith("Length") else "number"
    is_min = key.startswith("min")

    def holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
        if not _is_a(value, kind):
            return True
        measure = value if kind == "number" else len(value)
        return not ((measure < want) if is_min else (measure > want))

    return holds


def _all_of_holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    return all(_conforms(value, sub, visits) for sub in want)


def _any_of_holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    return any(_conforms(value, sub, visits) for sub in want)


def _one_of_holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    return sum(1 for sub in want if _conforms(value, sub, visits)) == 1


def _not_holds(value: Any, want: Any, schema: dict, visits: list[int]) -> bool:
    return not _conforms(value, want, visits)


_KEYWORD_HOLDS: dict[str, Callable[[Any, Any, dict, list[int]], bool]] = {
    "type": _type_holds,
    "enum": _enum_holds,
    "properties": _properties_hold,
    "required": _required_holds,
    "items": _items_hold,
    "additionalProperties": _additional_properties_hold,
    **{key: _bound_holds(key) for key in ("minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum")},
    "allOf": _all_of_holds,
    "anyOf": _any_of_holds,
    "oneOf": _one_of_holds,
    "not": _not_holds,
}


def quick_valid(value: Any, schema: dict) -> bool:
    """True when `value` certainly satisfies the (well-formed) subset `schema`; False when it may not.

    Most values a run checks are valid, and saying so needs no messages: this pure check answers
    them without importing `jsonschema` (which costs a short run more than its whole engine).
    Anything it does not decide exactly like the library (a refusal included) goes to the library,
    which words the errors.
    """
    try:
        return _conforms(value, schema, [0])
    except (_Undecided, RecursionError, TypeError):
        return False


def validate_instance(value: Any, schema: dict, root_label: str = "$") -> list[str]:
    """Validate a JSON value against a subset schema; return `"<path>: <problem>"` strings.

    An empty list means valid. A malformed or too-deep schema, or an evaluation exceeding the
    visit budget, yields an error rather than an exception or a false "valid".
    """
    if not isinstance(schema, dict):
        return [f"{root_label}: invalid schema: schema must be a mapping"]
    malformed = [p for p in check_schema_definition(schema) if p.kind == "malformed"]
    if malformed:
        return [f"{root_label}: invalid schema (at {_where(p.path)}): {p.message}" for p in malformed]
    if quick_valid(value, schema):
        return []

    token = _budget.set([0])
    try:
        errors = list(_subset_validator()(schema).iter_errors(value))
    except _BudgetExceeded:
        return [f"{root_label}: validation exceeded {MAX_VISITS} steps; simplify the schema"]
    except RecursionError:
        return [f"{root_label}: value nests too deeply to validate"]
    except Exception as exc:  # noqa: BLE001 - a part of the schema the subset check does not vet
        # (e.g. inside an unsupported schema-form keyword) was malformed; report, never raise.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [f"{root_label}: invalid schema: {first}"]
    finally:
        _budget.reset(token)

    return _error_lines(errors, root_label)


def _error_lines(errors: list[Any], root_label: str) -> list[str]:
    """The library's errors as `"<path>: <problem>"` lines, each once. Per node, a type mismatch is the whole
    story: the enum and combinator noise of a node that has one is dropped."""
    typed_nodes = {
        (tuple(e.absolute_path), tuple(e.absolute_schema_path)[:-1]) for e in errors if e.validator == "type"
    }
    out: list[str] = []
    seen: set[str] = set()
    for err in errors:
        node = (tuple(err.absolute_path), tuple(err.absolute_schema_path)[:-1])
        if err.validator != "type" and node in typed_nodes:
            continue
        where = render_path(root_label, err.absolute_path)
        for msg in _messages(err, root_label):
            line = f"{where}: {msg}"
            if line not in seen:
                seen.add(line)
                out.append(line)
    return out
