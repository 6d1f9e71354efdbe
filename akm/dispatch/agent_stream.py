"""Reading an agent CLI's output while it runs: progress, retries, and when to stop it early.

The real CLIs retry a failing model API on their own — claude for minutes on a 401, gemini
with growing back-offs on a 429, opencode on a 500 — and print nothing a person sees while
they do. Each of them does say so somewhere in its stream: claude's `stream-json` has
`system/api_retry` events, codex's `--json` has `Reconnecting... n/5 (unexpected status 401 …)`
errors, gemini writes `Attempt n failed with status 429. Retrying with backoff...` to stderr,
opencode (`--print-logs`) a `stream error` log line per failed call.

`StreamWatch` reads those lines (fed by `akm.dispatch.process.run_process`'s `on_line`) and

* stops the CLI at the FIRST refused key (HTTP 401/403): retrying a revoked key never helps,
  and the unit fails `agent_auth` within seconds saying the key was refused;
* stops it once it has retried a rate limit (429) or a server error more than `retries` times:
  `llm_rate_limit` or `agent_error`, so the unit's own `retry:` policy decides what comes next;
* keeps an `Activity` — turns, tool calls, the tool running, retries, the session id — and
  hands a copy to `on_activity` whenever it changes (the unit's live progress).

Pure parsing: no processes, no clocks; one instance per attempt, called from one thread.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from akm.record import dataclass

# What a stream says that matters here (per line, in order).
_SESSION, _TURN, _TOOL, _RETRY = "session", "turn", "tool", "retry"


@dataclass
class Activity:
    """What an agent CLI has done so far in this attempt, as its own stream told it."""

    turns: int = 0
    tool_calls: int = 0
    tool: str | None = None  # the last tool it called
    retries: int = 0  # failed model calls it retried
    retry_status: int | None = None  # the HTTP status of the last one, when the CLI said
    session_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"turns": self.turns, "toolCalls": self.tool_calls, "retries": self.retries}
        for key, value in (("tool", self.tool), ("retryStatus", self.retry_status), ("sessionId", self.session_id)):
            if value is not None:
                out[key] = value
        return out


@dataclass
class Stop:
    """Why the watch stopped the CLI: a failure reason of the unit vocabulary and its words."""

    reason: str  # agent_auth | llm_rate_limit | agent_error
    message: str
    status: int | None = None


def reason_for_status(status: int | None) -> str:
    """The unit failure reason for a model API's HTTP status the CLI reported."""
    if status in (401, 403):
        return "agent_auth"
    if status == 429:
        return "llm_rate_limit"
    return "agent_error"


def refused_key_message(platform: str, status: int, detail: str) -> str:
    """The words for a refused key: what happened, and what to do about it."""
    detail = f": {detail}" if detail else ""
    return (
        f"the model API refused {platform}'s API key (HTTP {status}){detail} — check the key "
        f"{platform} uses (its environment variable or its own login)"
    )


# --------------------------------------------------------------------------- per-CLI line readers

Signal = tuple[str, Any]


def _json_line(line: str) -> dict[str, Any] | None:
    text = line.strip()
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _claude(stream: str, line: str) -> list[Signal]:
    ev = _json_line(line) if stream == "stdout" else None
    if ev is None:
        return []
    out: list[Signal] = []
    kind = ev.get("type")
    if kind == "system" and ev.get("subtype") == "init" and ev.get("session_id"):
        out.append((_SESSION, str(ev["session_id"])))
    elif kind == "system" and ev.get("subtype") == "api_retry":
        status = ev.get("error_status") if isinstance(ev.get("error_status"), int) else None
        if status is None and ev.get("error") == "authentication_failed":
            status = 401
        out.append((_RETRY, (status, str(ev.get("error") or ""))))
    elif kind == "assistant" and isinstance(ev.get("message"), dict) and ev.get("parent_tool_use_id") is None:
        out.extend(_claude_turn(ev["message"]))
    return out


def _claude_turn(message: dict[str, Any]) -> list[Signal]:
    """A top-level assistant message: a turn (unless claude's stand-in for a failed answer), then each tool use."""
    out: list[Signal] = []
    if message.get("model") != "<synthetic>":  # claude's own stand-in for an answer that failed
        out.append((_TURN, None))
    for part in message.get("content") or []:
        if isinstance(part, dict) and part.get("type") == "tool_use":
            out.append((_TOOL, str(part.get("name") or "tool")))
    return out


_HTTP_STATUS = re.compile(r"\bstatus:? (\d{3})\b")


