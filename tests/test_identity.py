"""Golden vectors for plan hashes, unit ids and input hashes.

These must never change silently: a change re-dispatches (or diverges) every
journaled unit of every existing run. The vectors agree with the upstream
tool's published values, which is a useful cross-check of our canonical JSON.
"""

import pytest

from akm.canonical import CanonicalError, canonical_json
from akm.plan.identity import (
    attempt_id,
    base_of_attempt,
    gate_row_id,
    item_unit_id,
    journal_base_id,
    solo_unit_id,
    unit_input_hash,
)
from akm.plan.model import ExecSpec, Invocation, Plan, PlanError, UnitNode

SHIP_PLAN = {
    "irVersion": 3,
    "title": "ship",
    "params": ["version"],
    "paramSchemas": {"version": {"type": "string", "description": "Semver"}},
    "execution": {
        "maxConcurrency": 2,
        "engines": {
            "fast": {
                "name": "fast",
                "kind": "llm",
                "endpoint": "https://api.example.test/v1/chat/completions",
                "model": "gpt-x",
                "concurrency": 1,
                "credential": {"names": ["AKM_ENGINE_FAST_API_KEY"], "required": False},
            }
        },
    },
    "steps": [
        {
            "stepId": "check",
            "title": "check",
            "sequenceIndex": 0,
            "root": {
                "kind": "unit",
                "id": "check",
                "instructions": "Check the version.",
                "templating": "verbatim",
                "invocation": {"engine": "fast", "model": "gpt-x", "timeoutMs": 600000},
                "onError": "fail",
                "isolation": "none",
                "source": {"path": "workflows/ship.md", "start": 9, "end": 11},
            },
            "gate": {
                "kind": "gate",
                "id": "check.gate",
                "stepId": "check",
                "criteria": [],
                "maxLoops": 1,
                "judge": None,
            },
        }
    ],
}
SHIP_HASH = "d48432bba09dd901da8fb15a0fab7e7f3b94279f0cecf69edcd15254e0993723"


def _reorder(value):
    if isinstance(value, dict):
        return {k: _reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reorder(v) for v in value]
    return value


def test_plan_hash_golden_and_key_order_independent():
    plan = Plan.model_validate(SHIP_PLAN)
    assert plan.plan_hash() == SHIP_HASH
    assert Plan.model_validate(_reorder(SHIP_PLAN)).plan_hash() == SHIP_HASH


def test_plan_round_trips_byte_identical():
    plan = Plan.model_validate(SHIP_PLAN)
    text = plan.canonical()
    import json

    assert Plan.model_validate(json.loads(text)).canonical() == text


def test_plan_decoder_is_strict():
    bad = dict(SHIP_PLAN, surprise=1)
    with pytest.raises(PlanError, match="surprise"):
        Plan.model_validate(bad)


def test_canonical_json_rules():
    assert canonical_json({"b": 1, "a": 2, "é": 3, "Z": 4, "_": 5}) == '{"Z":4,"_":5,"a":2,"b":1,"é":3}'
    assert canonical_json([1.0, 0.5, -0.0, 2]) == "[1,0.5,0,2]"
    assert canonical_json("line\nbreak\u0001") == '"line\\nbreak\\u0001"'
    with pytest.raises(CanonicalError):
        canonical_json(float("nan"))
    with pytest.raises(CanonicalError):
        canonical_json({1: "x"})
    deep: list = []
    cur = deep
    for _ in range(70):
        cur.append([])
        cur = cur[0]
    with pytest.raises(CanonicalError):
        canonical_json(deep)


