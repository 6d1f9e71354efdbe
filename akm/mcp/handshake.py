"""The `initialize` answer before the SDK is loaded: `akm mcp`'s first answer costs a start, not an import.

Why: importing the `mcp` SDK (its protocol types are pydantic models for every protocol version, its server
pulls in starlette, uvicorn, httpx and cryptography) takes about half a second warm and more with an empty cache,
and a client waits for the `initialize` answer before anything else. So while the main thread imports the SDK
and builds the server, a thread reads the first line of stdin and, when it is a plain `initialize` request,
writes the answer the SDK would write (same bytes). Everything read is handed to the serving loop anyway
(`pushback`), so the SDK still receives that `initialize` (its session state must be the same) and its answer
to it is not written again but compared: a difference is reported on stderr (tests/test_mcp_handshake.py keeps
them equal).

The `tools/list` answer goes the same way: after answering `initialize`, the reader also answers a plain
`tools/list` (no cursor) while the SDK is still loading — a client is connected in the time of a start instead
of an SDK import. The answer is `akm/mcp/tools.json`, generated from the tools' request models
(`akm.mcp.reference`; a test keeps it equal to what the server lists). It too is handed to the SDK, whose
answer is compared and not written; a difference is reported on stderr.

"Plain" is deliberately narrow: only what the SDK is certain to accept (JSON-RPC 2.0, an integer or string id,
params of `protocolVersion`, `capabilities` and `clientInfo` in the shapes mainstream clients send). Anything
else — a malformed request, another method first, an SDK already imported, an SDK outside the tested versions —
is left to the SDK, as before. Nothing here imports the SDK or touches its internals.
"""

from __future__ import annotations

import json
import operator
import os
import select
import sys
import threading
from typing import Any

from akm import __version__

# The `mcp` versions akm/mcp/stdio.py's use of SDK internals (and the answer below) were written and tested
# against (PEP 440 specifiers, lower bound inclusive, upper exclusive).
SDK_TESTED = (">=2.3.0", "<2.4")

INSTRUCTIONS = """akm runs durable markdown workflows. workflow_catalog lists the workflows and their params. The loop:
1. workflow_run(target=<file, workflows/<name> or run id>, params={...}) — akm runs every command unit itself, in
   the background: a call waits up to its bound; if the run is still going (driving: true), call workflow_run
   with the run id again to keep waiting (nothing is redone).
2. If the result's run.status is "awaiting_session", run.awaiting is the brief: the units you must do (prompt,
   context, output schema) or the gate verdict you must give (workflow_next(run_id) fetches it again).
3. Do each unit in your own session, then unit_report(**unit.report, result=...). The report that finishes the
   step's units answers with the judge brief when a gate needs your verdict:
   unit_report(**judge.report, verdict={"complete": bool, "missing": [...], "feedback": "..."}).
4. When a report's stepOutcome is completed, call workflow_run(target=<run id>) again; repeat until
   run.status is "completed". Every answer's `next` says what to do.
Results that miss their output schema are refused with the errors: fix and report again. Resending a report
whose answer you lost is safe: the same report again answers recorded "idempotent"."""

# What the SDK negotiates through the handshake (mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS and
# LATEST_HANDSHAKE_VERSION; tests/test_mcp_handshake.py checks they still are).
HANDSHAKE_PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE_VERSION = HANDSHAKE_PROTOCOL_VERSIONS[-1]
# What akm's server advertises (tools; the SDK's MCPServer always registers resource handlers; prompts are dropped).
CAPABILITIES = {"resources": {"listChanged": False, "subscribe": False}, "tools": {"listChanged": False}}

_MAX_FIRST_LINE = 1024 * 1024  # a longer first line is left to the serving loop's bounded reader
_CLIENT_INFO_KEYS = ("name", "version", "title", "description", "websiteUrl")


def initialize_result(protocol_version: str) -> dict[str, Any]:
    """The `initialize` result akm's server gives a client asking for `protocol_version` (key order as the SDK's)."""
    negotiated = protocol_version if protocol_version in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
    return {
        "capabilities": CAPABILITIES,
        "instructions": INSTRUCTIONS,
        "protocolVersion": negotiated,
        "serverInfo": {"name": "akm", "version": __version__},
    }


def _nested_objects(value: Any, depth: int = 0) -> bool:
    """Objects of objects (the shape of every standard client capability but `roots`)."""
    return isinstance(value, dict) and depth < 8 and all(_nested_objects(v, depth + 1) for v in value.values())


def _plain_capabilities(caps: Any) -> bool:
    if not isinstance(caps, dict):
        return False
    for name, value in caps.items():
        if name == "roots":
            if not (isinstance(value, dict) and set(value) <= {"listChanged"}):
                return False
            if value.get("listChanged") not in (None, True, False):
                return False
        elif name in ("experimental", "extensions"):
            if not (isinstance(value, dict) and all(isinstance(v, dict) for v in value.values())):
                return False
        elif not _nested_objects(value):
            return False
    return True


