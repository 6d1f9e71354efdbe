"""Engines end to end: config written with `akm config`, a run against a loopback LLM server and fake agent CLIs."""

from __future__ import annotations

import json
import os

import pytest

from akm import api, cli, paths
from akm.errors import ConfigError
from tests import fake_harness
from tests.helpers import journal_sql, needs_shared, run, steps_of, write_wf

KEY = "zz-loopback-key-7f3a91"


def akm_config(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["config", *args])
    out, err = capsys.readouterr()
    return code, out, err


def set_engine(capsys, name: str, engine: dict) -> None:
    code, _, err = akm_config(capsys, "set", f"engines.{name}", json.dumps(engine))
    assert code == 0, err


def test_llm_unit_with_schema_and_gate_completes(project, fake_openai, capsys, monkeypatch):
    monkeypatch.setenv("FAST_KEY", KEY)
    set_engine(capsys, "fast", {"kind": "llm", "endpoint": fake_openai.url, "model": "json", "apiKey": "${FAST_KEY}"})
    set_engine(capsys, "judge", {"kind": "llm", "endpoint": fake_openai.url, "model": "verdict-pass"})
    assert akm_config(capsys, "set", "defaults.llmEngine", "fast")[0] == 0
    assert akm_config(capsys, "set", "workflow.judgeEngine", "judge")[0] == 0
    wf = write_wf(
        project,
        "ask.md",
        """
        steps:
          - id: ask
            output: { type: object, required: [ok], properties: { ok: { type: boolean } } }
        """,
        "## ask\n\nSay ok.\n\n### gate\n\nThe answer says ok.",
    )
    res = run(wf, project)
    assert res.run.status == "completed", steps_of(res)
    assert steps_of(res)["ask"]["output"] == {"ok": True}
    asks = fake_openai.bodies("json")
    assert len(asks) == 1 and fake_openai.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"
    assert len(fake_openai.bodies("verdict-pass")) == 1
    con = journal_sql()
    try:
        rows = con.execute("SELECT unit_id, runner, engine, tokens FROM units ORDER BY unit_id").fetchall()
    finally:
        con.close()
    assert ("ask:solo", "llm", "fast", 7) in rows
    assert any(r[0].startswith("ask.gate") and r[2] == "judge" for r in rows)
    # the key is in the environment only: never in config, journal, events or output
    _assert_nowhere(KEY, project, res)


def _assert_nowhere(secret: str, project, res) -> None:
    places = [paths.config_dir(), paths.data_dir(), project]
    for root in places:
        for dirpath, _, files in os.walk(root):
            for f in files:
                data = open(os.path.join(dirpath, f), "rb").read()
                assert secret.encode() not in data, os.path.join(dirpath, f)
    assert secret not in json.dumps(res.to_json())
    assert secret not in json.dumps(api.events(run_id=res.run.run_id).to_json())


def test_unit_retry_on_rate_limit_waits_for_retry_after(project, fake_openai, capsys):
    """A 429 whose Retry-After does not fit the unit's timeout fails the attempt at once; the unit's
    `retry: { on: [llm_rate_limit] }` then waits what the server asked before asking again."""
    # Retry-After 4 s against a 3 s unit timeout: the second attempt's whole request must fit in those 3 s
    set_engine(capsys, "fast", {"kind": "llm", "endpoint": fake_openai.url, "model": "rate-limit-4"})
    akm_config(capsys, "set", "defaults.llmEngine", "fast")
    wf = write_wf(
        project,
        "rl.md",
        """
        steps:
          - id: ask
            unit: { timeout: 3s, retry: { max: 1, on: [llm_rate_limit] } }
        """,
        "## ask\n\nSay ok.",
    )
    res = run(wf, project)
    assert res.run.status == "completed", steps_of(res)
    first, second = fake_openai.requests
    assert second["at"] - first["at"] >= 3.9  # not re-asked before the server's Retry-After
    con = journal_sql()
    try:
        rows = con.execute("SELECT unit_id, status, failure_reason FROM units ORDER BY unit_id").fetchall()
    finally:
        con.close()
    assert rows == [("ask:solo", "failed", "llm_rate_limit"), ("ask:solo~r1", "completed", None)]