def test_unit_ids():
    assert solo_unit_id("check") == "check:solo"
    assert item_unit_id("review.unit", "a.ts") == "review.unit:8b3148685648"
    assert item_unit_id("review.unit", {"b": 1, "a": 2}) == "review.unit:d3626ac30a87"
    base = journal_base_id("review.unit:8b3148685648", 1)
    assert attempt_id(base, 1) == "review.unit:8b3148685648~r1"
    assert journal_base_id("review.unit:8b3148685648", 2) == "review.unit:8b3148685648~l2"
    assert attempt_id(journal_base_id("review.unit:8b3148685648", 2), 1) == "review.unit:8b3148685648~l2~r1"
    assert gate_row_id("review", 1) == "review.gate:l1"
    assert base_of_attempt("x:solo~l2~r13") == "x:solo~l2"
    assert base_of_attempt("x:solo") == "x:solo"


def test_llm_unit_input_hash_golden():
    """hash_version 4: what runs created before v5 keep computing (and, as `runs.hash_version` values
    below 4 read as 4, what such a run computes too)."""
    check = UnitNode.model_validate(SHIP_PLAN["steps"][0]["root"])
    snap = SHIP_PLAN["execution"]["engines"]["fast"]
    params = {"version": "1.2.3"}
    assert (
        unit_input_hash(template=check, params=params, dispatch=snap, hash_version=4)
        == "3fa9d19efff034a333bacb87927f2c8d47741566a20f3756204dec9f48582edd"
    )
    assert (
        unit_input_hash(template=check, params=params, dispatch=snap, item="a.ts", hash_version=4)
        == "c41ba89098692eb9c934f5cdc65618e6358a954789d49eceeb95d24027b31643"
    )
    assert unit_input_hash(template=check, params=params, dispatch=snap, hash_version=1) == unit_input_hash(
        template=check, params=params, dispatch=snap, hash_version=4
    )


def test_llm_unit_input_hash_golden_v5():
    check = UnitNode.model_validate(SHIP_PLAN["steps"][0]["root"])
    snap = SHIP_PLAN["execution"]["engines"]["fast"]
    params = {"version": "1.2.3"}
    assert (
        unit_input_hash(template=check, params=params, dispatch=snap)
        == unit_input_hash(template=check, params=params, dispatch=snap, hash_version=5)
        == "1ed17fd0e7e1cd631a6b3af2635ee53ad7d608b782fd6f81afe68d63c613f51d"
    )
    assert (
        unit_input_hash(template=check, params=params, dispatch=snap, item="a.ts")
        == "5656642abb27907159600c13b2af84a28f74dd91fd8a00a4150887502cd72328"
    )


def test_v5_preimage_is_the_item_and_a_digest_of_the_rest():
    """v5 spelled out with the standard library alone (no akm.canonical): sha256 of the canonical JSON
    of {hashVersion: 5, item, shared}, `shared` the sha256 hex of the canonical JSON of every other field."""
    import hashlib
    import json

    def canonical(v: object) -> bytes:
        return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    rest = {
        "template": "Do it.",
        "inputs": [{"reference": "steps.a.output", "value": {"n": 1}}],
        "params": {"xs": ["a.ts", "b.ts"]},
        "dispatch": None,
        "invocation": None,
        "exec": {"command": ["bun", "run", "test:unit"], "timeoutMs": 600000},
        "schema": None,
        "env": None,
        "isolation": "none",
    }
    shared = hashlib.sha256(canonical(rest)).hexdigest()
    expected = hashlib.sha256(canonical({"hashVersion": 5, "item": "a.ts", "shared": shared})).hexdigest()
    unit = UnitNode(
        id="work.unit", instructions="Do it.", exec=ExecSpec(command=["bun", "run", "test:unit"], timeout_ms=600000)
    )
    inputs = [("steps.a.output", {"n": 1})]
    params = {"xs": ["a.ts", "b.ts"]}
    assert unit_input_hash(template=unit, params=params, item="a.ts", inputs=inputs) == expected
    assert expected == "b23ac08ddfbc9f1b6acc43f2a990839bae08af67b0cd3139b488e90138d32110"


def test_a_hash_version_newer_than_this_akm_is_refused():
    unit = UnitNode(id="w", instructions="x", exec=ExecSpec(command=["true"], timeout_ms=1000))
    with pytest.raises(ValueError, match="newer"):
        unit_input_hash(template=unit, params={}, hash_version=6)


