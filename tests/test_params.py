"""Run params from CLI flags (spec-format §4.6, acceptance §8 items 51–55)."""

from __future__ import annotations

import pytest

from akm.errors import EXIT_USAGE, UsageError
from akm.format.params import (
    RUN_CONTROL_BOOL_FLAGS,
    RUN_CONTROL_VALUE_FLAGS,
    RunArgs,
    coerce_params,
    js_number,
    split_run_args,
)

SCHEMAS = {
    "include_processes": {"type": "boolean"},
    "count": {"type": "integer", "minimum": 1},
    "name": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "metadata": {"type": "object"},
    "mode": {"type": "string", "enum": ["quick", "full"]},
    "strict": {"type": "boolean"},
}


def _params(tokens: list[str], schemas: dict = SCHEMAS) -> dict:
    args = split_run_args(["workflows/x", *tokens])
    return coerce_params(args.params, schemas)


def _usage(fn, *args) -> UsageError:
    with pytest.raises(UsageError) as info:
        fn(*args)
    assert info.value.exit_status == EXIT_USAGE
    return info.value


def test_acceptance_51():
    tokens = [
        "workflows/x",
        "--include_processes=true",
        "--count",
        "3",
        "--name=001",
        "--tags",
        "api",
        "--tags=worker",
        '--metadata={"owner":"ops"}',
        "--mode",
        "quick",
        "--max-steps",
        "1",
        "--timeout",
        "5m",
        "--format=json",
    ]
    args = split_run_args(tokens)
    assert args.target == "workflows/x"
    assert args.controls == {"max-steps": "1", "timeout": "5m", "format": "json"}
    params = coerce_params(args.params, SCHEMAS)
    assert params == {
        "include_processes": True,
        "count": 3,
        "name": "001",
        "tags": ["api", "worker"],
        "metadata": {"owner": "ops"},
        "mode": "quick",
    }
    assert type(params["count"]) is int


def test_acceptance_52_names_must_match_exactly():
    err = _usage(_params, ["--include-processes"])
    assert err.code == "UNKNOWN_FLAG"
    assert "--include-processes" in err.message and "must exactly match" in err.message
    assert "--include_processes" in err.hint and "--count" in err.hint


def test_unknown_flag_without_declared_params():
    err = _usage(_params, ["--x", "1"], {})
    assert err.code == "UNKNOWN_FLAG" and "declares no params" in err.hint


@pytest.mark.parametrize(
    ("tokens", "fragment"),
    [
        (["--count", "2", "--count", "3"], "provided more than once"),
        (["--count", "0"], "below minimum"),
        (["--mode", "slow"], "not one of"),
        (["--metadata", "nope"], "must contain valid JSON"),
        (["--count"], "is declared as integer, not boolean"),
        (["--count", "abc"], "must be integer"),
        (["--count", "1.5"], "must be integer"),
        (["--tags", "[oops"], "must contain valid JSON"),
        (["--tags", "[1]"], "params.tags[0]: expected type string"),
        (["--metadata", "[1]"], "must be object"),
    ],
)
def test_acceptance_53_55_errors(tokens, fragment):
    err = _usage(_params, tokens)
    assert err.code == "INVALID_ARGUMENT"
    assert fragment in err.message


def test_schema_errors_name_the_param():
    err = _usage(_params, ["--count", "0"])
    assert "params.count: 0 is below minimum 1" in err.message
    assert err.details["errors"] == ["params.count: 0 is below minimum 1"]


def test_acceptance_55_values():
    assert _params(["--tags", '["a","b"]']) == {"tags": ["a", "b"]}
    assert _params(["--tags", ' ["a"] ']) == {"tags": ["a"]}
    assert _params(["--tags", '{"a":1}']) == {"tags": ['{"a":1}']}  # not '[': one element
    assert _params(["--strict"]) == {"strict": True}
    assert _params(["--name="]) == {"name": ""}
    assert _params(["--strict=false"]) == {"strict": False}