def test_rejecting_judge_loops_then_blocks(project, fake_openai, capsys):
    set_engine(capsys, "fast", {"kind": "llm", "endpoint": fake_openai.url, "model": "plain"})
    set_engine(capsys, "judge", {"kind": "llm", "endpoint": fake_openai.url, "model": "verdict-reject"})
    akm_config(capsys, "set", "defaults.llmEngine", "fast")
    akm_config(capsys, "set", "workflow.judgeEngine", "judge")
    wf = write_wf(
        project,
        "loop.md",
        """
        steps:
          - id: write
            gate: { max_loops: 2 }
        """,
        "## write\n\nWrite it.\n\n### gate\n\nIt is detailed.",
    )
    res = run(wf, project)
    assert res.run.status == "blocked"
    assert len(fake_openai.bodies("plain")) == 2 and len(fake_openai.bodies("verdict-reject")) == 2
    second = fake_openai.bodies("plain")[1]["messages"][-1]["content"]
    assert "add more detail" in second  # the judge's feedback reaches the next loop


def test_unknown_engines_refuse_the_run_up_front(project, fake_openai, capsys):
    set_engine(capsys, "fast", {"kind": "llm", "endpoint": fake_openai.url, "model": "plain"})
    wf = write_wf(
        project,
        "bad.md",
        """
        steps:
          - id: a
            unit: { engine: missing }
        """,
        "## a\n\nDo it.",
    )
    with pytest.raises(ConfigError) as info:
        run(wf, project)
    assert info.value.code == "UNKNOWN_ENGINE" and "missing" in info.value.message and info.value.exit_status == 78
    # a hand-written judgeEngine naming nothing: the config itself is refused, before anything runs
    cfg = paths.config_dir() / "config.json"
    data = json.loads(cfg.read_text())
    data["workflow"] = {"judgeEngine": "nope"}
    cfg.write_text(json.dumps(data))
    ok = write_wf(project, "ok.md", "steps:\n  - id: a\n", "## a\n\nDo it.")
    with pytest.raises(ConfigError) as info:
        run(ok, project)
    assert "workflow.judgeEngine" in info.value.message and str(cfg) in info.value.message
    assert fake_openai.requests == [] and api.list_runs(cwd=str(project)).runs == []


def test_llm_fan_out_respects_engine_concurrency_and_the_token_budget(project, fake_openai, capsys):
    set_engine(capsys, "fast", {"kind": "llm", "endpoint": fake_openai.url, "model": "hold-0.3", "concurrency": 3})
    akm_config(capsys, "set", "defaults.llmEngine", "fast")
    akm_config(capsys, "set", "workflow.maxConcurrency", "8")  # the host limit must not be what binds
    wf = write_wf(
        project,
        "fan.md",
        """
        params: { items: { type: array } }
        steps:
          - id: each
            map: { over: params.items, concurrency: 8 }
        """,
        "## each\n\nHandle the item.",
    )
    res = api.run_workflow(str(wf), cwd=str(project), params={"items": [f"item-{i}" for i in range(20)]})
    assert res.run.status == "completed", steps_of(res)
    assert len(fake_openai.bodies("hold-0.3")) == 20 and fake_openai.max_inflight == 3
    budget = write_wf(
        project,
        "budget.md",
        """
        params: { items: { type: array } }
        budget: { max_tokens: 10 }
        steps:
          - id: each
            map: { over: params.items, concurrency: 1, unit: { model: slow-0 } }
        """,
        "## each\n\nHandle the item.",
    )
    before = len(fake_openai.requests)
    res = api.run_workflow(str(budget), cwd=str(project), params={"items": [f"x{i}" for i in range(20)]})
    assert res.run.status == "failed" and "max_tokens" in json.dumps(steps_of(res))
    assert len(fake_openai.requests) - before == 5  # 2 tokens each: the fifth reaches the ceiling of 10


