"""LLM units: one OpenAI-compatible chat completion per attempt (spec/config.md §7).

Any server speaking `POST …/chat/completions` works: Ollama, LM Studio, vLLM,
llama.cpp, hosted APIs. The request body is built from the engine snapshot
frozen in the plan plus the unit's `llm:` options; the API key is read from the
environment at dispatch time (never stored) and scrubbed from everything
returned.

Three things shape the transport:

* **Cancellation must be prompt.** A non-streaming completion sends nothing
  until the whole answer is ready, so a blocked read can last minutes. Each
  request uses its own connection; one watchdog thread watches every request
  in flight and, on cancel or deadline, shuts its socket down, which wakes the
  blocked read at once. (No event loop per request, no thread per request.)
* **One absolute deadline** covers connect, headers and body (`timeout_ms`
  from the plan; None = unbounded). Transport retries spend the same budget.
* **Retry is narrow** (§5.5): one retry for 5xx answers and dropped
  connections, with a short jittered pause; a 429 is retried after the
  server's `Retry-After` when that fits the budget (at most twice). Nothing
  else is retried here — the unit's own `retry:` policy decides the rest.

Errors map onto the failure vocabulary: `aborted`, `timeout`,
`llm_rate_limit`, `llm_http_error` (non-2xx), `llm_bad_response` (a 2xx that
is not one JSON completion: HTML, not JSON, no choices, an event stream),
`llm_network_error` (could not talk to the server), `llm_content_filter`.

`import httpx` happens on first use: the CLI never pays for it otherwise.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import random
import re
import socket
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    import ssl

from akm.dispatch.base import UnitRequest
from akm.dispatch.redact import REDACTED, clip, redact_text
from akm.dispatch.types import DIAGNOSTIC_CLIP, DispatchResult, token_count
from akm.record import dataclass, field

DEFAULT_TIMEOUT_MS = 600_000
DEFAULT_TEMPERATURE = 0.3
MAX_BODY_BYTES = 10 * 1024 * 1024
ERROR_EXCERPT = 200
MAX_RETRY_AFTER_S = 120.0
MAX_RATE_LIMIT_RETRIES = 2
CONNECT_TIMEOUT_S = 30.0
WATCHDOG_TICK_S = 0.02
RESPONSE_SCHEMA_NAME = "akm_response"


class LlmCallError(Exception):
    """A chat completion that did not produce an answer.

    `code`: aborted | timeout | rate_limited | http_error | bad_response |
    network_error | credential_missing | content_filter | invalid_request.
    `status` is the HTTP status when there was one; `retry_after_s` what a 429 asked for.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        tokens: int | None = None,
        html: bool = False,
    ) -> None:
        super().__init__(message)
        self.html = html  # the body was an HTML page (a proxy or a wrong URL, not the model server): never retried
        self.code = code
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s
        self.tokens = tokens


_REASON_BY_CODE = {
    "aborted": "aborted",
    "timeout": "timeout",
    "rate_limited": "llm_rate_limit",
    "http_error": "llm_http_error",
    "bad_response": "llm_bad_response",
    "network_error": "llm_network_error",
    "content_filter": "llm_content_filter",
    "credential_missing": "dispatch_error",
    "invalid_request": "dispatch_error",
}


def failure_reason_for(code: str) -> str:
    """The unit failure reason for an `LlmCallError.code`."""
    return _REASON_BY_CODE.get(code, "dispatch_error")


@dataclass
class ChatResponse:
    """One completion: the answer text and what the server said about it."""

    text: str
    status: int
    model: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens: part of prompt_tokens
    reasoning_tokens: int | None = None  # completion_tokens_details.reasoning_tokens: part of completion_tokens
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def usage(self) -> dict[str, Any] | None:
        """The parts the server reported (`DispatchResult.usage`): input, output, cacheRead, reasoning."""
        parts = {
            "input": self.prompt_tokens,
            "output": self.completion_tokens,
            "cacheRead": self.cached_tokens,
            "reasoning": self.reasoning_tokens,
        }
        known = {k: v for k, v in parts.items() if v is not None}
        return known or None

    @property
    def tokens(self) -> int | None:
        """Tokens this call used (total, else prompt + completion), None when the server did not say."""
        if self.total_tokens is not None:
            return self.total_tokens
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


# --------------------------------------------------------------------------- credentials