def test_bare_flag_for_a_non_boolean_param_is_an_error_naming_it():
    # issue 6 item 9: a bare --name used to become the string "true"
    for tokens, name in ((["--name"], "name"), (["--count"], "count"), (["--tags"], "tags")):
        err = _usage(_params, tokens)
        assert err.code == "INVALID_ARGUMENT"
        assert f"Param {name} needs a value" in err.message


def test_array_items_are_coerced():
    schemas = {"ids": {"type": "array", "items": {"type": "integer"}}, "raw": {"type": "array"}}
    assert _params(["--ids", "1", "--ids", "1e1", "--ids=-3"], schemas) == {"ids": [1, 10, -3]}
    assert _params(["--raw", "a", "--raw"], schemas) == {"raw": ["a", True]}
    assert _usage(_params, ["--ids", "x"], schemas).code == "INVALID_ARGUMENT"
    # A single value that does not start with '[' is one element, kept as typed text.
    assert _params(["--raw", '{"a": 1}'], schemas) == {"raw": ['{"a": 1}']}
    schemas = {"one": {"type": "array"}}
    assert _params(["--one", "[]"], schemas) == {"one": []}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3", 3),
        (" 7 ", 7),
        ("1.0", 1),
        ("1e3", 1000),
        ("0x10", 16),
        ("0X1f", 31),
        ("0o17", 15),
        ("0b101", 5),
        ("017", 17),
        ("-3", -3),
        ("+4", 4),
        ("1.", 1),
        (".5", 0.5),
        ("-2.5e-1", -0.25),
        ("\u00a08\ufeff", 8),
        ("", None),
        ("   ", None),
        ("abc", None),
        ("1_000", None),
        ("nan", None),
        ("NaN", None),
        ("Infinity", None),
        ("-Infinity", None),
        ("inf", None),
        ("1e400", None),
        ("-0x10", None),
        ("0x", None),
        ("1e", None),
        ("12px", None),
        ("0x" + "f" * 300, None),
    ],
)
def test_js_number(text, expected):
    got = js_number(text)
    assert got == expected
    if expected is not None:
        assert type(got) is type(expected)


@pytest.mark.parametrize(
    ("schema", "raw", "expected"),
    [
        ({"type": "integer"}, "1e3", 1000),
        ({"type": "integer"}, "9007199254740991", 9007199254740991),
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "boolean"}, "true", True),
        ({"type": "string"}, "001", "001"),
        ({"type": ["integer", "string"]}, "5", "5"),  # string wins: exact text kept
        ({"type": ["boolean", "integer"]}, "1", 1),
        ({"type": ["integer", "null"]}, "null", None),
        ({"type": ["null", "object"]}, '{"a": [1]}', {"a": [1]}),
        ({"description": "untyped"}, "anything", "anything"),
        ({"description": "untyped"}, True, True),
        ({}, "x", "x"),
    ],
)
def test_coercion(schema, raw, expected):
    assert coerce_params([("p", raw)], {"p": schema}) == {"p": expected}


@pytest.mark.parametrize(
    ("schema", "raw", "fragment"),
    [
        ({"type": "integer"}, "9007199254740993", "outside the supported range"),
        ({"type": "integer"}, "", "must be integer"),
        ({"type": "number"}, "Infinity", "must be number"),
        ({"type": "boolean"}, "True", "must be boolean"),
        ({"type": "boolean"}, "yes", "must be boolean"),
        ({"type": "null"}, "", "must be null"),
        ({"type": ["integer", "boolean"]}, "x", "must be integer or boolean"),
        ({"type": "object"}, "{bad", "must contain valid JSON"),
        ({"type": "object"}, "NaN", "must contain valid JSON"),
        ({"type": "number"}, True, "is declared as number, not boolean"),
        ({"type": "string"}, True, "is declared as string, not boolean"),
    ],
)
def test_coercion_errors(schema, raw, fragment):
    err = _usage(coerce_params, [("p", raw)], {"p": schema})
    assert err.code == "INVALID_ARGUMENT"
    assert fragment in err.message and "--p" in err.message


def test_missing_params_are_fine_and_order_is_first_appearance():
    assert coerce_params([], SCHEMAS) == {}
    out = coerce_params([("name", "a"), ("count", "2")], SCHEMAS)
    assert list(out) == ["name", "count"]