EXEC_VECTORS = [
    ({}, "7d8cf6b136c3d69ad64a07a02190b03fe145b8ddec96380903907c7dd886e85f"),
    ({"cwd": "sub"}, "0c54e3a9951dc341ee40ba753493cd0025df692bab87455efd26d63945d6e3eb"),
    ({"inherit_env": True}, "fb6930cd0392c2b8e80ea361f67cebad59baf245de44a0b323f50aa47ba88caa"),
    ({"pass_env": ["CARGO_HOME"]}, "0aa055d56b0224f86b33f23fcc7596d85ab3dee53aeec090c609373c468cef11"),
    ({"timeout_ms": 5000}, "9a489759b796ba8afe7af9aa224edb10168538d5886768f267ef693c192699b5"),
    ({"timeout_ms": None}, "0944edb4da3071e600ca541a09d678aafd8f212e1bdbbb799cf0c45f802db9a7"),
]


EXEC_VECTORS_V5 = [
    ({}, "adb415346a368428d2a96b1a0a9291e7a53b2719fa3d588ea1db60c753ec22f9"),
    ({"cwd": "sub"}, "d3d401daa2eba72b4ed3afef4e37d90641a1db05a1b203143273a753cb7376dd"),
    ({"inherit_env": True}, "4b3247005ce176b436ba5223ab67fb19472a12776474f46e72257fd75d3abebc"),
    ({"pass_env": ["CARGO_HOME"]}, "41a1edb5d6f3fea852d79ab84788917fbf334d9f35d150c882219166786c2fec"),
    ({"timeout_ms": 5000}, "da08b1cdcd4a1d21aa5060876284235d932b3d63ce8b1441c69a55151117ad97"),
    ({"timeout_ms": None}, "4757253a896f0f4f00a3ead2fac78fc87eb097a68f68d7e25cfffbd261d3ce69"),
]


@pytest.mark.parametrize("exec_extra,expected", EXEC_VECTORS)
def test_exec_unit_input_hash_golden(exec_extra, expected):
    spec = {"command": ["bun", "run", "test:unit"], "timeout_ms": 600000, **exec_extra}
    unit = UnitNode(id="work", instructions="Do it.", exec=ExecSpec(**spec))
    assert unit_input_hash(template=unit, params={}, hash_version=4) == expected


@pytest.mark.parametrize("exec_extra,expected", EXEC_VECTORS_V5)
def test_exec_unit_input_hash_golden_v5(exec_extra, expected):
    spec = {"command": ["bun", "run", "test:unit"], "timeout_ms": 600000, **exec_extra}
    unit = UnitNode(id="work", instructions="Do it.", exec=ExecSpec(**spec))
    assert unit_input_hash(template=unit, params={}) == expected


def test_exec_unit_hash_env_and_isolation_golden():
    base = UnitNode(
        id="work", instructions="Do it.", exec=ExecSpec(command=["bun", "run", "test:unit"], timeout_ms=600000)
    )
    assert (
        unit_input_hash(template=base.model_copy(update={"env": ["env/ci"]}), params={}, hash_version=4)
        == "caa60dd66834784737406723a79c3be78ae60a0457e83f8797bcc419cba2bdcc"
    )
    assert (
        unit_input_hash(template=base.model_copy(update={"isolation": "worktree"}), params={}, hash_version=4)
        == "37fc00699fb0552e42eb16e2b343bf419e0c875f6d72a396361ea2724b80a4fd"
    )
    assert (
        unit_input_hash(template=base.model_copy(update={"env": ["env/ci"]}), params={})
        == "f26132da15b3eb52d562f04749031de0f9346011029985033d3fdc66b2487836"
    )
    assert (
        unit_input_hash(template=base.model_copy(update={"isolation": "worktree"}), params={})
        == "57b92f1b4d9d2b5f40aaeed2f8e8b89bd9a945fd9f63a133a62f9836fef2b97c"
    )


