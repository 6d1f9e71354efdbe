"""Engines frozen into plans: selection, snapshots, models, timeouts, judges — decided at run creation."""

from __future__ import annotations

import json
import textwrap

import pytest

from akm import config, paths
from akm.errors import ConfigError
from akm.format.parse import parse_workflow
from akm.plan.compile import compile_plan
from akm.plan.engines import is_loopback_endpoint, resolve_model

FAST = {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "qwen3"}
REMOTE = {
    "kind": "llm",
    "endpoint": "https://api.example.test/v1/chat/completions",
    "model": "gpt-x",
    "apiKey": "${REMOTE_KEY}",
    "temperature": 0.1,
}
CLAUDE = {"kind": "agent", "platform": "claude"}


def write_config(data: dict) -> None:
    path = paths.config_dir() / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def doc(frontmatter: str, body: str):
    text = "---\n" + textwrap.dedent(frontmatter).strip() + "\n---\n\n" + textwrap.dedent(body).strip() + "\n"
    parsed = parse_workflow(text, "wf.md")
    assert parsed.errors == [], parsed.errors
    return parsed.document


def freeze(project, frontmatter: str, body: str):
    return compile_plan(doc(frontmatter, body), title="wf", config=config.load_config_if_any(project))


EXEC_ONLY = (
    """
    steps:
      - id: a
        unit: { exec: { command: [echo, hi] } }
      - id: b
        map: { over: params.xs, unit: { exec: { command: [echo] } } }
        gate: { max_loops: 2 }
    params: { xs: { type: array } }
    """,
    "## a\n\nRun.\n\n## b\n\nEach.\n\n### gate\n\nAll printed.",
)


def test_exec_only_plans_are_byte_identical_with_or_without_engines(project):
    bare = freeze(project, *EXEC_ONLY)
    write_config({"engines": {"fast": FAST, "cc": CLAUDE}, "defaults": {"llmEngine": "fast", "agentEngine": "cc"}})
    with_engines = freeze(project, *EXEC_ONLY)
    assert with_engines.canonical() == bare.canonical()
    assert bare.execution.engines == {}


def test_exec_only_gated_step_gets_the_judge_but_nothing_else_moves(project):
    bare = freeze(project, *EXEC_ONLY).to_json_obj()
    write_config({"engines": {"fast": FAST}, "workflow": {"judgeEngine": "fast"}})
    judged = freeze(project, *EXEC_ONLY).to_json_obj()
    assert judged["steps"][1]["gate"]["judge"] == {"engine": "fast", "model": "qwen3", "timeoutMs": 600000}
    assert judged["steps"][0] == bare["steps"][0] and judged["steps"][1]["root"] == bare["steps"][1]["root"]
    assert list(judged["execution"]["engines"]) == ["fast"]


def test_workflow_settings_apply(project):
    write_config({"workflow": {"maxConcurrency": 6, "defaultMapConcurrency": 2}})
    plan = freeze(project, *EXEC_ONLY)
    assert plan.execution.max_concurrency == 6 and plan.step("b").root.concurrency == 2


UNITS = (
    """
    steps:
      - id: plain
      - id: named
        unit: { engine: remote, model: big }
      - id: tuned
        unit: { llm: { temperature: 0.9 } }
      - id: isolated
        unit: { isolation: worktree }
      - id: timed
        unit: { engine: fast, timeout: 90s }
    """,
    "## plain\n\nA.\n\n## named\n\nB.\n\n## tuned\n\nC.\n\n## isolated\n\nD.\n\n## timed\n\nE.",
)


