"""A real HTTP server on 127.0.0.1 speaking the OpenAI chat-completions API, for tests.

What it answers is chosen by the request's `model`, so one server serves many
behaviours at once (and parallel requests never share a script):

  plain            content "hello" with usage 12 + 5 tokens
  json             content '{"ok": true}'
  probe-ok         content '{"ok": true, "ingest": true, "lint": true}' (the capability probe's answer)
  probe-fenced     the same object after a <think> block, in a ```json fence (a thinking model's answer)
  verdict-pass     a judge's passing verdict
  verdict-held     a passing verdict, sent once the test sets `release` (counted in `held`)
  verdict-reject   a judge's rejecting verdict (missing ["more detail"], feedback "add more detail")
  verdict-reject-once  a rejecting verdict (missing ["depth"], feedback "Go deeper.") the first time, then passing
  echo             content = the last message's content
  transcript       content = JSON of the whole `messages` array
  echo-auth        content = "auth=<Authorization header>" (redaction tests)
  reasoning        empty content, reasoning_content "thought"
  rate-limit-N     429 with Retry-After: N on the first request of that model, then "ok"
  rate-limit       429 without Retry-After, every time
  flaky-500        500 on the first request of that model, then "ok"
  fail-500         500 every time
  flaky-500-words  500 whose JSON error message mentions HTML on the first request, then "ok"
  unauthorized     401 whose body echoes the Authorization header
  html-502         502 with an HTML page
  html-200         200 with an HTML page
  malformed        200 with "not json at all"
  no-choices       200 with {"object": "chat.completion"}
  no-content       200 with {"choices": [{"message": {}}]}
  stream           200 text/event-stream chunks
  filtered         empty content, finish_reason content_filter
  slow-S           sleeps S seconds (float), then "ok"
  hold-S           like slow-S, counted in `max_inflight` (concurrency tests)
  drop             closes the connection without answering, every time
  smart            answers by what is asked: "OK" to setup's verification, a passing verdict to a
                   gate judge, the probe's object under response_format, else "hello"

Setup tests also need the GET side of a model server: `shape` chooses which model
lists it serves (`openai`: GET /v1/models; `ollama`: also /api/tags; `lmstudio`:
also /api/v0/models) with `models`; `behaviour` maps a listed model name to one of
the behaviours above; `require_key` answers 401 to any request without
`Authorization: Bearer <key>`. `Silent` is a port that accepts connections and
never answers.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Silent:
    """A TCP port that accepts connections and never answers. `peak` is how many connections were open at once
    (each stays open until its client gives up): requests asked in parallel show as more than one, whatever
    the load, where a time bound would not tell them from requests asked one after another on a slow box."""

    def __init__(self) -> None:
        import selectors
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.peak = 0
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        import selectors

        self.sock.setblocking(False)
        open_: set = set()
        while not self._stop.is_set():
            ready = [key.fileobj for key, _ in self._selector.select(timeout=0.1)]
            while self.sock in ready:  # every waiting connection first, so a late look still counts them all open
                try:
                    conn, _ = self.sock.accept()
                except BlockingIOError:
                    break
                self._selector.register(conn, selectors.EVENT_READ)
                open_.add(conn)
                self.peak = max(self.peak, len(open_))
            for conn in ready:
                if conn is not self.sock and not conn.recv(1 << 16):  # type: ignore[union-attr]  # client gave up
                    self._selector.unregister(conn)
                    conn.close()  # type: ignore[union-attr]
                    open_.discard(conn)
        for conn in open_:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(timeout=30)
        self.sock.close()


class LoopbackHandler(BaseHTTPRequestHandler):
    """What every loopback fake's handler shares: keep-alive HTTP/1.1, quiet, whole answers in one write."""

    protocol_version = "HTTP/1.1"
    # one segment per answer and no Nagle: keep-alive clients must not wait on delayed ACKs
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def send_json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        self.send_text(status, json.dumps(doc), "application/json", headers)

    def send_text(self, status: int, text: str, ctype: str, headers: dict[str, str] | None = None) -> None:
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            pass


