"""JSON-Schema subset: the authoring check ([R+]) and the bounded runtime validator."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akm.format.schema import (
    MAX_SCHEMA_DEPTH,
    SUPPORTED_KEYWORDS,
    UNSUPPORTED_KEYWORDS,
    check_schema_definition,
    validate_instance,
)


def _nested(depth: int, leaf: dict | None = None) -> dict:
    """`depth` levels of `items` nesting below the root."""
    schema: dict = dict(leaf or {})
    for _ in range(depth):
        schema = {"items": schema}
    return schema


# ------------------------------------------------------------------ authoring check


def test_supported_keyword_set():
    assert SUPPORTED_KEYWORDS == {
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
    assert not SUPPORTED_KEYWORDS & UNSUPPORTED_KEYWORDS


def test_realistic_schema_is_clean():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "x",
        "$comment": "c",
        "title": "T",
        "description": "D",
        "default": {},
        "examples": [{}],
        "x-owner": "ops",
        "deprecated": False,
        "type": ["object", "null"],
        "required": ["files"],
        "additionalProperties": False,
        "properties": {
            "files": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 0, "maxItems": 2.0},
            "count": {"type": "integer", "minimum": -1.5, "maximum": 10},
            "mode": {"enum": ["quick", "full", None, 1]},
            "either": {"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]},
            "all": {"allOf": [{"type": "number"}], "oneOf": [{"minimum": 0}, {"maximum": -1}]},
        },
    }
    assert check_schema_definition(schema) == []


@pytest.mark.parametrize("keyword", sorted(UNSUPPORTED_KEYWORDS))
def test_each_unsupported_keyword_is_reported(keyword):
    problems = check_schema_definition({"type": "object", "properties": {"a": {keyword: "x"}}})
    assert len(problems) == 1
    p = problems[0]
    assert (p.kind, p.keyword, p.path) == ("unsupported", keyword, ("properties", "a"))
    assert keyword in p.message


def test_tuple_items_and_schema_additional_properties_are_unsupported():
    problems = check_schema_definition({"items": [{"type": "string"}], "additionalProperties": {"type": "string"}})
    assert [(p.keyword, p.kind) for p in problems] == [
        ("items", "unsupported"),
        ("additionalProperties", "unsupported"),
    ]


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "str"}, "type"),
        ({"type": []}, "type"),
        ({"type": 3}, "type"),
        ({"type": ["string", "string"]}, "type"),
        ({"type": ["string", 1]}, "type"),
        ({"enum": []}, "enum"),
        ({"enum": "a"}, "enum"),
        ({"allOf": []}, "allOf"),
        ({"anyOf": {"type": "string"}}, "anyOf"),
        ({"oneOf": [{"type": "string"}, 3]}, "oneOf"),
        ({"not": []}, "not"),
        ({"required": "a"}, "required"),
        ({"required": ["a", 1]}, "required"),
        ({"properties": []}, "properties"),
        ({"properties": {"a": "string"}}, "properties"),
        ({"items": "string"}, "items"),
        ({"additionalProperties": "no"}, "additionalProperties"),
        ({"minItems": -1}, "minItems"),
        ({"maxItems": 1.5}, "maxItems"),
        ({"minLength": True}, "minLength"),
        ({"maxLength": "3"}, "maxLength"),
        ({"minimum": "1"}, "minimum"),
        ({"maximum": float("inf")}, "maximum"),
        ({"minimum": False}, "minimum"),
    ],
)
def test_malformed_keywords(schema, keyword):
    problems = check_schema_definition(schema)
    assert [(p.kind, p.keyword) for p in problems] == [("malformed", keyword)]


def test_non_mapping_schema_is_malformed():
    for value in (None, [], "string", 3, True):
        problems = check_schema_definition(value)
        assert len(problems) == 1 and problems[0].kind == "malformed"


def test_problem_paths_follow_subschemas():
    schema = {
        "anyOf": [{"type": "string"}, {"items": {"pattern": "x"}}],
        "not": {"properties": {"k": {"const": 1}}},
        "allOf": [{"type": "bogus"}],
    }
    found = {(p.path, p.keyword) for p in check_schema_definition(schema)}
    assert found == {
        (("anyOf", 1, "items"), "pattern"),
        (("not", "properties", "k"), "const"),
        (("allOf", 0), "type"),
    }


def test_depth_limit():
    assert check_schema_definition(_nested(MAX_SCHEMA_DEPTH, {"type": "string"})) == []
    problems = check_schema_definition(_nested(MAX_SCHEMA_DEPTH + 1))
    assert len(problems) == 1 and problems[0].kind == "malformed" and "deeper than 64" in problems[0].message


def test_huge_shared_subtree_is_bounded():
    # YAML aliases can build a DAG that is exponential as a tree; the check must stay bounded.
    node: dict = {"type": "string"}
    for _ in range(40):
        node = {"anyOf": [node, node]}
    start = time.process_time()  # CPU time of this process: a loaded machine does not inflate it
    problems = check_schema_definition(node)
    assert time.process_time() - start < 5  # unbounded, 2**40 visits would never finish
    assert problems and problems[0].kind == "malformed"


_keys = st.sampled_from(sorted(SUPPORTED_KEYWORDS | UNSUPPORTED_KEYWORDS | {"title", "x-a", "foo"}))
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(_keys | st.text(max_size=3), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(_json)
def test_check_never_raises(value):
    problems = check_schema_definition(value)
    assert all(p.kind in ("unsupported", "malformed") for p in problems)
    # The validator accepts whatever the check accepts (or reports errors) — never raises.
    if isinstance(value, dict):
        out = validate_instance({"a": [1, "x", None]}, value)
        assert isinstance(out, list)


# ------------------------------------------------------------------ runtime validation

PARAMS = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "mode": {"type": "string", "enum": ["quick", "full"]},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "maxItems": 2},
    },
    "required": ["count"],
}


def test_messages_and_paths():
    errors = validate_instance({"count": 0, "mode": "slow", "tags": ["ok", 3, "x"]}, PARAMS)
    assert errors == [
        "$.count: 0 is below minimum 1",
        '$.mode: value "slow" is not one of ["quick","full"]',
        "$.tags[1]: expected type string, got integer",
        "$.tags[2]: string is shorter than minLength 2 (length 1)",
        "$.tags: array has more than maxItems 2 items (has 3)",
    ]


def test_root_label_and_required_and_type():
    assert validate_instance({}, PARAMS, root_label="params") == ['params: missing required property "count"']
    assert validate_instance("x", {"type": "object"}) == ["$: expected type object, got string"]
    assert validate_instance({"count": 11}, PARAMS, "params") == ["params.count: 11 is above maximum 10"]
    assert validate_instance({"a b": 1}, {"properties": {"a b": {"type": "string"}}}) == [
        '$["a b"]: expected type string, got integer'
    ]


def test_type_mismatch_suppresses_other_keywords_on_that_node():
    assert validate_instance(5, {"type": "string", "enum": ["a"]}) == ["$: expected type string, got integer"]


def test_js_number_semantics():
    assert validate_instance(2.0, {"type": "integer"}) == []
    assert validate_instance(2.5, {"type": "integer"}) == ["$: expected type integer, got number"]
    assert validate_instance(True, {"type": "number"}) == ["$: expected type number, got boolean"]
    assert validate_instance(True, {"type": "integer"}) == ["$: expected type integer, got boolean"]
    assert validate_instance(1, {"type": "boolean"}) == ["$: expected type boolean, got integer"]
    assert validate_instance(3, {"type": "number"}) == []
    assert validate_instance(None, {"type": ["string", "null"]}) == []
    # enum is strict: true is not 1 and 1 is not true; 1.0 equals 1.
    assert validate_instance(1, {"enum": [True]}) != []
    assert validate_instance(True, {"enum": [1]}) != []
    assert validate_instance(1.0, {"enum": [1]}) == []


def test_additional_properties_false():
    assert validate_instance({}, {"additionalProperties": False}) == []
    assert validate_instance({"x": 1}, {"additionalProperties": False}) == [
        '$: unexpected property "x" (additionalProperties: false)'
    ]
    schema = {"properties": {"a": {}}, "additionalProperties": False}
    assert validate_instance({"a": 1, "b": 2, "c": 3}, schema) == [
        '$: unexpected property "b" (additionalProperties: false)',
        '$: unexpected property "c" (additionalProperties: false)',
    ]


def test_combinators():
    any_of = {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 10}]}
    assert validate_instance("x", any_of) == []
    (err,) = validate_instance(3, any_of)
    assert err.startswith("$: does not match any schema in anyOf")
    assert "branch 1: $: expected type string, got integer" in err
    assert "branch 2: $: 3 is below minimum 10" in err

    one_of = {"oneOf": [{"type": "integer"}, {"minimum": 0}]}
    assert validate_instance(-1, one_of) == []
    assert validate_instance(5, one_of) == ["$: matches more than one schema in oneOf (exactly one must match)"]
    assert validate_instance("s", {"oneOf": [{"type": "integer"}]})[0].startswith(
        "$: does not match any schema in oneOf"
    )

    assert validate_instance(1, {"not": {"type": "integer"}}) == ['$: must not match the schema in "not"']
    assert validate_instance("a", {"not": {"type": "integer"}}) == []

    # allOf errors surface as the branch's own errors.
    assert validate_instance({"n": 0}, {"allOf": [{"properties": {"n": {"minimum": 1}}}, {"required": ["m"]}]}) == [
        "$.n: 0 is below minimum 1",
        '$: missing required property "m"',
    ]


def test_unsupported_keywords_are_inert_at_runtime():
    schema = {"type": "string", "pattern": "^a", "format": "email", "$ref": "https://example.invalid/s.json"}
    assert validate_instance("zzz", schema) == []


def test_string_length_counts_code_points():
    assert validate_instance("😀", {"maxLength": 1}) == []


def test_malformed_schema_is_an_error_not_an_exception():
    (err,) = validate_instance(1, {"anyOf": [{"type": "nope"}]})
    assert err.startswith("$: invalid schema (at anyOf[0]):")
    assert validate_instance(1, "not a schema")  # type: ignore[arg-type]


def test_deep_schemas():
    inst: object = "x"
    for _ in range(MAX_SCHEMA_DEPTH):
        inst = [inst]
    assert validate_instance(inst, _nested(MAX_SCHEMA_DEPTH, {"type": "string"})) == []
    bad = validate_instance(inst, _nested(MAX_SCHEMA_DEPTH, {"type": "integer"}))
    assert len(bad) == 1 and bad[0].endswith("expected type integer, got string")
    (err,) = validate_instance([], _nested(MAX_SCHEMA_DEPTH + 1))
    assert "deeper than 64" in err


def test_visit_budget_turns_blowup_into_an_error():
    schema = {"items": {"anyOf": [{"type": "integer", "minimum": i} for i in range(10)]}}
    assert validate_instance([9] * 100, schema) == []
    start = time.process_time()  # CPU time of this process: a loaded machine does not inflate it
    (err,) = validate_instance(["x"] * 20_000, schema)  # 200k+ keyword visits
    assert "exceeded 100000 steps" in err
    assert time.process_time() - start < 10


def test_pathologically_deep_instance_is_an_error_not_a_crash():
    inst: object = 1
    for _ in range(5000):
        inst = [inst]
    assert validate_instance(inst, {"type": "array"}) == []
    (err,) = validate_instance(inst, {"enum": ["a"]})
    assert err.startswith("$: ")


# ------------------------------------------------------------------ the quick check agrees with the library

_scalar = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, 1.0, 1.5, -2.0]) | st.text(max_size=3)
_values = st.recursive(
    _scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from("abc"), c, max_size=3), max_leaves=8
)
_types = st.sampled_from(sorted(["string", "number", "integer", "boolean", "object", "array", "null"]))


def _schemas(children):
    small = st.integers(0, 3)
    return st.one_of(
        st.fixed_dictionaries({"type": _types | st.lists(_types, min_size=1, max_size=2, unique=True)}),
        st.fixed_dictionaries({"enum": st.lists(_values, min_size=1, max_size=3)}),
        st.fixed_dictionaries(
            {"properties": st.dictionaries(st.sampled_from("abc"), children, max_size=2)},
            optional={
                "required": st.lists(st.sampled_from("abc"), max_size=2, unique=True),
                "additionalProperties": st.booleans(),
            },
        ),
        st.fixed_dictionaries({"items": children}, optional={"minItems": small, "maxItems": small}),
        st.fixed_dictionaries({"minLength": small}, optional={"maxLength": small, "description": st.text(max_size=3)}),
        st.fixed_dictionaries({"minimum": st.integers(-2, 2)}, optional={"maximum": st.sampled_from([0, 1.5, 2])}),
        st.fixed_dictionaries(
            {st.sampled_from(["allOf", "anyOf", "oneOf"]): st.lists(children, min_size=1, max_size=3)}
        ),
        st.fixed_dictionaries({"not": children}),
    )


_schema = st.recursive(st.just({}) | _schemas(st.just({})), _schemas, max_leaves=6)


@settings(max_examples=400, deadline=None)
@given(schema=_schema, value=_values)
def test_quick_check_decides_like_the_library(schema, value):
    """`validate_instance` answers valid values without the library (no jsonschema import): the quick
    check must agree with the library on every value it calls valid, and call valid what the library does."""
    from akm.format.schema import _subset_validator, quick_valid

    library_ok = not list(_subset_validator()(schema).iter_errors(value))
    assert quick_valid(value, schema) == library_ok, (schema, value)


def test_a_valid_value_needs_no_jsonschema_import():
    import subprocess
    import sys

    code = (
        "import sys; from akm.format.schema import validate_instance as v; "
        "assert v({'xs': [1, 2.0], 'n': 'a'}, {'type': 'object', 'properties': {'xs': {'type': 'array', "
        "'items': {'type': 'integer'}}, 'n': {'enum': ['a', 'b']}}, 'required': ['xs']}) == []; "
        "assert 'jsonschema' not in sys.modules; "
        "assert v(3, {'type': 'string'}) == ['$: expected type string, got integer']"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