def test_selection_snapshots_models_and_timeouts(project):
    write_config(
        {
            "engines": {"fast": FAST, "remote": REMOTE, "cc": {**CLAUDE, "model": "sonnet"}},
            "defaults": {"llmEngine": "fast", "agentEngine": "cc"},
            "modelAliases": {"big": {"remote": "gpt-x-large", "*": "generic-big"}},
        }
    )
    plan = freeze(project, *UNITS)
    inv = {s.step_id: s.root.invocation.model_dump(mode="json", by_alias=True) for s in plan.steps}
    # agents: 30 minutes unless a timeout is set (`timeout: none` / `timeoutMs: null` asks for none)
    assert inv["plain"] == {"engine": "cc", "model": "claude-sonnet-4-6", "timeoutMs": 1_800_000}
    assert inv["named"] == {"engine": "remote", "model": "gpt-x-large", "timeoutMs": 600000}
    assert inv["tuned"] == {"engine": "fast", "model": "qwen3", "timeoutMs": 600000, "llm": {"temperature": 0.9}}
    assert inv["isolated"]["engine"] == "cc"
    assert inv["timed"] == {"engine": "fast", "model": "qwen3", "timeoutMs": 90000}
    engines = plan.execution.engines
    assert engines["fast"] == {
        "name": "fast",
        "kind": "llm",
        "endpoint": FAST["endpoint"],
        "model": "qwen3",
        "concurrency": 1,
        "credential": {"names": ["AKM_ENGINE_FAST_API_KEY", "AKM_LLM_API_KEY"], "required": False},
    }
    assert engines["remote"]["concurrency"] == 4 and engines["remote"]["temperature"] == 0.1
    assert engines["remote"]["credential"] == {"names": ["REMOTE_KEY"], "required": True}
    assert "apiKey" not in json.dumps(engines)
    assert engines["cc"] == {"name": "cc", "kind": "agent", "platform": "claude"}
    assert plan.step("plain").root.invocation.model_fields_set >= {"timeout_ms"}  # null means "no timeout"


def test_without_an_agent_default_plain_units_go_to_the_llm_default(project):
    write_config({"engines": {"fast": FAST}, "defaults": {"llmEngine": "fast"}})
    plan = freeze(project, "steps:\n  - id: a\n", "## a\n\nDo.")
    assert plan.step("a").root.invocation.engine == "fast"


def test_no_engine_configured_makes_session_units(project):
    frontmatter, body = "steps:\n  - id: a\n    unit: { engine: fast, model: m }\n", "## a\n\nDo."
    bare = freeze(project, frontmatter, body)
    assert bare.step("a").root.invocation.model_dump(mode="json", by_alias=True) == {"engine": None, "model": "m"}
    write_config({"workflow": {"maxConcurrency": 2}})
    assert freeze(project, frontmatter, body).step("a").root.invocation.engine is None
    write_config({"engines": {"other": FAST}})  # engines exist but no default: an unnamed unit waits for the session
    assert freeze(project, "steps:\n  - id: a\n", "## a\n\nDo.").step("a").root.invocation.engine is None


def test_unknown_engine_fails_at_freeze(project):
    write_config({"engines": {"fast": FAST}})
    with pytest.raises(ConfigError) as info:
        freeze(project, "steps:\n  - id: a\n    unit: { engine: missing }\n", "## a\n\nDo.")
    assert info.value.code == "UNKNOWN_ENGINE" and 'step "a"' in info.value.message
    assert "wf.md:" in info.value.message and "fast" in info.value.message


@pytest.mark.parametrize(
    "unit,words",
    [
        ("{ engine: fast, isolation: worktree }", "working directory"),
        ("{ engine: fast, env: [env/ci] }", "env bindings"),
        ("{ engine: cc, llm: { temperature: 0.5 } }", "llm options"),
    ],
)
def test_an_engine_that_cannot_run_the_unit_fails_at_freeze(project, unit, words):
    write_config({"engines": {"fast": FAST, "cc": CLAUDE}})
    with pytest.raises(ConfigError) as info:
        freeze(project, f"steps:\n  - id: a\n    unit: {unit}\n", "## a\n\nDo.")
    assert info.value.code == "ENGINE_MISMATCH" and words in info.value.message


def test_document_llm_defaults_do_not_bind_agent_units(project):
    write_config({"engines": {"cc": CLAUDE}, "defaults": {"agentEngine": "cc"}})
    plan = freeze(project, "defaults: { llm: { temperature: 0.2 } }\nsteps:\n  - id: a\n", "## a\n\nDo.")
    assert plan.step("a").root.invocation.llm is None and plan.step("a").root.invocation.engine == "cc"


