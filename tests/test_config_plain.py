"""The config's fast path (`akm.config.plain`) agrees with the pydantic models: it accepts only what they
accept, with the same values, and accepts the usual valid configs (so a run with a config imports no pydantic)."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from akm.config import _models
from akm.config.plain import _AGENT, _DEFAULTS, _LLM, _WORKFLOW, _camel, plain_config

EP = "http://127.0.0.1:11434/v1/chat/completions"
VALID = [
    {},
    {"engines": {"fast": {"kind": "llm", "endpoint": EP, "model": "qwen3"}}},
    {
        "engines": {
            "fast": {
                "kind": "llm",
                "endpoint": EP,
                "model": "m",
                "apiKey": "${KEY}",
                "temperature": 1,
                "maxTokens": 5,
                "contextLength": 9,
                "supportsJsonSchema": True,
                "concurrency": 4,
                "extraParams": {"top_p": 0.5, "nested": [{"a": 1}]},
                "timeoutMs": None,
                "enableThinking": False,
                "provider": "ollama",
                "x-note": "kept",
            }
        },
        "defaults": {"llmEngine": "fast"},
        "workflow": {"judgeEngine": "session", "maxConcurrency": 2, "defaultMapConcurrency": 3},
        "modelAliases": {"claude": {"fast": "claude-x"}},
    },
    {
        "engines": {
            "cc": {
                "kind": "agent",
                "platform": "claude",
                "model": "opus",
                "args": ["--x"],
                "bin": "claude",
                "timeoutMs": 1000,
                "envPassthrough": ["HOME"],
                "modelAliases": {"big": "opus"},
            },
            "oc": {"kind": "agent", "platform": "opencode", "llmEngine": "fast"},
            "fast": {"kind": "llm", "endpoint": EP, "model": "m"},
        },
        "defaults": {"agentEngine": "cc", "llmEngine": "fast"},
    },
]

_values = st.sampled_from(
    [
        None,
        True,
        0,
        1,
        5,
        64,
        65,
        -1,
        1.5,
        float("inf"),
        "",
        " ",
        "x",
        "${KEY}",
        "KEY",
        EP,
        "http://h/v1",
        "claude",
        "opencode",
        "opencode-sdk",
        "llm",
        "agent",
        ["a"],
        [1],
        ["BAD-NAME"],
        {},
        {"a": "b"},
        {"A": "x", "a": "y"},
        {"apiKey": "x"},
        {"model": 1},
        {"k": {"authorization": "x"}},
    ]
)
_llm_keys = st.sampled_from([_camel(n) for n in _LLM] + ["max_tokens", "platform", "x-extra"])
_agent_keys = st.sampled_from([_camel(n) for n in _AGENT] + ["timeout_ms", "endpoint", "x-extra"])


def _engine(keys):
    return st.dictionaries(keys, _values, max_size=4)


@st.composite
def _configs(draw):
    data = dict(draw(st.sampled_from(VALID)))
    engines = dict(data.get("engines", {}))
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(["fast", "cc", "oc", "new"]))
        base = dict(
            engines.get(name)
            or draw(
                st.sampled_from(
                    [{"kind": "llm", "endpoint": EP, "model": "m"}, {"kind": "agent", "platform": "claude"}]
                )
            )
        )
        extra = draw(_engine(_llm_keys if base.get("kind") == "llm" else _agent_keys))
        base.update(extra)
        engines[name] = base
    data["engines"] = engines
    if draw(st.booleans()):
        data["defaults"] = draw(
            st.dictionaries(st.sampled_from(["llmEngine", "agentEngine", "engine"]), _values, max_size=2)
        )
    if draw(st.booleans()):
        data["workflow"] = draw(
            st.dictionaries(
                st.sampled_from(["judgeEngine", "maxConcurrency", "defaultMapConcurrency", "max_concurrency"]),
                _values,
                max_size=2,
            )
        )
    if draw(st.booleans()):
        data["modelAliases"] = draw(
            st.dictionaries(
                st.sampled_from(["claude", "Claude", "x"]),
                st.sampled_from([{}, {"a": "b"}, {"a": ""}, "x", None]),
                max_size=2,
            )
        )
    return data


def _same(plain, model) -> None:
    for rec, mod, spec in ((plain.defaults, model.defaults, _DEFAULTS), (plain.workflow, model.workflow, _WORKFLOW)):
        for name in spec:
            assert getattr(rec, name) == getattr(mod, name), name
            assert rec.declared(name) == (name in mod.model_fields_set), name
    assert plain.model_aliases == model.model_aliases
    assert sorted(plain.engines) == sorted(model.engines)
    for name, engine in plain.engines.items():
        other = model.engines[name]
        spec = _LLM if engine.kind == "llm" else _AGENT
        for field in spec:
            value = getattr(engine, field)
            assert value == getattr(other, field) and type(value) is type(getattr(other, field)), (name, field)
            assert engine.declared(field) == (field in other.model_fields_set), (name, field)


def _pydantic(data):
    from pydantic import ValidationError

    try:
        return _models()["Config"].model_validate(data)
    except ValidationError:
        return None


def test_usual_configs_take_the_fast_path_with_the_models_values():
    for data in VALID:
        plain, model = plain_config(data), _pydantic(data)
        assert plain is not None and model is not None, data
        _same(plain, model)


@settings(max_examples=600, deadline=None)
@given(data=_configs())
def test_the_fast_path_is_never_looser_than_the_models(data):
    plain = plain_config(data)
    if plain is not None:
        model = _pydantic(data)
        assert model is not None, data  # the fast path accepted what the models refuse
        _same(plain, model)


def test_a_run_with_a_valid_config_imports_no_pydantic(tmp_path):
    import json
    import os

    (tmp_path / ".akm").mkdir()
    (tmp_path / ".akm" / "config.json").write_text(json.dumps(VALID[2]))
    (tmp_path / "t.md").write_text(
        "---\nsteps:\n  - id: a\n    unit: { exec: { command: ['true'] } }\n---\n\n## a\n\nx\n"
    )
    code = (
        "import sys; from akm.cli import main; code = main(['workflow', 'run', 't.md']); "
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))"
    )
    env = dict(os.environ, AKM_DATA_DIR=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.stdout.splitlines()[-1] == "0 []", (done.stdout, done.stderr)
