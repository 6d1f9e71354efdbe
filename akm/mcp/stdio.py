"""The stdio transport of `akm mcp`: bounded lines, an answer for every request, nothing dropped.

Why not the SDK's `stdio_server` as it is: it reads a line of any length into memory (a 300 MB line
cost 1.6 GB), drops every line it cannot validate without a word (a client waiting on that id waits
forever: `{}`, a batch array, an id that is an object, a float or a bool — an id of `1.0` or `null`
even passes as a notification), stops at pydantic's 200-level JSON nesting with a message about
Unicode, and at end of input cancels the requests still running, so `init`, `tools/call`, `ping`
written at once and then EOF answered only the first. This module keeps the SDK's stream claim
(fd 0 and 1 diverted while serving) and its serving loop, and owns the reading and writing:

* a line is read to at most `MAX_LINE_BYTES` (16 MiB) + 1; a longer one is skipped to its newline
  and answered -32600 (with its id when the line begins with it);
* every line that is a request gets an answer: -32700 for what is not JSON (or not Unicode text),
  -32600 Invalid Request (id null unless a valid one is known) for what is not a request;
  notifications and responses never get one, as JSON-RPC wants;
* at end of input the requests in flight are answered before the server stops — unless the client
  is gone (its end of stdout closed), which still cancels them at once.

This is also the one module of akm that touches the SDK's internals (private modules of the `mcp` package):
the stdio helpers above, declared in `SDK_MODULE_INTERNALS` and written against the SDK versions in
`SDK_TESTED`; tests/test_mcp_sdk_pin.py fails when the installed SDK leaves that range or loses one of them.
The server itself is built on the SDK's public low-level `Server` (`akm.mcp.server`).
"""

from __future__ import annotations

import json
import re
import select
import sys
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Mapping

import anyio
import mcp_types as types
from pydantic import ValidationError

from akm.mcp import handshake

if TYPE_CHECKING:
    from mcp.server import Server

# The `mcp` versions this module's use of SDK internals was written and tested against (PEP 440 specifiers);
# kept in `akm.mcp.handshake`, which checks it before the SDK is imported.
SDK_TESTED = handshake.SDK_TESTED
# Private names imported from SDK modules (module -> names).
SDK_MODULE_INTERNALS: dict[str, tuple[str, ...]] = {
    "mcp.server.stdio": ("_claim_fd", "_open_stdin_diversion", "_open_stdout_diversion"),
    "mcp.shared._context_streams": ("create_context_streams",),
    "mcp.shared.message": ("SessionMessage",),
}

MAX_LINE_BYTES = 16 * 1024 * 1024  # the most one protocol line may hold (a report's bound, spec/session.md)
_DRAIN_CHUNK = 1024 * 1024
_HEAD_BYTES = 4096  # what of an over-long line is kept to find its id
EOF_DRAIN_LIMIT_S = 900.0  # the longest akm waits at end of input for the answers still owed


class Oversized:
    """A line longer than MAX_LINE_BYTES: its size and its first bytes (for the id), never the rest."""

    def __init__(self, size: int, head: bytes) -> None:
        self.size, self.head = size, head


def read_line(stream: BinaryIO) -> bytes | Oversized | None:
    """The next line (None at end of input), reading at most MAX_LINE_BYTES + 1 bytes of it into memory."""
    line = stream.readline(MAX_LINE_BYTES + 1)
    if not line:
        return None
    if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
        return line
    size, head = len(line), line[:_HEAD_BYTES]
    del line
    while True:  # skip the rest of it, a chunk at a time
        more = stream.readline(_DRAIN_CHUNK)
        if not more:
            break
        size += len(more)
        if more.endswith(b"\n"):
            size -= 1
            break
    return Oversized(size, head)


