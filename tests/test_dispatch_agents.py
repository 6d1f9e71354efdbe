"""Agent units: each harness profile against a fake CLI on PATH printing that harness's real output shape."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from akm.dispatch import harnesses as hz
from akm.dispatch.agents import AgentDispatcher
from akm.dispatch.base import UnitRequest
from tests import fake_harness

KEY = "sk-agent-llm-key-0042"


@pytest.fixture
def bin_dir(tmp_path):
    d = tmp_path / "bin"
    fake_harness.install(str(d))
    return d


def parent_env(bin_dir, **extra) -> dict:
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        **extra,
    }


def req(
    bin_dir,
    platform: str,
    prompt: str = "Do the task.",
    *,
    engine: dict | None = None,
    env=None,
    timeout_ms=30_000,
    cwd=None,
    **kw,
) -> UnitRequest:
    snap = {"name": f"{platform}-eng", "kind": "agent", "platform": platform, **(engine or {})}
    return UnitRequest(
        run_id="run-1",
        step_id="s",
        unit_id="s:solo",
        attempt_id="s:solo",
        kind="agent",
        cwd=str(cwd or bin_dir.parent),
        prompt=prompt,
        timeout_ms=timeout_ms,
        engine_name=snap["name"],
        engine=snap,
        parent_env=env if env is not None else parent_env(bin_dir),
        **kw,
    )


def run(request, cancel=None, feedback=None):
    return AgentDispatcher().dispatch(request, cancel or threading.Event(), feedback)


# --------------------------------------------------------------------------- each profile end to end

EXPECTED = {  # platform: (session id, tokens) as each real output shape reports them
    # the replayed four: the fake model API counts 120 in + 30 out per answer; gemini's router adds 50 + 5,
    # its main model's 157 include 7 thinking tokens
    "claude": (fake_harness.SESSIONS["claude"], 150),
    "codex": (fake_harness.SESSIONS["codex"], 150),
    "opencode": (fake_harness.SESSIONS["opencode"], 150),
    "gemini": (fake_harness.SESSIONS["gemini"], 212),
    "copilot": ("6364c2f8-ac3c-412d-8495-05b65b146837", 31),
    "pi": ("ccd569e0-4e1b-4c7d-a981-637ed4107310", 352),
    "aider": (None, 2450),
    "amazonq": (None, None),
    "openhands": ("oh-1234", None),
}


@pytest.mark.parametrize("platform", sorted(EXPECTED))
def test_each_harness_answer_session_and_tokens(bin_dir, platform):
    res = run(req(bin_dir, platform, "Summarise.\nFAKE:answer=all good here"))
    assert res.ok, res.error
    assert res.text == "all good here"
    assert (res.session_id, res.tokens) == EXPECTED[platform]
    [call] = fake_harness.calls(str(bin_dir))
    assert call["prompt"].startswith("Summarise.")
    assert call["cwd"] == str(bin_dir.parent)


@pytest.mark.parametrize("platform", ["claude", "codex", "opencode", "gemini", "copilot", "pi"])
def test_a_failure_reported_in_the_output_fails_the_unit(bin_dir, platform):
    """FAKE:error is a model API answering 500: claude and codex give up after their own retries, opencode and
    gemini would retry for minutes and are stopped by akm once they retried more than akm allows."""
    res = run(req(bin_dir, platform, "FAKE:error"))
    assert not res.ok and res.failure_reason == "agent_error", res
    # gemini prints its session id only when it ends, and it was stopped before
    assert res.session_id == (None if platform == "gemini" else EXPECTED[platform][0])
    if platform in hz.REAL_CLIS:
        assert res.tokens is None and res.usage is None  # no model answered: unknown, not 0


@pytest.mark.parametrize("platform", hz.REAL_CLIS)
@pytest.mark.parametrize("status", [401, 429])
def test_the_model_api_status_codes_the_failure(bin_dir, platform, status):
    res = run(req(bin_dir, platform, f"FAKE:api={status}"))
    assert not res.ok and res.failure_reason == ("agent_auth" if status == 401 else "llm_rate_limit"), res
    if status == 401:
        assert "refused" in res.error and "key" in res.error, res.error
    assert "Reading additional input" not in res.error and "    at " not in res.error, res.error
    assert res.tokens is None


def test_claude_in_verbose_mode_prints_an_array_whose_last_result_is_read(bin_dir):
    """With verbose mode on (`--verbose`, or `viewMode: verbose` in ~/.claude/settings.json) claude's
    `--output-format json` is a JSON array of every session message, the result object last."""
    res = run(req(bin_dir, "claude", "FAKE:verbose\nFAKE:answer=from the array"))
    assert res.ok, res.error
    assert (res.text, res.session_id, res.tokens) == ("from the array", "0b6e2f4e-claude-session", 18)
    failed = run(req(bin_dir, "claude", "FAKE:verbose\nFAKE:error"))
    assert not failed.ok and failed.failure_reason == "agent_error"


def test_codex_0_4x_item_type_events_are_read(bin_dir):
    res = run(req(bin_dir, "codex", "FAKE:legacy\nFAKE:answer=legacy answer"))
    assert res.ok, res.error
    assert (res.text, res.session_id, res.tokens) == ("legacy answer", "0199a213-81c0-7800-8aa1-bbab2a035a53", 24885)


def test_opencode_gets_the_system_prompt_in_its_message(bin_dir):
    """`opencode run` has no system-prompt option and refuses unknown ones: an agent judge on opencode
    (judges always carry a system prompt) must still run."""
    res = run(req(bin_dir, "opencode", "FAKE:answer=judged", system_prompt="You are a strict auditor."))
    assert res.ok, res.error
    assert res.text == "judged"
    [call] = fake_harness.calls(str(bin_dir))
    assert "--system-prompt" not in call["argv"]
    assert call["prompt"] == "You are a strict auditor.\n\nFAKE:answer=judged"


def test_plain_text_from_a_structured_harness_is_still_an_answer(bin_dir):
    res = run(req(bin_dir, "claude", "FAKE:noise\nFAKE:answer=x"))
    assert res.ok and res.text == "some plain text\nx" and res.session_id is None


# --------------------------------------------------------------------------- argv builders (pure)


def test_claude_argv():
    built = hz.build("claude", hz.Call(bin="claude", args=[], prompt="P", system_prompt="S", model="claude-opus-4-7"))
    assert built.argv == [
        "claude",
        "--system-prompt",
        "S",
        "--model",
        "claude-opus-4-7",
        "--output-format",
        "stream-json",
        "--verbose",
        "--print",
        "--",
        "P",
    ]
    assert built.env_defaults == {"CLAUDE_CODE_MAX_RETRIES": str(hz.HARNESS_RETRIES)}
    long = hz.build("claude", hz.Call(bin="claude", args=[], prompt="x" * 200_000))
    assert long.argv[-1] == "--print" and long.stdin == "x" * 200_000
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    native = hz.build("claude", hz.Call(bin="claude", args=[], prompt="P", schema=schema))
    assert native.argv[1:3] == ["--json-schema", json.dumps(schema, separators=(",", ":"))]
    # a tool's input must be an object for the Anthropic API: an array schema stays in the prompt
    listed = hz.build("claude", hz.Call(bin="claude", args=[], prompt="P", schema={"type": "array"}))
    assert "--json-schema" not in listed.argv


def test_codex_argv_and_schema_file(tmp_path):
    built = hz.build("codex", hz.Call(bin="codex", args=[], prompt="P"))
    assert built.argv == ["codex", "exec", "--sandbox", "workspace-write", "--skip-git-repo-check", "--json", "--", "P"]
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    built = hz.build(
        "codex",
        hz.Call(
            bin="codex",
            args=["exec", "-s", "read-only"],
            prompt="P",
            system_prompt="S",
            schema=schema,
            schema_path=str(tmp_path / "s.json"),
        ),
    )
    assert built.argv[:4] == ["codex", "exec", "-s", "read-only"] and "--sandbox" not in built.argv
    assert built.argv[-4:] == ["--output-schema", str(tmp_path / "s.json"), "--", "S\n\nP"]
    assert json.loads(built.schema_file[1]) == schema


def test_opencode_model_replaces_the_configured_one_keeping_its_provider():
    built = hz.build(
        "opencode", hz.Call(bin="opencode", args=["run", "--model", "openai/gpt-5"], prompt="do work", model="gpt-6")
    )
    assert built.argv == [
        "opencode",
        "run",
        "--model",
        "openai/gpt-6",
        "--format",
        "json",
        "--print-logs",
        "--log-level",
        "ERROR",
        "--",
        "do work",
    ]


def test_text_harness_argv():
    assert hz.build("aider", hz.Call(bin="aider", args=["--no-auto-commits"], prompt="P", model="m")).argv == [
        "aider",
        "--no-auto-commits",
        "--model",
        "m",
        "--yes-always",
        "--no-pretty",
        "--message=P",
    ]
    assert hz.build("amazonq", hz.Call(bin="q", args=["chat", "--trust-tools=fs_read,fs_write"], prompt="P")).argv == [
        "q",
        "chat",
        "--trust-tools=fs_read,fs_write",
        "--no-interactive",
        "--",
        "P",
    ]
    oh = hz.build("openhands", hz.Call(bin="openhands", args=[], prompt="P", model="gpt-x"))
    assert oh.argv == ["openhands", "--headless", "--json", "--task=P"] and oh.env == {"LLM_MODEL": "gpt-x"}
    gemini = hz.build("gemini", hz.Call(bin="gemini", args=[], prompt="P", system_prompt="S"))
    assert gemini.argv == ["gemini", "--output-format", "json", "-p", "S\n\nP"]
    assert gemini.env_defaults == {"GEMINI_CLI_TRUST_WORKSPACE": "true"}  # else headless gemini exits 55


def test_a_flag_shaped_model_is_refused(bin_dir):
    with pytest.raises(hz.HarnessError):
        hz.build("claude", hz.Call(bin="claude", args=[], prompt="P", model="--dangerously-skip-permissions"))
    res = run(req(bin_dir, "claude", model="--evil"))
    assert res.failure_reason == "dispatch_error" and "flag" in res.error
    assert fake_harness.calls(str(bin_dir)) == []


def test_detect_finds_clis_on_path(bin_dir):
    found = hz.detect(str(bin_dir))
    assert list(found) == list(hz.DETECTION_ORDER) and found["amazonq"].endswith("/q")


# --------------------------------------------------------------------------- process and environment


def test_environment_is_built_from_nothing(bin_dir):
    env = parent_env(
        bin_dir, SECRET_X="top-secret-value-1", ANTHROPIC_API_KEY="anthropic-key-value", EXTRA_ALLOWED="extra-value-77"
    )
    res = run(
        req(
            bin_dir,
            "claude",
            "FAKE:echo-env=SECRET_X",
            env=env,
            engine={"envPassthrough": ["EXTRA_ALLOWED"]},
            env_bindings={"BOUND": "bound-secret-42"},
        )
    )
    assert res.ok and res.text is None  # SECRET_X is not passed
    [call] = fake_harness.calls(str(bin_dir))
    child = call["env"]
    assert "SECRET_X" not in child and child["HOME"] == env["HOME"] and child["PATH"].startswith(str(bin_dir))
    assert child["ANTHROPIC_API_KEY"] == "anthropic-key-value"  # the harness's own key
    assert child["EXTRA_ALLOWED"] == "extra-value-77" and child["BOUND"] == "bound-secret-42"
    assert child["AKM_RUN_ID"] == "run-1" and child["AKM_UNIT_ID"] == "s:solo"


def test_passthrough_secrets_and_bindings_are_redacted_from_output(bin_dir):
    env = parent_env(bin_dir, ANTHROPIC_API_KEY="anthropic-key-value")
    res = run(req(bin_dir, "claude", "FAKE:echo-env=ANTHROPIC_API_KEY", env=env))
    assert res.ok and res.text == "[REDACTED]"
    res = run(
        req(
            bin_dir,
            "claude",
            "FAKE:echo-env=BOUND",
            env_bindings={"BOUND": "bound-secret-42"},
            sensitive_values=["bound-secret-42"],
        )
    )
    assert res.text == "[REDACTED]"


def test_missing_binary_is_spawn_failed(bin_dir, tmp_path):
    res = run(req(bin_dir, "claude", env={"PATH": str(tmp_path / "empty"), "HOME": "/tmp"}))
    assert res.failure_reason == "spawn_failed" and "not on PATH" in res.error
    res = run(req(bin_dir, "claude", engine={"bin": str(tmp_path / "nope")}))
    assert res.failure_reason == "spawn_failed"


def test_non_zero_exit_keeps_stderr_and_session(bin_dir):
    res = run(req(bin_dir, "codex", "FAKE:exit=3"))
    assert res.failure_reason == "non_zero_exit" and "exited 3" in res.error and "fatal error" in res.error
    assert res.session_id == EXPECTED["codex"][0]


def test_timeout_kills_the_group_promptly(bin_dir):
    start = time.monotonic()
    res = run(req(bin_dir, "claude", "FAKE:sleep=300", timeout_ms=300))
    assert res.failure_reason == "timeout" and "300 ms" in res.error
    assert time.monotonic() - start < 120  # far below the 300 s the CLI sleeps (generous: CI is loaded)


def test_cancel_kills_the_group_promptly(bin_dir):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    start = time.monotonic()
    res = run(req(bin_dir, "gemini", "FAKE:sleep=300", timeout_ms=None), cancel)
    assert res.failure_reason == "aborted" and time.monotonic() - start < 120  # far below the CLI's 300 s


def test_a_background_child_holding_stdout_is_swept(bin_dir):
    start = time.monotonic()
    res = run(req(bin_dir, "claude", "FAKE:background"))
    assert res.failure_reason == "spawn_failed" and "background process" in res.error
    assert time.monotonic() - start < 15


def test_cwd_comes_from_the_request(bin_dir, tmp_path):
    tree = tmp_path / "worktree"
    tree.mkdir()
    assert run(req(bin_dir, "codex", cwd=tree)).ok
    assert fake_harness.calls(str(bin_dir))[-1]["cwd"] == str(tree)


def test_codex_gets_the_schema_as_a_file(bin_dir):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    res = run(req(bin_dir, "codex", "Answer in JSON.", output_schema=schema))
    assert res.ok and json.loads(res.text) == {"ok": True}
    call = fake_harness.calls(str(bin_dir))[-1]
    assert json.loads(call["schema_file"]) == schema
    assert not os.path.exists(call["argv"][call["argv"].index("--output-schema") + 1])  # cleaned up


def test_codex_gets_no_schema_file_that_openai_strict_mode_would_refuse(bin_dir):
    """codex forwards --output-schema to OpenAI in strict mode: an open object or an optional property
    is an HTTP 400 and the turn fails. Such a schema stays in the prompt only."""
    for schema in (
        {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        {"type": "object", "required": ["ok"], "properties": {"ok": {}}, "additionalProperties": False},
        {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}, "note": {"type": "string"}},
            "required": ["ok"],
            "additionalProperties": False,
        },
    ):
        res = run(req(bin_dir, "codex", "Answer in JSON.", output_schema=schema))
        assert res.ok and json.loads(res.text) == {"ok": True}, res.error
        assert "--output-schema" not in fake_harness.calls(str(bin_dir))[-1]["argv"]


def test_long_prompt_goes_through_stdin_for_claude(bin_dir):
    prompt = "FAKE:answer=long ok\n" + "x" * 200_000
    res = run(req(bin_dir, "claude", prompt))
    assert res.ok and res.text == "long ok"
    assert fake_harness.calls(str(bin_dir))[-1]["stdin"] == prompt
    res = run(req(bin_dir, "gemini", prompt))
    assert res.failure_reason == "dispatch_error" and "command line" in res.error


def test_feedback_is_appended_to_the_prompt(bin_dir):
    run(req(bin_dir, "claude", "Do it."), feedback="That was not JSON.")
    assert fake_harness.calls(str(bin_dir))[-1]["prompt"] == "Do it.\n\nThat was not JSON."


@pytest.mark.parametrize(
    "platform,where",
    [("opencode", "OPENCODE_CONFIG_CONTENT"), ("aider", "OPENAI_API_KEY"), ("openhands", "LLM_API_KEY")],
)
def test_agent_on_an_llm_engine_gets_its_endpoint_and_key(bin_dir, platform, where):
    llm = {
        "name": "local",
        "kind": "llm",
        "endpoint": "http://127.0.0.1:9/v1/chat/completions",
        "model": "qwen3",
        "credential": {"names": ["LOCAL_KEY"], "required": True},
    }
    env = parent_env(bin_dir, LOCAL_KEY=KEY)
    marker = "FAKE:echo-env=AKM_LLM_API_KEY" if platform == "opencode" else f"FAKE:echo-env={where}"
    res = run(req(bin_dir, platform, marker, env=env, engine={"llmEngine": "local", "llm": llm}))
    assert res.ok and res.text == "[REDACTED]", res  # the key reached the harness, and never came back out
    child = fake_harness.calls(str(bin_dir))[-1]
    if platform == "opencode":
        config = json.loads(child["env"]["OPENCODE_CONFIG_CONTENT"])
        assert config["model"] == "akm/qwen3" and KEY not in child["env"]["OPENCODE_CONFIG_CONTENT"]
        assert config["provider"]["akm"]["options"]["baseURL"] == "http://127.0.0.1:9/v1"
        assert child["argv"][child["argv"].index("--model") + 1] == "akm/qwen3"
    elif platform == "aider":
        assert "--openai-api-base" in child["argv"] and child["env"][where] == KEY
    else:
        assert child["env"]["LLM_BASE_URL"] == "http://127.0.0.1:9/v1" and child["env"]["LLM_MODEL"] == "openai/qwen3"
    missing = run(req(bin_dir, platform, env=parent_env(bin_dir), engine={"llmEngine": "local", "llm": llm}))
    assert missing.failure_reason == "dispatch_error" and "$LOCAL_KEY" in missing.error


def test_engine_concurrency_caps_running_processes(bin_dir):
    dispatcher = AgentDispatcher()
    results = []

    def one(i: int) -> None:
        r = req(bin_dir, "claude", "FAKE:sleep=0.4", engine={"concurrency": 1})
        r.attempt_id = f"u{i}"
        results.append((time.monotonic(), dispatcher.dispatch(r, threading.Event(), None)))

    start = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r.ok for _, r in results) and len(results) == 3
    assert time.monotonic() - start >= 1.2  # three 0.4 s runs, one at a time


def test_a_passthrough_switch_is_not_scrubbed_from_answers(bin_dir):
    """`OPENCODE_DISABLE_MODELS_FETCH=true` passed through must not turn the answer's `true` into [REDACTED]."""
    env = parent_env(bin_dir, OPENCODE_DISABLE_MODELS_FETCH="true", SOME_TOKEN="tok-9f8e7d6c5b")
    engine = {"envPassthrough": ["OPENCODE_DISABLE_MODELS_FETCH", "SOME_TOKEN"]}
    res = run(req(bin_dir, "opencode", 'FAKE:answer={"ok": true}', engine=engine, env=env))
    assert res.ok and res.text == '{"ok": true}', res
    leak = run(req(bin_dir, "opencode", "FAKE:echo-env=SOME_TOKEN", engine=engine, env=env))
    assert leak.ok and "tok-9f8e7d6c5b" not in (leak.text or "") and "REDACTED" in (leak.text or "")


def test_gemini_without_credentials_is_an_auth_failure_naming_the_variable():
    """What the real gemini 0.61 prints with no GEMINI_API_KEY (exit 41): its JSON error on stderr."""
    stderr = json.dumps(
        {
            "session_id": "cdd1a249-2646-4358-92d7-359ecef1dbb2",
            "error": {
                "type": "Error",
                "message": "When using Gemini API, you must specify the GEMINI_API_KEY environment variable.",
                "code": 41,
            },
        },
        indent=2,
    )
    got = hz.extract("gemini", "", "Warning: Basic terminal detected (TERM=dumb).\n" + stderr)
    assert got.no_credentials and got.api_status is None and "GEMINI_API_KEY" in (got.error or "")
    assert got.session_id == "cdd1a249-2646-4358-92d7-359ecef1dbb2"