def _plain_client_info(info: Any) -> bool:
    if not isinstance(info, dict) or not set(info) <= set(_CLIENT_INFO_KEYS):
        return False
    if not (isinstance(info.get("name"), str) and isinstance(info.get("version"), str)):
        return False
    return all(isinstance(info[k], str) or info[k] is None for k in ("title", "description", "websiteUrl") if k in info)


def early_answer(line: bytes) -> tuple[Any, bytes] | None:
    """(request id, answer line) for a plain `initialize` request line, else None (the SDK answers it)."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or set(obj) != {"jsonrpc", "id", "method", "params"}:
        return None
    rid, params = obj["id"], obj["params"]
    if obj["jsonrpc"] != "2.0" or obj["method"] != "initialize":
        return None
    if not ((isinstance(rid, int) and not isinstance(rid, bool)) or isinstance(rid, str)):
        return None
    if not isinstance(params, dict) or set(params) != {"protocolVersion", "capabilities", "clientInfo"}:
        return None
    if not isinstance(params["protocolVersion"], str):
        return None
    if not (_plain_capabilities(params["capabilities"]) and _plain_client_info(params["clientInfo"])):
        return None
    answer = {"jsonrpc": "2.0", "id": rid, "result": initialize_result(params["protocolVersion"])}
    return rid, json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


_DIGITS = frozenset("0123456789")
_COMPARE = {">=": operator.ge, "<=": operator.le, "<": operator.lt, ">": operator.gt, "==": operator.eq}


def release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version: `2.3.0rc1` -> (2, 3, 0), `2.3` -> (2, 3). ValueError when the
    text does not start with a number. Pre-release and local tags are not compared (what `SDK_TESTED` needs)."""
    parts: list[int] = []
    for piece in version.strip().split("."):
        digits = ""
        for ch in piece:
            if ch not in _DIGITS:
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    if not parts:
        raise ValueError(f"not a version: {version!r}")
    return tuple(parts)


def version_satisfies(version: str, spec: str) -> bool:
    """Does `version` meet one specifier (`>=2.3.0`, `<2.4`; also `<=`, `>`, `==`)?

    The one rule for the SDK range, used here and by tests/test_mcp_sdk_pin.py: release parts compared
    with the shorter one padded with zeros, so `2.3` is `2.3.0` (an SDK reporting "2.3" is in `>=2.3.0`).
    ValueError for a specifier or version it cannot read.
    """
    text = spec.strip()
    op = text[:2] if text[:2] in _COMPARE else text[:1]
    if op not in _COMPARE:
        raise ValueError(f"not a version specifier: {spec!r}")
    have, want = release(version), release(text[len(op) :])
    width = max(len(have), len(want))
    return bool(_COMPARE[op](have + (0,) * (width - len(have)), want + (0,) * (width - len(want))))


def in_tested_range(version: str) -> bool:
    """Whether `version` of the SDK meets every specifier of `SDK_TESTED`."""
    return all(version_satisfies(version, spec) for spec in SDK_TESTED)


def sdk_in_tested_range() -> bool:
    """Whether the installed `mcp` is one this module's answer was checked against (without importing it)."""
    from importlib import metadata

    try:
        return in_tested_range(metadata.version("mcp"))
    except (metadata.PackageNotFoundError, ValueError):
        return False


_POLL_S = 0.02  # how often the early reader checks whether the SDK has taken over, while input is quiet


def tools_list_result() -> bytes | None:
    """The `tools/list` result bytes as the SDK writes them: `tools.json` (generated from the request models,
    `akm.mcp.reference`: compact JSON, one tool a line) without its newlines; None when it cannot be read."""
    try:
        path = os.path.join(os.path.dirname(__file__), "tools.json")
        data = __loader__.get_data(path).replace(b"\n", b"")  # type: ignore[name-defined]  # the zipapp's loader too
    except (OSError, AttributeError):
        return None
    return data if data.startswith(b'{"tools":[{') and data.endswith(b"}]}") else None


def _answer_head(rid: Any) -> bytes:
    return b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode("utf-8") + b',"result":'


def _answer_line(rid: Any, result: bytes) -> bytes:
    """A response line as the SDK writes one (compact, keys in its order), around `result` bytes."""
    return _answer_head(rid) + result + b"}\n"


def is_initialized_notification(line: bytes) -> bool:
    """`notifications/initialized` with nothing else in it (what every client sends after `initialize`)."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    return obj == {"jsonrpc": "2.0", "method": "notifications/initialized"}


def plain_tools_list_id(line: bytes) -> tuple[bool, Any]:
    """(True, id) for a `tools/list` request without a cursor (or `_meta`) and a plain id, else (False, None)."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return False, None
    if not isinstance(obj, dict) or obj.get("method") != "tools/list" or obj.get("jsonrpc") != "2.0":
        return False, None
    if set(obj) - {"jsonrpc", "id", "method", "params"} or obj.get("params", {}) not in ({}, None):
        return False, None
    rid = obj.get("id")
    if not ((isinstance(rid, int) and not isinstance(rid, bool) and abs(rid) < 2**53) or _plain_string_id(rid)):
        return False, None
    return True, rid