def resolve_api_key(engine: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> str | None:
    """The key for a frozen LLM snapshot, read from the environment now (first non-blank name wins).

    A required credential (an explicit `apiKey: ${NAME}`) that is unset raises
    `LlmCallError("credential_missing")` naming the variable, before any request.
    """
    env = os.environ if environ is None else environ
    cred = engine.get("credential") or {}
    names = list(cred.get("names") or [])
    for name in names:
        value = (env.get(name) or "").strip()
        if value:
            return value
    if cred.get("required") and names:
        raise LlmCallError(
            "credential_missing",
            f"LLM engine {engine.get('name', '?')!r} needs its API key in ${names[0]}, which is not "
            "set in akm's environment; nothing was sent.",
        )
    return None


# --------------------------------------------------------------------------- request body


def build_body(
    engine: Mapping[str, Any],
    messages: Sequence[Mapping[str, str]],
    *,
    schema: Mapping[str, Any] | None = None,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The chat-completions body (§5.1): model, messages, temperature, then what is configured.

    `options` are the unit's `llm:` overrides (camelCase keys, as frozen in the
    plan); they win over the engine's. No `stream` key is ever sent.
    """
    opt = {
        **{
            k: engine[k]
            for k in ("temperature", "maxTokens", "supportsJsonSchema", "extraParams", "enableThinking")
            if k in engine
        },
        **dict(options or {}),
    }
    body: dict[str, Any] = {
        "model": model or engine.get("model"),
        "messages": [dict(m) for m in messages],
        "temperature": opt["temperature"] if opt.get("temperature") is not None else DEFAULT_TEMPERATURE,
    }
    if opt.get("maxTokens") is not None:
        body["max_tokens"] = opt["maxTokens"]
    if schema is not None and opt.get("supportsJsonSchema") is True:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": RESPONSE_SCHEMA_NAME, "schema": dict(schema), "strict": strict_compatible(schema)},
        }
    thinking = opt.get("enableThinking")
    if thinking is not None:
        if str(engine.get("provider") or "").lower() == "vllm":
            body["chat_template_kwargs"] = {"enable_thinking": bool(thinking)}
        else:
            body["enable_thinking"] = bool(thinking)
    body.update(_extra_params(opt.get("extraParams")))
    return body


def _extra_params(extra: Any) -> dict[str, Any]:
    """The configured `extraParams` the body takes: any key but the three akm owns (model, messages, stream)."""
    if not isinstance(extra, Mapping):
        return {}
    return {k: v for k, v in extra.items() if k not in ("model", "messages", "stream")}


def strict_compatible(schema: Any) -> bool:
    """Can this schema be sent with `strict: true`?

    OpenAI's strict mode refuses a schema unless every object closes its
    properties (`additionalProperties: false`) and requires all of them; other
    servers ignore the flag. A schema that is not strict-shaped is still sent,
    as guidance, with `strict: false` rather than failing the request.
    """
    if isinstance(schema, list):
        return all(strict_compatible(s) for s in schema)
    if not isinstance(schema, Mapping):
        return schema is not True  # `true` (anything goes) cannot be said in strict mode
    if not any(k in schema for k in ("type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const")):
        return False  # strict mode wants every node typed; `{}` is refused
    props = schema.get("properties")
    is_object = schema.get("type") == "object" or isinstance(props, Mapping)
    if is_object:
        if schema.get("additionalProperties") is not False:
            return False
        if isinstance(props, Mapping) and set(schema.get("required") or []) != set(props):
            return False
    for key in ("properties", "$defs", "definitions"):
        sub = schema.get(key)
        if isinstance(sub, Mapping) and not all(strict_compatible(v) for v in sub.values()):
            return False
    for key in ("items", "anyOf", "allOf", "oneOf", "prefixItems"):
        if key in schema and not strict_compatible(schema[key]):
            return False
    return True


# --------------------------------------------------------------------------- transport


class _Inflight:
    """One request the watchdog may cut: its cancel flag, deadline and sockets."""

    __slots__ = ("cancel", "deadline", "socks", "fired", "lock")

    def __init__(self, cancel: threading.Event | None, deadline: float | None) -> None:
        self.cancel = cancel
        self.deadline = deadline
        self.socks: list[socket.socket] = []
        self.fired: str | None = None
        self.lock = threading.Lock()

    def add(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self.lock:
            self.socks.append(sock)
            fired = self.fired
        if fired:
            _shutdown(sock)

    def fire(self, reason: str) -> None:
        with self.lock:
            if self.fired:
                return
            self.fired = reason
            socks = list(self.socks)
        for s in socks:
            _shutdown(s)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Watchdog:
    """One daemon thread cutting the connections of cancelled or overdue requests."""

    def __init__(self) -> None:
        self._items: set[_Inflight] = set()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def register(self, item: _Inflight) -> None:
        with self._cv:
            self._items.add(item)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="akm-llm-watchdog", daemon=True)
                self._thread.start()
            self._cv.notify()

    def unregister(self, item: _Inflight) -> None:
        with self._cv:
            self._items.discard(item)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items:
                    self._cv.wait()
                items = list(self._items)
            now = time.monotonic()
            for it in items:
                if it.fired:
                    continue
                if it.cancel is not None and it.cancel.is_set():
                    it.fire("aborted")
                elif it.deadline is not None and now >= it.deadline:
                    it.fire("timeout")
            time.sleep(WATCHDOG_TICK_S)


_WATCHDOG = _Watchdog()


@functools.lru_cache(maxsize=1)
def _ssl_context() -> "ssl.SSLContext":
    import httpx

    return httpx.create_ssl_context()


@functools.lru_cache(maxsize=64)
def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy the environment asks for (HTTPS_PROXY/HTTP_PROXY/ALL_PROXY, NO_PROXY); never for loopback.

    Computed once per host: httpx's own environment lookup costs milliseconds per client.
    """
    import urllib.request

    if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.") or host.endswith(".localhost"):
        return None
    proxies = urllib.request.getproxies_environment()
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # public; typeshed omits it
    if not proxies or bypass(host, proxies):
        return None
    return proxies.get(scheme) or proxies.get("all")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    import email.utils  # rare: an HTTP-date Retry-After
    from datetime import datetime, timezone

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


_PATTERN_SECRETS = (
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{4,}"),
    re.compile(r"\b(?:sk|rk|pk)[-_][A-Za-z0-9_-]{6,}"),
    re.compile(r"(?i)(\"(?:api[_-]?key|authorization|token|access[_-]?token)\"\s*:\s*)\"[^\"]*\""),
)


def _scrub(text: str, secrets: Sequence[str]) -> str:
    """Exact secrets first, then credential-shaped patterns (error bodies only)."""
    text = redact_text(text, secrets)
    text = _PATTERN_SECRETS[0].sub(f"Bearer {REDACTED}", text)
    text = _PATTERN_SECRETS[1].sub(REDACTED, text)
    return _PATTERN_SECRETS[2].sub(lambda m: m.group(1) + f'"{REDACTED}"', text)


def _excerpt(body: bytes, secrets: Sequence[str]) -> str:
    text = body.decode("utf-8", errors="replace")
    if _looks_html(text):
        text = re.sub(r"<[^>]*>", " ", text)
    text = " ".join(_scrub(text, secrets).split())
    return clip(text, ERROR_EXCERPT)


def _looks_html(text: str) -> bool:
    head = text.lstrip()[:15].lower()
    return head.startswith("<!doctype html") or head.startswith("<html")


class _Conn:
    """One client with at most one keep-alive connection, used by one request at a time.

    Reusing the connection saves a client, an SSL context and a TCP (or TLS) handshake per
    request; holding it exclusively keeps the watchdog's cut exact: the socket a request may
    be cut on is this client's own (`sock`, recorded when it connected), never another's.
    """

    __slots__ = ("client", "sock")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sock: Any = None


_IDLE: dict[tuple[Any, ...], list[_Conn]] = {}
_IDLE_LOCK = threading.Lock()
_IDLE_MAX = 64  # per endpoint: the widest a step can be


def _checkout(key: tuple[Any, ...], scheme: str, proxy: str | None) -> _Conn:
    with _IDLE_LOCK:
        free = _IDLE.get(key)
        if free:
            return free.pop()
    import httpx

    # plain http needs no TLS context (building one loads the CA bundle: ~0.3 s in a one-shot process)
    return _Conn(
        httpx.Client(
            trust_env=False,
            verify=_ssl_context() if scheme == "https" else False,
            proxy=proxy,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
    )


def _checkin(key: tuple[Any, ...], conn: _Conn) -> None:
    with _IDLE_LOCK:
        free = _IDLE.setdefault(key, [])
        if len(free) < _IDLE_MAX:
            free.append(conn)
            return
    conn.client.close()


def close_idle_connections() -> None:
    """Close every pooled client (at exit, and for callers that want no socket left open)."""
    with _IDLE_LOCK:
        conns = [c for free in _IDLE.values() for c in free]
        _IDLE.clear()
    for c in conns:
        try:
            c.client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


atexit.register(close_idle_connections)


def post_chat(
    endpoint: str,
    body: Mapping[str, Any],
    *,
    api_key: str | None = None,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    cancel: threading.Event | None = None,
    secrets: Sequence[str] = (),
    deadline: float | None = None,
) -> ChatResponse:
    """ONE request with exactly `body`; no retry. Raises `LlmCallError`.

    For callers that must control the body byte for byte (setup's endpoint
    verification); units go through `chat`. `deadline` (monotonic seconds)
    overrides `timeout_ms` when given.
    """
    import httpx

    if deadline is None and timeout_ms is not None:
        deadline = time.monotonic() + timeout_ms / 1000.0
    secrets = [*secrets, *([api_key] if api_key else [])]
    where = f"{endpoint}"
    if cancel is not None and cancel.is_set():
        raise LlmCallError("aborted", f"request to {where} was not sent: the unit was cancelled")
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        raise LlmCallError("timeout", f"request to {where} timed out before it was sent")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        content = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise LlmCallError("invalid_request", f"the request body cannot be sent as JSON: {exc}") from None

    inflight = _Inflight(cancel, deadline)

    url = httpx.URL(endpoint)
    proxy = _proxy_for(url.scheme, url.host)
    key = (url.scheme, url.host, url.port, proxy)
    conn: _Conn | None = None
    reusable = False

    def trace(event: str, info: Mapping[str, Any]) -> None:
        if event.endswith("connect_tcp.complete") or event.endswith("start_tls.complete"):
            stream = info.get("return_value")
            try:
                sock = stream.get_extra_info("socket") if stream is not None else None
            except Exception:  # an exotic transport without a socket: the deadline backstop still applies
                sock = None
            if sock is not None and conn is not None:
                conn.sock = sock
            inflight.add(sock)

    t = None if remaining is None else max(0.001, remaining)
    timeout = httpx.Timeout(t, connect=min(t, CONNECT_TIMEOUT_S) if t is not None else CONNECT_TIMEOUT_S)
    started = time.monotonic()
    _WATCHDOG.register(inflight)
    try:
        conn = _checkout(key, url.scheme, proxy)
        inflight.add(conn.sock)  # a kept-alive connection: cut it if this request is cancelled or overdue
        with conn.client.stream(
            "POST", url, content=content, headers=headers, timeout=timeout, extensions={"trace": trace}
        ) as resp:
            status = resp.status_code
            ctype = resp.headers.get("content-type", "").lower()
            retry_after = _retry_after(resp.headers.get("retry-after"))
            if "text/event-stream" in ctype:
                raise LlmCallError(
                    "bad_response",
                    f"{where} answered with an event stream (HTTP {status}, "
                    "text/event-stream); akm needs one JSON completion — turn streaming off "
                    "for this endpoint",
                    status=status,
                )
            chunks: list[bytes] = []
            size = 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise LlmCallError(
                        "bad_response",
                        f"{where} answered with more than {MAX_BODY_BYTES} "
                        f"bytes (HTTP {status}); refusing to read further",
                        status=status,
                    )
                chunks.append(chunk)
            data = b"".join(chunks)
        reusable = True
    except LlmCallError:
        raise
    except httpx.HTTPError as exc:
        if inflight.fired == "aborted":
            raise LlmCallError("aborted", f"request to {where} was cancelled while in flight") from None
        if (
            inflight.fired == "timeout"
            or isinstance(exc, httpx.TimeoutException)
            or (deadline is not None and time.monotonic() >= deadline)
        ):
            ms = timeout_ms if timeout_ms is not None else int((time.monotonic() - started) * 1000)
            raise LlmCallError("timeout", f"request to {where} timed out after {ms} ms") from None
        detail = _scrub(str(exc) or type(exc).__name__, secrets)
        raise LlmCallError(
            "network_error", f"network error talking to {where}: {type(exc).__name__}: {clip(detail, ERROR_EXCERPT)}"
        ) from None
    finally:
        _WATCHDOG.unregister(inflight)
        if conn is not None:
            if reusable and not inflight.fired:
                _checkin(key, conn)
            else:  # an error or a cut may leave the connection in any state: never hand it on
                conn.client.close()
    if inflight.fired == "aborted":
        raise LlmCallError("aborted", f"request to {where} was cancelled while in flight")
    return _parse_response(where, status, data, retry_after, secrets)


def _parse_response(
    where: str, status: int, data: bytes, retry_after: float | None, secrets: Sequence[str]
) -> ChatResponse:
    text = data.decode("utf-8", errors="replace")
    if status == 429:
        wait = f"; the server asks to retry after {retry_after:g} s" if retry_after is not None else ""
        raise LlmCallError(
            "rate_limited",
            f"{where} rate-limited the request (HTTP 429){wait}: {_excerpt(data, secrets)}",
            status=status,
            retry_after_s=retry_after,
        )
    if not 200 <= status < 300:
        html = _looks_html(text)
        kind = "an HTML error page" if html else "an error"
        raise LlmCallError(
            "http_error",
            f"{where} answered HTTP {status} with {kind}: {_excerpt(data, secrets)}",
            status=status,
            html=html,
        )
    if _looks_html(text):
        raise LlmCallError(
            "bad_response",
            f"{where} answered HTTP {status} with an HTML page, not a chat "
            f"completion (is the endpoint URL right?): {_excerpt(data, secrets)}",
            status=status,
        )
    try:
        doc = json.loads(text)
    except ValueError:
        raise LlmCallError(
            "bad_response",
            f"{where} answered HTTP {status} with something that is not JSON: {_excerpt(data, secrets)}",
            status=status,
        ) from None
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise LlmCallError(
            "bad_response",
            f"{where} answered HTTP {status} with JSON that has no choices: {_excerpt(data, secrets)}",
            status=status,
        )
    first = choices[0]
    raw_message = first.get("message")
    message: dict[str, Any] = raw_message if isinstance(raw_message, dict) else {}
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    answer = content.strip() if isinstance(content, str) else ""
    if not answer and isinstance(message.get("reasoning_content"), str):
        answer = message["reasoning_content"].strip()
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}

    def count(key: str, within: dict[str, Any] = usage) -> int | None:
        return token_count(within.get(key))

    raw_prompt, raw_completion = usage.get("prompt_tokens_details"), usage.get("completion_tokens_details")
    prompt_details: dict[str, Any] = raw_prompt if isinstance(raw_prompt, dict) else {}
    completion_details: dict[str, Any] = raw_completion if isinstance(raw_completion, dict) else {}

    return ChatResponse(
        text=redact_text(answer, secrets),
        status=status,
        model=doc.get("model") if isinstance(doc.get("model"), str) else None,
        finish_reason=first.get("finish_reason") if isinstance(first.get("finish_reason"), str) else None,
        prompt_tokens=count("prompt_tokens"),
        completion_tokens=count("completion_tokens"),
        total_tokens=count("total_tokens"),
        cached_tokens=count("cached_tokens", prompt_details),
        reasoning_tokens=count("reasoning_tokens", completion_details),
        raw=doc,
    )


_CONTEXT_OVERFLOW = re.compile(
    r"(?i)(context (size|length|window)|prompt (is )?too long|maximum context|"
    r"exceeds? .{0,40}context|too many tokens)"
)


def _retryable(err: LlmCallError) -> bool:
    if _CONTEXT_OVERFLOW.search(err.message):
        return False
    if err.code == "http_error":
        return err.status is not None and err.status >= 500 and not err.html
    if err.code == "network_error":
        return not re.search(r"(?i)connecterror|connection refused|name or service|nodename", err.message)
    return False


def chat(
    engine: Mapping[str, Any],
    messages: Sequence[Mapping[str, str]],
    *,
    schema: Mapping[str, Any] | None = None,
    model: str | None = None,
    options: Mapping[str, Any] | None = None,
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS,
    cancel: threading.Event | None = None,
    api_key: str | None = None,
    resolve_key: bool = True,
    environ: Mapping[str, str] | None = None,
    secrets: Sequence[str] = (),
) -> ChatResponse:
    """A chat completion against a frozen LLM snapshot, with the transport retries of §5.5.

    Used by LLM units, the gate judge and setup. The key is resolved from the
    environment (`resolve_key`) unless `api_key` is given. Raises `LlmCallError`;
    its message is already scrubbed of the key and `secrets`.
    """
    if api_key is None and resolve_key:
        api_key = resolve_api_key(engine, environ)
    secrets = [*secrets, *([api_key] if api_key else [])]
    body = build_body(engine, messages, schema=schema, model=model, options=options)
    endpoint = str(engine.get("endpoint") or "")
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
    transport_retried = False
    rate_retries = 0
    while True:
        try:
            resp = post_chat(
                endpoint,
                body,
                api_key=api_key,
                timeout_ms=timeout_ms,
                cancel=cancel,
                secrets=secrets,
                deadline=deadline,
            )
        except LlmCallError as err:
            remaining = None if deadline is None else deadline - time.monotonic()
            if (
                err.code == "rate_limited"
                and err.retry_after_s is not None
                and rate_retries < MAX_RATE_LIMIT_RETRIES
                and err.retry_after_s <= MAX_RETRY_AFTER_S
                and (remaining is None or err.retry_after_s < remaining)
            ):
                rate_retries += 1
                _pause(err.retry_after_s, cancel, endpoint)
                continue
            if (
                not transport_retried
                and _retryable(err)
                and (remaining is None or timeout_ms is None or remaining > 0.1 * timeout_ms / 1000.0)
            ):
                transport_retried = True
                _pause(random.uniform(0.2, 0.8), cancel, endpoint)
                continue
            raise
        if resp.finish_reason == "content_filter" and not resp.text:
            raise LlmCallError(
                "content_filter",
                f"{endpoint} withheld the answer (finish_reason content_filter)",
                status=resp.status,
                tokens=resp.tokens,
            )
        return resp


def _pause(seconds: float, cancel: threading.Event | None, endpoint: str) -> None:
    if cancel is None:
        time.sleep(seconds)
    elif cancel.wait(seconds):
        raise LlmCallError("aborted", f"request to {endpoint} was cancelled while waiting to retry")


# --------------------------------------------------------------------------- capability probe


@dataclass
class ProbeResult:
    reachable: bool
    structured_output: bool
    error: str | None = None


_PROBE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["ok", "ingest", "lint"],
    "properties": {k: {"type": "boolean", "const": True} for k in ("ok", "ingest", "lint")},
}