def test_judges_are_frozen_per_gated_step(project):
    gated = ("steps:\n  - id: a\n  - id: b\n", "## a\n\nDo.\n\n### gate\n\nDone.\n\n## b\n\nDo.")
    write_config(
        {
            "engines": {"fast": FAST, "cc": {**CLAUDE, "timeoutMs": 120000}},
            "defaults": {"llmEngine": "fast"},
            "workflow": {"judgeEngine": "cc"},
        }
    )
    plan = freeze(project, *gated)
    assert plan.step("a").gate.judge.model_dump(mode="json", by_alias=True) == {
        "engine": "cc",
        "model": None,
        "timeoutMs": 120000,
    }
    assert plan.step("b").gate.judge is None and "cc" in plan.execution.engines
    write_config({"engines": {"fast": FAST}, "defaults": {"llmEngine": "fast"}, "workflow": {"judgeEngine": "session"}})
    assert freeze(project, *gated).step("a").gate.judge is None


def test_agent_on_an_llm_engine_snapshots_the_connection(project):
    write_config(
        {
            "engines": {
                "fast": FAST,
                "oc": {
                    "kind": "agent",
                    "platform": "opencode",
                    "llmEngine": "fast",
                    "bin": "/opt/oc",
                    "args": ["run"],
                    "envPassthrough": ["X_TOKEN"],
                    "concurrency": 2,
                },
            },
            "defaults": {"agentEngine": "oc"},
        }
    )
    plan = freeze(project, "steps:\n  - id: a\n", "## a\n\nDo.")
    snap = plan.execution.engines["oc"]
    assert snap["llm"]["endpoint"] == FAST["endpoint"] and snap["llmEngine"] == "fast"
    assert (snap["bin"], snap["args"], snap["envPassthrough"], snap["concurrency"]) == (
        "/opt/oc",
        ["run"],
        ["X_TOKEN"],
        2,
    )


def test_engine_config_is_part_of_the_plan_hash(project):
    write_config({"engines": {"fast": FAST}, "defaults": {"llmEngine": "fast"}})
    first = freeze(project, "steps:\n  - id: a\n", "## a\n\nDo.").plan_hash()
    write_config({"engines": {"fast": {**FAST, "temperature": 0.5}}, "defaults": {"llmEngine": "fast"}})
    assert freeze(project, "steps:\n  - id: a\n", "## a\n\nDo.").plan_hash() != first


def test_model_alias_resolution_order():
    root = {"big": {"claude": "claude-big", "*": "any-big"}}
    assert resolve_model("BIG", columns=["claude"], engine_aliases=None, root_aliases=root) == "claude-big"
    assert resolve_model("big", columns=["codex"], engine_aliases=None, root_aliases=root) == "any-big"
    assert resolve_model("big", columns=["claude"], engine_aliases={"Big": "mine"}, root_aliases=root) == "mine"
    assert (
        resolve_model("opus", columns=["claude"], engine_aliases=None, root_aliases={}, builtin_column="claude")
        == "claude-opus-4-7"
    )
    assert (
        resolve_model("opus", columns=["codex"], engine_aliases=None, root_aliases={}, builtin_column="codex") == "opus"
    )


@pytest.mark.parametrize(
    "endpoint,loopback",
    [
        ("http://localhost:11434/v1/chat/completions", True),
        ("http://127.0.0.2:1/v1/chat/completions", True),
        ("http://[::1]:8080/v1/chat/completions", True),
        ("http://[::ffff:127.0.0.1]/v1/chat/completions", True),
        ("http://0.0.0.0/v1/chat/completions", True),
        ("https://api.openai.com/v1/chat/completions", False),
        ("http://10.0.0.5/v1/chat/completions", False),
    ],
)
def test_loopback_detection(endpoint, loopback):
    assert is_loopback_endpoint(endpoint) is loopback


