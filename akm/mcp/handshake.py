"""Answers before the SDK is loaded: a client is connected in the time of a start, not of an SDK import.

Why: importing the `mcp` SDK (its protocol types are pydantic models for every protocol version, its server
pulls in starlette, uvicorn, httpx and cryptography) takes about half a second warm and more with an empty cache,
and a client waits for its first answers before anything else. So while the main thread imports the SDK and
builds the server, a thread reads stdin and answers what needs no SDK — the same bytes the SDK would write:

* a 2025 handshake-era client: a plain `initialize`, then (after `notifications/initialized`) plain
  `tools/list`, `resources/list` and `resources/templates/list` requests;
* a 2026-07-28 client (every request carries its envelope in `params._meta`): `server/discover` and the
  same three lists, in any order and as often as asked (Claude Code probes discover twice).

The answers are assembled from `answers.json`, generated from the server itself — the tools' request models,
the capabilities the SDK derives from akm's handlers, the resources, the instructions (`akm.mcp.reference`;
tests/test_mcp_reference.py keeps it current) — by the SDK's wire rule: a result's keys in alphabetical
order, and in the 2026 era `cacheScope`, `resultType`, `ttlMs` and the `_meta` server stamp added.
Everything read is handed to the serving loop anyway (`pushback`), so the SDK still receives each request
(its state is the same as without the early answers); its answers to them are not written again but
compared: a difference is reported on stderr (tests/test_mcp_handshake.py keeps them equal).

"Plain" is deliberately narrow: only what the SDK is certain to accept and answer the same way (JSON-RPC 2.0,
an integer or printable string id used once, params in the shapes mainstream clients send, no cursor). The
first request that is anything else — a malformed one, a `tools/call`, a notification other than
`initialized` — ends the reading ahead, and it and all that follows are the SDK's; so is everything when the
SDK is already imported or is outside `SDK_TESTED`. Nothing here imports the SDK or touches its internals.
"""

from __future__ import annotations

import json
import operator
import os
import select
import sys
import threading
from typing import Any

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

# What the SDK negotiates through the handshake, and the 2026 versions it serves on the per-request envelope
# (mcp_types.version's HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION and MODERN_PROTOCOL_VERSIONS;
# tests/test_mcp_handshake.py checks they still are).
HANDSHAKE_PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE_VERSION = HANDSHAKE_PROTOCOL_VERSIONS[-1]
MODERN_PROTOCOL_VERSIONS = ("2026-07-28",)
# The 2026 envelope's keys in `params._meta` (mcp_types' PROTOCOL_VERSION_META_KEY, ...).
PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
# The lists answered early in both eras (their results take no arguments).
LISTS = {"tools/list": "tools", "resources/list": "resources", "resources/templates/list": "resourceTemplates"}

_MAX_FIRST_LINE = 1024 * 1024  # a longer first line is left to the serving loop's bounded reader
_CLIENT_INFO_KEYS = ("name", "version", "title", "description", "websiteUrl")


def initialize_result(protocol_version: str) -> bytes | None:
    """The `initialize` result bytes akm's server gives a client asking for `protocol_version` (None: the
    generated answers cannot be read)."""
    negotiated = protocol_version if protocol_version in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
    pieces = answer_pieces()
    if pieces is None:
        return None
    return _result(
        {
            "capabilities": pieces["capabilities"],
            "instructions": pieces["instructions"],
            "protocolVersion": json.dumps(negotiated).encode(),
            "serverInfo": pieces["serverInfo"],
        }
    )


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
    if obj["jsonrpc"] != "2.0" or obj["method"] != "initialize" or not _valid_plain_id(rid):
        return None
    if not _plain_initialize_params(params):
        return None
    result = initialize_result(params["protocolVersion"])
    return (rid, _answer_line(rid, result)) if result is not None else None


def _plain_initialize_params(params: Any) -> bool:
    """`initialize` params of exactly the three keys, each in the plain form the early answer knows."""
    if not isinstance(params, dict) or set(params) != {"protocolVersion", "capabilities", "clientInfo"}:
        return False
    if not isinstance(params["protocolVersion"], str):
        return False
    return _plain_capabilities(params["capabilities"]) and _plain_client_info(params["clientInfo"])


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
ANSWERS_FILE = "answers.json"
_pieces: dict[str, bytes] | None = None
_pieces_lock = threading.Lock()


def answer_pieces() -> dict[str, bytes] | None:
    """The members of `answers.json` as the SDK writes them (compact JSON bytes), by name; None when it cannot
    be read. Split by line, never parsed whole: one member a line (`"name":value,`), the tools one a line
    between `"tools":[` and `]`, so the early answers splice bytes instead of re-serializing 60 KB."""
    global _pieces
    with _pieces_lock:
        if _pieces is None:
            _pieces = _read_pieces()
        return _pieces or None