def _codex_tool(item: dict[str, Any]) -> str | None:
    """The tool a codex item starts (a command, an MCP tool call, a file change, a web search), or None."""
    item_kind = str(item.get("type") or item.get("item_type") or "")
    if item_kind in ("command_execution", "mcp_tool_call", "file_change", "web_search"):
        return str(item.get("tool") or item_kind)
    return None


def _codex(stream: str, line: str) -> list[Signal]:
    ev = _json_line(line) if stream == "stdout" else None
    if ev is None:
        return []
    kind = ev.get("type")
    if kind == "thread.started" and ev.get("thread_id"):
        return [(_SESSION, str(ev["thread_id"]))]
    if kind == "turn.started":
        return [(_TURN, None)]
    if kind == "item.started" and isinstance(ev.get("item"), dict):
        tool = _codex_tool(ev["item"])
        if tool is not None:
            return [(_TOOL, tool)]
    if kind == "error" and isinstance(ev.get("message"), str) and ev["message"].startswith("Reconnecting"):
        m = _HTTP_STATUS.search(ev["message"])
        return [(_RETRY, (int(m.group(1)) if m else None, ev["message"]))]
    return []


def _opencode(stream: str, line: str) -> list[Signal]:
    if stream == "stderr":
        # `--print-logs --log-level ERROR`: one line per failed model call (opencode retries them silently)
        if 'message="stream error"' not in line:
            return []
        logged: list[Signal] = []
        session = re.search(r"\bsession\.id=(\S+)", line)
        if session:
            logged.append((_SESSION, session.group(1)))
        status = 429 if re.search(r"rate.?limit|too many requests", line, re.IGNORECASE) else None
        m = re.search(r'error\.error="([^"]*)"', line)
        return logged + [(_RETRY, (status, m.group(1) if m else "stream error"))]
    ev = _json_line(line)
    if ev is None:
        return []
    out: list[Signal] = []
    if ev.get("sessionID"):
        out.append((_SESSION, str(ev["sessionID"])))
    kind = ev.get("type")
    if kind == "step_start":
        out.append((_TURN, None))
    elif kind == "tool_use":
        part = ev["part"] if isinstance(ev.get("part"), dict) else {}
        out.append((_TOOL, str(part.get("tool") or "tool")))
    return out


_GEMINI_RETRY = re.compile(r"Attempt (\d+) failed with status (\d{3})")


def _gemini(stream: str, line: str) -> list[Signal]:
    if stream == "stderr":
        m = _GEMINI_RETRY.search(line)
        return [(_RETRY, (int(m.group(2)), line.strip()[:300]))] if m else []
    return []


READERS: dict[str, Callable[[str, str], list[Signal]]] = {
    "claude": _claude,
    "codex": _codex,
    "opencode": _opencode,
    "gemini": _gemini,
}


# --------------------------------------------------------------------------- the watch


class StreamWatch:
    """One attempt's watch over its CLI's lines (see the module docstring)."""

    def __init__(
        self,
        platform: str,
        *,
        retries: int,
        on_activity: Callable[[Activity], None] | None = None,
    ) -> None:
        self.platform = platform
        self.retries = retries
        self.on_activity = on_activity
        self.reader = READERS.get(platform)
        self.activity = Activity()
        self.stop: Stop | None = None

    @property
    def watches(self) -> bool:
        """Does this platform have a stream worth reading?"""
        return self.reader is not None

    def line(self, stream: str, line: str) -> str | None:
        """One line of the CLI's stdout or stderr; a reason to stop it, or None."""
        if self.reader is None or self.stop is not None:
            return None
        changed = False
        for what, value in self.reader(stream, line):
            changed = True
            a = self.activity
            if what == _SESSION:
                changed = a.session_id != value
                a.session_id = value
            elif what == _TURN:
                a.turns += 1
            elif what == _TOOL:
                a.tool_calls += 1
                a.tool = value
            elif what == _RETRY:
                status, detail = value
                a.retries += 1
                a.retry_status = status
                self.stop = self._judge(status, detail)
        if changed and self.on_activity is not None:
            self.on_activity(Activity(**vars(self.activity)))
        return self.stop.message if self.stop is not None else None

    def _judge(self, status: int | None, detail: str) -> Stop | None:
        if status in (401, 403):
            return Stop("agent_auth", refused_key_message(self.platform, status, _short(detail)), status)
        if self.activity.retries <= self.retries:
            return None
        what = f"HTTP {status}" if status is not None else "an error"
        return Stop(
            reason_for_status(status),
            f"the model API kept failing ({what}): {self.activity.retries} failed calls, and akm allows "
            f"{self.platform} {self.retries} retries, so akm stopped it"
            + (f" (last: {_short(detail)})" if detail else ""),
            status,
        )


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