# ------------------------------------------------------------------ tokenisation


def test_split_basic_forms():
    args = split_run_args(["./release.md", "--a", "x", "--b=", "--c", "--d", "-5", "--e", "--f=-x"])
    assert args == RunArgs(
        target="./release.md",
        controls={},
        params=[("a", "x"), ("b", ""), ("c", True), ("d", "-5"), ("e", True), ("f", "-x")],
    )


def test_controls_anywhere_and_consumed():
    args = split_run_args(["--max-steps", "2", "--quiet", "-q", "run-123", "--verbose", "--timeout=10s", "--help"])
    assert args.target == "run-123"
    assert args.params == []
    assert args.controls == {"max-steps": "2", "quiet": True, "timeout": "10s", "verbose": True, "help": True}
    assert split_run_args(["-h"]).controls == {"help": True}
    assert split_run_args(["--quiet=false", "w"]).controls == {"quiet": False}


def test_reserved_names_are_run_controls_not_params():
    assert set(RUN_CONTROL_VALUE_FLAGS) == {"max-steps", "timeout", "format", "from"}
    assert set(RUN_CONTROL_BOOL_FLAGS) == {"help", "quiet", "verbose", "new", "detach", "workers", "plan"}
    args = split_run_args(["w", "--timeout", "5m", "--format", "json"])
    assert args.params == [] and args.controls == {"timeout": "5m", "format": "json"}
    # Even when the workflow declares a param called `timeout`, the flag never reaches it.
    assert coerce_params(args.params, {"timeout": {"type": "string"}}) == {}


def test_negative_number_can_be_the_target_position_value():
    args = split_run_args(["w", "--count", "-1"])
    assert args.params == [("count", "-1")]


@pytest.mark.parametrize(
    ("tokens", "code", "fragment"),
    [
        (["--count", "2", "workflows/x"], "INVALID_ARGUMENT", "must come after the workflow path, ref or run id"),
        (["--count"], "INVALID_ARGUMENT", "must come after"),
        (["w", "other"], "INVALID_ARGUMENT", "must come after"),
        (["w", "--"], "INVALID_ARGUMENT", "must come after"),
        (["--", "w"], "INVALID_ARGUMENT", "must come after"),
        (["w", "--params", "{}"], "INVALID_ARGUMENT", "--params was removed; pass each param as --name value"),
        (["w", "--params={}"], "INVALID_ARGUMENT", "--params was removed"),
        (["w", "--max-steps"], "INVALID_ARGUMENT", "--max-steps requires a value"),
        (["w", "--format", "--quiet"], "INVALID_ARGUMENT", "--format requires a value"),
        (["w", "--quiet=yes"], "INVALID_ARGUMENT", "--quiet takes no value"),
        (["w", "--=x"], "INVALID_ARGUMENT", "Malformed flag"),
        (["w", "-x"], "UNKNOWN_FLAG", 'Unknown option "-x"'),
    ],
)
def test_split_errors(tokens, code, fragment):
    err = _usage(split_run_args, tokens)
    assert err.code == code
    assert fragment in err.message


def test_params_flag_before_target_even_after_controls():
    err = _usage(split_run_args, ["--quiet", "--n", "1", "w"])
    assert "--n" in err.message and "must come after" in err.message


def test_no_tokens():
    assert split_run_args([]) == RunArgs(target=None, controls={}, params=[])


@pytest.mark.parametrize("raw", ["0x10", "0X1f", "0o17", "0b101", " 0x10 "])
@pytest.mark.parametrize("kind", ["integer", "number"])
def test_radix_literals_are_not_coerced_to_numbers(raw, kind):
    """`--count 0x10` is refused with the decimal spelling, not silently read as 16 (issue 23)."""
    err = _usage(_params, ["--count", raw], {"count": {"type": kind}})
    assert err.code == "INVALID_ARGUMENT" and "decimal" in err.message and "count" in err.message
    assert _params(["--count", raw], {"count": {"type": ["integer", "string"]}}) == {"count": raw}
