"""Agent harness profiles: how to call each agent CLI, and how to read what it prints.

Pure functions (no processes, no environment reads): `build(platform, …)` turns
one unit attempt into an argv (+ extra environment, + optional stdin and a
temporary file), and `extract(platform, stdout)` reads the answer, the
harness's session id and the tokens it reports out of that harness's real
output format. `akm.dispatch.agents` runs them.

Output modes were chosen so each harness tells us its session id and usage:

| platform  | non-interactive call                                   | output read                           |
|-----------|--------------------------------------------------------|---------------------------------------|
| claude    | `claude --output-format stream-json --verbose -p -- P` | JSONL session events, `result` last   |
| codex     | `codex exec --json --sandbox workspace-write -- P`     | JSONL thread events                   |
| opencode  | `opencode run --format json --print-logs -- [S\n\n]P`  | JSONL part events (+ error logs)      |
| gemini    | `gemini --output-format json -p P`                     | one JSON object (`response`, `stats`); errors on stderr |
| copilot   | `copilot -p P --allow-all-tools --output-format json`  | JSONL session events                  |
| pi        | `pi --print --mode json P`                             | JSONL agent events                    |
| aider     | `aider --yes-always --no-pretty --message=P`           | text (banners stripped)               |
| amazonq   | `q chat --no-interactive --trust-all-tools -- P`       | text (ANSI stripped)                  |
| openhands | `openhands --headless --json --task=P`                 | JSONL events                          |

Anything a harness prints that does not parse as its format is returned as
plain text, so a version that changed its output still yields an answer.

Usage is read as each CLI reports it and nothing is made up: a figure the CLI did not
give stays unknown (None), a CLI that failed before any model call reports no usage
(claude prints zeros then), and the parts — input, output, reasoning, cache reads and
writes, and per model with its role (gemini's `utility_router` apart from `main`) — are
kept in `Extracted.usage` beside the one `tokens` figure budgets count.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping

from akm.canonical import json_object
from akm.dispatch.llm import strict_compatible
from akm.dispatch.types import add_usage, token_count
from akm.record import dataclass, field

# Environment every harness needs (beyond the exec allowlist): where its config and
# caches live, and how the network is reached.
COMMON_PASSTHROUGH: tuple[str, ...] = (
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
)

# Passthrough names whose values are paths or identifiers, not secrets (spec/engine.md).
SAFE_ENV_NAMES = frozenset(
    {
        "HOME",
        "PATH",
        "TMPDIR",
        "TEMP",
        "TMP",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TERM",
        "TZ",
        "SystemRoot",
        "SystemDrive",
        "WINDIR",
        "COMSPEC",
        "PATHEXT",
        "USERPROFILE",
        "HOMEDRIVE",
        "HOMEPATH",
        "APPDATA",
        "LOCALAPPDATA",
        "ProgramData",
        "ProgramFiles",
        "AKM_EVENT_SOURCE",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_CACHE_HOME",
        "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
        "REQUESTS_CA_BUNDLE",
        "OPENCODE_CONFIG",
        "CLAUDE_CONFIG",
        "CLAUDE_CONFIG_DIR",
        "CODEX_CONFIG",
        "CODEX_HOME",
        "AWS_PROFILE",
        "AWS_REGION",
        "LLM_MODEL",
        "LLM_BASE_URL",
        "GOOGLE_CLOUD_PROJECT",
    }
)

ARGV_PROMPT_LIMIT = 120_000  # bytes: one argv string is capped at 128 KiB on Linux
LLM_KEY_ENV = "AKM_LLM_API_KEY"  # how an agent on an `llmEngine` receives that engine's key
NO_KEY = "akm-no-key"  # placeholder for keyless local servers (some harnesses insist on a key)


class HarnessError(ValueError):
    """A request the harness cannot be given (a flag-shaped model, a prompt too long for argv, …)."""


@dataclass(frozen=True)
class Profile:
    platform: str
    bin: str
    base_args: tuple[str, ...]
    env_passthrough: tuple[str, ...]
    builder: Callable[["Call"], "Built"]
    extractor: Callable[[str, str], "Extracted"]
    llm_engine: bool = False  # can be pointed at an OpenAI-compatible endpoint (`llmEngine`)
    stderr_noise: tuple[str, ...] = ()  # regexes of stderr lines that say nothing about a failure


@dataclass
class Call:
    """What one attempt asks of a harness (already resolved: exact model, full prompt)."""

    bin: str
    args: list[str]
    prompt: str
    system_prompt: str | None = None
    model: str | None = None
    schema: dict[str, Any] | None = None
    schema_path: str | None = None  # where a schema file may be written (codex)
    llm: Mapping[str, Any] | None = None  # the `llmEngine` snapshot, when the agent runs on one
    llm_api_key: str | None = None  # that engine's key, resolved from akm's environment (a secret)


@dataclass
class Built:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stdin: str | None = None
    schema_file: tuple[str, str] | None = None  # (path, content) to write before spawning
    env_defaults: dict[str, str] = field(default_factory=dict)  # set unless the user's environment sets them


@dataclass
class Extracted:
    text: str
    session_id: str | None = None
    tokens: int | None = None
    error: str | None = None  # the harness said it failed (in its own output)
    parsed: bool = True  # False: the output was not in the harness's format and is returned as plain text
    api_status: int | None = None  # the model API's HTTP status behind `error`, when the harness said
    no_credentials: bool = False  # the harness itself found no usable credentials (nothing was sent)
    usage: dict[str, Any] | None = None  # the parts of `tokens` (see the module docstring)


# --------------------------------------------------------------------------- helpers


def _check_flag_safe(what: str, value: str | None) -> None:
    if value is not None and value.lstrip().startswith("-"):
        raise HarnessError(f"{what} {value!r} starts with '-', which the harness would read as a flag")


def _payload(call: Call) -> str:
    """System prompt (if any) and prompt as one text, for harnesses without a system-prompt flag."""
    return f"{call.system_prompt}\n\n{call.prompt}" if call.system_prompt else call.prompt


def _fits_argv(text: str) -> bool:
    return len(text.encode("utf-8")) <= ARGV_PROMPT_LIMIT


def _too_long(platform: str, text: str) -> HarnessError:
    return HarnessError(
        f"the prompt is {len(text.encode('utf-8'))} bytes; {platform} takes it on its command "
        f"line, where one argument is limited to {ARGV_PROMPT_LIMIT} bytes — pass bulk data "
        "through files"
    )


def _llm_base(llm: Mapping[str, Any]) -> str:
    endpoint = str(llm.get("endpoint") or "")
    return endpoint[: -len("/chat/completions")] if endpoint.endswith("/chat/completions") else endpoint


def _jsonl(stdout: str) -> list[dict[str, Any]]:
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            events.append(obj)
    return events


def _json_doc(stdout: str) -> dict[str, Any] | None:
    text = stdout.strip()
    if not text.startswith("{"):
        start = text.rfind("\n{")
        if start == -1:
            return None
        text = text[start + 1 :]
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _sum(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _usage(**parts: Any) -> dict[str, Any] | None:
    """A usage record of the figures that are known (None when none is)."""
    out = {k: v for k, v in parts.items() if v is not None and v != {}}
    return out or None


def _figures(src: Mapping[str, Any], **keys: str) -> dict[str, Any]:
    """Token figures read from a CLI's usage object: each named figure from the key given for it."""
    return {name: token_count(src.get(key)) for name, key in keys.items()}


