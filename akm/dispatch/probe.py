"""Small read-only probes `akm setup` uses to look around: GET a JSON document, list a CLI's models.

They live here because only `akm.dispatch` talks to the network or spawns
processes. Both are bounded by short timeouts and never raise: a probe that
fails is an answer too ("nothing there"), and setup must finish quickly on a
machine with nothing installed.

Loopback URLs are fetched with `http.client` (no proxy can apply to them, and
it costs a few milliseconds to import where httpx costs a fifth of a second);
anything else goes through httpx with the environment's proxy, like LLM units.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence
from urllib.parse import urlsplit

from akm.record import dataclass

MAX_DOC_BYTES = 2 * 1024 * 1024


@dataclass
class HttpAnswer:
    """What a GET produced: the status (None = no HTTP answer), the JSON document (None = not JSON), why not."""

    url: str
    status: int | None = None
    doc: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and self.doc is not None


def _loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    return host in ("localhost", "::1") or host.startswith("127.") or host.endswith(".localhost")


def get_json(url: str, *, timeout_s: float = 2.0, api_key: str | None = None) -> HttpAnswer:
    """GET `url` and parse its body as JSON. `api_key` (a value read from the environment by the caller)
    goes only into the Authorization header; it is never part of the answer."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        return HttpAnswer(url, error=f"not a valid URL: {exc}")
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        if _loopback(host) or parts.scheme not in ("http", "https"):
            status, body = _get_stdlib(parts, headers, timeout_s)
        else:
            status, body = _get_httpx(url, headers, timeout_s)
    except TimeoutError:
        return HttpAnswer(url, error=f"no answer within {timeout_s:g} s")
    except OSError as exc:
        return HttpAnswer(url, error=_os_reason(exc))
    except Exception as exc:  # httpx errors and malformed answers: a probe never raises
        return HttpAnswer(url, error=f"{type(exc).__name__}: {str(exc)[:160]}")
    try:
        doc = json.loads(body.decode("utf-8", errors="replace")) if body else None
    except ValueError:
        doc = None
    return HttpAnswer(url, status=status, doc=doc, error=None if doc is not None else "the answer is not JSON")


def _os_reason(exc: OSError) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return exc.strerror or type(exc).__name__


def _get_stdlib(parts: Any, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
    import http.client

    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname, parts.port, timeout=timeout_s)
    try:
        path = parts.path or "/"
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_DOC_BYTES)
    finally:
        conn.close()


def _get_httpx(url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
    import httpx

    from akm.dispatch.llm import _proxy_for, _ssl_context

    u = httpx.URL(url)
    with httpx.Client(
        trust_env=False,
        verify=_ssl_context(),
        timeout=timeout_s,
        proxy=_proxy_for(u.scheme, u.host),
        follow_redirects=False,
    ) as client:
        with client.stream("GET", u, headers=headers) as resp:
            chunks: list[bytes] = []
            size = 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > MAX_DOC_BYTES:
                    break
                chunks.append(chunk)
            return resp.status_code, b"".join(chunks)


def run_listing(argv: Sequence[str], *, timeout_s: float = 5.0) -> str | None:
    """Run a CLI's read-only listing command (`ollama list`); its stdout, or None when it failed.

    Supervised like every other child (`akm.dispatch.process`): stdin is
    /dev/null, and at the timeout the whole process group is killed, so a CLI
    that wants to prompt or hangs on a dead server cannot stall setup.
    """
    from akm.dispatch.process import run_process

    result = run_process(
        list(argv), cwd=os.getcwd(), env=dict(os.environ), timeout_ms=int(timeout_s * 1000), capture_limit=MAX_DOC_BYTES
    )
    if result.exit_code != 0 or result.capture_error:
        return None
    return result.stdout


def cli_version(exe: str, *, timeout_s: float = 10.0) -> str | None:
    """What `exe --version` says its version is (None: it failed, timed out, or printed none).

    In a scratch directory with stdin /dev/null and the process group killed at the timeout: a CLI
    that starts an update check or a prompt cannot stall setup."""
    import tempfile

    from akm.dispatch.harnesses import version_in
    from akm.dispatch.process import run_process

    with tempfile.TemporaryDirectory(prefix="akm-version-") as scratch:
        result = run_process(
            [exe, "--version"], cwd=scratch, env=dict(os.environ), timeout_ms=int(timeout_s * 1000), capture_limit=4096
        )
    if result.exit_code != 0 or result.timed_out:
        return None
    return version_in(result.stdout) or version_in(result.stderr)