def test_an_agent_unit_is_unbounded_only_when_asked(project):
    """No timeout anywhere: an agent unit still ends (30 min); `timeoutMs: null` on the engine, or
    `timeout: none` on the unit, is an explicit request for none."""
    write_config({"engines": {"cc": CLAUDE, "free": {**CLAUDE, "timeoutMs": None}}, "defaults": {"agentEngine": "cc"}})
    plan = freeze(
        project,
        """
        steps:
          - id: plain
          - id: free
            unit: { engine: free }
          - id: none
            unit: { timeout: none }
        """,
        "## plain\n\nA.\n\n## free\n\nB.\n\n## none\n\nC.",
    )
    assert plan.step("plain").root.invocation.timeout_ms == 1_800_000
    assert plan.step("free").root.invocation.timeout_ms is None
    assert plan.step("none").root.invocation.timeout_ms is None


TOOL_STEPS = (
    """
    steps:
      - id: fetch
      - id: think
      - id: tuned
        unit: { llm: { temperature: 0.2 } }
      - id: prompt-lines
      - id: bound
        unit: { env: [env/ci] }
    """,
    "## fetch\n\nGet the PR:\n\n```sh\ngh pr view 12 --json title\n```\n\n"
    "## think\n\nSummarise the input in two sentences.\n\n"
    "## tuned\n\nExplain this command:\n\n```bash\nls -la\n```\n\n"
    "## prompt-lines\n\nRun:\n\n    $ make test\n\n"
    "## bound\n\nUse the token.",
)


def test_with_only_an_llm_a_step_that_needs_tools_goes_to_the_calling_agent(project):
    """A chat model can run nothing: a step with a shell block, `$ command` lines or env bindings goes to the
    calling agent when no agent engine is configured — a step that asks for a model (`llm:`) still gets it."""
    from akm.plan.engines import step_routes

    write_config({"engines": {"fast": FAST}, "defaults": {"llmEngine": "fast"}})
    plan = freeze(project, *TOOL_STEPS)
    where = {s.step_id: (s.root.invocation.engine, s.root.route) for s in plan.steps}
    assert where == {
        "fetch": (None, "needs-tools"),
        "think": ("fast", "llm-default"),
        "tuned": ("fast", "llm-default"),
        "prompt-lines": (None, "needs-tools"),
        "bound": (None, "needs-tools"),
    }
    routes = {r.step_id: r for r in step_routes(plan)}
    assert routes["fetch"].kind == "session" and "sh block" in routes["fetch"].text
    assert routes["fetch"].text.startswith("the calling agent: the step needs a workspace and tools")
    assert routes["bound"].text.endswith("(it binds environment variables (env:))")
    assert routes["think"].text == "engine fast (llm, defaults.llmEngine)"


def test_with_an_agent_engine_a_step_that_needs_tools_goes_to_it(project):
    from akm.plan.engines import step_routes

    write_config({"engines": {"fast": FAST, "cc": CLAUDE}, "defaults": {"llmEngine": "fast", "agentEngine": "cc"}})
    plan = freeze(project, *TOOL_STEPS)
    where = {s.step_id: (s.root.invocation.engine, s.root.route) for s in plan.steps}
    assert where["fetch"] == ("cc", "agent-default") and where["bound"] == ("cc", "agent-default")
    assert where["think"] == ("cc", "agent-default") and where["tuned"] == ("fast", "llm-default")
    assert {r.step_id: r.text for r in step_routes(plan)}["fetch"] == "engine cc (agent, defaults.agentEngine)"


def test_without_any_engine_no_route_is_recorded_and_the_plan_is_as_before(project):
    plan = freeze(project, *TOOL_STEPS)
    assert all(s.root.route is None and s.root.invocation.engine is None for s in plan.steps)
    assert '"route"' not in plan.canonical()


def test_the_route_is_not_part_of_a_units_identity(project):
    from akm.plan.identity import unit_input_hash
    from akm.plan.model import UnitNode

    write_config({"engines": {"fast": FAST}, "defaults": {"llmEngine": "fast"}})
    unit = freeze(project, *TOOL_STEPS).step("think").root
    other = UnitNode.model_validate({**unit.model_dump(mode="json", by_alias=True), "route": "named"})
    assert unit_input_hash(template=unit, params={}) == unit_input_hash(template=other, params={})