class FakeOpenAI:
    def __init__(
        self,
        *,
        shape: str | None = None,
        models: list[str] | None = None,
        behaviour: dict[str, str] | None = None,
        require_key: str | None = None,
    ) -> None:
        self.shape = shape
        self.models = list(models or [])
        self.behaviour = dict(behaviour or {})
        self.require_key = require_key
        self.gets: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.inflight = 0
        self.max_inflight = 0
        self.held = threading.Semaphore(0)  # one release per `verdict-held` request received
        self.release = threading.Event()
        server = self

        class Handler(LoopbackHandler):
            def authorized(self) -> bool:
                if server.require_key is None or self.headers.get("Authorization") == f"Bearer {server.require_key}":
                    return True
                self.send_json(401, {"error": {"message": "missing or wrong API key"}})
                return False

            def do_GET(self) -> None:  # noqa: N802
                with server.lock:
                    server.gets.append({"path": self.path, "headers": dict(self.headers.items())})
                if not self.authorized():
                    return
                doc = server.model_list(self.path)
                if doc is None:
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                else:
                    self.send_json(200, doc)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                with server.lock:
                    server.requests.append(
                        {"path": self.path, "headers": dict(self.headers.items()), "body": body, "at": time.monotonic()}
                    )
                    model = str(body.get("model", ""))
                    n = server.counts[model] = server.counts.get(model, 0) + 1
                if not self.authorized():
                    return
                server.answer(self, server.behaviour.get(model, model), n, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        host, port = self.httpd.server_address[:2]
        self.base = f"http://{host}:{port}"
        self.url = f"{self.base}/v1/chat/completions"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def model_list(self, path: str) -> Any:
        """The GET answers of a model server of `self.shape` (None = 404)."""
        if self.shape is None:
            return None
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "fake"} for m in self.models]}
        if path == "/api/tags" and self.shape == "ollama":
            return {
                "models": [
                    {
                        "name": m if ":" in m else f"{m}:latest",
                        "model": m,
                        "details": {"family": "nomic-bert" if "embed" in m else "qwen2"},
                    }
                    for m in self.models
                ]
            }
        if path == "/api/v0/models" and self.shape == "lmstudio":
            return {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "type": "embeddings" if "embed" in m else "llm", "state": "loaded"}
                    for m in self.models
                ],
            }
        return None

    def bodies(self, model: str | None = None) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if model is None or r["body"].get("model") == model]

    @staticmethod
    def completion(
        content: str, *, finish: str = "stop", usage: dict[str, int] | None = None, reasoning: str | None = None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        doc: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if usage is not None:
            doc["usage"] = usage
        return doc

    def answer(self, h: Any, model: str, n: int, body: dict[str, Any]) -> None:  # noqa: C901
        msgs = body.get("messages") or [{}]
        if model == "plain":
            h.send_json(
                200, self.completion("hello", usage={"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17})
            )
        elif model == "json":
            h.send_json(200, self.completion('{"ok": true}', usage={"prompt_tokens": 3, "completion_tokens": 4}))
        elif model == "probe-ok":
            h.send_json(200, self.completion('{"ok": true, "ingest": true, "lint": true}'))
        elif model == "probe-fenced":
            h.send_json(
                200,
                self.completion(
                    '<think>they want JSON</think>\n```json\n{"ok": true, "ingest": true, "lint": true}\n```'
                ),
            )
        elif model == "verdict-pass":
            h.send_json(
                200,
                self.completion(
                    '{"complete": true, "missing": [], "feedback": ""}',
                    usage={"prompt_tokens": 50, "completion_tokens": 10},
                ),
            )
        elif model == "verdict-held":
            self.held.release()
            self.release.wait(120)
            h.send_json(200, self.completion('{"complete": true, "missing": [], "feedback": ""}'))
        elif model == "verdict-reject":
            h.send_json(
                200, self.completion('{"complete": false, "missing": ["more detail"], "feedback": "add more detail"}')
            )
        elif model == "verdict-reject-once":
            if n == 1:
                h.send_json(200, self.completion('{"complete": false, "missing": ["depth"], "feedback": "Go deeper."}'))
            else:
                h.send_json(200, self.completion('{"complete": true, "missing": [], "feedback": ""}'))
        elif model == "echo":
            h.send_json(200, self.completion(str(msgs[-1].get("content", ""))))
        elif model == "transcript":
            h.send_json(200, self.completion(json.dumps(msgs)))
        elif model == "echo-auth":
            h.send_json(200, self.completion(f"auth={h.headers.get('Authorization')}"))
        elif model == "reasoning":
            h.send_json(200, self.completion("", reasoning="thought"))
        elif model.startswith("rate-limit-"):
            if n == 1:
                h.send_json(429, {"error": {"message": "slow down"}}, {"Retry-After": model.rsplit("-", 1)[1]})
            else:
                h.send_json(200, self.completion("ok"))
        elif model == "rate-limit":
            h.send_json(429, {"error": {"message": "slow down"}})
        elif model == "flaky-500-words":
            if n == 1:
                h.send_json(500, {"error": {"message": "renderer failed: <p> in HTML template"}})
            else:
                h.send_json(200, self.completion("ok"))
        elif model == "flaky-500":
            if n == 1:
                h.send_json(500, {"error": {"message": "boom"}})
            else:
                h.send_json(200, self.completion("ok"))
        elif model == "fail-500":
            h.send_json(500, {"error": {"message": "boom"}})
        elif model == "unauthorized":
            h.send_json(401, {"error": {"message": f"bad key: {h.headers.get('Authorization')}"}})
        elif model == "html-502":
            h.send_text(502, "<!DOCTYPE html><html><body><h1>Bad Gateway</h1></body></html>", "text/html")
        elif model == "html-200":
            h.send_text(200, "<html><body>Welcome to nginx</body></html>", "text/html")
        elif model == "malformed":
            h.send_text(200, "not json at all", "application/json")
        elif model == "no-choices":
            h.send_json(200, {"object": "chat.completion"})
        elif model == "no-content":
            h.send_json(200, {"choices": [{"message": {}}]})
        elif model == "stream":
            chunk = json.dumps({"choices": [{"delta": {"content": "hi"}}]})
            h.send_text(200, f"data: {chunk}\n\ndata: [DONE]\n\n", "text/event-stream")
        elif model == "filtered":
            h.send_json(200, self.completion("", finish="content_filter"))
        elif model.startswith("slow-") or model.startswith("hold-"):
            with self.lock:
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                time.sleep(float(model.split("-", 1)[1]))
            finally:
                with self.lock:
                    self.inflight -= 1
            h.send_json(
                200, self.completion("ok", usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})
            )
        elif model == "smart":
            last = str(msgs[-1].get("content", "")) if msgs else ""
            fmt = body.get("response_format") or {}
            schema = ((fmt.get("json_schema") or {}).get("schema") or {}) if isinstance(fmt, dict) else {}
            if last == "Reply OK":
                h.send_json(200, self.completion("OK"))
            elif "Return only the JSON verdict" in last:
                h.send_json(
                    200,
                    self.completion(
                        '{"complete": true, "missing": [], "feedback": ""}',
                        usage={"prompt_tokens": 40, "completion_tokens": 9},
                    ),
                )
            elif set(schema.get("properties") or {}) == {"ok", "ingest", "lint"}:
                h.send_json(200, self.completion('{"ok": true, "ingest": true, "lint": true}'))
            else:
                h.send_json(
                    200,
                    self.completion("hello", usage={"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}),
                )
        elif model == "drop":
            h.close_connection = True
            try:
                h.connection.shutdown(2)
            except OSError:
                pass
        else:
            h.send_json(404, {"error": {"message": f"unknown model {model}"}})