def _read_pieces() -> dict[str, bytes]:
    try:
        path = os.path.join(os.path.dirname(__file__), ANSWERS_FILE)
        data: bytes = __loader__.get_data(path)  # type: ignore[name-defined]  # the zipapp's loader too
    except (OSError, AttributeError):
        return {}
    lines = data.split(b"\n")
    if not lines or lines[0] != b"{":
        return {}
    pieces: dict[str, bytes] = {}
    items: list[bytes] | None = None  # the lines of a list member being read, one item a line
    name = ""
    for line in lines[1:]:
        if items is not None:
            if line in (b"]", b"],"):
                pieces[name] = b"[" + b"".join(items) + b"]"
                items = None
            else:
                items.append(line)
        elif line.startswith(b'"'):
            key, sep, value = line.partition(b'":')
            if not sep:
                return {}
            name = key[1:].decode("utf-8")
            if value == b"[":
                items = []
            else:
                pieces[name] = value.removesuffix(b",")
    needed = {"capabilities", "discoverCapabilities", "instructions", "serverInfo", "supportedVersions", "modernTools"}
    return pieces if needed | set(LISTS.values()) <= set(pieces) else {}


def _result(members: dict[str, bytes], *, modern: bool = False) -> bytes:
    """A result object as the SDK writes it: keys in alphabetical order; in the 2026 era with `cacheScope`,
    `resultType` and `ttlMs`, and the server's `_meta` stamp last."""
    if modern:
        members = {**members, "cacheScope": b'"private"', "resultType": b'"complete"', "ttlMs": b"0"}
    body = b",".join(json.dumps(name).encode() + b":" + value for name, value in sorted(members.items()))
    if modern:
        pieces = answer_pieces() or {}
        body += b',"_meta":{"' + SERVER_INFO_KEY.encode() + b'":' + pieces.get("serverInfo", b"{}") + b"}"
    return b"{" + body + b"}"


def list_result(method: str, *, modern: bool = False) -> bytes | None:
    """The result bytes of `tools/list`, `resources/list` or `resources/templates/list` (no cursor)."""
    pieces = answer_pieces()
    if pieces is None:
        return None
    name = LISTS[method]
    value = pieces["modernTools" if modern and name == "tools" else name]
    return _result({name: value}, modern=modern)


def discover_result() -> bytes | None:
    """The `server/discover` result bytes."""
    pieces = answer_pieces()
    if pieces is None:
        return None
    members = {k: pieces[k] for k in ("instructions", "supportedVersions")}
    return _result({**members, "capabilities": pieces["discoverCapabilities"]}, modern=True)


def tools_list_result() -> bytes | None:
    """The handshake-era `tools/list` result bytes (what a client of the 2025 protocols is answered)."""
    return list_result("tools/list")


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


def _valid_plain_id(rid: Any) -> bool:
    """An integer id, or a string the SDK writes back exactly as `json.dumps` does (printable ASCII)."""
    if isinstance(rid, int) and not isinstance(rid, bool):
        return abs(rid) < 2**53
    return isinstance(rid, str) and all(" " <= ch <= "~" and ch not in '"\\' for ch in rid)


