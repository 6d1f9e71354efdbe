"""Loopback fakes of the model APIs the real agent CLIs speak, for tests.

One real HTTP server on 127.0.0.1 answers four wire formats, told apart by path:

  Anthropic Messages      POST …/v1/messages (SSE when `stream`), HEAD / (claude's reachability probe)
  OpenAI Responses        POST …/v1/responses (SSE: codex)
  OpenAI-compatible chat  POST …/v1/chat/completions (SSE when `stream`: opencode)
  Gemini                  POST …/v1beta/models/<model>:generateContent | :streamGenerateContent (?alt=sse)

The FIRST path segment is the scenario, so one server serves every test at once and parallel CLIs never
share a script: a CLI configured with base URL `<base>/<scenario>` (see `FakeModelApis.base`) gets

  ok[.tag]          the answer (`answers[scenario]`, default `DEFAULT_ANSWER`) with usage figures
  401[.tag]         HTTP 401 in the API's own error shape ("invalid x-api-key" / "API key not valid")
  429[.tag]         HTTP 429 (rate limited, `retry-after: 1`) every time
  500[.tag]         HTTP 500 every time
  500ok[.tag]       HTTP 500 on the scenario's first generation request, then ok
  notjson[.tag]     prose (not JSON) on the scenario's first generation request, then ok
  slow[.tag]        holds every generation request for `SLOW_S` seconds (or until the server closes)
  prose<P>[.tag]    prose instead of the answer on P % of generation requests (seeded by the scenario: the
                    same draws on every run); a
                    claude request offering its StructuredOutput tool gets prose instead of the tool call

A scenario in `scripts` is a scripted model (Anthropic Messages only): `scripts[scenario](body)` reads the
conversation so far and returns the next content block — a `tool_use` to call a tool, or `text` to end the turn.

A `.tag` makes a scenario's counters its own (two tests both asking for `500ok` must not share the "first").

Requests the CLIs make besides the answer — gemini's model router and next-speaker check, opencode's title —
are recognised by what they ask for and answered in kind; they are recorded with `kind` set ("router",
"next_speaker", "title") and never consume a scenario's failure. Everything is recorded in `requests`.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.fake_openai import LoopbackHandler

DEFAULT_ANSWER = '{"ok": true}'
PROSE = "Here is what I found: everything looks fine to me."
SLOW_S = 600.0
# Usage the fakes report per generation, so tests can tell what akm counted.
IN_TOKENS, OUT_TOKENS, CACHED_TOKENS, REASONING_TOKENS = 120, 30, 40, 7
ROUTER_IN, ROUTER_OUT = 50, 5


class FakeModelApis:
    """The server (see the module docstring). `close()` releases held requests and stops it."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers: dict[str, str] = {}
        self.scripts: dict[str, Any] = {}  # scenario -> the scripted model: body -> the next content block
        self.lock = threading.Lock()
        self.generations: dict[str, int] = {}
        self.closing = threading.Event()
        server = self

        class Handler(LoopbackHandler):
            def do_HEAD(self) -> None:  # noqa: N802 (claude probes the base URL)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                server.record(self, "GET", None)
                scenario, rest = server.split(self.path)
                if rest.endswith("/models") or "/models?" in rest:
                    self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                else:
                    self.send_json(404, {"error": {"message": f"no route GET {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                server.serve(self, body if isinstance(body, dict) else {"_body": body})

            def send_sse(self, events: list[tuple[str | None, Any]]) -> None:
                """A whole event stream (named or bare `data:` events), then the connection closes."""
                chunks = []
                for name, data in events:
                    payload = data if isinstance(data, str) else json.dumps(data)
                    chunks.append((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")
                self.send_text(200, "".join(chunks), "text/event-stream", {"Cache-Control": "no-cache"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        host, port = self.httpd.server_address[:2]
        self.root = f"http://{host}:{port}"

    # ------------------------------------------------------------------ API for tests

    def base(self, scenario: str) -> str:
        """The base URL a CLI is given for `scenario` (append the API's own path after it)."""
        return f"{self.root}/{scenario}"

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def of(self, scenario: str, kind: str | None = "main") -> list[dict[str, Any]]:
        """Recorded POSTs of one scenario (of one kind; None: all)."""
        with self.lock:
            return [r for r in self.requests if r["scenario"] == scenario and (kind is None or r["kind"] == kind)]

    # ------------------------------------------------------------------ plumbing

    @staticmethod
    def split(path: str) -> tuple[str, str]:
        parts = urlsplit(path)
        head, _, rest = parts.path.lstrip("/").partition("/")
        return head, "/" + rest + (f"?{parts.query}" if parts.query else "")

    def record(self, h: Any, method: str, body: Any, kind: str = "main", api: str = "") -> dict[str, Any]:
        scenario, rest = self.split(h.path)
        entry = {
            "scenario": scenario,
            "method": method,
            "path": rest,
            "api": api,
            "kind": kind,
            "headers": {k.lower(): v for k, v in h.headers.items()},
            "body": body,
            "at": time.monotonic(),
        }
        with self.lock:
            self.requests.append(entry)
        return entry

    def serve(self, h: Any, body: dict[str, Any]) -> None:
        scenario, rest = self.split(h.path)
        path = rest.split("?", 1)[0]
        if path.endswith("/messages") or path.endswith("/messages/count_tokens"):
            api = "anthropic"
        elif path.endswith("/responses"):
            api = "responses"
        elif path.endswith("/chat/completions"):
            api = "chat"
        elif ":generateContent" in path or ":streamGenerateContent" in path or ":countTokens" in path:
            api = "gemini"
        else:
            self.record(h, "POST", body, "unknown")
            h.send_json(404, {"error": {"message": f"no route POST {h.path}"}})
            return
        kind = _kind(api, path, body)
        self.record(h, "POST", body, kind, api)
        if kind == "count_tokens":
            h.send_json(200, {"input_tokens": IN_TOKENS} if api == "anthropic" else {"totalTokens": IN_TOKENS})
            return
        behaviour = scenario.split(".", 1)[0]
        script = self.scripts.get(scenario)
        if script is not None and api == "anthropic" and kind == "main":
            _anthropic_send(h, body, script(body))
            return
        if kind == "main":
            with self.lock:
                n = self.generations[scenario] = self.generations.get(scenario, 0) + 1
            failure = _failure(behaviour, n)
            if failure == "slow":
                self.closing.wait(SLOW_S)
                failure = None
            if failure is not None:
                status, message = failure
                _send_error(h, api, status, message)
                return
            prose = (behaviour == "notjson" and n == 1) or (
                behaviour.startswith("prose") and _chance(scenario, n) < int(behaviour[5:] or 0)
            )
            text = PROSE if prose else self.answers.get(scenario, DEFAULT_ANSWER)
        elif behaviour in ("401", "429"):  # auxiliary calls meet the same refusing server
            _send_error(h, api, int(behaviour), _ERRORS[int(behaviour)])
            return
        elif kind == "router" and "complexity_score" in _schema_properties(body):
            text = json.dumps({"complexity_reasoning": "a simple, direct task", "complexity_score": 10})
        else:
            text = _AUX_ANSWERS.get(kind, "Title")
        ANSWERERS[api](h, body, text, path, kind)


_ERRORS = {
    401: "invalid x-api-key",
    429: "Number of request tokens has exceeded your per-minute rate limit",
    500: "Internal server error",
}


def _failure(behaviour: str, n: int) -> tuple[int, str] | str | None:
    if behaviour in ("401", "429"):
        return int(behaviour), _ERRORS[int(behaviour)]
    if behaviour == "500" or (behaviour == "500ok" and n == 1):
        return 500, _ERRORS[500]
    if behaviour == "slow":
        return "slow"
    return None


def _chance(key: str, n: int) -> int:
    """0 … 99, the same for the n-th request of `key` on every run."""
    import hashlib

    return int(hashlib.sha256(f"{key}/{n}".encode()).hexdigest()[:8], 16) % 100


def _schema_properties(body: dict[str, Any]) -> set[str]:
    cfg = body.get("generationConfig") or body.get("config") or {}
    schema = cfg.get("responseJsonSchema") or cfg.get("responseSchema") or {}
    props = schema.get("properties") if isinstance(schema, dict) else None
    return set(props) if isinstance(props, dict) else set()


def _kind(api: str, path: str, body: dict[str, Any]) -> str:
    """What a request is for: the answer ("main") or one of a CLI's side calls."""
    if path.endswith("count_tokens") or ":countTokens" in path:
        return "count_tokens"
    if api == "gemini":
        props = _schema_properties(body)
        if "model_choice" in props or "complexity_score" in props:
            return "router"
        if "next_speaker" in props:
            return "next_speaker"
    text = json.dumps(body)[:4000].lower()
    if api in ("chat", "anthropic") and ("generate a title" in text or "title generator" in text):
        return "title"
    return "main"


_AUX_ANSWERS = {
    "router": json.dumps({"reasoning": "a simple task", "model_choice": "flash"}),
    "next_speaker": json.dumps({"reasoning": "the model answered", "next_speaker": "user"}),
    "title": "Akm unit",
}


def _send_error(h: Any, api: str, status: int, message: str) -> None:
    headers = {"retry-after": "1"} if status == 429 else None
    if api == "anthropic":
        kind = {401: "authentication_error", 429: "rate_limit_error", 500: "api_error"}[status]
        h.send_json(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)
    elif api == "gemini":
        word = {401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL"}[status]
        text = "API key not valid. Please pass a valid API key." if status == 401 else message
        h.send_json(status, {"error": {"code": status, "message": text, "status": word}}, headers)
    else:
        code = {401: "invalid_api_key", 429: "rate_limit_exceeded", 500: "server_error"}[status]
        text = "Incorrect API key provided" if status == 401 else message
        h.send_json(status, {"error": {"message": text, "type": code, "code": code}}, headers)


# ---------------------------------------------------------------------- the four answer shapes


def _anthropic(h: Any, body: dict[str, Any], text: str, path: str, kind: str) -> None:
    tools = [t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    content: dict[str, Any]
    structured = next((t for t in tools if t and "structured" in t.lower()), None)
    parsed: Any = None
    if structured and kind == "main" and text != PROSE and not _answered_tool(body, structured):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
    if parsed is not None:
        content = {"type": "tool_use", "id": "toolu_fake1", "name": structured, "input": parsed}
    else:
        if structured and _answered_tool(body, structured):
            text = "Done."
        content = {"type": "text", "text": text}
    _anthropic_send(h, body, content)


def _anthropic_send(h: Any, body: dict[str, Any], content: dict[str, Any]) -> None:
    """One assistant message of one content block (a tool call ends its turn with `tool_use`)."""
    model = str(body.get("model") or "claude-fake")
    stop = "tool_use" if content["type"] == "tool_use" else "end_turn"
    usage = {
        "input_tokens": IN_TOKENS,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": CACHED_TOKENS,
        "output_tokens": OUT_TOKENS,
    }
    message = {
        "id": "msg_fake1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [content],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if not body.get("stream"):
        h.send_json(200, message)
        return
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    if content["type"] == "text":
        block_start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": content["text"]}
    else:
        block_start = {"type": "tool_use", "id": content["id"], "name": content["name"], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(content["input"])}
    h.send_sse(
        [
            ("message_start", {"type": "message_start", "message": start}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block_start}),
            ("ping", {"type": "ping"}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": OUT_TOKENS},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
    )


def _answered_tool(body: dict[str, Any], name: str) -> bool:
    """Has the conversation already called tool `name` (its result is in the last user turn)?"""
    for msg in body.get("messages") or []:
        for part in msg.get("content") or [] if isinstance(msg.get("content"), list) else []:
            if isinstance(part, dict) and part.get("type") == "tool_use" and part.get("name") == name:
                return True
    return False


def _responses(h: Any, body: dict[str, Any], text: str, path: str, kind: str) -> None:
    model = str(body.get("model") or "gpt-fake")
    item = {
        "type": "message",
        "id": "msg_fake1",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    usage = {
        "input_tokens": IN_TOKENS,
        "input_tokens_details": {"cached_tokens": CACHED_TOKENS},
        "output_tokens": OUT_TOKENS,
        "output_tokens_details": {"reasoning_tokens": REASONING_TOKENS},
        "total_tokens": IN_TOKENS + OUT_TOKENS,
    }
    response = {"id": "resp_fake1", "object": "response", "model": model, "status": "in_progress", "output": []}
    h.send_sse(
        [
            ("response.created", {"type": "response.created", "response": response}),
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
            ),
            (
                "response.output_text.delta",
                {"type": "response.output_text.delta", "item_id": "msg_fake1", "output_index": 0, "delta": text},
            ),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            (
                "response.completed",
                {
                    "type": "response.completed",
                    "response": {**response, "status": "completed", "output": [item], "usage": usage},
                },
            ),
        ]
    )


def _chat(h: Any, body: dict[str, Any], text: str, path: str, kind: str) -> None:
    model = str(body.get("model") or "fake-model")
    usage = {
        "prompt_tokens": IN_TOKENS,
        "completion_tokens": OUT_TOKENS,
        "total_tokens": IN_TOKENS + OUT_TOKENS,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
        "completion_tokens_details": {"reasoning_tokens": REASONING_TOKENS},
    }
    base = {"id": "chatcmpl-fake1", "object": "chat.completion.chunk", "created": 1767036059, "model": model}
    if not body.get("stream"):
        h.send_json(
            200,
            {
                **base,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": usage,
            },
        )
        return
    h.send_sse(
        [
            (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            (None, {**base, "choices": [{"index": 0, "delta": {"content": text}}]}),
            (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            (None, {**base, "choices": [], "usage": usage}),
            (None, "[DONE]"),
        ]
    )


def _gemini(h: Any, body: dict[str, Any], text: str, path: str, kind: str) -> None:
    model = path.rsplit("/", 1)[-1].split(":", 1)[0]
    small = kind != "main"
    usage = {
        "promptTokenCount": ROUTER_IN if small else IN_TOKENS,
        "candidatesTokenCount": ROUTER_OUT if small else OUT_TOKENS,
        "totalTokenCount": (ROUTER_IN + ROUTER_OUT) if small else IN_TOKENS + OUT_TOKENS + REASONING_TOKENS,
    }
    if not small:
        usage["cachedContentTokenCount"] = CACHED_TOKENS
        usage["thoughtsTokenCount"] = REASONING_TOKENS
    doc = {
        "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": "resp-fake1",
    }
    if ":streamGenerateContent" in path:
        h.send_sse([(None, doc)])
    else:
        h.send_json(200, doc)


ANSWERERS = {"anthropic": _anthropic, "responses": _responses, "chat": _chat, "gemini": _gemini}