def test_agent_engine_unit_runs_the_harness(project, tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    fake_harness.install(str(bin_dir), ["claude"])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    set_engine(capsys, "coder", {"kind": "agent", "platform": "claude", "model": "sonnet"})
    akm_config(capsys, "set", "defaults.agentEngine", "coder")
    wf = write_wf(
        project,
        "agent.md",
        """
        steps:
          - id: code
            output: { type: object }
        """,
        "## code\n\nWrite the code and answer in JSON.",
    )
    res = run(wf, project)
    assert res.run.status == "completed", steps_of(res)
    assert steps_of(res)["code"]["output"] == {"ok": True}
    [call] = fake_harness.calls(str(bin_dir))
    assert call["argv"][call["argv"].index("--model") + 1] == "claude-sonnet-4-6"
    assert call["cwd"] == str(project)
    con = journal_sql()
    try:
        [(runner, engine, session, tokens)] = con.execute(
            "SELECT runner, engine, session_id, tokens FROM units"
        ).fetchall()
    finally:
        con.close()
    assert (runner, engine, session, tokens) == ("agent", "coder", fake_harness.SESSIONS["claude"], 150)


def test_an_agent_units_live_progress_reaches_the_listener_the_journal_and_a_watcher(
    project, tmp_path, capsys, monkeypatch
):
    """What the CLI streams (here claude's real stream-json, replayed) is the unit's live progress: the run's
    `on_progress` gets it at once, the journal gets a `workflow_unit_activity` event and the session id on
    the running row, and `status --watch` of another process prints it."""
    bin_dir = tmp_path / "bin"
    fake_harness.install(str(bin_dir), ["claude"])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    set_engine(capsys, "coder", {"kind": "agent", "platform": "claude"})
    akm_config(capsys, "set", "defaults.agentEngine", "coder")
    wf = write_wf(project, "agent.md", "steps:\n  - id: code", "## code\n\nWork.\nFAKE:linger=0.5")
    seen: list = []
    res = run(wf, project, on_progress=seen.append)
    assert res.run.status == "completed", steps_of(res)
    activity = [p for p in seen if p.kind == "unit_activity"]
    assert activity and activity[-1].session_id == fake_harness.SESSIONS["claude"]
    assert activity[-1].turns == 1 and activity[-1].attempt_id == "code:solo"
    assert seen.index(activity[0]) < next(i for i, p in enumerate(seen) if p.kind == "unit")  # before it finished
    from akm.engine.activity import WRITER

    WRITER.drain()  # the journal gets it from a background thread (never from the one supervising the CLI)
    events = api.events(run_id=res.run.run_id).events
    [journaled] = [e for e in events if e.event_type == "workflow_unit_activity"][:1]
    assert journaled.metadata["unitId"] == "code:solo"
    assert journaled.metadata["sessionId"] == fake_harness.SESSIONS["claude"]
    [unit] = api.run_status(res.run.run_id, units=True).units
    assert unit.session_id == fake_harness.SESSIONS["claude"] and unit.engine == "coder"
    import io

    from akm.report.watch import follow

    out = io.StringIO()
    assert follow(res.run.run_id, out, api, poll_s=0.01) == 0
    assert "[code] code:solo: " in out.getvalue(), out.getvalue()


def test_no_engine_configured_keeps_units_for_the_session(project, capsys):
    wf = write_wf(
        project,
        "s.md",
        """
        steps:
          - id: a
            unit: { engine: fast }
        """,
        "## a\n\nDo it.",
    )
    res = run(wf, project)
    assert res.run.status == "awaiting_session"


def test_status_says_where_each_step_goes(project, fake_openai, capsys):
    """LLM engine, no agent engine: the step with a shell block waits for the calling agent, and `status` says so
    per step, as the plan froze it (the chat model gets only what it can do)."""
    set_engine(capsys, "fast", {"kind": "llm", "endpoint": fake_openai.url, "model": "plain"})
    akm_config(capsys, "set", "defaults.llmEngine", "fast")
    wf = write_wf(
        project,
        "tools.md",
        "steps:\n  - id: think\n  - id: fetch",
        "## think\n\nSay hello.\n\n## fetch\n\nGet it:\n\n```sh\ngh pr view 1\n```",
    )
    res = run(wf, project)
    assert res.run.status == "awaiting_session" and res.run.current_step_id == "fetch"
    steps = {s.id: s for s in api.run_status(res.run.run_id).steps}
    assert steps["think"].runs_on == "engine fast (llm, defaults.llmEngine)" and steps["think"].status == "completed"
    assert steps["fetch"].runs_on.startswith("the calling agent: the step needs a workspace and tools")
    assert "sh block" in steps["fetch"].runs_on
    assert cli.main(["workflow", "status", res.run.run_id]) == 0
    out = capsys.readouterr().out
    assert "fetch" in out and "on the calling agent: the step needs a workspace and tools" in out, out


@needs_shared()
def test_code_review_prs_steps_with_only_a_chat_model(project, capsys):
    """The corpus's code-review-pr with an LLM engine and no agent engine: its `gh pr view` step is the calling
    agent's, not the chat model's."""
    from tests.helpers import CORPUS

    set_engine(capsys, "fast", {"kind": "llm", "endpoint": "http://127.0.0.1:9/v1/chat/completions", "model": "m"})
    akm_config(capsys, "set", "defaults.llmEngine", "fast")
    from akm import config
    from akm.format.parse import parse_workflow
    from akm.plan.compile import compile_plan
    from akm.plan.engines import step_routes

    path = CORPUS / "current" / "code-review-pr.md"
    parsed = parse_workflow(path.read_text(encoding="utf-8"), str(path))
    plan = compile_plan(parsed.document, title="crp", config=config.load_config_if_any(project))
    routes = {r.step_id: r for r in step_routes(plan)}
    assert routes["load-context"].kind == "session" and routes["load-context"].route == "needs-tools"


@pytest.mark.parametrize("platform", ["gemini", "codex"])
def test_usage_parts_are_journaled_and_unknown_tokens_stay_null(project, tmp_path, capsys, monkeypatch, platform):
    """The CLIs' own usage figures (captured from the real ones): reasoning and cache tokens apart, gemini's model
    router apart from its main model; a unit whose model API refused the key has no tokens (null, not 0)."""
    bin_dir = tmp_path / "bin"
    fake_harness.install(str(bin_dir), [platform])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    set_engine(capsys, "ag", {"kind": "agent", "platform": platform})
    akm_config(capsys, "set", "defaults.agentEngine", "ag")
    wf = write_wf(project, "u.md", "steps:\n  - id: a\n  - id: b", "## a\n\nWork.\n\n## b\n\nMore.\nFAKE:api=401")
    res = run(wf, project)
    assert res.run.status == "failed"
    finished = {
        e.metadata["unitId"]: e.metadata
        for e in api.events(run_id=res.run.run_id).events
        if e.event_type == "workflow_unit_finished"
    }
    usage = finished["a:solo"]["usage"]
    if platform == "gemini":
        models = usage["models"]
        roles = {m["role"] for m in models.values()}
        assert roles == {"main", "router"}
        main = next(m for m in models.values() if m["role"] == "main")
        assert (usage["input"], usage["reasoning"], usage["cacheRead"]) == (main["input"], 7, 40)
        assert finished["a:solo"]["tokens"] == sum(m["total"] for m in models.values())
    else:
        assert (usage["input"], usage["output"], usage["reasoning"], usage["cacheRead"]) == (120, 30, 7, 40)
    assert finished["b:solo"]["failureReason"] == "agent_auth"
    assert "tokens" not in finished["b:solo"] and "usage" not in finished["b:solo"]
    units = {u.unit_id: u for u in api.run_status(res.run.run_id, units=True).units}
    assert units["b:solo"].tokens is None and units["a:solo"].tokens
