"""A fake agent harness CLI: installed as `claude`, `codex`, `opencode`, … on a test PATH.

For engine, setup and dispatcher-mechanics tests that need a harness that starts in milliseconds and does
what a marker says (the real CLIs run in tests/test_agent_clis_real.py). `install(bin_dir)` writes one real
executable per harness. Each run appends a record (argv, cwd, environment, stdin) to
`<bin_dir>/calls.jsonl`, then prints its answer as that harness really does:

* claude, codex, opencode and gemini REPLAY what the real CLIs printed (tests/agent_clis/captured/, made
  by `python -m tests.agent_clis.capture` from the pinned versions): the same events, warnings, exit
  statuses and streams, with the answer, paths and session id filled in. A failing model API is replayed
  as the real CLI reports it — claude exits 1 with `is_error` and `api_error_status`, codex prints its
  `Reconnecting…` events and exits 1, opencode's error event (or its endless retries, in its error log),
  gemini's JSON error on stderr with exit 145 (or its endless "Attempt n failed" retries). Like the real
  gemini, the fake one refuses a folder it was not told to trust (exit 55).
* copilot, pi, aider, amazonq and openhands (not installed here) print the output shapes of their docs.

Markers in the prompt:

  FAKE:answer=<text>     the answer (up to the end of the line)
  FAKE:exit=<n>          exit with status n after printing
  FAKE:sleep=<s>         sleep s seconds first
  FAKE:linger=<s>        sleep s seconds after printing, before exiting (output seen while it runs)
  FAKE:echo-env=<NAME>   the answer is the value of $NAME (empty when unset)
  FAKE:api=<status>      the model API answers HTTP <status> (401, 429 or 500), reported as the CLI does
  FAKE:error             the harness reports a failure: for the replayed four, FAKE:api=500
  FAKE:background        leave a child holding stdout open after exiting
  FAKE:noise             print plain text instead of the structured format
  FAKE:verbose           claude: the JSON array `--output-format json` prints in verbose mode
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
from pathlib import Path

CAPTURED = Path(__file__).resolve().parent / "agent_clis" / "captured"
REPLAYED = ("claude", "codex", "opencode", "gemini")
CAPTURED_ANSWER = {"ok": True}  # what the fake model API answered when the captures were made
# The session ids in the captures (tests/agent_clis/capture.py SESSIONS).
SESSIONS = {
    "claude": "5f0c7a9e-2b1d-4e8a-9c3f-akmcapture01",
    "codex": "01a24d93-9e5b-73d1-a386-akmcapture02",
    "opencode": "ses_akmcapture03OhrNJmCge5xwp",
    "gemini": "9a1e6c2d-7f3b-4d8e-b5a0-akmcapture04",
}

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


# The options `opencode run --help` lists (opencode-ai 1.18); anything else is refused.
OPENCODE_RUN_OPTIONS = {
    "--help",
    "-h",
    "--version",
    "-v",
    "--print-logs",
    "--log-level",
    "--pure",
    "--command",
    "--continue",
    "-c",
    "--session",
    "-s",
    "--fork",
    "--share",
    "--model",
    "-m",
    "--agent",
    "--format",
    "--file",
    "-f",
    "--title",
    "--attach",
    "--password",
    "-p",
    "--username",
    "-u",
    "--dir",
    "--port",
    "--variant",
    "--thinking",
    "--interactive",
    "-i",
    "--auto",
}


def _capture(platform: str, case: str) -> dict:
    with open(CAPTURED / platform / f"{case}.json", encoding="utf-8") as fh:
        return json.load(fh)


def _fill(text: str, answer: str) -> str:
    """A captured stream with this run's answer, directory and HOME in it."""
    try:
        as_json = json.dumps(json.loads(answer), separators=(",", ":"), ensure_ascii=False)
    except ValueError:
        as_json = json.dumps(answer)
    return (
        text.replace("@@ANSWER_JSON@@", as_json)
        .replace("@@ANSWER@@", json.dumps(answer, ensure_ascii=False)[1:-1])
        .replace("@@CWD@@", os.getcwd())
        .replace("@@HOME@@", os.environ.get("HOME", "/nonexistent"))
        .replace("@@BASE@@", "http://127.0.0.1:9/fake")
    )


def _replay(platform: str, argv: list[str], answer: str, status: int | None) -> int | None:
    """Print what the real CLI printed in that case; its exit status (None: it would retry forever)."""
    if platform == "gemini" and os.environ.get("GEMINI_CLI_TRUST_WORKSPACE") != "true" and "--skip-trust" not in argv:
        case = "untrusted"
    elif status is None:
        case = "ok-schema" if platform == "claude" and "--json-schema" in argv and _is_json(answer) else "ok"
    else:
        cases = {
            "claude": {401: "api-401", 429: "api-429", 500: "api-500"},
            "codex": {401: "api-401", 429: "api-429", 500: "api-500"},
            "opencode": {401: "api-401", 429: "api-429", 500: "retry-500"},
            "gemini": {401: "api-401", 429: "retry-429", 500: "retry-429"},
        }[platform]
        case = cases[status]
    got = _capture(platform, case)
    stdout, stderr = _fill(got["stdout"], answer), _fill(got["stderr"], answer)
    if platform == "gemini" and case == "retry-429" and status == 500:
        stderr = stderr.replace("429", "500").replace("RESOURCE_EXHAUSTED", "INTERNAL")
    sys.stdout.write(stdout)
    sys.stdout.flush()
    sys.stderr.write(stderr)
    sys.stderr.flush()
    if got["exit"] is not None:
        return int(got["exit"])
    # the real CLI was still retrying when the capture stopped it: go on retrying, as it would
    retry_lines = [line for line in stderr.splitlines() if "Attempt " in line or 'message="stream error"' in line]
    n = len(retry_lines)
    while retry_lines:
        time.sleep(0.3)
        n += 1
        line = re.sub(r"Attempt \d+", f"Attempt {n}", retry_lines[-1])
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    time.sleep(600)
    return None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


FAKE_VERSIONS = {"claude": "2.1.332", "codex": "0.171.0", "opencode": "1.18.33", "gemini": "0.61.0"}


def main(platform: str) -> None:
    argv = sys.argv[1:]
    if argv == ["--version"]:  # what `akm setup` asks of each CLI it finds (not a unit: not recorded)
        print(f"{FAKE_VERSIONS.get(platform, '1.0.0')} (fake {platform})")
        return
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
    api = _marker(prompt, "api")
    status = int(api) if api else (500 if failed else None)
    if _marker(prompt, "background") is not None:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])  # inherits stdout
    replayed = None
    if _marker(prompt, "noise") is not None:
        print(f"some plain text\n{answer}")
    elif platform == "claude" and _marker(prompt, "verbose") is not None:
        print(_claude_verbose(answer, failed))
    elif platform == "codex" and _marker(prompt, "legacy") is not None:
        print(_codex_legacy(answer))
    elif platform in REPLAYED:
        replayed = _replay(platform, argv, answer, status)
    else:
        print(SHAPES[platform](answer, failed))
    sys.stdout.flush()
    if (s := _marker(prompt, "linger")) is not None:
        time.sleep(float(s))
    code = _marker(prompt, "exit")
    if code:
        sys.stderr.write(f"{platform}: fatal error (exit {code})\n")
        sys.exit(int(code))
    if replayed:
        sys.exit(replayed)


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
    "copilot": _copilot,
    "pi": _pi,
    "aider": _aider,
    "amazonq": _amazonq,
    "openhands": _openhands,
}