def _plain_string_id(rid: Any) -> bool:
    """A string id the SDK writes back exactly as `json.dumps` does (printable ASCII, nothing to escape)."""
    return isinstance(rid, str) and all(" " <= ch <= "~" and ch not in '"\\' for ch in rid)


class EarlyStart:
    """The first lines of stdin, read (and answered when they are a plain `initialize` and then a plain
    `tools/list`) while the SDK loads."""

    def __init__(self) -> None:
        self.pushback = b""  # every byte read from fd 0: the serving loop reads these first
        self.answered_id: Any = None  # the `initialize` id answered early (None: nothing was)
        self.sent = b""  # the `initialize` answer line written
        self.protocol_version: str | None = None  # what the early `initialize` answer negotiated
        self.tools_list_id: Any = None  # the `tools/list` id answered early (None: none was)
        self.tools_list_sent = b""  # that answer line
        self._stop = threading.Event()  # the SDK is loaded: stop reading ahead
        self._thread = threading.Thread(target=self._run, name="akm-mcp-initialize", daemon=True)

    def _run(self) -> None:
        buf = bytearray()
        try:
            while b"\n" not in buf and len(buf) <= _MAX_FIRST_LINE:
                chunk = os.read(0, 65536)
                if not chunk:
                    break
                buf += chunk
        except OSError:
            pass
        self.pushback = bytes(buf)
        end = buf.find(b"\n")
        if end < 0:
            return
        got = early_answer(bytes(buf[:end]))
        if got is None:
            return
        rid, data = got
        if not self._write(data):
            return  # the client is gone (or stdout is unusable): let the serving loop find out as before
        self.answered_id, self.sent = rid, data
        self.protocol_version = json.loads(data)["result"]["protocolVersion"]
        tools = tools_list_result()
        # Not from a terminal: a person typing needs no head start, and macOS cannot poll a tty.
        if tools is not None and hasattr(select, "poll") and not os.isatty(0):
            self._answer_tools_list(buf, end + 1, tools)

    def _answer_tools_list(self, buf: bytearray, start: int, tools: bytes) -> None:
        """Read on (until the SDK takes over) for the plain `tools/list` that usually follows, and answer it."""
        poller = select.poll()
        poller.register(0, select.POLLIN)
        initialized = False  # a request before `notifications/initialized` is the SDK's to judge
        while not self._stop.is_set() and len(buf) <= _MAX_FIRST_LINE:
            end = buf.find(b"\n", start)
            if end >= 0:
                line = bytes(buf[start:end])
                start = end + 1
                if not initialized and is_initialized_notification(line):
                    initialized = True
                    continue
                plain, rid = plain_tools_list_id(line)
                same_id = type(rid) is type(self.answered_id) and rid == self.answered_id  # the SDK's to refuse
                if plain and initialized and not same_id:
                    data = _answer_line(rid, tools)
                    if self._write(data):
                        self.tools_list_id, self.tools_list_sent = rid, data
                return  # anything else, and all that follows, is the SDK's
            try:
                events = poller.poll(_POLL_S * 1000)
                if not events:
                    continue
                if not events[0][1] & (select.POLLIN | select.POLLHUP):
                    return  # POLLNVAL, POLLERR: nothing to read here; the serving loop finds out
                chunk = os.read(0, 65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            self.pushback = bytes(buf)

    @staticmethod
    def _write(data: bytes) -> bool:
        """Write `data` to stdout; whether any of it was written (then the answer counts as sent: the SDK's
        copy after a torn line would not mend it)."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(1, view) :]
            except (BlockingIOError, InterruptedError):  # a non-blocking stdout that is full: wait for room
                try:
                    select.select([], [1], [], 1.0)
                except (OSError, ValueError):
                    return len(view) < len(data)
            except OSError:
                return len(view) < len(data)
        return True

    def stop(self) -> None:
        """Stop reading ahead (within `_POLL_S`), without waiting for the first line."""
        self._stop.set()

    def result(self) -> EarlyStart:
        """Stop reading ahead and wait for what was read (at least the first line, or end of input); self."""
        self.stop()
        self._thread.join()
        return self


def start() -> EarlyStart | None:
    """Begin reading (and answering) the first line, when that can win anything and is safe; else None."""
    if "mcp" in sys.modules or not sdk_in_tested_range():
        return None  # the SDK is loaded already (nothing to win), or it is one the answer was not checked against
    try:
        os.fstat(0)
        os.fstat(1)
    except OSError:
        return None
    early = EarlyStart()
    early._thread.start()
    return early