def plain_tools_list_id(line: bytes) -> tuple[bool, Any]:
    """(True, id) for a `tools/list` request without a cursor (or `_meta`) and a plain id, else (False, None)."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return False, None
    plain, rid = _plain_list_request(obj)
    return (plain and obj.get("method") == "tools/list"), (rid if plain else None)


def _plain_list_request(obj: Any) -> tuple[bool, Any]:
    """A handshake-era list request of `LISTS` with no params (or empty ones) and a plain id."""
    if not isinstance(obj, dict) or obj.get("method") not in LISTS or obj.get("jsonrpc") != "2.0":
        return False, None
    if set(obj) - {"jsonrpc", "id", "method", "params"} or obj.get("params", {}) not in ({}, None):
        return False, None
    rid = obj.get("id")
    return (True, rid) if "id" in obj and _valid_plain_id(rid) else (False, None)


def _plain_envelope(params: Any) -> bool:
    """`params` of exactly a 2026-07-28 envelope, in the shapes mainstream clients send (Claude Code's)."""
    if not isinstance(params, dict) or set(params) != {"_meta"}:
        return False
    meta = params["_meta"]
    if not isinstance(meta, dict) or set(meta) != {PROTOCOL_VERSION_KEY, CLIENT_INFO_KEY, CLIENT_CAPABILITIES_KEY}:
        return False
    return (
        meta[PROTOCOL_VERSION_KEY] in MODERN_PROTOCOL_VERSIONS
        and _plain_client_info(meta[CLIENT_INFO_KEY])
        and _plain_capabilities(meta[CLIENT_CAPABILITIES_KEY])
    )


def has_modern_envelope(obj: Any) -> bool:
    """Does the request carry the 2026 envelope (the key the SDK opens a modern connection on)?"""
    params = obj.get("params") if isinstance(obj, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta


class _Reader:
    """Which early answer each line gets, in the era the first request opens (as the SDK decides it)."""

    def __init__(self) -> None:
        self.era: str | None = None  # "handshake" | "modern", once the first request is answered
        self.initialized = False
        self.ids: set[tuple[str, Any]] = set()

    def answer(self, line: bytes) -> tuple[Any, str, bytes] | bool:
        """(id, method, answer line) for a line answered early; True for a line taken without an answer (the
        `initialized` notification); False: stop, this line and all after it are the SDK's."""
        try:
            obj = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            return False
        if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0":
            return False
        if self.era is None and obj.get("method") == "initialize":
            got = early_answer(line)
            if got is None:
                return False
            self.era = "handshake"
            return self._once(got[0], "initialize", got[1])
        if self.era == "handshake" or (self.era is None and not has_modern_envelope(obj)):
            return self._after_initialize(obj, line)
        return self._modern(obj)

    def _after_initialize(self, obj: dict[str, Any], line: bytes) -> tuple[Any, str, bytes] | bool:
        """A line after an early-answered `initialize`: the `initialized` notification, then plain lists."""
        if self.era is None:
            return False  # anything but initialize or a 2026 request first: the SDK's to judge
        if not self.initialized:
            self.initialized = is_initialized_notification(line)
            return self.initialized  # a request before `initialized` is the SDK's to judge
        plain, rid = _plain_list_request(obj)
        result = list_result(obj["method"]) if plain else None
        return self._once(rid, obj["method"], _answer_line(rid, result)) if result is not None else False

    def _modern(self, obj: dict[str, Any]) -> tuple[Any, str, bytes] | bool:
        """A 2026 request in a plain envelope: `server/discover` or a list, answered once it is plain."""
        method = obj.get("method")
        if set(obj) != {"jsonrpc", "id", "method", "params"} or not _valid_plain_id(obj.get("id")):
            return False
        if not _plain_envelope(obj["params"]):
            return False
        if method == "server/discover":
            result = discover_result()
        elif method in LISTS:
            result = list_result(method, modern=True)
        else:
            return False
        if result is None:
            return False
        self.era = "modern"
        return self._once(obj["id"], method, _answer_line(obj["id"], result))

    def _once(self, rid: Any, method: str, data: bytes) -> tuple[Any, str, bytes] | bool:
        key = (type(rid).__name__, rid)
        if key in self.ids:
            return False  # an id used twice: the SDK's to refuse
        self.ids.add(key)
        return rid, method, data


class EarlyStart:
    """The first lines of stdin, read (and answered while they are plain, see the module docstring) while the
    SDK loads."""

    def __init__(self) -> None:
        self.pushback = b""  # every byte read from fd 0: the serving loop reads these first
        self.answered: list[tuple[Any, str, bytes]] = []  # (request id, method, answer line written), in order
        self._stop = threading.Event()  # the SDK is loaded: stop reading ahead
        self._thread = threading.Thread(target=self._run, name="akm-mcp-early", daemon=True)

    def _run(self) -> None:
        buf = bytearray()
        start = 0
        reader = _Reader()
        # Not from a terminal: a person typing needs no head start, and macOS cannot poll a tty.
        poller = select.poll() if hasattr(select, "poll") and not _isatty(0) else None
        if poller is not None:
            poller.register(0, select.POLLIN)
        try:
            while len(buf) - start <= _MAX_FIRST_LINE:
                end = buf.find(b"\n", start)
                if end >= 0:
                    got = reader.answer(bytes(buf[start:end]))
                    start = end + 1
                    if got is False:
                        return
                    if isinstance(got, tuple):
                        if not self._write(got[2]):
                            return  # the client is gone (or stdout is unusable): the serving loop finds out
                        self.answered.append(got)
                    continue
                if self.answered or reader.initialized:
                    if poller is None or self._stop.is_set():
                        return
                    events = poller.poll(_POLL_S * 1000)  # the SDK may take over meanwhile
                    if not events:
                        continue
                    if not events[0][1] & (select.POLLIN | select.POLLHUP):
                        return  # POLLNVAL, POLLERR: nothing to read here; the serving loop finds out
                chunk = os.read(0, 65536)  # the first line: wait for it (the SDK is not ready sooner anyway)
                if not chunk:
                    return
                buf += chunk
                self.pushback = bytes(buf)
        except OSError:
            return
        finally:
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


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def start() -> EarlyStart | None:
    """Begin reading (and answering) the first lines, when that can win anything and is safe; else None."""
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