def _text_parts(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type") in (None, "text") and isinstance(p.get("text"), str)
        )
    return ""


_ANSI = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# --------------------------------------------------------------------------- claude

# How often a CLI may retry a failing model API by itself before akm stops it (claude is told so through
# CLAUDE_CODE_MAX_RETRIES; the others are watched: akm.dispatch.agent_stream). A refused key is never retried.
HARNESS_RETRIES = 2
SCHEMA_ARG_LIMIT = 64 * 1024  # bytes: a schema larger than this stays in the prompt, off the command line


def _build_claude(call: Call) -> Built:
    argv = [call.bin, *call.args]
    if call.system_prompt:
        argv += ["--system-prompt", call.system_prompt]
    if call.model:
        argv += ["--model", call.model]
    # claude's native structured output is a StructuredOutput tool whose input schema is the unit's schema; the
    # Anthropic API takes only an object as a tool's input, so any other schema stays in the prompt
    if call.schema is not None and call.schema.get("type") == "object":
        schema = json.dumps(call.schema, separators=(",", ":"))
        if len(schema.encode("utf-8")) <= SCHEMA_ARG_LIMIT:
            argv += ["--json-schema", schema]
    # stream-json (it needs --verbose) prints each event as it happens: retries, turns, tool calls
    argv += ["--output-format", "stream-json", "--verbose", "--print"]
    defaults = {"CLAUDE_CODE_MAX_RETRIES": str(HARNESS_RETRIES)}
    if _fits_argv(call.prompt):
        return Built(argv + ["--", call.prompt], env_defaults=defaults)
    return Built(argv, stdin=call.prompt, env_defaults=defaults)  # `claude -p` reads the prompt from stdin


def _claude_result(stdout: str) -> dict[str, Any] | None:
    """The result object claude printed: the last `type: result` event of `stream-json` (one per line),
    the one object of `--output-format json`, or — that format in verbose mode (`--verbose`, or
    `viewMode: verbose` in the user's claude settings) — the last `type: result` element of the JSON
    array of every session message."""
    results = [e for e in _jsonl(stdout) if e.get("type") == "result"]
    if results:
        return results[-1]
    doc = _json_doc(stdout)
    if doc is not None:
        return doc
    text = stdout.strip()
    if not text.startswith("["):
        return None
    try:
        items = json.loads(text)
    except ValueError:
        return None
    if not isinstance(items, list):
        return None
    return next((m for m in reversed(items) if isinstance(m, dict) and m.get("type") == "result"), None)