@pytest.mark.parametrize("version", [4, 5])
def test_retry_and_on_error_do_not_move_the_hash(version):
    from akm.plan.model import Retry

    def h(template=None, **kw):
        return unit_input_hash(template=template or base, hash_version=version, **kw)

    base = UnitNode(id="w", instructions="x", exec=ExecSpec(command=["true"], timeout_ms=1000))
    ref = h(params={"a": 1})
    changed = base.model_copy(update={"retry": Retry(max=2, on=["timeout"]), "on_error": "continue"})
    assert h(changed, params={"a": 1}) == ref
    assert h(params={"a": 2}) != ref
    assert h(params={"a": 1}, gate_feedback={"feedback": "f", "missing": []}) != ref
    assert h(base.model_copy(update={"instructions": "y"}), params={"a": 1}) != ref
    assert h(params={"a": 1}, item="i") != ref
    assert h(params={"a": 1}, inputs=[("steps.s.output", 1)]) != ref
    assert h(base.model_copy(update={"env": ["env/e"]}), params={"a": 1}) != ref
    assert h(base.model_copy(update={"isolation": "worktree"}), params={"a": 1}) != ref
    assert h(base.model_copy(update={"exec": ExecSpec(command=["false"], timeout_ms=1000)}), params={"a": 1}) != ref
    assert unit_input_hash(template=base, params={"a": 1}, hash_version=9 - version) != ref  # v4 and v5 differ


from hypothesis import given, settings  # noqa: E402  (the property tests below need it; the rest do not)
from hypothesis import strategies as st  # noqa: E402

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    params=st.dictionaries(st.text(max_size=6), _json, max_size=4),
    item=_json,
    exec_unit=st.booleans(),
    feedback=st.booleans(),
    version=st.sampled_from([4, 5]),
)
def test_unit_hasher_matches_reference_preimage(params, item, exec_unit, feedback, version):
    from functools import partial

    from akm.plan import identity

    UnitHasher = partial(identity.UnitHasher, hash_version=version)  # noqa: N806 - the class, at one version
    unit_input_hash = partial(identity.unit_input_hash, hash_version=version)

    if exec_unit:
        unit = UnitNode(id="s.unit", instructions="Do ü.", exec=ExecSpec(command=["x"], timeout_ms=5), env=["env/a"])
    else:
        unit = UnitNode(
            id="s.unit",
            instructions="Do ü.",
            invocation=Invocation(engine="e", model="m"),
            output_schema={"type": "object"},
        )
    fb = {"feedback": "again", "missing": ["a"]} if feedback else None
    inputs = [("steps.a.output", item)]
    ref = unit_input_hash(template=unit, params=params, item=item, inputs=inputs, dispatch={"k": 1}, gate_feedback=fb)
    fast = UnitHasher(template=unit, params=params, inputs=inputs, dispatch={"k": 1}, gate_feedback=fb).hash(item)
    assert fast == ref
    solo = unit_input_hash(template=unit, params=params, inputs=inputs, dispatch={"k": 1}, gate_feedback=fb)
    assert UnitHasher(template=unit, params=params, inputs=inputs, dispatch={"k": 1}, gate_feedback=fb).hash() == solo
    # a wide fan-out hashes with OpenSSL's SHA-256 instead of the builtin module's: the same digests
    many = UnitHasher(template=unit, params=params, inputs=inputs, dispatch={"k": 1}, gate_feedback=fb, units=10**7)
    assert many.hash(item) == ref and many.hash() == solo


@settings(max_examples=300, deadline=None)
@given(value=_json | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**30), 10**30))
def test_canonical_json_fast_paths_agree_with_the_encoder(value):
    """canonical_json writes a str or an int itself; the text is the encoder's, byte for byte."""
    import json

    from akm.canonical import normalize

    reference = json.dumps(normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == reference
