"""akm.dispatch.agent_stream: reading the real CLIs' streams, line by line, as they printed them.

The lines come from tests/agent_clis/captured/ (what the pinned CLIs printed against the fake model APIs).
"""

from __future__ import annotations

import json

import pytest

from akm.dispatch.agent_stream import Activity, StreamWatch
from tests.fake_harness import CAPTURED, SESSIONS


def feed(platform: str, case: str, retries: int = 2) -> tuple[StreamWatch, list[Activity], list[str]]:
    got = json.loads((CAPTURED / platform / f"{case}.json").read_text(encoding="utf-8"))
    seen: list[Activity] = []
    stops: list[str] = []
    watch = StreamWatch(platform, retries=retries, on_activity=seen.append)
    for stream in ("stdout", "stderr"):
        for line in got[stream].splitlines():
            if line.strip():
                reason = watch.line(stream, line)
                if reason:
                    stops.append(reason)
    return watch, seen, stops


@pytest.mark.parametrize("platform", ["claude", "codex", "opencode"])
def test_a_good_run_is_followed_turn_by_turn_without_a_stop(platform):
    watch, seen, stops = feed(platform, "ok")
    assert stops == [] and watch.stop is None
    assert watch.activity.session_id == SESSIONS[platform]
    assert watch.activity.turns >= 1 and watch.activity.retries == 0
    assert seen and seen[-1].turns == watch.activity.turns  # each change reported


def test_claude_is_stopped_at_its_first_refused_key():
    watch, _, stops = feed("claude", "retry-401")
    assert watch.stop is not None and watch.stop.reason == "agent_auth" and watch.stop.status == 401
    assert len(stops) == 1 and "refused claude's API key (HTTP 401)" in stops[0]
    assert watch.activity.retries == 1


def test_codex_refused_key_and_rate_limit():
    watch, _, stops = feed("codex", "api-401")
    assert watch.stop is not None and watch.stop.reason == "agent_auth"
    assert watch.activity.retries == 1  # the first `Reconnecting... 1/5 (unexpected status 401 …)` stopped it
    watch, _, _ = feed("codex", "api-429")
    assert watch.stop is not None and watch.stop.reason == "llm_rate_limit"
    assert watch.activity.retries == 3  # allowed 2 retries: the third failed call stops it
    assert "3 failed calls" in watch.stop.message and "HTTP 429" in watch.stop.message


def test_opencode_silent_server_errors_are_counted_from_its_error_log():
    watch, _, _ = feed("opencode", "retry-500")
    assert watch.stop is not None and watch.stop.reason == "agent_error"
    assert watch.activity.session_id == SESSIONS["opencode"]


def test_gemini_retries_on_stderr_are_counted():
    watch, _, _ = feed("gemini", "retry-429", retries=0)
    assert watch.stop is not None and watch.stop.reason == "llm_rate_limit" and watch.stop.status == 429
    watch, _, _ = feed("gemini", "retry-429", retries=50)
    assert watch.stop is None and watch.activity.retries >= 1 and watch.activity.retry_status == 429


def test_tool_calls_are_counted_from_each_stream():
    claude = StreamWatch("claude", retries=2)
    claude.line(
        "stdout",
        json.dumps(
            {
                "type": "assistant",
                "parent_tool_use_id": None,
                "message": {"content": [{"type": "text", "text": "x"}, {"type": "tool_use", "name": "Bash"}]},
            }
        ),
    )
    codex = StreamWatch("codex", retries=2)
    codex.line("stdout", json.dumps({"type": "item.started", "item": {"type": "command_execution", "command": "ls"}}))
    opencode = StreamWatch("opencode", retries=2)
    opencode.line("stdout", json.dumps({"type": "tool_use", "sessionID": "s", "part": {"tool": "bash"}}))
    assert (claude.activity.tool_calls, claude.activity.tool, claude.activity.turns) == (1, "Bash", 1)
    assert (codex.activity.tool_calls, codex.activity.tool) == (1, "command_execution")
    assert (opencode.activity.tool_calls, opencode.activity.tool) == (1, "bash")
    assert Activity(turns=1, tool_calls=2, tool="Bash").to_json() == {
        "turns": 1,
        "toolCalls": 2,
        "tool": "Bash",
        "retries": 0,
    }


def test_lines_that_are_not_events_are_ignored():
    for platform in ("claude", "codex", "opencode", "gemini", "pi"):
        watch = StreamWatch(platform, retries=0)
        for line in ("not json", "{broken", "[1,2]", '{"type": 5}', "\x1b[31mred\x1b[0m"):
            assert watch.line("stdout", line) is None and watch.line("stderr", line) is None
        assert watch.activity == Activity()
