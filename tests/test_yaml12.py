"""YAML 1.2 core-schema meaning (DECISIONS D3) and line anchors for diagnostics."""

from __future__ import annotations

import math
import time

import pytest
import yaml

from akm.format.yaml12 import MAX_ALIAS_EXPANSION, Yaml12Loader, js_string, load_yaml


def value_of(text: str):
    doc = load_yaml(text)
    assert doc.problems == [], doc.problems
    return doc.value


@pytest.mark.parametrize("word", ["on", "off", "yes", "no", "y", "n", "Y", "N", "On", "NO", "Yes"])
def test_yaml11_booleans_stay_strings(word: str) -> None:
    assert value_of(f"v: {word}\n") == {"v": word}
    assert value_of(f"{word}: 1\n") == {word: 1}


def test_retry_on_key_is_the_string_on() -> None:
    assert value_of("retry: { max: 1, on: [timeout] }\n") == {"retry": {"max": 1, "on": ["timeout"]}}


@pytest.mark.parametrize("text", ["2026-01-01", "2001-12-14t21:59:43.10-05:00", "2026-01-01 10:00:00"])
def test_dates_and_timestamps_stay_strings(text: str) -> None:
    assert value_of(f"updated: {text}\n") == {"updated": text}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1_000", "1_000"),
        ("017", 17),
        ("-017", -17),
        ("+5", 5),
        ("0o17", 15),
        ("0x1F", 31),
        ("0b101", "0b101"),
        ("1:30", "1:30"),  # YAML 1.1 sexagesimal is just text
        ("1.5", 1.5),
        ("1.", 1.0),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("-2.5E-3", -0.0025),
        ("true", True),
        ("False", False),
        ("TRUE", True),
        ("tRUE", "tRUE"),
        ("null", None),
        ("Null", None),
        ("~", None),
        ("", None),
        ("NULL", None),
        ("nULL", "nULL"),
        ("'yes'", "yes"),
        ("!!str 12", "12"),
        ("!!int '12'", 12),
        ("!!float 1", 1.0),
    ],
)
def test_core_schema_scalars(text: str, expected) -> None:
    got = value_of(f"v: {text}\n")["v"]
    assert got == expected and type(got) is type(expected)


def test_special_floats() -> None:
    v = value_of("a: .inf\nb: -.Inf\nc: .NaN\n")
    assert v["a"] == math.inf and v["b"] == -math.inf and math.isnan(v["c"])


def test_merge_key_is_a_plain_key() -> None:
    v = value_of("base: &b { x: 1 }\nderived:\n  <<: *b\n  y: 2\n")
    assert v["derived"] == {"<<": {"x": 1}, "y": 2}


def test_duplicate_key_is_an_error_with_both_lines() -> None:
    doc = load_yaml("a: 1\nb:\n  c: 1\n  c: 2\n")
    assert doc.value is None
    [p] = doc.problems
    assert (p.code, p.line, p.column, p.first_line) == ("duplicate_key", 4, 3, 3)
    assert '"c"' in p.message


def test_keys_are_stringified_and_collisions_are_duplicates() -> None:
    assert value_of("1: a\ntrue: b\n~: c\n1.5: d\n") == {"1": "a", "true": "b", "": "c", "1.5": "d"}
    assert load_yaml("1: a\n1.0: b\n").problems[0].code == "duplicate_key"


def test_complex_keys_are_refused() -> None:
    [p] = load_yaml("? [a, b]\n: 1\n").problems
    assert p.code == "yaml_syntax" and p.line == 1