class Prefixed:
    """A binary stream that serves `prefix` (bytes read from it before) ahead of the stream itself."""

    def __init__(self, prefix: bytes, stream: BinaryIO) -> None:
        self._prefix, self._stream = prefix, stream

    def readline(self, limit: int = -1) -> bytes:
        if not self._prefix:
            return self._stream.readline(limit)
        stop = len(self._prefix) if limit < 0 else min(limit, len(self._prefix))
        end = self._prefix.find(b"\n", 0, stop)
        if end >= 0 or stop < len(self._prefix) or stop == limit:
            cut = end + 1 if end >= 0 else stop
            line, self._prefix = self._prefix[:cut], self._prefix[cut:]
            return line
        line, self._prefix = self._prefix, b""
        return line + self._stream.readline(-1 if limit < 0 else limit - len(line))


def _error(rid: Any, code: int, message: str, data: Any = None) -> types.JSONRPCError:
    error = (
        types.ErrorData(code=code, message=message, data=data)
        if data is not None
        else types.ErrorData(code=code, message=message)
    )
    return types.JSONRPCError(jsonrpc="2.0", id=rid, error=error)


def _valid_id(rid: Any) -> bool:
    return (isinstance(rid, int) and not isinstance(rid, bool)) or isinstance(rid, str)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        float: "a number with a fraction or an exponent",
        dict: "an object",
        list: "an array",
        int: "an integer",
        str: "a string",
    }.get(type(value), type(value).__name__)


_PAIR = re.compile(
    r'\s*"((?:[^"\\]|\\.)*)"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)'
    r"\s*,"
)


def leading_id(head: str) -> Any:
    """The request id of a message read only in part, when the id comes before any nested value (as
    clients write it: `{"jsonrpc": "2.0", "id": 7, "method": …, "params": {…}}`); else None."""
    start = re.match(r"\s*\{", head)
    if start is None:
        return None
    pos = start.end()
    while (m := _PAIR.match(head, pos)) is not None:
        if m.group(1) == "id":
            rid = json.loads(m.group(2))
            return rid if _valid_id(rid) else None
        pos = m.end()
    return None


def classify(raw: bytes | Oversized) -> types.JSONRPCMessage | types.JSONRPCError | None:
    """One line as a message to serve, an error to answer, or None (a notification or response that
    cannot be read: JSON-RPC answers neither)."""
    if isinstance(raw, Oversized):
        rid = leading_id(raw.head.decode("utf-8", errors="replace"))
        return _error(
            rid,
            types.INVALID_REQUEST,
            f"Invalid request: the message is {raw.size} bytes, more than the {MAX_LINE_BYTES} bytes "
            "(16 MiB) a line may hold; it was not read. Write a large result to a file and send its path.",
            {"bytes": raw.size, "maxBytes": MAX_LINE_BYTES},
        )
    text = raw.decode("utf-8", errors="replace")  # as the SDK reads stdin
    try:
        message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except ValidationError as exc:
        return _unreadable(text, exc)
    return _checked(message, text)


def _checked(message: Any, text: str) -> Any:
    """pydantic reads `"id": 1.0` or `"id": null` as a notification (the id is ignored): refuse it."""
    if isinstance(message, types.JSONRPCNotification) and '"id"' in text:
        obj = _loads(text)
        if isinstance(obj, dict) and "id" in obj:
            return _error(
                None,
                types.INVALID_REQUEST,
                f"Invalid request: the id must be a string or an integer, not {_kind(obj['id'])}.",
            )
    return message


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _unreadable(text: str, exc: ValidationError) -> types.JSONRPCError | types.JSONRPCMessage | None:
    first: Mapping[str, Any] = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        try:
            obj = json.loads(text)
        except RecursionError:
            return _error(
                leading_id(text[:_HEAD_BYTES]),
                types.PARSE_ERROR,
                "Parse error: the message nests too deeply to read (a value, such as a unit_report "
                "result, may nest at most 200 levels).",
            )
        except ValueError:
            return _error(None, types.PARSE_ERROR, f"Parse error: {first.get('msg')}")
        if "recursion limit" in str(first.get("msg")):
            # pydantic's JSON reader stops at 200 levels, the envelope included; the engine's own limit for a
            # value is 200 levels of the value itself (akm.dispatch.answer.MAX_ANSWER_DEPTH), as at the CLI.
            try:
                return _checked(types.jsonrpc_message_adapter.validate_python(obj, by_name=False), text)
            except ValidationError as again:
                return _invalid(obj, again)
        rid = obj.get("id") if isinstance(obj, dict) else None
        return _error(
            rid if _valid_id(rid) else None,
            types.PARSE_ERROR,
            f"Parse error: the request is not Unicode text ({first.get('msg')}); send every string as "
            "valid UTF-8 (no lone surrogates).",
        )
    return _invalid(_loads(text), exc)


