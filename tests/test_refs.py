"""Reference grammar (spec-format §3): parsing, canonical spelling, syntax errors, resolution."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from akm.format.refs import (
    Reference,
    ReferenceResolutionError,
    ReferenceSyntaxError,
    parse_reference,
    resolve_reference,
)


@pytest.mark.parametrize(
    ("text", "root", "name", "path", "canonical"),
    [
        ("params.files", "params", "files", (), "params.files"),
        ("  params.files\t", "params", "files", (), "params.files"),
        ("params.my-x", "params", "my-x", (), "params.my-x"),  # ident admits '-'; never resolves
        ("steps.a.output", "steps", "a", (), "steps.a.output"),
        ("steps.first-step.output", "steps", "first-step", (), "steps.first-step.output"),
        ("steps.b.output.x[0].y_z", "steps", "b", ("x", 0, "y_z"), "steps.b.output.x[0].y_z"),
        ("steps.b.output[007]", "steps", "b", (7,), "steps.b.output[7]"),
        ("steps._s.output[0][12].k-2", "steps", "_s", (0, 12, "k-2"), "steps._s.output[0][12].k-2"),
        ("steps.a.output.output", "steps", "a", ("output",), "steps.a.output.output"),
    ],
)
def test_parse_valid(text, root, name, path, canonical):
    ref = parse_reference(text)
    assert ref == Reference(root=root, name=name, path=path, text=canonical)
    assert str(ref) == canonical


@pytest.mark.parametrize(
    ("text", "fragment", "offset"),
    [
        ("", "Empty reference", 0),
        ("   ", "Empty reference", 0),
        ("1abc", "must start with an identifier", 0),
        (".params.x", "must start with an identifier", 0),
        ("changed_files", 'Unknown root "changed_files"', 0),
        ("the params.files list", 'Unknown root "the"', 0),
        ("item", 'Unknown root "item"', 0),
        ("params", "requires a name", 6),
        ("params.", "requires a name", 7),
        ("params[0]", "requires a name", 6),
        ("params.1x", "Invalid param name", 7),
        ("params.a.b", "takes exactly one name — found trailing", 8),
        ("params.a b", "takes exactly one name — found trailing", 8),
        ("steps", 'must be followed by a step id and ".output"', 5),
        ("steps.", 'must be followed by a step id and ".output"', 5),
        ("steps.9", 'must be followed by a step id and ".output"', 5),
        ("steps.x", 'must be followed by ".output"', 7),
        ("steps.a.outputs", 'Expected ".output"', 7),
        ("steps.a[0]", 'Expected ".output"', 7),
        ("steps.a.", 'Expected ".output"', 7),
        ("steps.a.output.", "Invalid path segment", 15),
        ("steps.a.output.9", "Invalid path segment", 15),
        ("steps.a.output[-1]", "Invalid indexer", 14),
        ("steps.a.output[]", "Invalid indexer", 14),
        ("steps.a.output[x]", "Invalid indexer", 14),
        ("steps.a.output[1", "Invalid indexer", 14),
        ("steps.a.output[99999999999999999999]", "Invalid indexer", 14),
        ("steps.a.output x", "Unexpected character", 14),
        ("steps.a.output+1", "Unexpected character", 14),
        ("steps.a.output[٣]", "Invalid indexer", 14),  # non-ASCII digit is not a digit here
    ],
)
def test_syntax_errors(text, fragment, offset):
    with pytest.raises(ReferenceSyntaxError) as info:
        parse_reference(text)
    assert fragment in info.value.message
    assert str(info.value) == info.value.message
    assert info.value.offset == offset


def test_offsets_are_relative_to_trimmed_text():
    with pytest.raises(ReferenceSyntaxError) as info:
        parse_reference("   params.a.b   ")
    assert info.value.offset == 8


def test_non_string_is_a_syntax_error():
    with pytest.raises(ReferenceSyntaxError):
        parse_reference(42)  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=60))
def test_parse_never_raises_anything_else(text):
    try:
        ref = parse_reference(text)
    except ReferenceSyntaxError as exc:
        assert 0 <= exc.offset <= len(text.strip())
        assert exc.message
    else:
        # Canonical text parses back to the same reference.
        assert parse_reference(ref.text) == ref


_ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
_alphabet = st.sampled_from(list("params.steps.output[]0123456789_-ab. x"))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_alphabet, max_size=40))
def test_grammar_like_noise_never_raises_anything_else(text):
    try:
        parse_reference(text)
    except ReferenceSyntaxError:
        pass


@settings(max_examples=200, deadline=None)
@given(_ident, st.lists(st.one_of(_ident, st.integers(0, 10**6)), max_size=6))
def test_generated_step_refs_round_trip(step_id, path):
    text = "steps." + step_id + ".output" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    ref = parse_reference(text)
    assert ref.root == "steps" and ref.name == step_id and ref.path == tuple(path)
    assert ref.text == text


# ------------------------------------------------------------------ resolution


def _resolve(text, params=None, outputs=None):
    return resolve_reference(parse_reference(text), params or {}, outputs or {})


def test_resolve_params_and_steps():
    outputs = {"a": {"files": ["x.py", {"name": "y"}], "n": 0, "ok": False}, "r": {"route": {"value": "hi"}}}
    assert _resolve("params.mode", {"mode": "fast"}) == "fast"
    assert _resolve("steps.a.output", outputs=outputs) == outputs["a"]
    assert _resolve("steps.a.output.files[1].name", outputs=outputs) == "y"
    assert _resolve("steps.a.output.files[0]", outputs=outputs) == "x.py"
    # Falsy values are values, not missing.
    assert _resolve("steps.a.output.n", outputs=outputs) == 0
    assert _resolve("steps.a.output.ok", outputs=outputs) is False
    assert _resolve("steps.r.output.route.value", outputs=outputs) == "hi"


@pytest.mark.parametrize(
    ("text", "params", "outputs", "fragment"),
    [
        ("params.x", {}, {}, "params.x is not defined in the run's params"),
        ("params.x", {"x": None}, {}, "params.x resolved to null"),
        ("steps.s.output", {}, {}, "steps.s.output is not available"),
        ("steps.s.output[0]", {}, {"s": {"a": 1}}, "steps.s.output is not an array"),
        ("steps.s.output[2]", {}, {"s": [1, 2]}, "steps.s.output[2] is out of bounds (array length 2)"),
        ("steps.s.output.a", {}, {"s": [1, 2]}, "steps.s.output is not an object"),
        ("steps.s.output.a.b", {}, {"s": {"a": None}}, "steps.s.output.a is not an object"),
        ("steps.s.output.a", {}, {"s": "text"}, "steps.s.output is not an object"),
        ("steps.s.output.b", {}, {"s": {"a": 1}}, "steps.s.output.b is missing"),
        ("steps.s.output", {}, {"s": None}, "steps.s.output resolved to null"),
        ("steps.s.output[1]", {}, {"s": ["a", None]}, "steps.s.output[1] resolved to null"),
        # Own keys only: no attribute or prototype-like lookups.
        ("steps.s.output.keys", {}, {"s": {}}, "steps.s.output.keys is missing"),
        ("steps.s.output.constructor", {}, {"s": {}}, "is missing"),
        ("steps.s.output.x", {}, {"s": {"x": 1}, "t": 2}, None),
    ],
)
def test_resolution_errors(text, params, outputs, fragment):
    if fragment is None:
        assert _resolve(text, params, outputs) == 1
        return
    with pytest.raises(ReferenceResolutionError) as info:
        _resolve(text, params, outputs)
    assert fragment in info.value.message


def test_dash_param_never_resolves_from_declared_names():
    with pytest.raises(ReferenceResolutionError, match="not defined"):
        _resolve("params.my-x", {"my_x": 1})