def test_aliases_expand_normally_when_small() -> None:
    assert value_of("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}


def test_billion_laughs_is_refused_quickly() -> None:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*l{i - 1}"
        lines.append(f"l{i}: &l{i} [{', '.join([prev] * 10)}]")
    start = time.perf_counter()
    doc = load_yaml("\n".join(lines) + "\n")
    # refused at the bound, not after expanding 10^9 nodes (hours); generous for a loaded CI box
    assert time.perf_counter() - start < 60.0
    [p] = doc.problems
    assert p.code == "yaml_alias_expansion"
    assert str(MAX_ALIAS_EXPANSION) in p.message


def test_recursive_alias_is_refused() -> None:
    [p] = load_yaml("a: &a\n  - *a\n").problems
    assert p.code == "yaml_alias_expansion" and "recursive" in p.message


@pytest.mark.parametrize("tag", ["!!binary aGk=", "!!set {a}", "!custom x", "!!timestamp 2026-01-01"])
def test_unsupported_tags(tag: str) -> None:
    [p] = load_yaml(f"a: 1\nb: {tag}\n").problems
    assert p.code == "yaml_unsupported_tag" and p.line == 2


@pytest.mark.parametrize(
    ("text", "line"),
    [("a: b: c\n", 1), ("a: 1\nb: [1, 2\n", 3), ("a:\n\t- x\n", 2), ("a: 1\n  b: 2\n", 2), ("a: *nope\n", 1)],
)
def test_syntax_errors_have_lines(text: str, line: int) -> None:
    [p] = load_yaml(text).problems
    assert p.code == "yaml_syntax" and p.line == line
    assert p.message and "\n" not in p.message


def test_control_characters_and_deep_nesting_are_problems_not_exceptions() -> None:
    assert load_yaml("a: 1\nb: \x01\n").problems[0].line == 2
    assert load_yaml("[" * 5000).problems[0].code == "yaml_syntax"
    assert load_yaml("a: " + "[" * 300 + "]" * 300).problems[0].code == "yaml_syntax"


def test_marks_for_keys_and_values() -> None:
    doc = load_yaml(
        "steps:\n"
        "  - id: a\n"
        "    unit: { retry: { max: 1, on: [timeout] } }\n"
        "  - id: b\n"
        "    inputs:\n"
        "      - steps.a.output\n"
    )
    assert doc.value_marks[("steps", 0)] == (2, 5)
    assert doc.value_marks[("steps", 1)] == (4, 5)
    assert doc.key_marks[("steps", 0, "unit")] == (3, 5)
    assert doc.key_marks[("steps", 0, "unit", "retry", "on")][0] == 3
    assert doc.value_marks[("steps", 1, "inputs", 0)] == (6, 9)
    assert doc.mark_of(("steps", 1, "inputs"))[0] == 6  # block value starts on the next line
    assert doc.mark_of(("steps", 1, "inputs"), key=True)[0] == 5
    assert doc.mark_of(("steps", 1, "nothing", "deeper"))[0] == 4  # walks up to the nearest anchor


def test_empty_document_is_none() -> None:
    doc = load_yaml("")
    assert doc.value is None and doc.problems == []


def test_stock_loader_api_has_the_same_meaning() -> None:
    data = yaml.load("a: on\nb: 2026-01-01\nc: 0x10\nd: 017\n<<: x\n", Loader=Yaml12Loader)
    assert data == {"a": "on", "b": "2026-01-01", "c": 16, "d": 17, "<<": "x"}
    with pytest.raises(yaml.YAMLError):
        yaml.load("a: 1\na: 2\n", Loader=Yaml12Loader)
    with pytest.raises(yaml.YAMLError):
        yaml.load("a: !!binary aGk=\n", Loader=Yaml12Loader)
    with pytest.raises(yaml.YAMLError):
        yaml.load("? [a]\n: 1\n", Loader=Yaml12Loader)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (None, "null"),
        (1, "1"),
        (1.0, "1"),
        (-0.0, "0"),
        (1e3, "1000"),
        (0.1, "0.1"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (2.5e-7, "2.5e-7"),
        (0.000001, "0.000001"),
        (1.5e300, "1.5e+300"),
        (-123.456, "-123.456"),
        (math.inf, "Infinity"),
        (math.nan, "NaN"),
        ("x", "x"),
    ],
)
def test_js_string(value, text: str) -> None:
    assert js_string(value) == text