def _invalid(obj: Any, exc: ValidationError) -> types.JSONRPCError | None:
    """JSON that is no JSON-RPC message: -32600, unless it is a notification or a response."""
    shapeless = _shapeless(obj)
    if shapeless is not None:
        return shapeless
    if "method" not in obj and ("result" in obj or "error" in obj):
        return None  # a malformed response of the client's: nothing to answer
    if "id" not in obj and "method" in obj:
        return None  # a malformed notification: JSON-RPC never answers one
    as_request = [e for e in exc.errors() if e["loc"][:1] == ("JSONRPCRequest",)] or exc.errors()
    problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'message'}: {e['msg']}" for e in as_request[:5])
    return _error(obj.get("id"), types.INVALID_REQUEST, f"Invalid request: {problems}")


def _shapeless(obj: Any) -> types.JSONRPCError | None:
    """The answer to JSON not even shaped as one message (a batch, a non-object, an id of the wrong type)."""
    if isinstance(obj, list):
        return _error(
            None,
            types.INVALID_REQUEST,
            "Invalid request: a batch (a JSON array) is not supported; send one JSON-RPC object per line.",
        )
    if not isinstance(obj, dict):
        return _error(
            None, types.INVALID_REQUEST, f"Invalid request: a JSON-RPC message is an object, not {_kind(obj)}."
        )
    if "id" in obj and not _valid_id(obj["id"]):
        return _error(
            None,
            types.INVALID_REQUEST,
            f"Invalid request: the id must be a string or an integer, not {_kind(obj['id'])}.",
        )
    return None


def _peer_gone(fd: int) -> bool:
    """The client closed its end of our stdout (a pipe or socket reports POLLERR/POLLHUP)."""
    try:
        poller = select.poll()
        poller.register(fd, 0)
        return any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _request_key(rid: Any) -> tuple[str, Any]:
    return (type(rid).__name__, rid)


async def serve(
    low: Any,
    init_options: Any,
    on_eof: Callable[[], None] | None = None,
    early: handshake.EarlyStart | None = None,
) -> bool:
    """Serve the low-level server `low` on stdin/stdout; False when the SDK internals it needs are missing
    (the caller then uses the SDK's own loop). `on_eof` runs when input ends, before the answers still owed
    are awaited (the MCP server stops its background drivers there, so a waiting `workflow_run` answers).
    `early`: what was read of stdin before the SDK was loaded (read first), and the `initialize` answered then
    (the SDK's own answer to it is compared, not written)."""
    try:  # SDK internals (mcp 2.x); an SDK that moved them is served by its own stdio loop instead
        from mcp.server.stdio import _claim_fd, _open_stdin_diversion, _open_stdout_diversion
        from mcp.shared._context_streams import create_context_streams
        from mcp.shared.message import SessionMessage
    except ImportError:
        if early is not None:
            early.result()  # it reads no further than the SDK's own loop now starts to
        return False
    if early is not None:
        early.result()  # the first line is read (and answered) before the descriptors change hands
    stdin, release_in = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
    try:
        stdout, release_out = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
    except BaseException:
        if release_in:
            release_in()
        raise
    try:
        if early is not None and early.pushback:
            stdin = Prefixed(early.pushback, stdin)  # type: ignore[assignment]
        await _serve(low, init_options, stdin, stdout, create_context_streams, SessionMessage, on_eof, early)
    finally:
        for release in (release_out, release_in):
            if release is not None:
                release()
    return True