def _claude_usage(doc: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    """(tokens, usage) of a claude result. No model answered (an API error, `modelUsage` empty): unknown,
    not the zeros claude prints then."""
    model_usage = doc.get("modelUsage")
    if doc.get("api_error_status") is not None and not model_usage:
        return None, None
    u = json_object(doc.get("usage"))
    models = {
        str(name): _usage(
            **_figures(
                m,
                input="inputTokens",
                output="outputTokens",
                cacheRead="cacheReadInputTokens",
                cacheWrite="cacheCreationInputTokens",
            )
        )
        for name, m in (model_usage.items() if isinstance(model_usage, dict) else [])
        if isinstance(m, dict)
    }
    details = json_object(u.get("output_tokens_details"))
    usage = _usage(
        input=token_count(u.get("input_tokens")),
        output=token_count(u.get("output_tokens")),
        reasoning=token_count(details.get("thinking_tokens")) or None,
        cacheRead=token_count(u.get("cache_read_input_tokens")),
        cacheWrite=token_count(u.get("cache_creation_input_tokens")),
        models={k: v for k, v in models.items() if v},
    )
    return _sum(token_count(u.get("input_tokens")), token_count(u.get("output_tokens"))), usage


def _extract_claude(stdout: str, stderr: str = "") -> Extracted:
    doc = _claude_result(stdout)
    session = next((str(e["session_id"]) for e in _jsonl(stdout) if e.get("session_id")), None)
    if doc is None or not (doc.get("type") == "result" or ("result" in doc and doc.get("session_id"))):
        if session is not None:  # the stream began (a session) but no result came: cut off, or killed
            return Extracted("", session_id=session, parsed=True)
        return Extracted(stdout.strip(), parsed=False)
    result = doc.get("result")
    text = result if isinstance(result, str) else ""
    if "structured_output" in doc and doc.get("structured_output") is not None:
        text = json.dumps(doc["structured_output"], ensure_ascii=False)  # what --json-schema produced
    error = None
    status = doc.get("api_error_status") if isinstance(doc.get("api_error_status"), int) else None
    if status is not None:
        kind = f" {doc['api_error_type']}" if isinstance(doc.get("api_error_type"), str) else ""
        error = f"the model API answered HTTP {status}{kind}: {text}".rstrip(": ")
    elif doc.get("is_error") is True or str(doc.get("subtype", "")).startswith("error"):
        subtype = str(doc.get("subtype") or "")
        what = subtype.replace("_", " ") if subtype.startswith("error") else "an error"
        error = f"claude reported {what}: {text}".rstrip(": ")
    tokens, usage = _claude_usage(doc)
    return Extracted(
        text.strip(),
        session_id=doc.get("session_id") or session,
        tokens=tokens,
        error=error,
        api_status=status,
        usage=usage,
    )


# --------------------------------------------------------------------------- codex

_CODEX_STATUS = re.compile(r"\bstatus:? (\d{3})\b")


def _build_codex(call: Call) -> Built:
    args = list(call.args)
    if args[:1] == ["exec"]:
        args = args[1:]
    argv = [call.bin, "exec", *args]
    if not any(a in ("--sandbox", "-s") or a.startswith("--sandbox=") for a in args):
        argv += ["--sandbox", "workspace-write"]
    if "--skip-git-repo-check" not in args:
        argv.append("--skip-git-repo-check")
    if call.model:
        argv += ["--model", call.model]
    argv.append("--json")
    schema_file = None
    # codex sends --output-schema to OpenAI in strict mode, which refuses (HTTP 400 invalid_json_schema)
    # any schema that leaves an object open or a property optional; such a schema only rides in the prompt
    if call.schema is not None and call.schema_path and strict_compatible(call.schema):
        argv += ["--output-schema", call.schema_path]
        schema_file = (call.schema_path, json.dumps(call.schema, indent=2))
    payload = _payload(call)
    if _fits_argv(payload):
        return Built(argv + ["--", payload], schema_file=schema_file)
    return Built(argv + ["-"], stdin=payload, schema_file=schema_file)  # `-`: read the prompt from stdin


@dataclass
class _CodexRead:
    """What `codex exec --json` said so far: its session, last answer, failure, and tokens and usage summed
    over its turns."""

    session: str | None = None
    text: str | None = None
    error: str | None = None
    tokens: int | None = None
    usage: dict[str, Any] | None = None

    def event(self, ev: dict[str, Any]) -> None:
        kind = ev.get("type")
        if kind == "thread.started" and ev.get("thread_id"):
            self.session = self.session or str(ev["thread_id"])
        elif kind == "item.completed" and isinstance(ev.get("item"), dict):
            self._item(ev["item"])
        elif kind == "turn.completed":
            self._turn(json_object(ev.get("usage")))
        elif kind == "turn.failed" or (kind == "error" and not str(ev.get("message", "")).startswith("Reconnecting")):
            err = json_object(ev.get("error")) or ev
            self.error = str(err.get("message") or "codex reported a failure")
        msg = ev.get("msg") if isinstance(ev.get("msg"), dict) else None  # the older exec --json shape
        if msg:
            self._older(msg)

    def _item(self, item: dict[str, Any]) -> None:
        item_kind = item.get("type") or item.get("item_type")  # codex 0.4x tagged items `item_type`
        if item_kind in ("agent_message", "assistant_message") and isinstance(item.get("text"), str):
            self.text = item["text"]

    def _turn(self, u: dict[str, Any]) -> None:
        self.error = None  # a later completed turn supersedes an earlier stream error
        self.tokens = _sum(self.tokens, token_count(u.get("input_tokens")), token_count(u.get("output_tokens")))
        parts = _figures(
            u,
            input="input_tokens",
            output="output_tokens",
            reasoning="reasoning_output_tokens",
            cacheRead="cached_input_tokens",
            cacheWrite="cache_write_input_tokens",
        )
        self.usage = add_usage(self.usage, _usage(**parts))

    def _older(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "session_configured" and msg.get("session_id"):
            self.session = self.session or str(msg["session_id"])
        elif msg.get("type") == "agent_message" and isinstance(msg.get("message"), str):
            self.text = msg["message"]
        elif msg.get("type") == "task_complete" and isinstance(msg.get("last_agent_message"), str):
            self.text = msg["last_agent_message"]


def _extract_codex(stdout: str, stderr: str = "") -> Extracted:
    read = _CodexRead()
    for ev in _jsonl(stdout):
        read.event(ev)
    if read.text is None and read.session is None:
        return Extracted(stdout.strip(), parsed=False)
    m = _CODEX_STATUS.search(read.error) if read.error else None
    return Extracted(
        (read.text or "").strip(),
        session_id=read.session,
        tokens=read.tokens,
        error=read.error,
        api_status=int(m.group(1)) if m else None,
        usage=read.usage,
    )


# --------------------------------------------------------------------------- opencode


def _build_opencode(call: Call) -> Built:
    args = list(call.args)
    env: dict[str, str] = {}
    model = call.model
    if call.llm is not None:
        model = f"akm/{model or call.llm.get('model')}"
        options: dict[str, str] = {"baseURL": _llm_base(call.llm)}
        if call.llm_api_key:
            # the key travels in the child's environment; the config only names it (opencode's {env:…})
            env[LLM_KEY_ENV] = call.llm_api_key
            options["apiKey"] = "{env:" + LLM_KEY_ENV + "}"
        config = {
            "$schema": "https://opencode.ai/config.json",
            "model": model,
            "provider": {
                "akm": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "akm",
                    "options": options,
                    "models": {model.split("/", 1)[1]: {}},
                }
            },
        }
        env["OPENCODE_CONFIG_CONTENT"] = json.dumps(config, separators=(",", ":"))
    if model:
        kept: list[str] = []
        prefix = None
        i = 0
        while i < len(args):  # a model requested now replaces one in the configured args
            a = args[i]
            if a == "--model" and i + 1 < len(args):
                prefix = args[i + 1].split("/", 1)[0] if "/" in args[i + 1] else None
                i += 2
                continue
            if a.startswith("--model="):
                value = a.split("=", 1)[1]
                prefix = value.split("/", 1)[0] if "/" in value else None
                i += 1
                continue
            kept.append(a)
            i += 1
        args = kept
        if prefix and "/" not in model:
            model = f"{prefix}/{model}"
    argv = [call.bin, *args]
    if model:
        argv += ["--model", model]
    if "--format" not in args:
        argv += ["--format", "json"]
    if "--print-logs" not in args and not any(a == "--log-level" or a.startswith("--log-level=") for a in args):
        # its failed model calls, which it retries silently, show only in its error log (akm watches it)
        argv += ["--print-logs", "--log-level", "ERROR"]
    payload = _payload(call)  # `opencode run` has no system-prompt flag (and refuses unknown flags)
    if not _fits_argv(payload):
        raise _too_long("opencode", payload)
    return Built(argv + ["--", payload], env=env)


def _extract_opencode(stdout: str, stderr: str = "") -> Extracted:
    events = _jsonl(stdout)
    if not events:
        return Extracted(stdout.strip(), parsed=False)
    session = error = None
    status: int | None = None
    tokens: int | None = None
    usage: dict[str, Any] | None = None
    by_message: dict[str, list[str]] = {}
    order: list[str] = []
    for ev in events:
        session = session or ev.get("sessionID") or None
        part = json_object(ev.get("part"))
        if ev.get("type") == "text" and isinstance(part.get("text"), str):
            mid = str(part.get("messageID") or "")
            if mid not in by_message:
                by_message[mid] = []
                order.append(mid)
            by_message[mid].append(part["text"])
        elif ev.get("type") == "step_finish" and isinstance(part.get("tokens"), dict):
            t = part["tokens"]
            cache = json_object(t.get("cache"))
            # opencode splits what the API counted: input without cache reads, output without reasoning;
            # its `total` is the API's prompt + completion
            counted = token_count(t.get("total"))
            if counted is None:
                counted = _sum(
                    token_count(t.get("input")),
                    token_count(t.get("output")),
                    token_count(t.get("reasoning")),
                    token_count(cache.get("read")),
                    token_count(cache.get("write")),
                )
            tokens = _sum(tokens, counted)
            parts = _figures(t, input="input", output="output", reasoning="reasoning")
            parts.update(_figures(cache, cacheRead="read", cacheWrite="write"))
            usage = add_usage(usage, _usage(**parts))
        elif ev.get("type") == "error":
            err = ev.get("error")
            data = json_object(err.get("data")) if isinstance(err, dict) else {}
            error = str(data.get("message") or (err.get("name") if isinstance(err, dict) else err))
            status = data.get("statusCode") if isinstance(data.get("statusCode"), int) else None
    text = "".join(by_message[order[-1]]) if order else ""
    return Extracted(text.strip(), session_id=session, tokens=tokens, error=error, api_status=status, usage=usage)


# --------------------------------------------------------------------------- gemini


def _build_gemini(call: Call) -> Built:
    argv = [call.bin, *call.args]
    if call.model:
        argv += ["--model", call.model]
    argv += ["--output-format", "json"]
    payload = _payload(call)
    if not _fits_argv(payload):
        raise _too_long("gemini", payload)
    # headless gemini refuses a folder it has not been told to trust (exit 55); the unit's folder is the
    # one akm was asked to work in
    return Built(argv + ["-p", payload], env_defaults={"GEMINI_CLI_TRUST_WORKSPACE": "true"})


GEMINI_AUTH_EXIT = 41  # gemini's exit status (and error code) when it has no usable credentials

_SESSION_KEYS = ("session_id", "sessionId", "conversation_id", "conversationId", "chat_id", "chatId")


def _gemini_role(model: dict[str, Any]) -> str:
    """A model's role in a gemini run: `main` (the one that answered, or one with no roles), `router`, or
    its first role."""
    named = model.get("roles")
    roles = sorted(named) if isinstance(named, dict) else []
    return "main" if "main" in roles or not roles else ("router" if any("router" in r for r in roles) else roles[0])


def _gemini_usage(stats: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
    """(tokens, usage) from gemini's `stats.models`: every model it called, each with its role — the
    model router (`utility_router`) is reported apart from the model that answered (`main`)."""
    models = json_object(stats.get("models"))
    tokens: int | None = None
    per_model: dict[str, Any] = {}
    main: dict[str, Any] | None = None
    for name, m in models.items():
        t = m.get("tokens") if isinstance(m, dict) else None
        if not isinstance(t, dict):
            continue
        total = token_count(t.get("total"))
        if total is None:
            total = _sum(token_count(t.get("prompt")), token_count(t.get("candidates")))
        tokens = _sum(tokens, total)
        role = _gemini_role(m)
        figures = _usage(
            role=role,
            total=total,
            input=token_count(t.get("prompt")),
            output=token_count(t.get("candidates")),
            reasoning=token_count(t.get("thoughts")),
            cacheRead=token_count(t.get("cached")),
        )
        per_model[str(name)] = figures
        if role == "main" and figures:
            main = add_usage(main, {k: v for k, v in figures.items() if k not in ("role", "total")})
    if not per_model:
        return tokens, None
    return tokens, _usage(**(main or {}), models=per_model)


def _gemini_error(doc: dict[str, Any]) -> tuple[str | None, int | None]:
    """gemini's `error` object: its message (unwrapping the API's own JSON in it) and the HTTP status."""
    err = doc.get("error")
    if not err:
        return None, None
    if not isinstance(err, dict):
        return str(err), None
    message = str(err.get("message") or err.get("type") or "gemini reported an error")
    status = err.get("code") if isinstance(err.get("code"), int) else None
    message, status = _api_error_inside(message, status)
    return message, status if status is not None and 100 <= status <= 599 else None


def _api_error_inside(message: str, status: int | None) -> tuple[str, int | None]:
    """A message that quotes the API's JSON error body whole: its status and message, and its code when
    gemini gave none."""
    try:
        inner = json.loads(message)
    except ValueError:
        inner = None
    if isinstance(inner, dict) and isinstance(inner.get("error"), dict):  # the API's body, quoted whole
        api = inner["error"]
        message = " ".join(str(api[k]) for k in ("status", "message") if api.get(k)) or message
        if status is None and isinstance(api.get("code"), int):
            status = api["code"]
    return message, status


def _extract_gemini(stdout: str, stderr: str = "") -> Extracted:
    doc = _json_doc(stdout)
    if doc is None:
        doc = _json_doc(stderr)  # a failing gemini writes its JSON error to stderr
        if doc is None or "error" not in doc:
            return Extracted(stdout.strip(), parsed=False)
    text = next(
        (doc[k] for k in ("response", "result", "text", "output", "content") if isinstance(doc.get(k), str)), None
    )
    session = next((str(doc[k]) for k in _SESSION_KEYS if doc.get(k)), None)
    tokens, usage = _gemini_usage(json_object(doc.get("stats")))
    error, status = _gemini_error(doc)
    if text is None and error is None:
        return Extracted(stdout.strip(), session_id=session, tokens=tokens, parsed=False, usage=usage)
    code = json_object(doc.get("error")).get("code")
    return Extracted(
        (text or "").strip(),
        session_id=session,
        tokens=tokens,
        error=error,
        api_status=status,
        usage=usage,
        no_credentials=code == GEMINI_AUTH_EXIT,  # its FatalAuthenticationError: no key, nothing sent
    )


# --------------------------------------------------------------------------- copilot


def _build_copilot(call: Call) -> Built:
    argv = [call.bin, *call.args]
    if call.model:
        argv += ["--model", call.model]
    if not any(a.startswith("--allow-tool") or a.startswith("--allow-all") or a == "--yolo" for a in call.args):
        argv.append("--allow-all-tools")
    argv += ["--output-format", "json"]
    payload = _payload(call)
    if not _fits_argv(payload):
        raise _too_long("copilot", payload)
    return Built(argv + ["-p", payload])


def _extract_copilot(stdout: str, stderr: str = "") -> Extracted:
    events = [e for e in _jsonl(stdout) if isinstance(e.get("type"), str)]
    if not events:
        return Extracted(stdout.strip(), parsed=False)
    text = session = error = None
    tokens: int | None = None
    for ev in events:
        data = json_object(ev.get("data"))
        kind = ev["type"]
        if kind == "session.start":
            session = session or data.get("sessionId")
        elif kind == "assistant.message":
            if isinstance(data.get("content"), str) and data["content"].strip():
                text = data["content"]
            tokens = _sum(tokens, token_count(data.get("outputTokens")))
        elif kind == "result":
            session = ev.get("sessionId") or data.get("sessionId") or session
            usage = ev.get("usage") if isinstance(ev.get("usage"), dict) else None
            if usage:
                tokens = _sum(token_count(usage.get("inputTokens")), token_count(usage.get("outputTokens"))) or tokens
        elif kind in ("session.error", "error"):
            error = str(data.get("message") or ev.get("message") or "copilot reported an error")
    return Extracted((text or "").strip(), session_id=session, tokens=tokens, error=error)


# --------------------------------------------------------------------------- pi


def _build_pi(call: Call) -> Built:
    argv = [call.bin, *call.args]
    if call.system_prompt:
        argv += ["--system-prompt", call.system_prompt]
    if call.model:
        argv += ["--model", call.model]
    argv += ["--print", "--mode", "json"]
    prompt = call.prompt if not call.prompt.startswith("-") else " " + call.prompt  # pi has no `--`
    if not _fits_argv(prompt):
        raise _too_long("pi", prompt)
    return Built(argv + [prompt])


def _extract_pi(stdout: str, stderr: str = "") -> Extracted:
    events = _jsonl(stdout)
    if not events:
        return Extracted(stdout.strip(), parsed=False)
    text = session = error = None
    tokens: int | None = None
    for ev in events:
        kind = ev.get("type")
        if kind == "session" and ev.get("id"):
            session = session or str(ev["id"])
        elif kind == "message_end" and isinstance(ev.get("message"), dict):
            msg = ev["message"]
            if msg.get("role") == "assistant":
                t = _text_parts(msg.get("content"))
                if t.strip():
                    text = t
                u = json_object(msg.get("usage"))
                tokens = _sum(tokens, token_count(u.get("input")), token_count(u.get("output")))
                if msg.get("stopReason") == "error":
                    error = str(msg.get("errorMessage") or "pi reported an error")
                else:
                    error = None  # pi retried and this later answer stands
        elif kind == "agent_end" and isinstance(ev.get("messages"), list) and text is None:
            for msg in reversed(ev["messages"]):
                if isinstance(msg, dict) and msg.get("role") == "assistant" and _text_parts(msg.get("content")):
                    text = _text_parts(msg.get("content"))
                    break
    return Extracted((text or "").strip(), session_id=session, tokens=tokens, error=error)


# --------------------------------------------------------------------------- aider


def _build_aider(call: Call) -> Built:
    argv = [call.bin, *call.args]
    env: dict[str, str] = {}
    model = call.model
    if call.llm is not None:
        model = f"openai/{model or call.llm.get('model')}"
        argv += ["--openai-api-base", _llm_base(call.llm)]
        env["OPENAI_API_KEY"] = call.llm_api_key or NO_KEY  # litellm wants some key even for local servers
    if model:
        argv += ["--model", model]
    payload = _payload(call)
    if not _fits_argv(payload):
        raise _too_long("aider", payload)
    return Built(argv + ["--yes-always", "--no-pretty", f"--message={payload}"], env=env)


_AIDER_NOISE = re.compile(
    r"^(Aider v\d|Main model:|Weak model:|Editor model:|Git repo:|Repo-map:|Model:|Added .* to the chat|"
    r"Tokens: |Cost: |Applied edit to|Commit [0-9a-f]{7}|Use /help|Warning: |Can't initialize prompt toolkit|"
    r"Detected dumb terminal|https://aider\.chat/|─+$|-{5,}$)"
)
_AIDER_TOKENS = re.compile(r"Tokens:\s*([\d.]+)([kKmM]?)\s+sent,\s*([\d.]+)([kKmM]?)\s+received")


def _scaled(number: str, unit: str) -> int:
    return int(round(float(number) * {"": 1, "k": 1_000, "m": 1_000_000}[unit.lower()]))


def _extract_aider(stdout: str, stderr: str = "") -> Extracted:
    text = strip_ansi(stdout)
    tokens = None
    for m in _AIDER_TOKENS.finditer(text):
        tokens = _sum(tokens, _scaled(m.group(1), m.group(2)) + _scaled(m.group(3), m.group(4)))
    kept = [line for line in text.splitlines() if not _AIDER_NOISE.match(line.strip())]
    answer = "\n".join(kept).strip()
    return Extracted(answer or text.strip(), tokens=tokens, parsed=False)


# --------------------------------------------------------------------------- amazonq


def _build_amazonq(call: Call) -> Built:
    args = list(call.args)
    if args[:1] == ["chat"]:
        args = args[1:]
    argv = [call.bin, "chat", *args, "--no-interactive"]
    if not any(a.startswith("--trust") for a in args):
        argv.append("--trust-all-tools")
    if call.model:
        argv += ["--model", call.model]
    payload = _payload(call)
    if not _fits_argv(payload):
        raise _too_long("amazonq", payload)
    return Built(argv + ["--", payload])


def _extract_amazonq(stdout: str, stderr: str = "") -> Extracted:
    lines = [line.rsplit("\r", 1)[-1] for line in strip_ansi(stdout).split("\n")]
    for i, line in enumerate(lines):
        if line.strip():
            if line.startswith("> "):
                lines[i] = line[2:]
            break
    return Extracted("\n".join(lines).strip(), parsed=False)


# --------------------------------------------------------------------------- openhands


def _build_openhands(call: Call) -> Built:
    env: dict[str, str] = {}
    model = call.model
    if call.llm is not None:
        model = f"openai/{model or call.llm.get('model')}"
        env["LLM_BASE_URL"] = _llm_base(call.llm)
        env["LLM_API_KEY"] = call.llm_api_key or NO_KEY
    if model:
        env["LLM_MODEL"] = model
    payload = _payload(call)
    if not _fits_argv(payload):
        raise _too_long("openhands", payload)
    return Built([call.bin, *call.args, "--headless", "--json", f"--task={payload}"], env=env)


def _extract_openhands(stdout: str, stderr: str = "") -> Extracted:
    events = _jsonl(stdout)
    if not events:
        return Extracted(stdout.strip(), parsed=False)
    text = session = None
    for ev in events:
        session = session or next(
            (str(ev[k]) for k in ("session_id", "sessionId", "sid", "conversation_id") if ev.get(k)), None
        )
        if ev.get("source") not in (None, "agent"):
            continue
        args = json_object(ev.get("args"))
        if ev.get("action") == "message":
            text = args.get("content") or ev.get("message") or text
        elif ev.get("action") == "finish":
            text = args.get("final_thought") or args.get("thought") or ev.get("message") or text
    return Extracted(str(text or "").strip(), session_id=session)


# --------------------------------------------------------------------------- the table

_BASE_ENV = {
    "claude": (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "CLAUDE_CONFIG",
        "CLAUDE_CONFIG_DIR",
        "CLAUDE_CODE_MAX_RETRIES",
    ),
    "codex": ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_CONFIG", "CODEX_HOME"),
    "opencode": ("OPENCODE_API_KEY", "OPENCODE_CONFIG", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY"),
    "gemini": (
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "GOOGLE_CLOUD_PROJECT",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_GEMINI_BASE_URL",
        "GOOGLE_GENAI_USE_VERTEXAI",
        "GEMINI_CLI_TRUST_WORKSPACE",
    ),
    "copilot": ("GH_TOKEN", "GITHUB_TOKEN", "COPILOT_GITHUB_TOKEN"),
    "pi": ("PI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"),
    "aider": ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_BASE"),
    "amazonq": ("AWS_PROFILE", "AWS_REGION"),
    "openhands": ("LLM_MODEL", "LLM_API_KEY", "LLM_BASE_URL"),
}

# stderr lines of the real CLIs that say nothing about why a unit failed (kept out of its error).
_NODE_STACK = r"^\s+at .+\(?.*:\d+:\d+\)?$"
_STDERR_NOISE = {
    "codex": (
        r"^Reading additional input from stdin\.\.\.$",  # codex exec with stdin not a terminal (akm gives /dev/null)
        r"^WARNING: proceeding, even though we could not create PATH aliases",
    ),
    "gemini": (
        _NODE_STACK,
        r"^Warning: (Basic terminal detected|256-color support not detected)",
        r"^Ripgrep is not available",
        r"^Loaded cached credentials",
    ),
    "opencode": (_NODE_STACK,),
    "claude": (_NODE_STACK,),
}

PROFILES: dict[str, Profile] = {
    "claude": Profile(
        "claude",
        "claude",
        (),
        _BASE_ENV["claude"],
        _build_claude,
        _extract_claude,
        stderr_noise=_STDERR_NOISE["claude"],
    ),
    "codex": Profile(
        "codex", "codex", (), _BASE_ENV["codex"], _build_codex, _extract_codex, stderr_noise=_STDERR_NOISE["codex"]
    ),
    "opencode": Profile(
        "opencode",
        "opencode",
        ("run",),
        _BASE_ENV["opencode"],
        _build_opencode,
        _extract_opencode,
        llm_engine=True,
        stderr_noise=_STDERR_NOISE["opencode"],
    ),
    "gemini": Profile(
        "gemini",
        "gemini",
        (),
        _BASE_ENV["gemini"],
        _build_gemini,
        _extract_gemini,
        stderr_noise=_STDERR_NOISE["gemini"],
    ),
    "copilot": Profile("copilot", "copilot", (), _BASE_ENV["copilot"], _build_copilot, _extract_copilot),
    "pi": Profile("pi", "pi", (), _BASE_ENV["pi"], _build_pi, _extract_pi),
    "aider": Profile(
        "aider", "aider", ("--no-auto-commits",), _BASE_ENV["aider"], _build_aider, _extract_aider, llm_engine=True
    ),
    "amazonq": Profile("amazonq", "q", (), _BASE_ENV["amazonq"], _build_amazonq, _extract_amazonq),
    "openhands": Profile(
        "openhands", "openhands", (), _BASE_ENV["openhands"], _build_openhands, _extract_openhands, llm_engine=True
    ),
}

# The CLIs akm's CI runs for real, at these versions (tests/agent_clis/package.json pins them; a test keeps
# the two equal); the others are driven by their documented output shapes only.
TESTED_VERSIONS: dict[str, str] = {"claude": "2.1.332", "codex": "0.171.0", "opencode": "1.18.33", "gemini": "0.61.0"}
REAL_CLIS: tuple[str, ...] = tuple(TESTED_VERSIONS)
_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)?(?:[-+.][0-9A-Za-z.-]+)?)\b")


def version_in(text: str) -> str | None:
    """The version a CLI's `--version` printed (`2.1.332 (Claude Code)`, `codex-cli 0.171.0`), or None."""
    m = _VERSION.search(text)
    return m.group(1) if m else None


# Detection order: which CLI `akm setup --yes` prefers when several are on PATH (spec/setup.md).
DETECTION_ORDER: tuple[str, ...] = (
    "opencode",
    "claude",
    "codex",
    "copilot",
    "pi",
    "gemini",
    "aider",
    "amazonq",
    "openhands",
)


def build(platform: str, call: Call) -> Built:
    """The argv (and extras) for one attempt. Raises HarnessError for a request the harness cannot take."""
    profile = PROFILES[platform]
    _check_flag_safe("model", call.model)
    _check_flag_safe("system prompt", call.system_prompt)
    return profile.builder(call)


def extract(platform: str, stdout: str, stderr: str = "") -> Extracted:
    """The answer, session id and tokens from a harness's output (plain text when it is not the expected
    format). stderr matters to harnesses that print their failure there (gemini)."""
    return PROFILES[platform].extractor(stdout, stderr)


def quiet_stderr(platform: str, stderr: str) -> str:
    """stderr without the lines the harness always prints (banners, warnings, stack frames): what is
    left says why it failed."""
    noise = [re.compile(p) for p in PROFILES[platform].stderr_noise]
    if not noise:
        return stderr
    return "\n".join(line for line in stderr.splitlines() if not any(n.search(line) for n in noise))


def detect(path: str | None = None) -> dict[str, str]:
    """Harness CLIs on PATH: {platform: executable path}, in detection order."""
    import shutil

    found: dict[str, str] = {}
    for platform in DETECTION_ORDER:
        exe = shutil.which(PROFILES[platform].bin, path=path)
        if exe:
            found[platform] = exe
    return found
