"""A fake agent harness CLI: installed as `claude`, `codex`, `opencode`, … on a test PATH.

`install(bin_dir)` writes one real executable per harness. Each run appends a
record (argv, cwd, environment, stdin) to `<bin_dir>/calls.jsonl`, then prints
its answer in that harness's real output shape. What it does is steered by
markers in the prompt:

  FAKE:answer=<text>     the answer (up to the end of the line)
  FAKE:exit=<n>          exit with status n after printing
  FAKE:sleep=<s>         sleep s seconds first
  FAKE:echo-env=<NAME>   the answer is the value of $NAME (empty when unset)
  FAKE:error             the harness reports a failure in its output but exits 0
  FAKE:background        leave a child holding stdout open after exiting
  FAKE:noise             print plain text instead of the structured format
  FAKE:verbose           claude: the JSON array verbose mode prints instead of one result object
  FAKE:legacy            codex: the 0.4x event shape (items tagged `item_type`, `assistant_message`)

Like the real `opencode run` (yargs in strict mode), the fake opencode refuses
an option it does not know, with exit 1 and nothing on stdout.

Without a marker the answer is `{"ok": true}` when the prompt asks for JSON,
else `done`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

PLATFORMS = {
    "claude": "claude",
    "codex": "codex",
    "opencode": "opencode",
    "gemini": "gemini",
    "copilot": "copilot",
    "pi": "pi",
    "aider": "aider",
    "amazonq": "q",
    "openhands": "openhands",
}


def install(bin_dir: str, platforms: list[str] | None = None) -> dict[str, str]:
    """Write the fake executables; returns {platform: path}."""
    os.makedirs(bin_dir, exist_ok=True)
    out = {}
    for platform, exe in PLATFORMS.items():
        if platforms is not None and platform not in platforms:
            continue
        path = os.path.join(bin_dir, exe)
        with open(path, "w") as fh:
            fh.write(
                f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                f"import fake_harness\nfake_harness.main({platform!r})\n"
            )
        os.chmod(path, 0o755)
        out[platform] = path
    return out


def calls(bin_dir: str) -> list[dict]:
    try:
        with open(os.path.join(bin_dir, "calls.jsonl")) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def _prompt(platform: str, argv: list[str], stdin: str) -> str:
    if platform in ("gemini", "copilot"):
        return argv[argv.index("-p") + 1]
    if platform in ("aider",):
        return next(a for a in argv if a.startswith("--message="))[len("--message=") :]
    if platform == "openhands":
        return next(a for a in argv if a.startswith("--task="))[len("--task=") :]
    if platform == "pi":
        return argv[-1]
    if "--" in argv:
        return argv[argv.index("--") + 1]
    return stdin


def _openai_strict(schema) -> bool:
    """OpenAI strict structured outputs: every object closed and requiring all of its properties."""
    if isinstance(schema, list):
        return all(_openai_strict(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    props = schema.get("properties")
    if schema.get("type") == "object" or isinstance(props, dict):
        if schema.get("additionalProperties") is not False:
            return False
        if isinstance(props, dict) and set(schema.get("required") or []) != set(props):
            return False
    return all(
        _openai_strict(v)
        for k, v in schema.items()
        if k in ("properties", "items", "anyOf")
        for v in ([v] if k != "properties" else v.values())
    )


def _marker(prompt: str, name: str) -> str | None:
    m = re.search(rf"FAKE:{name}(?:=([^\n]*))?", prompt)
    if not m:
        return None
    return m.group(1) if m.group(1) is not None else ""


# The options `opencode run` accepts (packages/opencode/src/cli/cmd/run.ts); anything else is refused.
OPENCODE_RUN_OPTIONS = {
    "--model",
    "-m",
    "--format",
    "--agent",
    "--continue",
    "-c",
    "--session",
    "-s",
    "--share",
    "--command",
    "--file",
    "-f",
    "--title",
    "--attach",
    "--port",
    "--print-logs",
    "--log-level",
}


def main(platform: str) -> None:
    argv = sys.argv[1:]
    if platform == "opencode":
        head = argv[: argv.index("--")] if "--" in argv else argv
        unknown = [a for a in head if a.startswith("-") and a.split("=", 1)[0] not in OPENCODE_RUN_OPTIONS]
        if unknown:
            sys.stderr.write(f"Unknown argument: {unknown[0].lstrip('-')}\n")
            sys.exit(1)
    stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    prompt = _prompt(platform, argv, stdin)
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    record = {
        "platform": platform,
        "argv": argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "stdin": stdin,
        "prompt": prompt,
    }
    if "--output-schema" in argv:
        with open(argv[argv.index("--output-schema") + 1]) as fh:
            record["schema_file"] = fh.read()
    with open(os.path.join(here, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps(record) + "\n")
    if "schema_file" in record and not _openai_strict(json.loads(record["schema_file"])):
        # what the real codex prints when OpenAI's strict mode refuses the --output-schema
        msg = (
            "Invalid schema for response_format 'codex_output_schema': In context=(), 'additionalProperties' "
            "is required to be supplied and to be false."
        )
        print(
            _jsonl(
                [
                    {"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"},
                    {"type": "turn.started"},
                    {"type": "error", "message": msg},
                    {"type": "turn.failed", "error": {"message": msg}},
                ]
            )
        )
        sys.exit(1)

    if (s := _marker(prompt, "sleep")) is not None:
        time.sleep(float(s))
    answer = _marker(prompt, "answer")
    if (name := _marker(prompt, "echo-env")) is not None:
        answer = os.environ.get(name, "")
    if answer is None:
        answer = '{"ok": true}' if "JSON" in prompt else "done"
    failed = _marker(prompt, "error") is not None
    if _marker(prompt, "background") is not None:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # inherits stdout
    if _marker(prompt, "noise") is not None:
        print(f"some plain text\n{answer}")
    elif platform == "claude" and _marker(prompt, "verbose") is not None:
        print(_claude_verbose(answer, failed))
    elif platform == "codex" and _marker(prompt, "legacy") is not None:
        print(_codex_legacy(answer))
    else:
        print(SHAPES[platform](answer, failed))
    sys.stdout.flush()
    code = _marker(prompt, "exit")
    if code:
        sys.stderr.write(f"{platform}: fatal error (exit {code})\n")
        sys.exit(int(code))


def _jsonl(events: list[dict]) -> str:
    return "\n".join(json.dumps(e) for e in events)


def _claude(answer: str, failed: bool) -> str:
    return json.dumps(
        {
            "type": "result",
            "subtype": "error_during_execution" if failed else "success",
            "is_error": failed,
            "duration_ms": 2345,
            "duration_api_ms": 2100,
            "num_turns": 1,
            "result": answer,
            "session_id": "0b6e2f4e-claude-session",
            "total_cost_usd": 0.0123,
            "usage": {
                "input_tokens": 11,
                "cache_creation_input_tokens": 200,
                "cache_read_input_tokens": 3000,
                "output_tokens": 7,
                "server_tool_use": {"web_search_requests": 0},
                "service_tier": "standard",
            },
            "permission_denials": [],
            "uuid": "5d1c0f7e-2f4b-4f0e-9a0a-0c7e0e1e2f3a",
        }
    )


def _claude_verbose(answer: str, failed: bool) -> str:
    """`claude -p --output-format json` with verbose mode on: every session message, the result last."""
    sid = "0b6e2f4e-claude-session"
    return json.dumps(
        [
            {
                "type": "system",
                "subtype": "init",
                "cwd": "/w",
                "session_id": sid,
                "tools": ["Bash", "Read"],
                "model": "claude-sonnet-4-6",
                "permissionMode": "default",
            },
            {
                "type": "assistant",
                "session_id": sid,
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-6",
                    "content": [{"type": "text", "text": answer}],
                    "stop_reason": None,
                    "usage": {"input_tokens": 11, "output_tokens": 7},
                },
            },
            json.loads(_claude(answer, failed)),
        ]
    )


def _codex_legacy(answer: str) -> str:
    """`codex exec --json` of the 0.4x releases: items tagged `item_type`, the answer an `assistant_message`."""
    return _jsonl(
        [
            {"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"},
            {"type": "turn.started"},
            {"type": "item.completed", "item": {"id": "item_0", "item_type": "reasoning", "text": "**Reading**"}},
            {
                "type": "item.completed",
                "item": {
                    "id": "item_1",
                    "item_type": "command_execution",
                    "command": "bash -lc 'cat note.txt'",
                    "aggregated_output": "PING\n",
                    "exit_code": 0,
                    "status": "completed",
                },
            },
            {"type": "item.completed", "item": {"id": "item_2", "item_type": "assistant_message", "text": answer}},
            {
                "type": "turn.completed",
                "usage": {"input_tokens": 24763, "cached_input_tokens": 24448, "output_tokens": 122},
            },
        ]
    )


def _codex(answer: str, failed: bool) -> str:
    events = [
        {"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "**Looking at files**"}},
        {
            "type": "item.started",
            "item": {
                "id": "item_1",
                "type": "command_execution",
                "command": "bash -lc ls",
                "aggregated_output": "",
                "exit_code": None,
                "status": "in_progress",
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": "item_1",
                "type": "command_execution",
                "command": "bash -lc ls",
                "aggregated_output": "README.md\n",
                "exit_code": 0,
                "status": "completed",
            },
        },
        {"type": "item.completed", "item": {"id": "item_2", "type": "agent_message", "text": "Let me check."}},
    ]
    if failed:
        events.append({"type": "turn.failed", "error": {"message": "stream disconnected before completion"}})
    else:
        events += [
            {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message", "text": answer}},
            {
                "type": "turn.completed",
                "usage": {"input_tokens": 24763, "cached_input_tokens": 24448, "output_tokens": 122},
            },
        ]
    return _jsonl(events)


def _opencode(answer: str, failed: bool) -> str:
    sid = "ses_494719016ffe85dkDMj0FPRbHK"
    events = [
        {
            "type": "step_start",
            "timestamp": 1767036059338,
            "sessionID": sid,
            "part": {"id": "prt_1", "sessionID": sid, "messageID": "msg_1", "type": "step-start", "snapshot": "abc"},
        },
        {
            "type": "text",
            "timestamp": 1767036059400,
            "sessionID": sid,
            "part": {
                "id": "prt_2",
                "sessionID": sid,
                "messageID": "msg_1",
                "type": "text",
                "text": "Let me look.",
                "time": {"start": 1, "end": 2},
            },
        },
        {
            "type": "tool_use",
            "timestamp": 1767036059500,
            "sessionID": sid,
            "part": {
                "id": "prt_3",
                "sessionID": sid,
                "messageID": "msg_1",
                "type": "tool",
                "tool": "bash",
                "callID": "call_1",
                "state": {"status": "completed", "input": {"command": "ls"}, "output": "x"},
            },
        },
        {
            "type": "step_finish",
            "timestamp": 1767036059600,
            "sessionID": sid,
            "part": {
                "id": "prt_4",
                "sessionID": sid,
                "messageID": "msg_1",
                "type": "step-finish",
                "reason": "tool-calls",
                "cost": 0,
                "tokens": {"input": 100, "output": 20, "reasoning": 5, "cache": {"read": 0, "write": 0}},
            },
        },
    ]
    if failed:
        events.append(
            {
                "type": "error",
                "timestamp": 1767036059700,
                "sessionID": sid,
                "error": {"name": "APIError", "data": {"message": "provider overloaded"}},
            }
        )
    else:
        events += [
            {
                "type": "text",
                "timestamp": 1767036059700,
                "sessionID": sid,
                "part": {
                    "id": "prt_5",
                    "sessionID": sid,
                    "messageID": "msg_2",
                    "type": "text",
                    "text": answer,
                    "time": {"start": 3, "end": 4},
                },
            },
            {
                "type": "step_finish",
                "timestamp": 1767036059800,
                "sessionID": sid,
                "part": {
                    "id": "prt_6",
                    "sessionID": sid,
                    "messageID": "msg_2",
                    "type": "step-finish",
                    "reason": "stop",
                    "cost": 0,
                    "tokens": {"input": 130, "output": 10, "reasoning": 0, "cache": {"read": 0, "write": 0}},
                },
            },
        ]
    return _jsonl(events)


def _gemini(answer: str, failed: bool) -> str:
    doc = {
        "session_id": "gem-7c1e",
        "response": None if failed else answer,
        "stats": {
            "models": {
                "gemini-2.5-pro": {
                    "api": {"totalRequests": 2, "totalErrors": 0, "totalLatencyMs": 5053},
                    "tokens": {
                        "prompt": 24939,
                        "candidates": 20,
                        "total": 25113,
                        "cached": 21263,
                        "thoughts": 154,
                        "tool": 0,
                    },
                }
            },
            "tools": {"totalCalls": 1, "totalSuccess": 1, "totalFail": 0, "totalDurationMs": 1881},
            "files": {"totalLinesAdded": 0, "totalLinesRemoved": 0},
        },
    }
    if failed:
        doc["error"] = {"type": "ApiError", "message": "quota exceeded", "code": 429}
    return json.dumps(doc, indent=2)


def _copilot(answer: str, failed: bool) -> str:
    base = {"timestamp": "2026-03-25T16:29:11.000Z", "parentId": None}
    events = [
        {
            "type": "session.start",
            "id": "evt-001",
            **base,
            "data": {
                "sessionId": "6364c2f8-ac3c-412d-8495-05b65b146837",
                "version": 1,
                "producer": "copilot-agent",
                "copilotVersion": "1.0.12",
                "startTime": "2026-03-25T16:29:09.644Z",
                "context": {"cwd": os.getcwd()},
            },
        },
        {"type": "user.message", "id": "evt-002", **base, "data": {"content": "task", "attachments": []}},
        {"type": "assistant.turn_start", "id": "evt-003", **base, "data": {"turnId": "0"}},
        {
            "type": "assistant.message",
            "id": "evt-004",
            **base,
            "data": {
                "messageId": "msg-001",
                "content": "",
                "toolRequests": [
                    {"toolCallId": "t1", "name": "bash", "arguments": {"command": "ls"}, "type": "function"}
                ],
                "outputTokens": 22,
            },
        },
        {
            "type": "tool.execution_start",
            "id": "evt-005",
            **base,
            "data": {"toolCallId": "t1", "toolName": "bash", "arguments": {"command": "ls"}},
        },
        {
            "type": "tool.execution_complete",
            "id": "evt-006",
            **base,
            "data": {"toolCallId": "t1", "success": True, "result": {"content": "README.md"}},
        },
    ]
    if failed:
        events.append({"type": "session.error", "id": "evt-007", **base, "data": {"message": "rate limited"}})
    else:
        events.append(
            {
                "type": "assistant.message",
                "id": "evt-007",
                **base,
                "data": {"messageId": "msg-002", "content": answer, "toolRequests": [], "outputTokens": 9},
            }
        )
    events += [
        {"type": "assistant.turn_end", "id": "evt-008", **base, "data": {"turnId": "0"}},
        {
            "type": "result",
            "timestamp": "2026-03-25T16:29:13.000Z",
            "sessionId": "6364c2f8-ac3c-412d-8495-05b65b146837",
            "exitCode": 0,
        },
    ]
    return _jsonl(events)


def _pi(answer: str, failed: bool) -> str:
    assistant = {
        "role": "assistant",
        "content": [{"type": "text", "text": "" if failed else answer}],
        "api": "anthropic-messages",
        "provider": "anthropic",
        "model": "claude-sonnet-4-5",
        "usage": {
            "input": 310,
            "output": 42,
            "cacheRead": 0,
            "cacheWrite": 0,
            "totalTokens": 352,
            "cost": {"total": 0.001},
        },
        "stopReason": "error" if failed else "stop",
        "timestamp": 1768264414702,
    }
    if failed:
        assistant["errorMessage"] = "401 invalid x-api-key"
    return _jsonl(
        [
            {
                "type": "session",
                "id": "ccd569e0-4e1b-4c7d-a981-637ed4107310",
                "version": 3,
                "timestamp": "2026-01-13T00:33:34.702Z",
                "cwd": os.getcwd(),
            },
            {"type": "agent_start"},
            {"type": "turn_start"},
            {"type": "message_start", "message": {"role": "user", "content": [{"type": "text", "text": "task"}]}},
            {"type": "message_end", "message": {"role": "user", "content": [{"type": "text", "text": "task"}]}},
            {"type": "message_start", "message": {**assistant, "content": []}},
            {
                "type": "message_update",
                "message": assistant,
                "assistantMessageEvent": {"type": "text_delta", "delta": answer, "contentIndex": 0},
            },
            {"type": "message_end", "message": assistant},
            {"type": "turn_end", "message": assistant, "toolResults": []},
        ]
    )


def _aider(answer: str, failed: bool) -> str:
    return "\n".join(
        [
            "Aider v0.86.1",
            "Main model: anthropic/claude-sonnet-4-5 with diff edit format, infinite output",
            "Weak model: anthropic/claude-3-5-haiku-20241022",
            "Git repo: .git with 42 files",
            "Repo-map: using 4096 tokens, auto refresh",
            "",
            answer,
            "",
            "Tokens: 2.3k sent, 150 received. Cost: $0.0091 message, $0.0091 session.",
        ]
    )


def _amazonq(answer: str, failed: bool) -> str:
    return f"\x1b[38;5;12m\x1b[1m> \x1b[0m{answer}\x1b[0m\n"


def _openhands(answer: str, failed: bool) -> str:
    return _jsonl(
        [
            {
                "id": 0,
                "timestamp": "2026-01-01T00:00:00",
                "source": "user",
                "action": "message",
                "args": {"content": "task"},
                "message": "task",
                "session_id": "oh-1234",
            },
            {"id": 1, "source": "agent", "action": "run", "args": {"command": "ls"}, "message": "Running ls"},
            {"id": 2, "source": "environment", "observation": "run", "content": "README.md"},
            {"id": 3, "source": "agent", "action": "message", "args": {"content": answer}, "message": answer},
            {"id": 4, "source": "agent", "action": "finish", "args": {"final_thought": answer}, "message": answer},
        ]
    )


SHAPES = {
    "claude": _claude,
    "codex": _codex,
    "opencode": _opencode,
    "gemini": _gemini,
    "copilot": _copilot,
    "pi": _pi,
    "aider": _aider,
    "amazonq": _amazonq,
    "openhands": _openhands,
}