async def _serve(
    low: Any,
    init_options: Any,
    stdin: BinaryIO,
    stdout: BinaryIO,
    create_context_streams: Callable[..., Any],
    SessionMessage: Any,
    on_eof: Callable[[], None] | None = None,
    early: handshake.EarlyStart | None = None,
) -> None:
    read_send, read_receive = create_context_streams(0)
    # Requests answered before the SDK was loaded, with the line sent: the SDK's answer is compared, not written.
    answered: dict[tuple[str, Any], tuple[str, bytes]] = {}
    for rid, method, sent in early.answered if early is not None else ():
        answered[_request_key(rid)] = (method, sent)
    write_send, write_receive = create_context_streams(0)
    in_flight: set[tuple[str, Any]] = set()
    settled = anyio.Event()
    out_fd = stdout.fileno()

    def next_message() -> Any:
        raw = read_line(stdin)
        return None if raw is None else (classify(raw),)

    async def reader() -> None:
        nonlocal settled
        async with read_send:
            while True:
                got = await anyio.to_thread.run_sync(next_message, abandon_on_cancel=True)
                if got is None:
                    break
                (message,) = got
                if message is None:
                    continue
                if isinstance(message, types.JSONRPCError):
                    await write_send.send(SessionMessage(message))
                    continue
                if isinstance(message, types.JSONRPCRequest):
                    in_flight.add(_request_key(message.id))
                elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                    in_flight.discard(_request_key((message.params or {}).get("requestId")))  # never answered
                await read_send.send(SessionMessage(message))
            if on_eof is not None:
                await anyio.to_thread.run_sync(on_eof)
            # End of input: answer what was asked before stopping (the SDK's loop cancels it at EOF). Bounded
            # all the same, for a stdout that never reports its reader gone (a file) and an answer that never comes.
            give_up = anyio.current_time() + EOF_DRAIN_LIMIT_S
            while in_flight and not _peer_gone(out_fd) and anyio.current_time() < give_up:
                settled = anyio.Event()
                with anyio.move_on_after(0.25):
                    await settled.wait()

    def write(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    async def writer() -> None:
        async with write_receive:
            async for session_message in write_receive:
                message = session_message.message
                data = message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8") + b"\n"
                done = isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)) and message.id is not None
                key = _request_key(message.id) if done else None
                early_answer = answered.pop(key, None) if key is not None else None
                if early_answer is not None:  # answered before the SDK was loaded: written once only
                    method, sent = early_answer
                    if data != sent:
                        sys.stderr.write(
                            f"akm mcp: the early {method} answer differs from the SDK's:\n"
                            f"  sent: {sent.decode('utf-8', 'replace')}  SDK:  {data.decode('utf-8', 'replace')}"
                        )
                        sys.stderr.flush()
                else:
                    await anyio.to_thread.run_sync(write, data)
                if done:
                    in_flight.discard(_request_key(message.id))
                    if not in_flight:
                        settled.set()

    reading = anyio.CancelScope()

    async def read_until_stopped() -> None:
        with reading:
            await reader()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_until_stopped)
            tg.start_soon(writer)  # ends when the serving loop closes its write stream, every answer written
            await low.run(read_receive, write_send, init_options)
            reading.cancel()
    except* (BrokenPipeError, ConnectionResetError):
        pass  # the client went away: nothing left to answer


async def serve_server(server: Server[Any], early: handshake.EarlyStart | None = None) -> None:
    """Serve `server` on stdin/stdout with bounded lines and every request answered (`serve` above)."""
    drives = getattr(server, "drives", None)
    on_eof = (lambda: drives.shutdown(wait_s=0)) if drives is not None else None  # the session ended: stop runs
    if not await serve(server, server.create_initialization_options(), on_eof, early):
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read_stream, write_stream):  # an SDK that moved its internals: its own loop
            await server.run(read_stream, write_stream, server.create_initialization_options())