def probe_json_schema(
    engine: Mapping[str, Any],
    *,
    api_key: str | None = None,
    timeout_ms: int = 30_000,
    cancel: threading.Event | None = None,
) -> ProbeResult:
    """Does this endpoint honour `response_format: json_schema`? (§5.6; for `akm setup --probe`.)"""
    probe_engine = {**engine, "supportsJsonSchema": True}
    messages = [
        {"role": "system", "content": "Reply with JSON only, no prose."},
        {"role": "user", "content": 'Return exactly {"ok": true, "ingest": true, "lint": true}'},
    ]
    try:
        resp = chat(
            probe_engine,
            messages,
            schema=_PROBE_SCHEMA,
            options={"maxTokens": 64, "temperature": 0},
            timeout_ms=timeout_ms,
            cancel=cancel,
            api_key=api_key,
            resolve_key=api_key is None,
        )
    except LlmCallError as err:
        return ProbeResult(False, False, err.message)
    if not resp.text:
        return ProbeResult(False, False, "empty reply")
    from akm.dispatch.answer import AnswerError, extract_model_json

    try:  # leniently, as upstream's parseJsonResponse: a think block or a code fence around the object is fine
        value = extract_model_json(resp.text)
    except AnswerError:
        value = None
    ok = isinstance(value, dict) and set(value) == {"ok", "ingest", "lint"} and all(v is True for v in value.values())
    return ProbeResult(True, ok)


# --------------------------------------------------------------------------- the dispatcher


class LlmDispatcher:
    """Dispatcher for `llm` units: builds the conversation, calls `chat`, maps errors to failure reasons.

    Per-engine concurrency (D6): a semaphore per engine name (sized by the
    snapshot's `concurrency`) caps requests in flight to one server across all
    steps and runs this process drives, on top of the step's width rule.
    A corrective follow-up (`feedback`) continues the conversation: the previous
    answer of the same attempt is replayed as the assistant turn, then the
    feedback as a new user turn.
    """

    kind = "llm"

    def __init__(self, *, environ: Mapping[str, str] | None = None, memory: int = 1024) -> None:
        self._environ = environ
        self._gates: dict[tuple[str, int], threading.BoundedSemaphore] = {}
        self._gates_lock = threading.Lock()
        self._answers: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._answers_lock = threading.Lock()
        self._memory = memory

    def _gate(self, name: str, width: int) -> threading.BoundedSemaphore:
        key = (name, max(1, width))
        with self._gates_lock:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = threading.BoundedSemaphore(key[1])
            return gate

    def _remember(self, key: tuple[str, str], text: str) -> None:
        with self._answers_lock:
            self._answers[key] = text
            self._answers.move_to_end(key)
            while len(self._answers) > self._memory:
                self._answers.popitem(last=False)

    def _recall(self, key: tuple[str, str]) -> str | None:
        with self._answers_lock:
            return self._answers.get(key)

    def messages_for(self, request: UnitRequest, feedback: str | None) -> list[dict[str, str]]:
        msgs: list[dict[str, str]] = []
        if request.system_prompt:
            msgs.append({"role": "system", "content": request.system_prompt})
        if not feedback:
            msgs.append({"role": "user", "content": request.prompt})
            return msgs
        previous = self._recall((request.run_id, request.attempt_id))
        if previous is None:  # another process asked first: the upstream form, feedback after a blank line
            msgs.append({"role": "user", "content": f"{request.prompt}\n\n{feedback}"})
        else:
            msgs += [
                {"role": "user", "content": request.prompt},
                {"role": "assistant", "content": previous},
                {"role": "user", "content": feedback},
            ]
        return msgs

    def dispatch(self, request: UnitRequest, cancel: threading.Event, feedback: str | None = None) -> DispatchResult:
        engine = request.engine or {}
        label = f"LLM unit {request.attempt_id} on engine {request.engine_name or engine.get('name', '?')!r}"
        secrets = list(request.sensitive_values)
        if engine.get("kind") != "llm" or not engine.get("endpoint"):
            return _failure("dispatch_error", f"{label}: the plan has no LLM engine snapshot for it", secrets)
        if request.env_bindings:
            return _failure(
                "env_unsupported",
                f"{label}: env bindings need an agent or exec unit; an LLM engine runs no process to pass them to",
                secrets,
            )
        if cancel.is_set():
            return _failure("aborted", f"{label} was not sent: the run was interrupted", secrets)
        env = request.parent_env if request.parent_env is not None else self._environ
        try:
            api_key = resolve_api_key(engine, env)
        except LlmCallError as err:
            return _failure(failure_reason_for(err.code), f"{label}: {err.message}", secrets)
        if api_key:
            secrets.append(api_key)
        gate = self._gate(
            str(engine.get("name") or request.engine_name or engine["endpoint"]), int(engine.get("concurrency") or 1)
        )
        while not gate.acquire(timeout=0.05):
            if cancel.is_set():
                return _failure("aborted", f"{label} was not sent: the run was interrupted", secrets)
        try:
            resp = chat(
                engine,
                self.messages_for(request, feedback),
                schema=request.output_schema,
                model=request.model,
                options=getattr(request, "llm_options", None),
                timeout_ms=request.timeout_ms,
                cancel=cancel,
                api_key=api_key,
                resolve_key=False,
                secrets=secrets,
            )
        except LlmCallError as err:
            failed = _failure(failure_reason_for(err.code), f"{label}: {err.message}", secrets, tokens=err.tokens)
            failed.retry_after_s = err.retry_after_s
            return failed
        except Exception as exc:  # a bug must not escape a dispatcher (base.py contract)
            return _failure("dispatch_error", f"{label} failed inside akm: {type(exc).__name__}: {exc}", secrets)
        finally:
            gate.release()
        text = redact_text(resp.text, secrets)
        self._remember((request.run_id, request.attempt_id), text)
        return DispatchResult(ok=True, text=text or None, tokens=resp.tokens, usage=resp.usage)


def _failure(reason: str, error: str, secrets: Sequence[str], tokens: int | None = None) -> DispatchResult:
    return DispatchResult(
        ok=False, failure_reason=reason, error=clip(redact_text(error, secrets), DIAGNOSTIC_CLIP), tokens=tokens
    )
